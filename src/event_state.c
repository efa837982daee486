/*
 * event_state.c
 *		Rows of outbox.event_state: events that did not go out on their
 *		first try, their backoff and their death.
 *
 * A failed event gets a row and is tried again after an exponential,
 * jittered backoff.  After outbox.max_attempts failures of its own (the
 * broker refused it, or refused its topic) it becomes dead; failures for
 * the broker's sake (timeouts while no broker answers, broker unreachable)
 * are counted and shown but never make an event dead, so an outage,
 * however long, loses nothing.  Nor do failures because the event's topic
 * does not exist yet (a cluster that does not create topics on first use,
 * and an operator who creates it late): the event waits for it, unless
 * outbox.missing_topic_dead says otherwise.  'new' rows wait for a retry,
 * 'sending' rows are in flight and answered for one by one; both hold
 * back the later events of their key.
 *
 * src/event_state.c
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "relay.h"

/*
 * Run as a superuser: schema-qualified functions and operators, and the
 * times computed here and passed typed, so that no expression resolves to
 * an object a database owner could create (such as an operator
 * *(integer, interval) in public, which pg_catalog lacks).
 */
static const char *const set_state_sql =
	"INSERT INTO outbox.event_state AS s"
	"  (id, status, attempts, next_attempt_at, last_error, updated_at)"
	" VALUES ($1, $2, $3, $4, $5, $6)"
	" ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status,"
	"  attempts = EXCLUDED.attempts, next_attempt_at = EXCLUDED.next_attempt_at,"
	"  last_error = COALESCE(EXCLUDED.last_error, s.last_error),"
	"  updated_at = EXCLUDED.updated_at";

static const char *const pending_keys_sql =
	"SELECT l.topic, l.msg_key"
	"  FROM outbox.event_state s JOIN outbox.event_log l"
	"    ON l.id OPERATOR(pg_catalog.=) s.id"
	" WHERE s.status OPERATOR(pg_catalog.=) ANY ('{new,sending}'::text[])";

/* At start nothing is in flight: 'sending' rows are due again. */
static const char *const reset_sending_sql =
	"UPDATE outbox.event_state SET status = 'new'"
	" WHERE status OPERATOR(pg_catalog.=) 'sending'";

/*
 * Events Kafka committed in a transaction whose record was lost: sent.
 * Only rows that exist: an event without one was recorded and kept none.
 */
static const char *const mark_sent_sql =
	"UPDATE outbox.event_state SET status = 'sent', updated_at = pg_catalog.now()"
	" WHERE id OPERATOR(pg_catalog.=) ANY ($1)"
	"   AND status OPERATOR(pg_catalog.<>) 'sent'";

static SPIPlanPtr set_state_plan = NULL;
static SPIPlanPtr mark_sent_plan = NULL;
static SPIPlanPtr pending_keys_plan = NULL;
static SPIPlanPtr reset_sending_plan = NULL;

/*
 * Events the broker refused twice in a row that wait for a retry.  Kafka
 * refuses a partition's whole batch of records for one it cannot take
 * (one larger than the topic's max.message.bytes: the limit is the
 * batch's), so the events sent with the guilty one are refused with it;
 * retried together they are refused together again, and would die with
 * it.  So an event refused on a retry too is retried alone (retries.c),
 * and the others of its batch go through.  The first retry still goes
 * together: a burst refused for a passing reason drains at the pace of
 * batches.  Kept in memory only: after a restart they travel together
 * once more, which costs each an attempt, no more.
 */
static HTAB *refused = NULL;

/*
 * Topics said to be missing (relay_say_topic_missing): each is said once
 * while its events wait, however many and however long, and again only
 * if it goes missing again after an event of it was delivered.
 */
static HTAB *missing_said = NULL;

static void log_dead(const OutboxMessage *msg, int failures, const char *error);
static const char *failure_text(const RelayBatch *batch, int i, bool *refused,
								bool *missing);
