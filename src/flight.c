/*
 * flight.c
 *		The batches Kafka has not answered for yet, and their bounds.
 *
 * First sends are a queue in stream order: several batches are in flight
 * while the oldest is answered, and progress is recorded from the head
 * only, so the cursor never passes an event Kafka has not answered for.
 * Retries have one slot of their own.  The events sent and not yet
 * recorded, which a crash would send again, are bounded by
 * outbox.max_in_flight_events; the payload bytes librdkafka holds for the
 * relay by outbox.max_in_flight_size.
 *
 * A batch whose events are all answered but a few, while Kafka has
 * acknowledged later ones, holds a stuck topic or partition: those few are
 * handed over (recorded as 'sending', answered for one by one) after
 * HANDOVER_MS, so that the head moves on and every other topic keeps its
 * pace.  Their topic counts as stuck until they are answered: its later
 * events wait in outbox.event_state instead of filling the flight (in
 * exactly_once, where a stuck event aborts its transaction, the topic is
 * held until that event is due again instead).  When
 * Kafka acknowledges nothing (an outage) nothing is handed over: the
 * batches wait for librdkafka's message.timeout.ms, then go again.
 *
 * A batch recorded or given up while messages of it are unanswered
 * lingers, with its memory (librdkafka points into it), until they are.
 *
 * src/flight.c
 */
#include "postgres.h"

#include "lib/ilist.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "relay.h"

/* How long a batch's head waits before its stragglers are handed over. */
#define HANDOVER_MS 1000

/* A topic that becomes stuck again is said again after this long. */
#define STUCK_REPEAT_MS 60000

/*
 * A stuck topic: how many of its handed-over events are unanswered, and
 * until when it is held after an aborted Kafka transaction (0 if not).
 */
typedef struct StuckTopic
{
	uint64 hash;
	int waiting;
	TimestampTz held_until;
} StuckTopic;

static dlist_head queue = DLIST_STATIC_INIT(queue);
static RelayBatch *retry_batch = NULL;
static dlist_head lingering = DLIST_STATIC_INIT(lingering);
static HTAB *stuck = NULL;
static int unrecorded = 0; /* events of admitted batches and handed-over ones */
static HTAB *said = NULL;  /* topic hash -> when it was last said stuck */
static RelayTally tally;
static char stuck_reason[512];
static char tally_error[OUTBOX_ERROR_LEN];

static void drop_messages(RelayBatch *batch, int from, bool handed_too);
static void let_go(RelayBatch *batch);
static bool freeable(const RelayBatch *batch);
static void unstick(RelayBatch *batch, int i);
static bool young(const RelayBatch *batch, TimestampTz now);
static bool later_acked(const RelayBatch *batch);
static bool first_waiting_missing(const RelayBatch *batch);
static StuckTopic *enter_stuck(const char *topic, const char *then);
static void say_stuck(const char *topic, uint64 hash, const char *then);

/*
 * relay_flight_init: the set of stuck topics, for the life of the relay.
 */
