/*
 * retries.c
 *		Events answered for one by one: due retries, and the events handed
 *		over from batches of first sends because their topic was stuck.
 *
 * An event that failed before is tried alone for its key: the later events
 * of the key wait behind it (read_due), which keeps per-key order across
 * retries; once it is delivered, the next one of the key is due.  One
 * batch of retries is in flight at a time, beside the first sends; one
 * whose stragglers are stuck hands them over like first sends do.
 *
 * src/retries.c
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "relay.h"

#define RETRY_COL_DUE 11

/* Handed-over events recorded per transaction, at most. */
#define HANDED_PER_STEP 1000

static const char *const waiting_sql =
	"SELECT s.id, l.topic, l.msg_key, l.payload, l.payload_bytes, l.headers,"
	"       l.biz_type, l.biz_key, l.incarnation, s.attempts,"
	"       s.status OPERATOR(pg_catalog.=) 'new'"
	"       AND s.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
	"  FROM outbox.event_state s JOIN outbox.event_log l"
	"    ON l.id OPERATOR(pg_catalog.=) s.id"
	" WHERE s.status OPERATOR(pg_catalog.=) ANY ('{new,sending}'::text[])"
	" ORDER BY s.id LIMIT $1";

static SPIPlanPtr waiting_plan = NULL;

static RelayBatch *reading = NULL; /* a batch being read and sent */

/* The latest batch sends one event the broker refused before, alone. */
static bool alone = false;

/*
 * Events released to travel together: those that waited behind an event
 * of their key just delivered, up to the first not due (note_released).
 */
static HTAB *released = NULL;

static void read_due(RelayBatch *batch, bool *any_due);
static void note_released(RelayBatch *batch);
static bool is_released(int64 id);
static void record_retries(RelayBatch *batch);
static void hand_over_stragglers(RelayBatch *batch);

/*
 * relay_retries_read: read the events waiting for a retry and send the
 * due ones (one that failed before alone for its key), unless a batch of
 * retries is still in flight.
 */
RelayRead
relay_retries_read(void)
{
	RelaySettings settings = relay_settings_now();
	RelayBatch *batch;
	bool any_due = false;

	if (relay_flight_retry() != NULL || relay_flight_room(&settings, NULL) == 0)
		return READ_FULL;
	if (!relay_begin(
			"reading due retries from outbox.event_state and outbox.event_log"))
		return READ_GONE;
	if (relay_pause_set())
	{
		relay_commit();
		return READ_PAUSED;
	}
	batch = reading = relay_batch_new(true, &settings, settings.batch_size);
	relay_flight_set_retry(batch);
	read_due(batch, &any_due);
	relay_commit();
	reading = NULL;
	relay_flight_admit(batch);
	if (any_due)
		outbox_kafka_push();
	if (batch->count == 0 || !any_due)
	{
		relay_flight_done(batch);
		return READ_NOTHING;
	}
	return READ_SOME;
}

/*
 * relay_retries_alone: whether the latest batch of retries sends an event
 * the broker refused before, alone (see event_state.c): no first sends
 * should travel with it.
 */
bool
relay_retries_alone(void)
{
	return alone;
}

/*
 * relay_retries_first: whether a batch of retries is in flight,
 * unanswered.  First sends wait for it (worker.c, briefly): read
 * meanwhile, they would hold a busy key's new events behind its retried
 * ones, the retry step would send those in its next batch while first
 * sends held more, and so on for as long as the key is written.  After a
 * burst of refusals a whole backlog went through outbox.event_state that
 * way, written twice more.  Once the batch is answered, first sends find
 * its keys free.  Not one that sends an event refused twice, alone: it is
 * likely refused again, its key stays blocked, and while a topic is
 * refused such batches follow one another (the round after it is enough).
 */
bool
relay_retries_first(void)
{
	RelayBatch *batch = relay_flight_retry();

	return batch != NULL && batch != reading && !alone &&
		   !relay_batch_all_answered(batch);
}

/*
 * relay_retries_settle: record the batch of retries once Kafka answered
 * for it (or hand its stuck stragglers over).  True if anything was
 * recorded; *unreachable if every event sent failed for the broker's sake.
 */
bool
relay_retries_settle(TimestampTz now, bool *unreachable)
{
	RelayBatch *batch = relay_flight_retry();
	int sent = 0;
	int transient = 0;

	if (batch == NULL || batch == reading)
		return false;
	if (!relay_batch_all_answered(batch) &&
		!relay_flight_may_hand_over(batch, now))
		return false;
	if (!relay_begin("recording retries in outbox.event_state"))
		return false;
	record_retries(batch);
	relay_commit();
	hand_over_stragglers(batch);
	for (int i = 0; i < batch->count; i++)
	{
		if (!batch->msgs[i].queued && !batch->msgs[i].done)
			continue;
		sent++;
		transient += batch->msgs[i].transient ? 1 : 0;
	}
	*unreachable = sent > 0 && transient == sent;
	note_released(batch);
	relay_flight_done(batch);
	return true;
}

/*
 * relay_handed_settle: record what Kafka answered for events handed over
 * earlier.  True if anything was recorded.
 */
