/*
 * validate.c
 *		Checks on the arguments of outbox.enqueue() and outbox.claim().
 *
 * Everything a caller can get wrong is rejected here, before any row is
 * written, with an SQLSTATE of class 22 (data exception) so that clients
 * can tell bad input from a failing server; a topic or consumer name the
 * caller's role is not allowed gets 42501.  The checks work on the text
 * arguments in place: enqueue runs once per event and every copy counts.
 *
 * src/validate.c
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/jsonb.h"

#include "compat.h"
#include "outbox.h"

/* Header names the relay sets itself; a user header may not take them. */
static const char *const reserved_headers[] = {"event_id", "biz_type",
											   "biz_key", "outbox_source"};

/*
 * What librdkafka counts of a message against its message.max.bytes
 * (rd_kafka_msg_max_wire_size): at most RECORD_FRAMING bytes of record
 * framing (length, attributes, timestamp and offset deltas, key and value
 * lengths, header count, as varints at their largest), the key, the
 * value, and each header's name and value with their lengths as varints.
 * enqueue counts the same, the relay's own headers included, so that what
 * it accepts the relay's producer sends.
 */
#define RECORD_FRAMING 36
#define EVENT_ID_MAX_DIGITS 19 /* a positive bigint */
#define SOURCE_LEN 53          /* a uuid as text, "/", 16 hex digits */

static size_t varint_size(size_t len);
static void check_text_size(Jsonb *payload, int key_len, size_t header_len,
							int64 budget);

/*
 * An entry of outbox.allowed_topics or outbox.allowed_consumers: a name,
 * or with a trailing "*" a prefix.
 */
typedef struct OutboxNamePattern
{
	const char *name; /* not NUL-terminated */
	int len;
	bool prefix;
} OutboxNamePattern;

/* A parsed list: one block, as GUC "extra" data must be (compat.h). */
struct OutboxNameList
{
	int count;
	OutboxNamePattern items[FLEXIBLE_ARRAY_MEMBER];
};

/* Most bytes of an invalid topic name an error message shows. */
#define TOPIC_SHOWN_MAX_LEN 255

static int check_length(const char *name, text *value, int max_len);
static void check_header_value(JsonbValue *value);
static void check_header_name(const char *name, int len);
static bool topic_char(char c);
static void check_not_progress(const char *topic, size_t len);
static const char *parse_name_pattern(const char *entry, size_t len,
									  bool topics, OutboxNamePattern *item);

/*
 * outbox_topic_problem: NULL if the len bytes at topic are a legal Kafka
 * topic name that a producer may write to, else the rule it breaks, worded
 * to follow "A Kafka topic name".
 */
const char *
outbox_topic_problem(const char *topic, size_t len)
{
	if (len == 0)
		return "must not be empty";
	if (len > OUTBOX_TOPIC_MAX_LEN)
		return "must be at most 249 characters long";
	if ((len == 1 && topic[0] == '.') ||
		(len == 2 && topic[0] == '.' && topic[1] == '.'))
		return "must not be \".\" or \"..\"";
	for (size_t i = 0; i < len; i++)
	{
		if (!topic_char(topic[i]))
			return "may contain only ASCII letters, digits, \".\", \"_\" and "
				   "\"-\"";
	}
	/* Kafka's own topics (__consumer_offsets...); never the outbox's. */
	if (len >= 2 && topic[0] == '_' && topic[1] == '_')
		return "must not start with \"__\", which Kafka keeps for its "
			   "internal topics";
	return NULL;
}

/*
 * topic_char: whether c may appear in a Kafka topic name.
 */
static bool
topic_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		   (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

/*
 * outbox_check_topic: reject a topic that is no legal Kafka topic name;
 * from_default says it came from outbox.default_topic.
 */
void
outbox_check_topic(const char *topic, size_t len, bool from_default)
{
	const char *problem = outbox_topic_problem(topic, len);
	int shown;

	if (problem == NULL)
	{
		check_not_progress(topic, len);
		return;
	}
	/* A name far too long is shown in part: it may be megabytes. */
	shown = pg_mbcliplen(topic, len, TOPIC_SHOWN_MAX_LEN);
	ereport(
		ERROR,
		(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
		 errmsg("invalid Kafka topic name \"%.*s%s\"", shown, topic,
				(size_t) shown < len ? "..." : ""),
		 errdetail("A Kafka topic name %s.", problem),
		 from_default
			 ? errhint("The topic came from outbox.default_topic; pass topic explicitly.")
			 : 0));
}

/*
 * check_not_progress: reject the relay's progress topic: only the relay
 * writes there, and a record an application put there under another
 * relay's key would be read back as that relay's progress (the relay
 * takes none without its proof, but no application needs the topic).
 */
static void
check_not_progress(const char *topic, size_t len)
{
	if (!outbox_is_progress_topic(topic, len))
		return;
	ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					errmsg("topic \"%s\" is the relay's progress topic",
						   outbox_progress_topic),
					errdetail("Only the relay writes to outbox.progress_topic."),
					errhint("Send the event to another topic.")));
}