static void note_refused(int64 id, bool is_refused);
static void forget_missing(const char *topic);

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
 * relay_mark_sent: the events given were delivered (exactly_once.c found
 * them in Kafka's progress).  Call inside relay_begin.
 */
void
relay_mark_sent(const int64 *ids, int n)
{
	Oid types[1] = {INT8ARRAYOID};
	Datum values[1];
	Datum *items = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		items[i] = Int64GetDatum(ids[i]);
	values[0] = PointerGetDatum(construct_array(
		items, n, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	relay_run_plan(&mark_sent_plan, mark_sent_sql, 1, types, values,
				   SPI_OK_UPDATE, false);
}

/*
 * Topics whose refusal was logged lately: a refused topic is said once a
 * minute, however many of its events fail, and no other line names it
 * while its events wait (librdkafka 2.14 logs nothing of it).
 */
#define REFUSALS_KEPT 16
#define REFUSAL_REPEAT_MS 60000

typedef struct RefusalSaid
{
	uint64 topic_hash;
	TimestampTz at;
} RefusalSaid;

static RefusalSaid refusals_said[REFUSALS_KEPT];

static void log_refused(const OutboxMessage *msg, const char *error);

/*
 * relay_record_outcome: what Kafka answered for event i of batch, which
 * has a state row of its own: sent, or failed once more.
 */
void
relay_record_outcome(const RelayBatch *batch, int i)
{
	const OutboxMessage *msg = &batch->msgs[i];

	if (msg->error == 0)
	{
		relay_set_state(msg->event_id, "sent", batch->attempts[i], 0, NULL);
		note_refused(msg->event_id, false);
		forget_missing(msg->topic);
	}
	else
		relay_record_failure(batch, i);
}

/*
 * relay_record_failure: note a failed try of event i of batch, which had
 * failed batch->attempts[i] times before: back off, or declare it dead,
 * by the settings the batch was read with.  A purge (the producer was
 * stopped) is no try: the event is due again at once, uncounted.  An
 * event whose topic does not exist waits for it: its tries are counted
 * and backed off, but make it dead only with outbox.missing_topic_dead.
 */
void
relay_record_failure(const RelayBatch *batch, int i)
{
	const OutboxMessage *msg = &batch->msgs[i];
	bool refused = !msg->transient;
	bool missing = false;
	const char *error = failure_text(batch, i, &refused, &missing);
	int failures = batch->attempts[i] + 1;
	bool dead;

	if (msg->purged)
	{
		relay_set_state(msg->event_id, "new", batch->attempts[i], 0, NULL);
		return;
	}
	if (missing)
		refused = batch->settings.missing_topic_dead;
	dead = refused && failures >= batch->settings.max_attempts;
	relay_set_state(msg->event_id, dead ? "dead" : "new", failures,
					dead ? 0 : relay_backoff_ms(&batch->settings, failures),
					error);
	/* Not alone: a missing topic refuses its events whatever travels along. */
	note_refused(msg->event_id, refused && !missing && !dead && failures >= 2);
	if (missing)
		relay_say_topic_missing(msg->topic, batch->settings.missing_topic_dead);
	else if (refused && !dead)
		log_refused(msg, error);
	/* What relay_status() shows, once this is recorded. */
	((OutboxMessage *) msg)->error_text =
		MemoryContextStrdup(batch->memory, error);
	if (dead)
		log_dead(msg, failures, error);
}

/*
 * log_dead: say that the event of msg is dead, and why, naming its topic
 * unless the error does: a librdkafka that fails an unauthorized topic's
 * messages at once (2.14 does; 2.0 holds them until message.timeout.ms,
 * then failure_text names the topic) logs nothing else that names it.
 */
static void
log_dead(const OutboxMessage *msg, int failures, const char *error)
{
	if (strstr(error, msg->topic) == NULL)
		error = psprintf("%s (topic \"%.200s\")", error, msg->topic);
	ereport(LOG, (errmsg("outbox relay: event " INT64_FORMAT
						 " is dead after %d failed attempts: %s",
						 msg->event_id, failures, error),
				  outbox_kafka_unauthorized(msg->error)
					  ? errhint("Grant the relay's Kafka principal Write on "
								"topic \"%.200s\", then replay the event "
								"with outbox.replay().",
								msg->topic)
					  : 0));
}

/*
 * log_refused: say that Kafka refused an event of msg's topic and that its
 * events wait, unless that was said of the topic within the last minute.
 */
static void
log_refused(const OutboxMessage *msg, const char *error)
{
	uint64 hash = relay_topic_hash(msg->topic);
	TimestampTz now = GetCurrentTimestamp();
	RefusalSaid *oldest = &refusals_said[0];

	for (int i = 0; i < REFUSALS_KEPT; i++)
	{
		RefusalSaid *said = &refusals_said[i];

		if (said->at != 0 && said->topic_hash == hash)
		{
			if (!TimestampDifferenceExceeds(said->at, now, REFUSAL_REPEAT_MS))
				return;
			oldest = said;
			break;
		}
		if (said->at < oldest->at)
			oldest = said;
	}
	oldest->topic_hash = hash;
	oldest->at = now;
	if (strstr(error, msg->topic) == NULL)
		error = psprintf("%s (topic \"%.200s\")", error, msg->topic);
	ereport(LOG, (errmsg("outbox relay: Kafka refused event " INT64_FORMAT ": %s",
						 msg->event_id, error),
				  errdetail("It is retried with backoff, and dead after "
							"outbox.max_attempts refusals; a topic's refusals "
							"are said once a minute."),
				  outbox_kafka_unauthorized(msg->error)
					  ? errhint("The relay's Kafka principal may not write "
								"to topic \"%.200s\": grant it Write there "
								"(Describe comes with it).",
								msg->topic)
					  : 0));
}

/*
 * failure_text: why event i failed, in at most a few hundred bytes.  A
 * timeout is the broker's sake unless the cluster, which acknowledges
 * others, reports an error for the event's topic: then *refused, or
 * *missing if the error is that the topic does not exist.  So is a topic
 * librdkafka calls unknown: the cluster's word names why (an invalid
 * name, say).  One the cluster does not confirm unknown, because it
 * reports the topic now (created meanwhile) or left the relay's question
 * unanswered, is librdkafka's older word: a failure for the broker's
 * sake, never dead for it, whatever outbox.missing_topic_dead says.
 */
static const char *
failure_text(const RelayBatch *batch, int i, bool *refused, bool *missing)
{
	const OutboxMessage *msg = &batch->msgs[i];
	char reported[256];

	if ((msg->timed_out || msg->topic_unknown) &&
		outbox_kafka_topic_refused(msg->topic, reported, sizeof(reported)))
	{
		if (outbox_kafka_topic_missing(msg->topic))
		{
			*missing = true;
			return relay_topic_missing_text(msg->topic,
											batch->settings.missing_topic_dead);
		}
		*refused = true;
		return psprintf("%s; the cluster reports for topic \"%.200s\": %s",
						msg->error_text, msg->topic, reported);
	}
	if (msg->topic_unknown && !msg->transient)
	{
		*refused = false;
		return psprintf("%s, as librdkafka last heard; the cluster has not "
						"confirmed it since",
						msg->error_text);
	}
	return msg->error_text ? msg->error_text : "delivery failed";
}

/*
 * relay_topic_missing_text: what an event of topic, which the cluster
 * reports does not exist, waits for, or (dead: outbox.missing_topic_dead)
 * why it fails; the same words in outbox.events' last_error,
 * relay_status() and the server log.
 */
const char *
relay_topic_missing_text(const char *topic, bool dead)
{
	if (dead)
		return psprintf("topic \"%.200s\" does not exist: the cluster reports "
						"it unknown and does not create it",
						topic);
	return psprintf("waiting for topic \"%.200s\" to be created: the cluster "
					"reports that it does not exist",
					topic);
}

/*
 * relay_say_topic_missing: say once that events of topic wait for it to be
 * created (see missing_said), by the rule dead says: whether they become
 * dead after outbox.max_attempts (outbox.missing_topic_dead).
 */
void
relay_say_topic_missing(const char *topic, bool dead)
{
	uint64 hash = relay_topic_hash(topic);

	if (missing_said == NULL)
		missing_said = relay_key_set(TopMemoryContext);
	if (relay_key_has(missing_said, hash))
		return;
	relay_key_add(missing_said, hash);
	ereport(LOG,
			(errmsg("outbox relay: events wait for topic \"%s\" to be created",
					topic),
			 dead ? errdetail("The Kafka cluster reports that the topic does "
							  "not exist, and does not create it.  Its events "
							  "are retried with backoff and, as "
							  "outbox.missing_topic_dead is on, become dead "
							  "after outbox.max_attempts tries.")
				  : errdetail("The Kafka cluster reports that the topic does "
							  "not exist, and does not create it.  Its events "
							  "are retried with backoff and delivered once it "
							  "exists; later events of their keys wait behind "
							  "them, and other topics go on."),
			 errhint("Create the topic in Kafka.")));
}

/*
 * forget_missing: an event of topic was delivered: if the topic goes
 * missing again, say so again.
 */
static void
forget_missing(const char *topic)
{
	uint64 hash;

	if (missing_said == NULL || hash_get_num_entries(missing_said) == 0)
		return;
	hash = relay_topic_hash(topic);
	(void) hash_search(missing_said, &hash, HASH_REMOVE, NULL);
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
 * relay_pending_keys: add to keys those of the events that wait for a
 * retry or are in flight one by one: they hold back every later event of
 * theirs.  Call inside relay_begin.
 */
void
relay_pending_keys(HTAB *keys)
{
	SPIPlanPtr plan =
		outbox_keep_plan(&pending_keys_plan, pending_keys_sql, 0, NULL, false);
	int rc = SPI_execute_plan(plan, NULL, NULL, true, 0);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox relay: pending keys query failed: %s",
			 SPI_result_code_string(rc));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple row = SPI_tuptable->vals[i];
		TupleDesc desc = SPI_tuptable->tupdesc;
		char *topic = SPI_getvalue(row, desc, 1);
		char *key = SPI_getvalue(row, desc, 2);

		relay_key_add(keys, relay_key_hash(topic ? topic : "", key ? key : ""));
	}
}

/*
 * relay_reset_sending: at start, events handed over by an earlier relay
 * are in nobody's hands: make them due again.  Call inside relay_begin.
 */
void
relay_reset_sending(void)
{
	relay_run_plan(&reset_sending_plan, reset_sending_sql, 0, NULL, NULL,
				   SPI_OK_UPDATE, false);
}

/*
 * relay_refused_before: whether the event is to be retried alone (see
 * refused above).
 */
bool
relay_refused_before(int64 id)
{
	return refused != NULL && relay_key_has(refused, (uint64) id);
}

/*
 * note_refused: remember, or forget, that the broker refused event id.
 */
static void
note_refused(int64 id, bool is_refused)
{
	uint64 key = (uint64) id;

	if (refused == NULL)
		refused = relay_key_set(TopMemoryContext);
	if (is_refused)
		relay_key_add(refused, key);
	else
		(void) hash_search(refused, &key, HASH_REMOVE, NULL);
}
