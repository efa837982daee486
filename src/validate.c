/*
 * validate.c
 *		Checks on the arguments of outbox.enqueue() and outbox.claim().
 *
 * Everything a caller can get wrong is rejected here, before any row is
 * written, with an SQLSTATE of class 22 (data exception) so that clients
 * can tell bad input from a failing server.
 *
 * src/validate.c
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/jsonb.h"

#include "outbox.h"

/* Header names the relay sets itself; a user header may not take them. */
static const char *const reserved_headers[] = {"event_id", "biz_type",
											   "biz_key"};

static void check_length(const char *name, const char *value, int max_len);
static void check_header_name(const char *name, int len);

/*
 * outbox_topic_problem: NULL if topic is a legal Kafka topic name, else
 * the rule it breaks, worded to follow "A Kafka topic name".
 */
const char *
outbox_topic_problem(const char *topic)
{
	size_t len = strlen(topic);

	if (len == 0)
		return "must not be empty";
	if (len > OUTBOX_TOPIC_MAX_LEN)
		return "must be at most 249 characters long";
	if (strcmp(topic, ".") == 0 || strcmp(topic, "..") == 0)
		return "must not be \".\" or \"..\"";
	for (const char *c = topic; *c; c++)
	{
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
			  (*c >= '0' && *c <= '9') || *c == '.' || *c == '_' || *c == '-'))
			return "may contain only ASCII letters, digits, \".\", \"_\" and "
				   "\"-\"";
	}
	return NULL;
}

/*
 * outbox_topic_from_pattern: the topic for biz_type under a routing
 * pattern, each "{biz_type}" replaced by biz_type.  Palloc'd.
 */
char *
outbox_topic_from_pattern(const char *pattern, const char *biz_type)
{
	StringInfoData buf;
	const char *rest = pattern;
	const char *hit;
	size_t holder_len = strlen(OUTBOX_TOPIC_PLACEHOLDER);

	initStringInfo(&buf);
	while ((hit = strstr(rest, OUTBOX_TOPIC_PLACEHOLDER)) != NULL)
	{
		appendBinaryStringInfo(&buf, rest, hit - rest);
		appendStringInfoString(&buf, biz_type);
		rest = hit + holder_len;
	}
	appendStringInfoString(&buf, rest);
	return buf.data;
}

/*
 * outbox_check_key: reject an empty or oversized biz_type, biz_key or
 * msg_key.  NULL is checked by the caller, which knows the default.
 */
void
outbox_check_key(const char *name, const char *value)
{
	check_length(name, value, OUTBOX_KEY_MAX_LEN);
}

/*
 * outbox_check_consumer: reject an empty or oversized consumer name.
 */
void
outbox_check_consumer(const char *value)
{
	check_length("consumer", value, OUTBOX_CONSUMER_MAX_LEN);
}

/*
 * check_length: value, the argument called name, must have 1 to max_len
 * bytes.
 */
static void
check_length(const char *name, const char *value, int max_len)
{
	size_t len = strlen(value);

	if (len == 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("%s must not be empty", name)));
	if (len > (size_t) max_len)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", name),
				 errdetail("It has %zu bytes; the limit is %d.", len, max_len)));
}

/*
 * outbox_check_payload: reject a payload whose compact JSON text, the form
 * in which it is sent, exceeds outbox.max_payload_size.
 */
void
outbox_check_payload(Jsonb *payload)
{
	StringInfoData text;
	bool fits;

	initStringInfo(&text);
	fits = outbox_json_compact(&text, payload, outbox_max_payload_size);
	pfree(text.data);
	if (!fits)
		ereport(
			ERROR,
			(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
			 errmsg("payload is too large"),
			 errdetail(
				 "Its JSON text is longer than outbox.max_payload_size (%d bytes).",
				 outbox_max_payload_size),
			 errhint("Store large documents elsewhere and send a reference.")));
}

/*
 * outbox_check_headers: headers must be a flat JSON object whose values
 * are strings, since Kafka headers are name/value pairs.
 */
void
outbox_check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;

	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(
			ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("headers must be a JSON object"),
			 errdetail(
				 "Kafka headers are name/value pairs, as in {\"traceparent\": \"00-...\"}.")));

	if (JsonContainerSize(&headers->root) > OUTBOX_MAX_USER_HEADERS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("too many headers"),
				 errdetail("An event may carry at most %d headers of its own.",
						   OUTBOX_MAX_USER_HEADERS)));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			check_header_name(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && v.type != jbvString)
			ereport(
				ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header values must be JSON strings"),
				 errdetail(
					 "Kafka header values are text; encode numbers, objects and null as strings.")));
	}
}

/*
 * check_header_name: a header name must be non-empty and must not be one
 * of the names the relay adds to every message.
 */
static void
check_header_name(const char *name, int len)
{
	if (len == 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("header names must not be empty")));

	for (size_t i = 0; i < lengthof(reserved_headers); i++)
	{
		if ((size_t) len == strlen(reserved_headers[i]) &&
			pg_strncasecmp(name, reserved_headers[i], len) == 0)
			ereport(
				ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header name \"%.*s\" is reserved", len, name),
				 errdetail(
					 "The relay sets the headers event_id, biz_type and biz_key on every message.")));
	}
}