/*
 * outbox_is_progress_topic: whether the len bytes at topic name the
 * relay's progress topic (outbox.progress_topic).
 */
bool
outbox_is_progress_topic(const char *topic, size_t len)
{
	return outbox_progress_topic != NULL &&
		   strlen(outbox_progress_topic) == len &&
		   memcmp(topic, outbox_progress_topic, len) == 0;
}

/*
 * outbox_topic_from_pattern: the topic for biz_type (type_len bytes) under
 * a routing pattern, each "{biz_type}" replaced by biz_type.  Palloc'd,
 * its length in *len.
 */
char *
outbox_topic_from_pattern(const char *pattern, const char *biz_type,
						  int type_len, size_t *len)
{
	StringInfoData buf;
	const char *rest = pattern;
	const char *hit;
	size_t holder_len = strlen(OUTBOX_TOPIC_PLACEHOLDER);

	initStringInfo(&buf);
	while ((hit = strstr(rest, OUTBOX_TOPIC_PLACEHOLDER)) != NULL)
	{
		appendBinaryStringInfo(&buf, rest, hit - rest);
		appendBinaryStringInfo(&buf, biz_type, type_len);
		rest = hit + holder_len;
	}
	appendStringInfoString(&buf, rest);
	*len = buf.len;
	return buf.data;
}

/*
 * outbox_check_key: reject an empty or oversized biz_type, biz_key or
 * msg_key; its length in bytes.  NULL is checked by the caller, which
 * knows the default.
 */
int
outbox_check_key(const char *name, text *value)
{
	return check_length(name, value, OUTBOX_KEY_MAX_LEN);
}

/*
 * outbox_check_consumer: reject an empty or oversized consumer name; its
 * length in bytes.
 */
int
outbox_check_consumer(text *value)
{
	return check_length("consumer", value, OUTBOX_CONSUMER_MAX_LEN);
}

/*
 * outbox_check_source: reject an empty or oversized claim source (an
 * outbox_source header is a uuid); its length in bytes.
 */
int
outbox_check_source(text *value)
{
	return check_length("source", value, OUTBOX_SOURCE_MAX_LEN);
}

/*
 * check_length: value, the argument called name, must have 1 to max_len
 * bytes; returns how many it has.
 */
static int
check_length(const char *name, text *value, int max_len)
{
	int len = VARSIZE_ANY_EXHDR(value);

	if (len == 0)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("%s must not be empty", name)));
	if (len > max_len)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", name),
				 errdetail("It has %d bytes; the limit is %d.", len, max_len)));
	return len;
}

/*
 * value_budget: what outbox.max_payload_size leaves for the message value
 * once the message key (key_len bytes) and the headers with the record's
 * framing (header_len bytes, as librdkafka counts them: see
 * RECORD_FRAMING) are counted; an error if nothing is left.
 */
static int64
value_budget(int key_len, size_t header_len)
{
	int64 budget =
		(int64) outbox_max_payload_size - key_len - (int64) header_len;

	if (budget < 0)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("event is too large"),
				 errdetail("Its message key (%d bytes) and headers with their "
						   "framing (%zu bytes, the relay's own included) alone "
						   "exceed outbox.max_payload_size (%d bytes).",
						   key_len, header_len, outbox_max_payload_size),
				 errhint("Send large values in the payload of another event, or "
						 "a reference to them.")));
	return budget;
}

/*
 * outbox_check_size: reject an event whose Kafka message would exceed
 * outbox.max_payload_size, its value being the payload as compact JSON,
 * or as jsonb's text in the shape outbox.message_format = debezium sends.
 */
