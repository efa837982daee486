/*
 * retry.c
 *		Events that failed: their retries, backoff and death.
 *
 * A failed event gets a row in outbox.event_state and is tried again after
 * an exponential, jittered backoff.  After outbox.max_attempts failures of
 * its own (the broker refused it) it becomes dead; failures for the
 * broker's sake (timeouts, broker unreachable) are counted and shown but
 * never make an event dead, so an outage, however long, loses nothing.
 * An event that failed before is tried alone for its key: the later events
 * of the key wait behind it, which keeps per-key order across retries, and
 * once it is delivered the due ones behind it go out together in the same
 * round (with the same caveat as first sends if one of them is refused).
 *
 * src/retry.c
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "relay.h"

#define RETRY_COL_DUE 9

/*
 * Run as a superuser: schema-qualified functions and operators, and the
 * times computed here and passed typed, so that no expression resolves to
 * an object a database owner could create (such as an operator
 * *(integer, interval) in public, which pg_catalog lacks).
 */
static const char *const waiting_sql =
	"SELECT s.id, l.topic, l.msg_key, l.payload, l.headers, l.biz_type,"
	"       l.biz_key, s.attempts,"
	"       s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
	"  FROM outbox.event_state s JOIN outbox.event_log l"
	"    ON l.id OPERATOR(pg_catalog.=) s.id"
	" WHERE s.status OPERATOR(pg_catalog.=) 'new'"
	" ORDER BY s.id LIMIT $1";

static const char *const set_state_sql =
	"INSERT INTO outbox.event_state AS s"
	"  (id, status, attempts, next_attempt_at, last_error, updated_at)"
	" VALUES ($1, $2, $3, $4, $5, $6)"
	" ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status,"
	"  attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,"
	"  last_error = COALESCE(EXCLUDED.last_error, s.last_error),"
	"  updated_at = EXCLUDED.updated_at";

static SPIPlanPtr waiting_plan = NULL;
static SPIPlanPtr set_state_plan = NULL;

static RelayBatch *read_due(bool **due);
static RelayOutcome send_and_record(RelayBatch *batch, int *delivered);
static int release_followers(RelayBatch *batch, const bool *due);
static void record_retries(RelayBatch *batch);

/*
 * relay_retries: send the events whose retry is due (one that failed
 * before alone for its key) and record what became of them; then, in the
 * same round, the due events that waited behind a retry just delivered.
 */
RelayOutcome
relay_retries(void)
{
	RelayBatch *batch;
	bool *due;
	int delivered;
	int followers = 0;
	RelayOutcome outcome;

	if (!relay_begin(
			"reading due retries from outbox.event_state and outbox.event_log"))
		return RELAY_IDLE;
	batch = read_due(&due);
	relay_commit();

	outcome = send_and_record(batch, &delivered);
	if (outcome == RELAY_SENT && delivered > 0 &&
		release_followers(batch, due) > 0)
	{
		outcome = send_and_record(batch, &followers);
		delivered += followers;
	}
	if (outcome != RELAY_SENT)
		return outcome;
	/* A full batch that moved most of what it read: read on at once. */
	if (batch->count >= batch->settings.batch_size &&
		delivered * 2 >= batch->count)
		return RELAY_MORE;
	return RELAY_SENT;
}

/*
 * send_and_record: send the events of batch not held and record their
 * fate; *delivered counts the ones Kafka acknowledged.  A wait cut short
 * by a reload ends the round: the events not answered stay as they were.
 */
static RelayOutcome
send_and_record(RelayBatch *batch, int *delivered)
{
	int sent = 0;
	int transient = 0;
	bool answered;

	*delivered = 0;
	for (int i = 0; i < batch->count; i++)
		sent += batch->held[i] ? 0 : 1;
	if (sent == 0)
		return batch->count > 0 ? RELAY_BACKOFF : RELAY_IDLE;

	answered = relay_batch_send(batch, relay_key_set());
	if (!relay_begin("recording retries in outbox.event_state"))
		return RELAY_IDLE;
	record_retries(batch);
	relay_commit();

	relay_count(batch, batch->count);
	if (!answered)
		return RELAY_INTERRUPTED;
	for (int i = 0; i < batch->count; i++)
	{
		if (batch->held[i])
			continue;
		transient += batch->msgs[i].transient ? 1 : 0;
		*delivered += batch->msgs[i].error == 0 ? 1 : 0;
	}
	return transient == sent ? RELAY_UNREACHABLE : RELAY_SENT;
}

/*
 * release_followers: after a first send, hold what was sent and release
 * the due events that waited only behind a delivered event of their key,
 * up to the first one of the key that is not due.  Returns how many.
 */
