/*
 * batch.c
 *		A batch: events read in one go, as Kafka messages, with the settings
 *		they were read with; sending one; the sets of keys that must wait.
 *
 * A message's value, key and headers are made just before it is sent and
 * freed right after: librdkafka copies them, so a batch holds only a few
 * dozen bytes per event however large the payloads, and what the relay
 * holds of payloads is what outbox.max_in_flight_size lets librdkafka hold.
 *
 * Per-key order rests on one rule applied by first sends and retries
 * alike: an event is held back while an earlier event of its (topic,
 * msg_key) waits.  Keys are compared by a 64-bit hash; a collision only
 * holds an event back longer than needed, it never lets one overtake.
 *
 * src/batch.c
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/xid8.h"

#include "outbox.h"
#include "relay.h"

static void make_message(OutboxMessage *msg, const BatchRow *row);
static const char *event_source(int64 incarnation);
static void make_value(OutboxMessage *msg, const BatchRow *row, bool debezium);
static void add_user_headers(OutboxMessage *msg, Jsonb *headers);
static bool is_relay_header(const OutboxMessage *msg, const char *name, int len);
static char *column_text(const BatchRow *row, int col);

/*
 * relay_settings_now: the current values of the settings a batch is
 * judged by; take them before reading the batch.
 */
RelaySettings
relay_settings_now(void)
{
	RelaySettings settings;

	settings.batch_size = outbox_batch_size;
	settings.max_attempts = outbox_max_attempts;
	settings.backoff_min = outbox_backoff_min;
	settings.backoff_max = outbox_backoff_max;
	settings.missing_topic_dead = outbox_missing_topic_dead;
	settings.max_in_flight_events = outbox_max_in_flight_events;
	settings.max_in_flight_size = outbox_max_in_flight_size;
	return settings;
}

/*
 * relay_batch_new: an empty batch of at most capacity events, in memory
 * of its own.
 */
RelayBatch *
relay_batch_new(bool retry, const RelaySettings *settings, int capacity)
{
	MemoryContext memory = AllocSetContextCreate(
		TopMemoryContext, "outbox relay batch", ALLOCSET_DEFAULT_SIZES);
	RelayBatch *batch = MemoryContextAllocZero(memory, sizeof(RelayBatch));
	int n = Max(capacity, 1);

	batch->memory = memory;
	batch->retry = retry;
	batch->settings = *settings;
	batch->capacity = capacity;
	/*
	 * Not zeroed: relay_batch_add sets each entry it uses.  Most batches
	 * are a few events while the relay keeps up, and zeroing batch_size
	 * entries for each read once cost more than the read; pages never
	 * touched cost nothing.  The array never moves: librdkafka's delivery
	 * reports point into msgs.
	 */
	batch->msgs = MemoryContextAlloc(memory, sizeof(OutboxMessage) * n);
	batch->fate = MemoryContextAlloc(memory, sizeof(MsgFate) * n);
	batch->key_hash = MemoryContextAlloc(memory, sizeof(uint64) * n);
	batch->tx = MemoryContextAlloc(memory, sizeof(uint64) * n);
	batch->attempts = MemoryContextAlloc(memory, sizeof(int) * n);
	batch->due = MemoryContextAlloc(memory, sizeof(bool) * n);
	batch->sent_at = GetCurrentTimestamp();
	return batch;
}

/*
 * relay_batch_free: let go of a batch Kafka has answered for.
 */
void
relay_batch_free(RelayBatch *batch)
{
	MemoryContextDelete(batch->memory);
}

/*
 * relay_batch_row: take a batch query's row apart, into out.
 */
void
relay_batch_row(BatchRow *out, HeapTuple row, TupleDesc desc)
{
	if (desc->natts > BATCH_MAX_COLS)
		elog(ERROR, "outbox relay: a batch query returned %d columns",
			 desc->natts);
	heap_deform_tuple(row, desc, out->values, out->nulls);
}

/*
 * relay_batch_add: note one batch row (id, topic, key and the batch's own
 * column) as the batch's next event, not sent yet; returns its index.
 */