void
outbox_check_size(Jsonb *payload, int key_len, size_t header_len)
{
	int64 budget = value_budget(key_len, header_len);
	size_t value_len = 0;

	if (outbox_message_format == OUTBOX_FORMAT_DEBEZIUM)
	{
		check_text_size(payload, key_len, header_len, budget);
		return;
	}
	if (outbox_json_compact_size(payload, budget, &value_len))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
			 errmsg("event is too large"),
			 errdetail("Its payload as compact JSON text (at least %zu bytes), "
					   "message key (%d bytes) and headers with their framing "
					   "(%zu bytes, the relay's own included) exceed "
					   "outbox.max_payload_size (%d bytes).",
					   value_len, key_len, header_len, outbox_max_payload_size),
			 errhint("Store large documents elsewhere and send a reference.")));
}

/*
 * check_text_size: outbox_check_size's check of a payload sent as jsonb's
 * text, which has a space after each colon and comma.
 */
static void
check_text_size(Jsonb *payload, int key_len, size_t header_len, int64 budget)
{
	StringInfoData text;

	initStringInfo(&text);
	(void) JsonbToCString(&text, &payload->root, VARSIZE(payload));
	pfree(text.data);
	if ((int64) text.len <= budget)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
			 errmsg("event is too large"),
			 errdetail("Its payload as jsonb's text (%d bytes, the value "
					   "outbox.message_format = debezium sends), message key "
					   "(%d bytes) and headers with their framing (%zu bytes, "
					   "the relay's own included) exceed "
					   "outbox.max_payload_size (%d bytes).",
					   text.len, key_len, header_len, outbox_max_payload_size),
			 errhint("Store large documents elsewhere and send a reference.")));
}

/*
 * outbox_check_bytes_size: the same for a value of value_len bytes.
 */
void
outbox_check_bytes_size(size_t value_len, int key_len, size_t header_len)
{
	if ((int64) value_len <= value_budget(key_len, header_len))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
			 errmsg("event is too large"),
			 errdetail("Its payload (%zu bytes), message key (%d bytes) and "
					   "headers with their framing (%zu bytes, the relay's own "
					   "included) exceed outbox.max_payload_size (%d bytes).",
					   value_len, key_len, header_len, outbox_max_payload_size),
			 errhint("Store large documents elsewhere and send a reference.")));
}

/*
 * outbox_check_headers: headers must be a flat JSON object whose values
 * are strings, since Kafka headers are name/value pairs.  Returns the
 * bytes of their names and values.
 */
size_t
outbox_check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;
	size_t bytes = 0;

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
		else if (tok == WJB_VALUE)
			check_header_value(&v);
		if (tok == WJB_KEY || tok == WJB_VALUE)
			bytes += v.val.string.len + varint_size(v.val.string.len);
	}
	return bytes;
}

/*
 * outbox_relay_headers_size: the bytes librdkafka counts for the record
 * framing and the headers the relay adds to every message (event_id,
 * biz_type, biz_key, outbox_source), beside an event's own.
 */
size_t
outbox_relay_headers_size(int type_len, int biz_key_len)
{
	return RECORD_FRAMING + strlen("event_id") + EVENT_ID_MAX_DIGITS +
		   varint_size(strlen("event_id")) + varint_size(EVENT_ID_MAX_DIGITS) +
		   strlen("biz_type") + type_len + varint_size(strlen("biz_type")) +
		   varint_size(type_len) + strlen("biz_key") + biz_key_len +
		   varint_size(strlen("biz_key")) + varint_size(biz_key_len) +
		   strlen("outbox_source") + SOURCE_LEN +
		   varint_size(strlen("outbox_source")) + varint_size(SOURCE_LEN);
}

/*
 * varint_size: the bytes of a length as a Kafka record writes it (a
 * zig-zag varint: seven bits a byte, of twice the length).
 */
static size_t
varint_size(size_t len)
{
	uint64 zigzag = (uint64) len << 1;
	size_t bytes = 1;

	while (zigzag >= 0x80)
	{
		zigzag >>= 7;
		bytes++;
	}
	return bytes;
}

/*
 * check_header_value: a header value must be a string.
 */
static void
check_header_value(JsonbValue *value)
{
	if (value->type != jbvString)
		ereport(
			ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("header values must be JSON strings"),
			 errdetail(
				 "Kafka header values are text; encode numbers, objects and null as strings.")));
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
					 "The relay sets the headers event_id, biz_type, biz_key and outbox_source on every message.")));
	}
}

