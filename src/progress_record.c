/*
 * progress_record.c
 *		A progress record read back from Kafka, taken apart (exactly_once.c
 *		says what the record is for and when it is read).
 *
 * What the relay reads from its progress topic is untrusted input: anyone
 * with write access to the topic can put any bytes there.  So the parser
 * is a pure function of the text and of what it must match (the database,
 * the proofs): no backend state, no ereport, only palloc and c.h, which
 * lets the fuzz harness (test/tools/progress_fuzz.c) build it alone under
 * AddressSanitizer and UndefinedBehaviorSanitizer.
 *
 * src/progress_record.c
 */
#include "postgres.h"

#include "utils/memutils.h"

#include "progress_record.h"

static bool proof_matches(const char *proof, const char *const *proofs);
static bool take_field(const char *name, char *value, ProgressRecord *out);
static bool take_text(char **field, char *value);
static int64 *parse_ids(char *text, int *n);
static bool parse_number(const char *text, uint64 max, uint64 *out);

/*
 * progress_record_parse: a progress record of this relay taken apart (text
 * is cut up); false if it is not one.  It is one only if it is written
 * exactly as exactly_once.c writes it, fields in any order: the format
 * line, then "; name value" for each field, once; database is database,
 * the proof one of the non-empty proofs (a NULL-terminated list), from and
 * to come together, and timeline and wal (records of 0.2.0 have neither),
 * numbers are positive and in decimal, ids int64, one space apart.
 * Nothing in the text is trusted before this says yes; out starts zeroed,
 * and may hold id lists to free even when it says no.
 */
bool
progress_record_parse(char *text, Oid database, const char *const *proofs,
					  ProgressRecord *out)
{
	char *line;
	char *rest = text;
	bool first = true;

	while ((line = strsep(&rest, ";")) != NULL)
	{
		char *value;

		if (first)
		{
			if (strcmp(line, PROGRESS_FORMAT) != 0)
				return false;
			first = false;
			continue;
		}
		/* "; name value": one space after the separator, one after name. */
		if (*line++ != ' ' || (value = strchr(line, ' ')) == NULL)
			return false;
		*value++ = '\0';
		if (!take_field(line, value, out))
			return false;
	}
	return !first && out->database == database &&
		   proof_matches(out->proof, proofs) &&
		   (out->from == NULL) == (out->to == NULL) &&
		   (out->timeline == 0) == (out->wal == 0);
}

/*
 * proof_matches: whether proof is one of the non-empty proofs: an empty
 * proof is that of no relay.
 */
static bool
proof_matches(const char *proof, const char *const *proofs)
{
	if (proof == NULL || proof[0] == '\0')
		return false;
	for (int i = 0; proofs[i] != NULL; i++)
	{
		if (proofs[i][0] != '\0' && strcmp(proof, proofs[i]) == 0)
			return true;
	}
	return false;
}

/*
 * take_field: one "name value" field of a progress record into out;
 * false if it is unknown, repeated or malformed.
 */
static bool
take_field(const char *name, char *value, ProgressRecord *out)
{
	if (strcmp(name, "database") == 0 && out->database == InvalidOid)
	{
		uint64 oid;

		if (!parse_number(value, PG_UINT32_MAX, &oid))
			return false;
		out->database = (Oid) oid;
		return true;
	}
	if (strcmp(name, "timeline") == 0 && out->timeline == 0)
	{
		uint64 timeline;

		if (!parse_number(value, PG_UINT32_MAX, &timeline))
			return false;
		out->timeline = (uint32) timeline;
		return true;
	}
	if (strcmp(name, "wal") == 0 && out->wal == 0)
		return parse_number(value, PG_UINT64_MAX, &out->wal);
	if (strcmp(name, "proof") == 0)
		return take_text(&out->proof, value);
	if (strcmp(name, "from") == 0)
		return take_text(&out->from, value);
	if (strcmp(name, "to") == 0)
		return take_text(&out->to, value);
	if (strcmp(name, "sent") == 0 && out->sent == NULL)
		return (out->sent = parse_ids(value, &out->nsent)) != NULL;
	if (strcmp(name, "held") == 0 && out->held == NULL)
		return (out->held = parse_ids(value, &out->nheld)) != NULL;
	return false;
}

/*
 * take_text: a text field (a proof, a place) into *field; false if it is
 * empty or was already taken.  A place is kept as text: first_sends.c
 * judges it before any input function sees it.
 */
static bool
take_text(char **field, char *value)
{
	if (*field != NULL || value[0] == '\0')
		return false;
	*field = value;
	return true;
}

/*
 * parse_ids: event ids separated by single spaces (text is cut up); NULL
 * if there is none, or one is not a positive int64.  The array is sized
 * by the ids counted, and a count palloc could not hold is refused rather
 * than raised as an error.
 */
static int64 *
parse_ids(char *text, int *n)
{
	int64 *ids;
	size_t count = 1;
	char *word;

	for (const char *p = text; *p != '\0'; p++)
		count += *p == ' ';
	if (count > MaxAllocSize / sizeof(int64))
		return NULL;
	ids = palloc(sizeof(int64) * count);
	*n = 0;
	while ((word = strsep(&text, " ")) != NULL)
	{
		uint64 id;

		if (!parse_number(word, PG_INT64_MAX, &id))
		{
			pfree(ids);
			*n = 0;
			return NULL;
		}
		ids[(*n)++] = (int64) id;
	}
	return ids;
}

/*
 * parse_number: text as a number from 1 to max, written as the relay
 * writes one: decimal digits, the first not 0, no sign, no space.
 * strtoul would take a sign, spaces and leading zeros, and wraps a
 * negative number.
 */
static bool
parse_number(const char *text, uint64 max, uint64 *out)
{
	uint64 value = 0;

	if (*text < '1' || *text > '9')
		return false;
	for (; *text != '\0'; text++)
	{
		int digit = *text - '0';

		if (digit < 0 || digit > 9 || value > (max - digit) / 10)
			return false;
		value = value * 10 + digit;
	}
	*out = value;
	return true;
}