int
relay_batch_add(RelayBatch *batch, const BatchRow *row)
{
	int i = batch->count;
	OutboxMessage *msg = &batch->msgs[i];
	MemoryContext old = MemoryContextSwitchTo(batch->memory);
	char *key;

	Assert(i < batch->capacity);
	MemSet(msg, 0, sizeof(OutboxMessage));
	batch->attempts[i] = 0;
	batch->tx[i] = 0;
	batch->due[i] = false;
	msg->event_id = DatumGetInt64(row->values[BATCH_COL_ID - 1]);
	msg->topic = column_text(row, BATCH_COL_TOPIC);
	key = column_text(row, BATCH_COL_MSG_KEY);
	batch->key_hash[i] = relay_key_hash(msg->topic, key);
	pfree(key);
	if (batch->retry)
		batch->attempts[i] = DatumGetInt32(row->values[BATCH_COL_ATTEMPTS - 1]);
	else
		batch->tx[i] =
			DatumGetFullTransactionId(row->values[BATCH_COL_TX - 1]).value;
	batch->fate[i] = FATE_IN_BATCH;
	batch->count++;
	MemoryContextSwitchTo(old);
	return i;
}

/*
 * relay_batch_send: send event i of the batch, made from its row.  False if
 * librdkafka's queue is full: the event was not sent, and the caller
 * takes it out of the batch.  A refusal at once is an answer like any.
 */
bool
relay_batch_send(RelayBatch *batch, int i, const BatchRow *row)
{
	MemoryContext old;
	OutboxMessage *msg = &batch->msgs[i];
	KafkaSendResult result;

	if (batch->scratch == NULL)
		batch->scratch = AllocSetContextCreate(batch->memory, "outbox message",
											   ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(batch->scratch);
	make_message(msg, row);
	/* An event enqueue let through before outbox.progress_topic changed. */
	if (outbox_is_progress_topic(msg->topic, strlen(msg->topic)))
		result = outbox_kafka_refuse(
			msg,
			"the topic is the relay's progress topic, which takes no events");
	else
		result = outbox_kafka_send(msg);
	/* librdkafka has its copies: keep only what the report needs. */
	msg->key = msg->value = NULL;
	msg->nheaders = 0;
	MemoryContextSwitchTo(old);
	MemoryContextReset(batch->scratch);
	return result != KAFKA_FULL;
}

/*
 * relay_batch_answered: whether Kafka answered for event i of the batch,
 * or it was never sent.
 */
bool
relay_batch_answered(const RelayBatch *batch, int i)
{
	return !batch->msgs[i].queued || batch->msgs[i].done;
}

/*
 * relay_batch_first_waiting: the seq (kafka.h) of the batch's first event
 * sent and not answered yet, the oldest of its unanswered; 0 if none.
 */
uint64
relay_batch_first_waiting(const RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		if (!relay_batch_answered(batch, i))
			return batch->msgs[i].seq;
	}
	return 0;
}

/*
 * relay_batch_all_answered: whether Kafka answered for every event sent.
 */
bool
relay_batch_all_answered(const RelayBatch *batch)
{
	for (int i = batch->count - 1; i >= 0; i--)
	{
		if (!relay_batch_answered(batch, i))
			return false;
	}
	return true;
}

/*
 * relay_key_set: an empty set of key hashes, in memory.
 */
