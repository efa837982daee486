/*
 * batch.c
 *		What first sends and retries share: the transaction bracket, reading
 *		events into Kafka messages, sending a batch, the set of keys that
 *		must wait, and the backoff.
 *
 * Per-key order rests on one rule applied in both places: an event is held
 * back while an earlier event of its (topic, msg_key) waits for a retry.
 * Keys are compared by a 64-bit hash; a collision only holds an event back
 * one round longer than needed, it never lets one overtake.
 *
 * src/batch.c
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"

#include "outbox.h"
#include "relay.h"

static const char *const pending_keys_sql =
	"SELECT l.topic, l.msg_key"
	"  FROM outbox.event_state s JOIN outbox.event_log l"
	"    ON l.id OPERATOR(pg_catalog.=) s.id"
	" WHERE s.status OPERATOR(pg_catalog.=) 'new'";

static SPIPlanPtr pending_keys_plan = NULL;

/* The extension this relay serves, by its pg_extension OID. */
static Oid served_extension = InvalidOid;

/* What the current step is doing, as pg_stat_activity shows it. */
static const char *current_activity = "";

static void load_message(OutboxMessage *msg, HeapTuple row, TupleDesc desc);
static void add_user_headers(OutboxMessage *msg, Jsonb *headers);
static char *column_text(HeapTuple row, TupleDesc desc, int col);

/*
 * relay_begin: start a transaction for one step of relaying, the way
 * worker_spi brackets a unit of work.  False, with no transaction open, if
 * the extension is not installed or is being dropped: the lock is taken
 * conditionally, so the relay never makes DROP EXTENSION wait for it.
 *
 * False too, once, when the extension was dropped and created again since
 * the last step: a batch read from the old one must not be recorded in the
 * new one, whose cursor and event ids start afresh.  The caller drops what
 * it holds and the next round starts clean.
 */
bool
relay_begin(const char *activity)
{
	Oid ext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	current_activity = activity;
	ext = get_extension_oid("outbox", true);
	if (!OidIsValid(ext) || !ConditionalLockDatabaseObject(
								ExtensionRelationId, ext, 0, AccessShareLock))
	{
		CommitTransactionCommand();
		return false;
	}
	if (ext != served_extension)
	{
		bool recreated = OidIsValid(served_extension);

		served_extension = ext;
		if (recreated)
		{
			ereport(
				LOG,
				(errmsg("outbox relay: the extension was created again; the relay starts clean"),
				 errdetail(
					 "What it was sending from the dropped extension is not recorded in the new one.")));
			CommitTransactionCommand();
			return false;
		}
	}
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
	return true;
}

/*
 * relay_activity: what the current or latest step was doing.
 */
const char *
relay_activity(void)
{
	return current_activity;
}

/*
 * relay_commit: end the step's transaction.
 */
void
relay_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(true);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * relay_key_set: an empty set of key hashes, for this round only.
 */
HTAB *
relay_key_set(void)
{
	HASHCTL ctl;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(uint64);
	ctl.hcxt = relay_batch_context();
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
 * relay_key_remove: take hash out of keys.
 */
void
relay_key_remove(HTAB *keys, uint64 hash)
{
	(void) hash_search(keys, &hash, HASH_REMOVE, NULL);
}

/*
 * relay_key_hash: the hash that stands for (topic, key).
 */
uint64
relay_key_hash(const char *topic, const char *key)
{
	uint64 h =
		hash_bytes_extended((const unsigned char *) topic, strlen(topic), 0);

	return hash_combine64(
		h, hash_bytes_extended((const unsigned char *) key, strlen(key), 1));
}

/*
 * relay_pending_keys: the keys of the events waiting for a retry, which
 * hold back every later event of theirs.  Call inside relay_begin.
 */
HTAB *
relay_pending_keys(void)
{
	SPIPlanPtr plan =
		outbox_keep_plan(&pending_keys_plan, pending_keys_sql, 0, NULL, false);
	HTAB *keys;
	int rc = SPI_execute_plan(plan, NULL, NULL, true, 0);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox relay: pending keys query failed: %s",
			 SPI_result_code_string(rc));
	keys = relay_key_set();
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple row = SPI_tuptable->vals[i];
		TupleDesc desc = SPI_tuptable->tupdesc;

		relay_key_add(keys, relay_key_hash(column_text(row, desc, 1),
										   column_text(row, desc, 2)));
	}
	return keys;
}

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
	return settings;
}

/*
 * relay_batch_load: the first n rows of a batch query, read with settings,
 * as messages, in the current memory context (which must outlive
 * SPI_finish).
 */
RelayBatch *
relay_batch_load(SPITupleTable *rows, uint64 n, const RelaySettings *settings)
{
	RelayBatch *batch = palloc0(sizeof(RelayBatch));
	bool with_attempts = rows->tupdesc->natts >= BATCH_COL_ATTEMPTS;

	batch->count = (int) n;
	batch->settings = *settings;
	batch->msgs = palloc0(sizeof(OutboxMessage) * Max(n, 1));
	batch->key_hash = palloc0(sizeof(uint64) * Max(n, 1));
	batch->held = palloc0(sizeof(bool) * Max(n, 1));
	batch->attempts = palloc0(sizeof(int) * Max(n, 1));
	for (uint64 i = 0; i < n; i++)
	{
		bool isnull;

		load_message(&batch->msgs[i], rows->vals[i], rows->tupdesc);
		batch->key_hash[i] =
			relay_key_hash(batch->msgs[i].topic, batch->msgs[i].key);
		if (with_attempts)
			batch->attempts[i] = DatumGetInt32(SPI_getbinval(
				rows->vals[i], rows->tupdesc, BATCH_COL_ATTEMPTS, &isnull));
	}
	return batch;
}