static int
release_followers(RelayBatch *batch, const bool *due)
{
	HTAB *open = relay_key_set();
	int released = 0;

	for (int i = 0; i < batch->count; i++)
	{
		if (!batch->held[i] && batch->msgs[i].error == 0)
			relay_key_add(open, batch->key_hash[i]);
	}
	for (int i = 0; i < batch->count; i++)
	{
		bool was_sent = !batch->held[i];

		batch->held[i] = true;
		if (was_sent || !relay_key_has(open, batch->key_hash[i]))
			continue;
		if (!due[i])
		{
			/* Not due: it and everything after it in its key wait on. */
			relay_key_remove(open, batch->key_hash[i]);
			continue;
		}
		batch->held[i] = false;
		released++;
	}
	return released;
}

/*
 * relay_record_failure: note a failed try of event i of batch, which had
 * failed batch->attempts[i] times before: back off, or declare it dead,
 * by the settings the batch was read with.
 */
void
relay_record_failure(const RelayBatch *batch, int i)
{
	const OutboxMessage *msg = &batch->msgs[i];
	int failures = batch->attempts[i] + 1;
	bool dead = !msg->transient && failures >= batch->settings.max_attempts;
	char error[256];

	snprintf(error, sizeof(error), "%s",
			 msg->error_text ? msg->error_text : "delivery failed");
	relay_set_state(msg->event_id, dead ? "dead" : "new", failures,
					dead ? 0 : relay_backoff_ms(&batch->settings, failures),
					error);
	if (dead)
		ereport(LOG, (errmsg("outbox relay: event " INT64_FORMAT
							 " is dead after %d failed attempts: %s",
							 msg->event_id, failures, error)));
}

/*
 * relay_set_state: write an event's delivery state, due again delay_ms
 * after the transaction's start (now() in SQL).  Call inside relay_begin.
 */
void
relay_set_state(int64 id, const char *status, int attempts, int delay_ms,
				const char *error)
{
	Oid types[6] = {INT8OID,        TEXTOID, INT4OID,
					TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID};
	Datum values[6];
	char nulls[6] = {' ', ' ', ' ', ' ', error ? ' ' : 'n', ' '};
	SPIPlanPtr plan =
		outbox_keep_plan(&set_state_plan, set_state_sql, 6, types, false);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	int rc;

	values[0] = Int64GetDatum(id);
	values[1] = CStringGetTextDatum(status);
	values[2] = Int32GetDatum(attempts);
	values[3] = TimestampTzGetDatum(TimestampTzPlusMilliseconds(now, delay_ms));
	values[4] = error ? CStringGetTextDatum(error) : (Datum) 0;
	values[5] = TimestampTzGetDatum(now);
	rc = SPI_execute_plan(plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR,
			 "outbox relay: could not record the state of event " INT64_FORMAT
			 ": %s",
			 id, SPI_result_code_string(rc));
}

/*
 * read_due: the waiting events, with every one that is not due, or that
 * waits behind an older event of its key, marked held.  Events that only
 * waited behind another (no failure of their own) travel together; one
 * that failed before blocks its key until it is delivered.  *due says
 * which are due.
 */
static RelayBatch *
read_due(bool **due)
{
	SPIPlanPtr plan;
	Oid type = INT8OID;
	RelaySettings settings = relay_settings_now();
	Datum limit = Int64GetDatum(settings.batch_size);
	MemoryContext old;
	RelayBatch *batch;
	HTAB *blocked;
	int rc;

	plan = outbox_keep_plan(&waiting_plan, waiting_sql, 1, &type, false);
	rc = SPI_execute_plan(plan, &limit, NULL, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox relay: retry query failed: %s",
			 SPI_result_code_string(rc));

	old = MemoryContextSwitchTo(relay_batch_context());
	batch = relay_batch_load(SPI_tuptable, SPI_processed, &settings);
	blocked = relay_key_set();
	*due = palloc0(sizeof(bool) * Max(batch->count, 1));
	for (int i = 0; i < batch->count; i++)
	{
		bool isnull;

		(*due)[i] = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i],
											   SPI_tuptable->tupdesc,
											   RETRY_COL_DUE, &isnull));
		batch->held[i] =
			!(*due)[i] || relay_key_has(blocked, batch->key_hash[i]);
		if (batch->held[i] || batch->attempts[i] > 0)
			relay_key_add(blocked, batch->key_hash[i]);
	}
	MemoryContextSwitchTo(old);
	return batch;
}

/*
 * record_retries: sent, or failed once more; an event not answered stays
 * due as it was.
 */
static void
record_retries(RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *msg = &batch->msgs[i];

		if (batch->held[i] || relay_unanswered(batch, i))
			continue;
		if (msg->error == 0)
			relay_set_state(msg->event_id, "sent", batch->attempts[i], 0, NULL);
		else
			relay_record_failure(batch, i);
	}
}
