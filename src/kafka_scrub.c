/*
 * kafka_scrub.c
 *		Cut the values of outbox.kafka_properties out of librdkafka's text.
 *
 * librdkafka quotes property values in what it says: a whole value, the
 * rest of one after the token it could not parse ("beginning at: ..."),
 * one word of a command it ran, a value cut short by its own buffers.  Any
 * of them may be a secret, whatever the property's name.  Every text from
 * librdkafka (log lines, error events, errors of rd_kafka_new and of the
 * transactional API) passes through outbox_scrub before it is kept for the
 * server log or relay_status(), and loses:
 *
 *	 - every run of four or more bytes found anywhere in a value (so any
 *	   fragment of it, however librdkafka split or cut it);
 *	 - every shorter token of a value (split at white space and at
 *	   , ; : = ' "), where it stands as a word of its own.
 *
 * kafka.c tells which values to look for: those of properties that take
 * free text.  A property librdkafka accepts only as a number, a boolean or
 * one of its named choices cannot hold a secret, and hiding "1" or "all"
 * would hide half of every line.  Nothing here allocates once the values
 * are set: it runs in librdkafka's callbacks.
 *
 * src/kafka_scrub.c
 */
#include "postgres.h"

#include "utils/memutils.h"

#include "kafka.h"

/* Shortest fragment hidden wherever it appears. */
#define FRAGMENT_LEN 4

/* Longest text scrubbed; what lies beyond is cut. */
#define SCRUB_MAX_LEN 2048

#define HIDDEN "(hidden)"
#define TOKEN_SEPARATORS " \t\r\n,;:='\""

static char **values = NULL; /* in TopMemoryContext */
static int nvalues = 0;
static int max_values = 0;

static void hide_fragments(const char *text, int len, const char *value,
						   bool *hidden);
static void hide_short_tokens(const char *text, int len, const char *value,
							  bool *hidden);
static void hide_word(const char *text, int len, const char *word,
					  int word_len, bool *hidden);
static bool word_char(char c);

/*
 * outbox_scrub_forget: look for no value any more.
 */
void
outbox_scrub_forget(void)
{
	for (int i = 0; i < nvalues; i++)
		pfree(values[i]);
	nvalues = 0;
}

/*
 * outbox_scrub_add: look for value (and its fragments) from now on.
 */
void
outbox_scrub_add(const char *value)
{
	if (*value == '\0')
		return;
	for (int i = 0; i < nvalues; i++)
		if (strcmp(values[i], value) == 0)
			return;
	if (nvalues == max_values)
	{
		max_values = Max(8, max_values * 2);
		values = values == NULL
					 ? MemoryContextAlloc(TopMemoryContext,
										  max_values * sizeof(char *))
					 : repalloc(values, max_values * sizeof(char *));
	}
	values[nvalues++] = MemoryContextStrdup(TopMemoryContext, value);
}

/*
 * outbox_scrub: text as it may be shown, in out (size bytes): every part
 * of a value replaced by "(hidden)".  text and out may be the same.
 */
void
outbox_scrub(const char *text, char *out, size_t size)
{
	char copy[SCRUB_MAX_LEN + 1];
	bool hidden[SCRUB_MAX_LEN];
	int len;
	size_t n = 0;

	if (size == 0)
		return;
	strlcpy(copy, text, sizeof(copy));
	len = (int) strlen(copy);
	memset(hidden, 0, sizeof(hidden));
	for (int i = 0; i < nvalues; i++)
	{
		hide_fragments(copy, len, values[i], hidden);
		hide_short_tokens(copy, len, values[i], hidden);
	}
	for (int i = 0; i < len && n + 1 < size; i++)
	{
		if (!hidden[i])
			out[n++] = copy[i];
		else if (i == 0 || !hidden[i - 1])
			n += strlcpy(out + n, HIDDEN, size - n);
		n = Min(n, size - 1);
	}
	out[n] = '\0';
}

/*
 * hide_fragments: mark every FRAGMENT_LEN bytes of text that also appear
 * in value: a longer fragment of value is a row of such windows.
 */
static void
hide_fragments(const char *text, int len, const char *value, bool *hidden)
{
	size_t value_len = strlen(value);

	if (value_len < FRAGMENT_LEN)
		return;
	for (int i = 0; i + FRAGMENT_LEN <= len; i++)
		if (memmem(value, value_len, text + i, FRAGMENT_LEN) != NULL)
			memset(hidden + i, true, FRAGMENT_LEN);
}

/*
 * hide_short_tokens: mark the words of text that are a token of value too
 * short for hide_fragments.
 */
static void
hide_short_tokens(const char *text, int len, const char *value, bool *hidden)
{
	const char *p = value;

	while (*p != '\0')
	{
		size_t token_len;

		p += strspn(p, TOKEN_SEPARATORS);
		token_len = strcspn(p, TOKEN_SEPARATORS);
		if (token_len > 0 && token_len < FRAGMENT_LEN)
			hide_word(text, len, p, (int) token_len, hidden);
		p += token_len;
	}
}

/*
 * hide_word: mark where word stands in text with no letter or digit
 * right before or after it.
 */
static void
hide_word(const char *text, int len, const char *word, int word_len, bool *hidden)
{
	for (int i = 0; i + word_len <= len; i++)
	{
		if (memcmp(text + i, word, word_len) != 0)
			continue;
		if ((i > 0 && word_char(text[i - 1]) && word_char(word[0])) ||
			(i + word_len < len && word_char(text[i + word_len]) &&
			 word_char(word[word_len - 1])))
			continue;
		memset(hidden + i, true, word_len);
	}
}

/*
 * word_char: whether c is part of a word (a letter or a digit).
 */
static bool
word_char(char c)
{
	return isalnum((unsigned char) c);
}