bool
relay_handed_settle(void)
{
	RelayRef refs[HANDED_PER_STEP];
	int n = relay_flight_answered_handed(refs, HANDED_PER_STEP);

	if (n == 0)
	{
		relay_flight_sweep();
		return false;
	}
	if (!relay_begin("recording handed-over events in outbox.event_state"))
		return false;
	for (int k = 0; k < n; k++)
		relay_record_outcome(refs[k].batch, refs[k].i);
	relay_commit();
	for (int k = 0; k < n; k++)
		relay_tally(&refs[k].batch->msgs[refs[k].i],
					refs[k].batch->attempts[refs[k].i]);
	relay_flight_settled(refs, n);
	return true;
}

/*
 * relay_retries_abandon: a batch whose reading failed half way is given
 * up; its events stay waiting in outbox.event_state.
 */
void
relay_retries_abandon(void)
{
	if (reading != NULL)
	{
		for (int i = 0; i < reading->count; i++)
			reading->fate[i] = FATE_DROPPED;
		relay_flight_done(reading);
	}
	reading = NULL;
}

/*
 * read_due: the waiting events, the due ones sent.  One that is not due,
 * that waits behind an older event of its key, or whose topic is stuck, is
 * held; events that only waited behind another (no failure of their own)
 * travel together, and one that failed before blocks its key until it is
 * delivered.  Events handed over ('sending') are in flight: they only
 * block their key.
 */
static void
read_due(RelayBatch *batch, bool *any_due)
{
	Oid type = INT8OID;
	Datum limit = Int64GetDatum(batch->capacity);
	SPIPlanPtr plan =
		outbox_keep_plan(&waiting_plan, waiting_sql, 1, &type, false);
	HTAB *blocked = relay_key_set(CurrentMemoryContext);

	alone = false;
	if (SPI_execute_plan(plan, &limit, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox relay: retry query failed");
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		BatchRow row;
		bool due;
		bool refused;
		int i;

		relay_batch_row(&row, SPI_tuptable->vals[r], SPI_tuptable->tupdesc);
		due = DatumGetBool(row.values[RETRY_COL_DUE - 1]);
		i = relay_batch_add(batch, &row);

		batch->due[i] = due;
		refused = relay_refused_before(batch->msgs[i].event_id);
		if (!due || relay_key_has(blocked, batch->key_hash[i]) ||
			relay_flight_topic_stuck(relay_topic_hash(batch->msgs[i].topic)) ||
			relay_flight_room(&batch->settings, batch) == 0 || alone ||
			(refused && *any_due))
			batch->fate[i] = FATE_HELD;
		else if (!relay_batch_send(batch, i, &row))
			batch->fate[i] = FATE_HELD;
		else
		{
			*any_due = true;
			alone = refused;
		}
		if (batch->fate[i] == FATE_HELD ||
			(batch->attempts[i] > 0 && !is_released(batch->msgs[i].event_id)) ||
			(batch->msgs[i].done && batch->msgs[i].error != 0))
			relay_key_add(blocked, batch->key_hash[i]);
	}
	if (released != NULL)
		hash_destroy(released);
	released = NULL;
}

/*
 * note_released: after a batch of retries, the due events that waited
 * only behind an event of their key it delivered travel together in the
 * next one, up to the first one of the key that is not due: a burst of
 * refusals drains at the pace of batches, not of one event per key and
 * round trip (with the same caveat as first sends if one is refused).
 */
static void
note_released(RelayBatch *batch)
{
	HTAB *open = relay_key_set(CurrentMemoryContext);

	if (released == NULL)
		released = relay_key_set(TopMemoryContext);
	for (int i = 0; i < batch->count; i++)
	{
		if (batch->fate[i] == FATE_IN_BATCH && batch->msgs[i].done &&
			batch->msgs[i].error == 0)
			relay_key_add(open, batch->key_hash[i]);
	}
	for (int i = 0; i < batch->count; i++)
	{
		uint64 id = (uint64) batch->msgs[i].event_id;

		if (batch->fate[i] != FATE_HELD ||
			!relay_key_has(open, batch->key_hash[i]))
			continue;
		if (!batch->due[i])
			(void) hash_search(open, &batch->key_hash[i], HASH_REMOVE, NULL);
		else
			relay_key_add(released, id);
	}
	hash_destroy(open);
}

/*
 * is_released: whether the event may travel with the earlier ones of its
 * key (note_released).
 */
static bool
is_released(int64 id)
{
	uint64 key = (uint64) id;

	return released != NULL && relay_key_has(released, key);
}

/*
 * record_retries: sent, or failed once more; an event not answered is
 * recorded as handed over.  Inside relay_begin.
 */
static void
record_retries(RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		if (batch->fate[i] != FATE_IN_BATCH)
			continue;
		if (!relay_batch_answered(batch, i))
			relay_set_state(batch->msgs[i].event_id, "sending",
							batch->attempts[i], 0, NULL);
		else
			relay_record_outcome(batch, i);
	}
}

/*
 * hand_over_stragglers: once recorded, count what was answered and hand
 * over what was not.
 */
static void
hand_over_stragglers(RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		if (batch->fate[i] != FATE_IN_BATCH)
			continue;
		if (!relay_batch_answered(batch, i))
			relay_flight_hand_over(batch, i);
		else
			relay_tally(&batch->msgs[i], batch->attempts[i]);
	}
}