/*
 * outbox_name_list_parse: parse a comma-separated list of names, each with
 * an optional trailing "*"; for topics the names must be made of topic
 * characters.  Returns a list from outbox_guc_malloc (NULL for an empty
 * value: no restriction) and *problem NULL, or on a syntax error NULL and
 * *problem saying what is wrong.
 */
OutboxNameList *
outbox_name_list_parse(const char *value, bool topics, const char **problem)
{
	int most = 1;
	size_t value_len = strlen(value);
	OutboxNameList *list;
	char *copy;
	char *entry;

	*problem = NULL;
	if (strspn(value, " \t\r\n") == value_len)
		return NULL;
	for (const char *c = value; *c; c++)
		most += (*c == ',');
	list = outbox_guc_malloc(offsetof(OutboxNameList, items) +
							 most * sizeof(OutboxNamePattern) + value_len + 1);
	if (list == NULL)
	{
		*problem = "Out of memory.";
		return NULL;
	}
	copy = (char *) &list->items[most];
	memcpy(copy, value, value_len + 1);
	list->count = 0;
	for (entry = copy; entry != NULL && *problem == NULL;)
	{
		char *comma = strchr(entry, ',');
		size_t len = comma ? (size_t) (comma - entry) : strlen(entry);

		*problem =
			parse_name_pattern(entry, len, topics, &list->items[list->count++]);
		entry = comma ? comma + 1 : NULL;
	}
	if (*problem == NULL)
		return list;
	outbox_guc_free(list);
	return NULL;
}

/*
 * parse_name_pattern: one entry of a name list, len bytes at entry,
 * trimmed of blanks, into *item; NULL, or what is wrong with it.
 */
static const char *
parse_name_pattern(const char *entry, size_t len, bool topics,
				   OutboxNamePattern *item)
{
	size_t max_len = topics ? OUTBOX_TOPIC_MAX_LEN : OUTBOX_CONSUMER_MAX_LEN;

	while (len > 0 && strchr(" \t\r\n", entry[0]) != NULL)
		entry++, len--;
	while (len > 0 && strchr(" \t\r\n", entry[len - 1]) != NULL)
		len--;
	item->prefix = len > 0 && entry[len - 1] == '*';
	item->name = entry;
	item->len = (int) len - (item->prefix ? 1 : 0);
	if (len == 0)
		return "An entry is empty.";
	if (item->len > (int) max_len)
		return topics ? "A topic name has at most 249 characters."
					  : "A consumer name has at most 256 bytes.";
	for (int i = 0; i < item->len; i++)
	{
		if (entry[i] == '*')
			return "\"*\" may only end an entry, as a prefix wildcard.";
		if (topics && !topic_char(entry[i]))
			return "A topic name may contain only ASCII letters, digits, "
				   "\".\", \"_\" and \"-\".";
	}
	return NULL;
}

/*
 * outbox_name_allowed: whether the len bytes at name match an entry of
 * list; a NULL list allows every name.
 */
bool
outbox_name_allowed(const OutboxNameList *list, const char *name, size_t len)
{
	if (list == NULL)
		return true;
	for (int i = 0; i < list->count; i++)
	{
		const OutboxNamePattern *item = &list->items[i];

		if ((item->prefix ? len >= (size_t) item->len
						  : len == (size_t) item->len) &&
			memcmp(name, item->name, item->len) == 0)
			return true;
	}
	return false;
}

/*
 * outbox_check_allowed_topic: refuse a topic outside the caller's
 * outbox.allowed_topics.
 */
void
outbox_check_allowed_topic(const char *topic, size_t len)
{
	if (outbox_name_allowed(outbox_allowed_topic_list, topic, len))
		return;
	ereport(
		ERROR,
		(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
		 errmsg("permission denied for topic \"%.*s\"", (int) len, topic),
		 errhint(
			 "The topics this session may enqueue to are set by outbox.allowed_topics.")));
}

/*
 * outbox_check_allowed_consumer: refuse a consumer name outside the
 * caller's outbox.allowed_consumers.
 */
void
outbox_check_allowed_consumer(text *consumer)
{
	const char *name = VARDATA_ANY(consumer);
	int len = VARSIZE_ANY_EXHDR(consumer);

	if (outbox_name_allowed(outbox_allowed_consumer_list, name, len))
		return;
	ereport(
		ERROR,
		(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
		 errmsg("permission denied for consumer \"%.*s\"", len, name),
		 errhint(
			 "The consumer names this session may claim under are set by outbox.allowed_consumers.")));
}