void
relay_flight_init(void)
{
	HASHCTL ctl;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(StuckTopic);
	ctl.hcxt = TopMemoryContext;
	stuck = hash_create("outbox stuck topics", 16, &ctl,
						HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	ctl.entrysize = sizeof(uint64) + sizeof(TimestampTz);
	said = hash_create("outbox stuck topics said", 16, &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*
 * relay_flight_push: a batch of first sends joins the queue, before its
 * first message is sent (from then on librdkafka may point into it).
 */
void
relay_flight_push(RelayBatch *batch)
{
	dlist_push_tail(&queue, &batch->node);
}

/*
 * relay_flight_head: the oldest batch of first sends, or NULL.
 */
RelayBatch *
relay_flight_head(void)
{
	if (dlist_is_empty(&queue))
		return NULL;
	return dlist_head_element(RelayBatch, node, &queue);
}

/*
 * relay_flight_next: the batch of first sends after batch, or NULL.
 */
RelayBatch *
relay_flight_next(RelayBatch *batch)
{
	if (!dlist_has_next(&queue, &batch->node))
		return NULL;
	return dlist_container(RelayBatch, node,
						   dlist_next_node(&queue, &batch->node));
}

/*
 * relay_flight_retry: the batch of retries in flight, or NULL.
 */
RelayBatch *
relay_flight_retry(void)
{
	return retry_batch;
}

/*
 * relay_flight_set_retry: the batch of retries now in flight.
 */
void
relay_flight_set_retry(RelayBatch *batch)
{
	Assert(retry_batch == NULL);
	retry_batch = batch;
}

/*
 * relay_flight_admit: a batch read whole counts against the bound until
 * it is recorded or dropped.
 */
void
relay_flight_admit(RelayBatch *batch)
{
	batch->admitted = true;
	unrecorded += batch->count;
}

/*
 * relay_flight_done: the batch recorded everything of its own; what is
 * left in flight of it is handed over or dropped.
 */
void
relay_flight_done(RelayBatch *batch)
{
	if (batch == retry_batch)
		retry_batch = NULL;
	else
		dlist_delete(&batch->node);
	let_go(batch);
}

/*
 * relay_flight_drop_from: give up event from of batch, the events after
 * it and every later batch of first sends: they are read again, and any
 * answer Kafka gives for them is ignored.
 */
void
relay_flight_drop_from(RelayBatch *batch, int from)
{
	dlist_mutable_iter iter;
	bool later = false;

	dlist_foreach_modify(iter, &queue)
	{
		RelayBatch *b = dlist_container(RelayBatch, node, iter.cur);

		if (b == batch)
			later = true;
		if (!later)
			continue;
		drop_messages(b, b == batch ? from : 0, false);
		dlist_delete(&b->node);
		let_go(b);
	}
}

/*
 * relay_flight_drop_all: give up every batch in flight (the producer
 * stopped, or the extension was created again: then handed_too, for the
 * rows they were handed over to are gone).
 */
void
relay_flight_drop_all(bool handed_too)
{
	RelayBatch *head = relay_flight_head();
	dlist_mutable_iter iter;

	if (head != NULL)
		relay_flight_drop_from(head, 0);
	if (retry_batch != NULL)
	{
		drop_messages(retry_batch, 0, false);
		relay_flight_done(retry_batch);
	}
	if (!handed_too)
		return;
	/* Left in the list while Kafka owes answers (let_go would requeue). */
	dlist_foreach_modify(iter, &lingering)
	{
		RelayBatch *b = dlist_container(RelayBatch, node, iter.cur);

		drop_messages(b, 0, true);
		if (freeable(b))
		{
			dlist_delete(&b->node);
			relay_batch_free(b);
		}
	}
}

/*
 * relay_flight_room: how many more events may be sent by the settings,
 * reading counting those of the batch being read (0 if none may).
 */
int
relay_flight_room(const RelaySettings *settings, const RelayBatch *reading)
{
	int messages;
	size_t bytes;
	int held = unrecorded + (reading != NULL ? reading->count : 0);

	outbox_kafka_in_flight(&messages, &bytes);
	if (bytes >= (size_t) settings->max_in_flight_size)
		return 0;
	return Max(0, settings->max_in_flight_events - held);
}

/*
 * relay_flight_failed_uncut: whether an event of a batch in the queue
 * failed for the broker's sake and the stream has not yet been cut there
 * (first_sends.c's settle reads it again from that event).  Until it is,
 * nothing younger may be sent: it would reach Kafka ahead of that event.
 * The queue is looked through only after a failure; once none is found,
 * not again until the next.
 */
bool
relay_flight_failed_uncut(void)
{
	static uint64 failures_seen = 0;
	uint64 failures = outbox_kafka_failures();
	dlist_iter iter;

	if (failures == failures_seen)
		return false;
	dlist_foreach(iter, &queue)
	{
		RelayBatch *batch = dlist_container(RelayBatch, node, iter.cur);

		for (int i = 0; i < batch->count; i++)
		{
			OutboxMessage *msg = &batch->msgs[i];

			if (msg->queued && msg->done && msg->error != 0 && msg->transient)
				return true;
		}
	}
	failures_seen = failures;
	return false;
}

/*
 * relay_flight_empty: whether no batch waits to be recorded.
 */
bool
relay_flight_empty(void)
{
	return dlist_is_empty(&queue) && retry_batch == NULL;
}

/*
 * relay_flight_idle: whether nothing at all is in flight.
 */
bool
relay_flight_idle(void)
{
	return relay_flight_empty() && dlist_is_empty(&lingering);
}

/*
 * young: whether batch was sent less than HANDOVER_MS ago, too soon to
 * call its unanswered events stuck.
 */
static bool
young(const RelayBatch *batch, TimestampTz now)
{
	return !TimestampDifferenceExceeds(batch->sent_at, now, HANDOVER_MS);
}

/*
 * relay_flight_may_hand_over: whether batch's unanswered events are stuck
 * rather than slow: it waited HANDOVER_MS, and Kafka acknowledged a
 * message sent after the first of them, or the cluster reports that the
 * first one's topic does not exist (librdkafka holds its messages for
 * topic.metadata.propagation.max.ms, 30 s, and nothing may come after
 * them).  Any acknowledgement since the batch was sent would not do:
 * under a burst, the first half of a large batch is acknowledged while
 * the rest is on its way.
 */
bool
relay_flight_may_hand_over(const RelayBatch *batch, TimestampTz now)
{
	if (young(batch, now))
		return false;
	return later_acked(batch) || first_waiting_missing(batch);
}

/*
 * first_waiting_missing: whether the cluster reports that the topic of
 * batch's first unanswered event does not exist.
 */
static bool
first_waiting_missing(const RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		if (!relay_batch_answered(batch, i))
			return outbox_kafka_topic_missing(batch->msgs[i].topic);
	}
	return false;
}

/*
 * relay_flight_round_stuck: in exactly_once nothing more is sent until a
 * round's transaction ends, so no message sent after batch's stragglers
 * may be acknowledged to show them stuck.  After HANDOVER_MS they are if
 * Kafka acknowledged messages of the round (its acked seq passed
 * round_seq, the one at the round's begin) and none since HANDOVER_MS, or
 * if the cluster reports an error for the first one's topic (the round
 * may hold nothing else).
 */
bool
relay_flight_round_stuck(const RelayBatch *batch, uint64 round_seq,
						 TimestampTz now)
{
	char reported[256];

	if (young(batch, now))
		return false;
	if (outbox_kafka_acked_seq() > round_seq &&
		TimestampDifferenceExceeds(outbox_kafka_last_ack(), now, HANDOVER_MS))
		return true;
	for (int i = 0; i < batch->count; i++)
	{
		if (!relay_batch_answered(batch, i))
			return outbox_kafka_topic_refused(batch->msgs[i].topic, reported,
											  sizeof(reported));
	}
	return false;
}

/*
 * later_acked: whether Kafka acknowledged a message sent after the first
 * unanswered one of batch.
 */
static bool
later_acked(const RelayBatch *batch)
{
	uint64 waiting = relay_batch_first_waiting(batch);

	return waiting != 0 && outbox_kafka_acked_seq() > waiting;
}

/*
 * relay_flight_next_handover: when the oldest batch of first sends or the
 * batch of retries may hand over, for the loop's wait; 0 if neither can
 * (nothing waits, or Kafka acknowledged nothing sent after it: an answer
 * wakes the loop anyway).  A batch still unanswered is looked at once
 * when HANDOVER_MS is over, acknowledged or not: its topic may not exist.
 */
TimestampTz
relay_flight_next_handover(void)
{
	RelayBatch *candidates[2] = {relay_flight_head(), retry_batch};
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz at = 0;

	for (int c = 0; c < 2; c++)
	{
		RelayBatch *b = candidates[c];
		TimestampTz when;

		if (b == NULL || relay_batch_all_answered(b))
			continue;
		when = TimestampTzPlusMilliseconds(b->sent_at, HANDOVER_MS);
		if (!later_acked(b) && when <= now)
			continue;
		at = at == 0 ? when : Min(at, when);
	}
	return at;
}

/*
 * relay_flight_hand_over: event i of batch is recorded as 'sending'; its
 * topic is stuck until Kafka answers for it.
 */
void
relay_flight_hand_over(RelayBatch *batch, int i)
{
	StuckTopic *topic = enter_stuck(
		batch->msgs[i].topic,
		"They wait in outbox.event_state as 'sending' until Kafka answers for "
		"them, later events of the topic wait behind them, and other topics "
		"go on.");

	topic->waiting++;
	unrecorded++;
	batch->fate[i] = FATE_HANDED;
}

/*
 * relay_flight_hold_topic: in exactly_once, a stuck event made the relay
 * abort its transaction; the topic's events are held back until `until`,
 * when the stuck one is due again, so that the next transactions, which
 * carry the other topics, are not stalled by it each in turn.
 */
void
relay_flight_hold_topic(const char *topic_name, TimestampTz until)
{
	StuckTopic *topic = enter_stuck(
		topic_name,
		"The Kafka transaction was aborted; the topic's events are held "
		"back in outbox.event_state until the stuck ones are retried, and "
		"other topics go on.");

	topic->held_until = Max(topic->held_until, until);
}

/*
 * enter_stuck: the topic's entry in the set of stuck topics, said (with
 * detail `then`) when it joins.
 */
static StuckTopic *
enter_stuck(const char *topic_name, const char *then)
{
	uint64 hash = relay_topic_hash(topic_name);
	bool found;
	StuckTopic *topic = hash_search(stuck, &hash, HASH_ENTER, &found);

	if (!found)
	{
		topic->waiting = 0;
		topic->held_until = 0;
		say_stuck(topic_name, hash, then);
	}
	return topic;
}

/*
 * relay_flight_topic_stuck: whether events of the topic wait for Kafka's
 * answer one by one, or are held after an aborted transaction.
 */
bool
relay_flight_topic_stuck(uint64 topic_hash)
{
	bool found;
	StuckTopic *topic = hash_search(stuck, &topic_hash, HASH_FIND, &found);

	if (!found)
		return false;
	if (topic->waiting > 0 || GetCurrentTimestamp() < topic->held_until)
		return true;
	(void) hash_search(stuck, &topic_hash, HASH_REMOVE, NULL);
	return false;
}

/*
 * relay_flight_held_keys: add to keys those of the events of first sends in
 * flight that were held back or refused at once: later events of theirs,
 * read before these are recorded, must wait too.
 */
void
relay_flight_held_keys(HTAB *keys)
{
	dlist_iter iter;

	dlist_foreach(iter, &queue)
	{
		RelayBatch *b = dlist_container(RelayBatch, node, iter.cur);

		for (int i = 0; i < b->count; i++)
		{
			if (b->fate[i] == FATE_HELD ||
				(b->msgs[i].done && b->msgs[i].error != 0))
				relay_key_add(keys, b->key_hash[i]);
		}
	}
}

/*
 * relay_flight_answered_handed: up to max handed-over events Kafka has
 * answered for, for the caller to record; then relay_flight_settled.
 */
int
relay_flight_answered_handed(RelayRef *out, int max)
{
	dlist_iter iter;
	int n = 0;

	dlist_foreach(iter, &lingering)
	{
		RelayBatch *b = dlist_container(RelayBatch, node, iter.cur);

		for (int i = 0; i < b->count && n < max; i++)
		{
			if (b->fate[i] != FATE_HANDED || !b->msgs[i].done)
				continue;
			out[n].batch = b;
			out[n].i = i;
			n++;
		}
	}
	return n;
}

/*
 * relay_flight_settled: the n events of refs are recorded; batches with
 * nothing left in flight are let go.
 */
void
relay_flight_settled(RelayRef *refs, int n)
{
	dlist_mutable_iter iter;

	for (int k = 0; k < n; k++)
		unstick(refs[k].batch, refs[k].i);
	dlist_foreach_modify(iter, &lingering)
	{
		RelayBatch *b = dlist_container(RelayBatch, node, iter.cur);

		if (freeable(b))
		{
			dlist_delete(&b->node);
			relay_batch_free(b);
		}
	}
}

/*
 * relay_flight_sweep: let go of lingering batches Kafka has answered for
 * entirely and that hold nothing to record.
 */
void
relay_flight_sweep(void)
{
	relay_flight_settled(NULL, 0);
}

/*
 * relay_tally: count an answered event for relay_status().
 */
void
relay_tally(const OutboxMessage *msg, int attempts)
{
	if (msg->purged)
		return;
	if (msg->error == 0)
		tally.sent++;
	else
	{
		/* Copied: the batch may be let go before the loop publishes it. */
		tally.failed++;
		strlcpy(tally_error,
				msg->error_text ? msg->error_text : "delivery failed",
				sizeof(tally_error));
		tally.error = tally_error;
	}
	if (attempts > 0)
		tally.retried++;
}

/*
 * relay_flight_take_tally: what was counted since the last call.
 */
RelayTally
relay_flight_take_tally(void)
{
	RelayTally taken = tally;

	memset(&tally, 0, sizeof(tally));
	return taken;
}

/*
 * say_stuck: say once (again after STUCK_REPEAT_MS) that events of topic
 * wait for Kafka while other topics go on, with what the cluster reports
 * for the topic if it reports anything; relay_status() shows it too.  A
 * topic that does not exist is said once for as long as it is missing,
 * by event_state.c, and named so here.
 */
static void
say_stuck(const char *topic, uint64 hash, const char *then)
{
	TimestampTz now = GetCurrentTimestamp();
	bool found;
	TimestampTz *last =
		(TimestampTz *) ((char *) hash_search(said, &hash, HASH_ENTER, &found) +
						 sizeof(uint64));
	char reported[256];

	if (found && !TimestampDifferenceExceeds(*last, now, STUCK_REPEAT_MS))
		return;
	*last = now;
	if (outbox_kafka_topic_missing(topic))
	{
		strlcpy(stuck_reason,
				relay_topic_missing_text(topic, outbox_missing_topic_dead),
				sizeof(stuck_reason));
		relay_say_topic_missing(topic, outbox_missing_topic_dead);
		tally.error = stuck_reason;
		return;
	}
	if (outbox_kafka_topic_refused(topic, reported, sizeof(reported)))
		snprintf(stuck_reason, sizeof(stuck_reason),
				 "events of topic \"%.249s\" are stuck: the cluster reports %s",
				 topic, reported);
	else
		snprintf(
			stuck_reason, sizeof(stuck_reason),
			"events of topic \"%.249s\" are stuck: not acknowledged within %d ms while later events were",
			topic, HANDOVER_MS);
	ereport(
		LOG,
		(errmsg("outbox relay: %s", stuck_reason), errdetail_internal("%s", then),
		 errhint(
			 "See outbox.events and outbox.stats.retrying; a topic the cluster refuses makes its events dead after outbox.max_attempts.")));
	tally.error = stuck_reason;
}

/*
 * drop_messages: events from onwards of batch not yet recorded (and, with
 * handed_too, the handed-over ones) are given up.
 */
static void
drop_messages(RelayBatch *batch, int from, bool handed_too)
{
	for (int i = from; i < batch->count; i++)
	{
		if (batch->fate[i] == FATE_IN_BATCH || batch->fate[i] == FATE_HELD)
			batch->fate[i] = FATE_DROPPED;
		else if (handed_too && batch->fate[i] == FATE_HANDED)
		{
			unstick(batch, i);
			batch->fate[i] = FATE_DROPPED;
		}
	}
}

/*
 * let_go: free a batch out of the queue, or keep it lingering while Kafka
 * owes answers for it.
 */
static void
let_go(RelayBatch *batch)
{
	if (batch->admitted)
		unrecorded -= batch->count;
	batch->admitted = false;
	if (freeable(batch))
		relay_batch_free(batch);
	else
		dlist_push_tail(&lingering, &batch->node);
}

/*
 * freeable: whether nothing of batch is in flight or left to record.
 */
static bool
freeable(const RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		if (batch->fate[i] == FATE_HANDED ||
			(batch->msgs[i].queued && !batch->msgs[i].done))
			return false;
	}
	return true;
}

/*
 * unstick: event i of batch, handed over, is recorded (or dropped): its
 * topic waits for one fewer.
 */
static void
unstick(RelayBatch *batch, int i)
{
	uint64 hash = relay_topic_hash(batch->msgs[i].topic);
	bool found;
	StuckTopic *topic = hash_search(stuck, &hash, HASH_FIND, &found);

	batch->fate[i] = FATE_SETTLED;
	unrecorded--;
	if (found && --topic->waiting <= 0 && topic->held_until == 0)
		(void) hash_search(stuck, &hash, HASH_REMOVE, NULL);
}