/*
 * relay_batch_send: send every event of the batch whose key is not blocked,
 * in order, and wait until Kafka has answered for each.  An event refused
 * at once blocks its key for the rest of the batch.
 *
 * False if a reload ended the wait first.  Applying it is the loop's job,
 * and so is stopping the producer if it needs another: the caller records
 * what was answered, leaves the rest (relay_unanswered) to go again, and
 * ends the round.
 */
bool
relay_batch_send(RelayBatch *batch, HTAB *blocked)
{
	bool answered = true;

	for (int i = 0; i < batch->count; i++)
	{
		if (batch->held[i])
			continue;
		if (relay_key_has(blocked, batch->key_hash[i]))
		{
			batch->held[i] = true;
			continue;
		}
		if (!outbox_kafka_send(&batch->msgs[i]))
			relay_key_add(blocked, batch->key_hash[i]);
	}

	pgstat_report_activity(STATE_RUNNING, "waiting for Kafka acknowledgements");
	while (!outbox_kafka_wait(100))
	{
		CHECK_FOR_INTERRUPTS();
		outbox_status_broker(outbox_kafka_broker_state());
		if (strcmp(outbox_kafka_broker_state(), "down") == 0)
			outbox_status_state(RELAY_STATE_UNREACHABLE);
		relay_check_alert();
		/* New settings may fix an unreachable broker: let the loop see. */
		if (ConfigReloadPending)
		{
			answered = false;
			break;
		}
	}
	pgstat_report_activity(STATE_IDLE, NULL);
	return answered;
}

/*
 * relay_unanswered: whether event i of batch was sent and Kafka has not
 * answered for it (the wait was cut short): neither delivered nor failed.
 */
bool
relay_unanswered(const RelayBatch *batch, int i)
{
	return !batch->held[i] && !batch->msgs[i].done;
}

/*
 * relay_backoff_ms: how long to wait before the next try after the given
 * number of failed ones, within [backoff_min, backoff_max]: the n-th wait
 * is drawn from [c/2, c], c = backoff_min * 2^n capped at backoff_max, so
 * that failures do not retry in step, the first ones included.
 */
int
relay_backoff_ms(const RelaySettings *settings, int attempts)
{
	double ceiling = settings->backoff_min;
	double floor;

	for (int i = 0; i < attempts && ceiling < settings->backoff_max; i++)
		ceiling *= 2;
	ceiling = Min(ceiling, (double) settings->backoff_max);
	floor = Max(ceiling / 2, (double) settings->backoff_min);
	if (floor >= ceiling)
		return (int) floor;
	return (int) (floor +
				  (ceiling - floor) * pg_prng_double(&pg_global_prng_state));
}

/*
 * load_message: one batch row as a message: key, compact JSON value and
 * the headers consumers rely on.
 */
static void
load_message(OutboxMessage *msg, HeapTuple row, TupleDesc desc)
{
	bool isnull;
	StringInfoData value;
	Datum headers;

	msg->event_id =
		DatumGetInt64(SPI_getbinval(row, desc, BATCH_COL_ID, &isnull));
	msg->topic = column_text(row, desc, BATCH_COL_TOPIC);
	msg->key = column_text(row, desc, BATCH_COL_MSG_KEY);
	msg->key_len = strlen(msg->key);

	initStringInfo(&value);
	(void) outbox_json_compact(
		&value,
		DatumGetJsonbP(SPI_getbinval(row, desc, BATCH_COL_PAYLOAD, &isnull)),
		-1);
	msg->value = value.data;
	msg->value_len = value.len;

	msg->header_names[0] = "event_id";
	msg->header_values[0] = psprintf(INT64_FORMAT, msg->event_id);
	msg->header_names[1] = "biz_type";
	msg->header_values[1] = column_text(row, desc, BATCH_COL_BIZ_TYPE);
	msg->header_names[2] = "biz_key";
	msg->header_values[2] = column_text(row, desc, BATCH_COL_BIZ_KEY);
	msg->nheaders = 3;
	headers = SPI_getbinval(row, desc, BATCH_COL_HEADERS, &isnull);
	if (!isnull)
		add_user_headers(msg, DatumGetJsonbP(headers));
}

/*
 * add_user_headers: append the event's own headers (a flat object of
 * strings, as enqueue checked).
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
		if (tok == WJB_KEY)
			msg->header_names[msg->nheaders] =
				pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && v.type == jbvString)
			msg->header_values[msg->nheaders++] =
				pnstrdup(v.val.string.val, v.val.string.len);
	}
}

/*
 * column_text: a non-null text column as a C string.
 */
static char *
column_text(HeapTuple row, TupleDesc desc, int col)
{
	bool isnull;
	Datum d = SPI_getbinval(row, desc, col, &isnull);

	return isnull ? pstrdup("") : TextDatumGetCString(d);
}
