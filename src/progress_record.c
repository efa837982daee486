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

#include "progress_record.h"

static bool proof_matches(const char *proof, const char *const *proofs);
static bool take_field(const char *name, char *value, ProgressRecord *out);
static int64 *parse_ids(char *text, int *n);

/*
 * progress_record_parse: a progress record of this relay taken apart (text
 * is cut up); false if it is not one: another format, another database
 * than database, a proof that is none of the non-empty proofs (a
 * NULL-terminated list), a field twice, or from without to.  Nothing in
 * the text is trusted before this says yes; out starts zeroed.
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

		line += strspn(line, " ");
		if (first)
		{
			if (strcmp(line, PROGRESS_FORMAT) != 0)
				return false;
			first = false;
			continue;
		}
		value = strchr(line, ' ');
		if (value == NULL)
			return false;
		*value++ = '\0';
		if (!take_field(line, value, out))
			return false;
	}
	return !first && out->database == database &&
		   proof_matches(out->proof, proofs) &&
		   (out->from == NULL) == (out->to == NULL);
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
		char *end;
		unsigned long oid;

		errno = 0;
		oid = strtoul(value, &end, 10);
		if (errno != 0 || *end != '\0' || end == value || oid == 0 ||
			oid > PG_UINT32_MAX)
			return false;
		out->database = (Oid) oid;
		return true;
	}
	if (strcmp(name, "proof") == 0 && out->proof == NULL)
		return (out->proof = value) != NULL;
	if (strcmp(name, "from") == 0 && out->from == NULL)
		return (out->from = value) != NULL;
	if (strcmp(name, "to") == 0 && out->to == NULL)
		return (out->to = value) != NULL;
	if (strcmp(name, "sent") == 0 && out->sent == NULL)
		return (out->sent = parse_ids(value, &out->nsent)) != NULL;
	if (strcmp(name, "held") == 0 && out->held == NULL)
		return (out->held = parse_ids(value, &out->nheld)) != NULL;
	return false;
}

/*
 * parse_ids: event ids separated by spaces; NULL if one is not a
 * positive number.
 */
static int64 *
parse_ids(char *text, int *n)
{
	int64 *ids = palloc(sizeof(int64) * (strlen(text) / 2 + 1));
	char *word;

	*n = 0;
	while ((word = strsep(&text, " ")) != NULL)
	{
		char *end;

		if (*word == '\0')
			continue;
		errno = 0;
		ids[*n] = strtoi64(word, &end, 10);
		if (errno != 0 || *end != '\0' || ids[*n] <= 0)
		{
			pfree(ids);
			*n = 0;
			return NULL;
		}
		(*n)++;
	}
	return ids;
}