HTAB *
relay_key_set(MemoryContext memory)
{
	HASHCTL ctl;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(uint64);
	ctl.hcxt = memory;
	return hash_create("outbox keys", 64, &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * relay_key_add: put hash into keys.
 */
void
relay_key_add(HTAB *keys, uint64 hash)
{
	(void) hash_search(keys, &hash, HASH_ENTER, NULL);
}

/*
 * relay_key_has: whether hash is in keys.
 */
bool
relay_key_has(HTAB *keys, uint64 hash)
{
	bool found;

	(void) hash_search(keys, &hash, HASH_FIND, &found);
	return found;
}

/*
 * relay_key_hash: the hash that stands for (topic, key).
 */
uint64
relay_key_hash(const char *topic, const char *key)
{
	return hash_combine64(
		relay_topic_hash(topic),
		hash_bytes_extended((const unsigned char *) key, strlen(key), 1));
}

/*
 * relay_topic_hash: the hash that stands for a topic.
 */
uint64
relay_topic_hash(const char *topic)
{
	return hash_bytes_extended((const unsigned char *) topic, strlen(topic), 0);
}

/*
 * make_message: the rest of the message from its row, in the current
 * memory: key, value and the headers consumers rely on, shaped as
 * outbox.message_format says.
 */
static void
make_message(OutboxMessage *msg, const BatchRow *row)
{
	bool debezium = outbox_message_format == OUTBOX_FORMAT_DEBEZIUM;
	char *event_id = palloc(MAXINT8LEN + 1);

	msg->key = column_text(row, BATCH_COL_MSG_KEY);
	msg->key_len = strlen(msg->key);
	make_value(msg, row, debezium);

	/*
	 * Debezium's event router names the event id "id" and, as its usual
	 * table.fields.additional.placement puts it, the type "type".  biz_key
	 * and outbox_source stay: outbox.claim dedupes by them.
	 */
	(void) pg_lltoa(msg->event_id, event_id);
	msg->header_names[0] = debezium ? "id" : "event_id";
	msg->header_values[0] = event_id;
	msg->header_names[1] = debezium ? "type" : "biz_type";
	msg->header_values[1] = column_text(row, BATCH_COL_BIZ_TYPE);
	msg->header_names[2] = "biz_key";
	msg->header_values[2] = column_text(row, BATCH_COL_BIZ_KEY);
	msg->header_names[3] = "outbox_source";
	msg->header_values[3] =
		event_source(DatumGetInt64(row->values[BATCH_COL_INCARNATION - 1]));
	msg->nheaders = OUTBOX_RELAY_HEADERS;
	if (!row->nulls[BATCH_COL_HEADERS - 1])
		add_user_headers(msg,
						 DatumGetJsonbP(row->values[BATCH_COL_HEADERS - 1]));
}

/*
 * event_source: the outbox_source header of an event of incarnation
 * (incarnation.c): the database's source, and the incarnation in 16 hex
 * digits after a slash; the source alone for an event stored before
 * 0.3.0 (0), as it was sent then.
 */
static const char *
event_source(int64 incarnation)
{
	if (incarnation == 0)
		return relay_source();
	return psprintf("%s/%016llx", relay_source(),
					(unsigned long long) incarnation);
}

/*
 * make_value: the message's value: the bytes enqueue_bytes took, or the
 * payload as compact JSON, or for Debezium's shape as jsonb's own text
 * (the text logical decoding hands Debezium, which its string converter
 * sends as is).
 */
static void
make_value(OutboxMessage *msg, const BatchRow *row, bool debezium)
{
	StringInfoData value;
	Jsonb *payload;

	if (row->nulls[BATCH_COL_PAYLOAD - 1])
	{
		bytea *bytes = DatumGetByteaPP(row->values[BATCH_COL_PAYLOAD_BYTES - 1]);

		msg->value = VARDATA_ANY(bytes);
		msg->value_len = VARSIZE_ANY_EXHDR(bytes);
		return;
	}
	payload = DatumGetJsonbP(row->values[BATCH_COL_PAYLOAD - 1]);
	initStringInfo(&value);
	if (debezium)
		(void) JsonbToCString(&value, &payload->root, VARSIZE(payload));
	else
		(void) outbox_json_compact(&value, payload, -1);
	msg->value = value.data;
	msg->value_len = value.len;
}

/*
 * add_user_headers: append the event's own headers (a flat object of
 * strings, as enqueue checked).  One named as a header the relay set is
 * left out: outbox_source enqueued before the name was the relay's, or id
 * and type in Debezium's shape, where a consumer taking the last "id"
 * would take the event's own.
 */
static void
add_user_headers(OutboxMessage *msg, Jsonb *headers)
{
	JsonbIterator *it = JsonbIteratorInit(&headers->root);
	JsonbIteratorToken tok;
	JsonbValue v;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (msg->nheaders >= OUTBOX_MAX_HEADERS)
			break;
		if (tok == WJB_KEY &&
			is_relay_header(msg, v.val.string.val, v.val.string.len))
		{
			(void) JsonbIteratorNext(&it, &v, true);
			continue;
		}
		if (tok == WJB_KEY)
			msg->header_names[msg->nheaders] =
				pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && v.type == jbvString)
			msg->header_values[msg->nheaders++] =
				pnstrdup(v.val.string.val, v.val.string.len);
	}
}

/*
 * is_relay_header: whether name (len bytes) is, case aside, the name of a
 * header the relay set on msg.
 */
static bool
is_relay_header(const OutboxMessage *msg, const char *name, int len)
{
	for (int i = 0; i < OUTBOX_RELAY_HEADERS; i++)
	{
		if ((size_t) len == strlen(msg->header_names[i]) &&
			pg_strncasecmp(name, msg->header_names[i], len) == 0)
			return true;
	}
	return false;
}

/*
 * column_text: a non-null text column as a C string.
 */
static char *
column_text(const BatchRow *row, int col)
{
	return row->nulls[col - 1] ? pstrdup("")
							   : TextDatumGetCString(row->values[col - 1]);
}
