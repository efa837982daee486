/*
 * exactly_once.c
 *		outbox.delivery = exactly_once: what one round reads is sent in one
 *		Kafka transaction, with a record of the progress it makes.
 *
 * A round begins a transaction before it reads (retries, then first
 * sends), and nothing more is read until that transaction is over.  Once
 * it has read, the relay adds a record to the progress topic
 * (kafka_txn.c), keyed by its transactional.id: the place
 * outbox.relay_cursor holds ("from"), the place the round's first sends
 * reach ("to"), the retries it sent ("sent") and the events it held back
 * behind an earlier one of their key ("held"), as one line:
 *
 *	 outbox progress 1; database OID; proof TOKEN; timeline TLI; wal LSN;
 *	 from PLACE; to PLACE; sent ID ...; held ID ...
 *
 * (PLACE as relay_pos_text writes it; TLI and LSN, in decimal, where this
 * server's WAL was when it wrote the record).  Once Kafka has answered for
 * every event of the round, the relay commits;
 * only after the commit is the progress recorded in PostgreSQL, as in
 * at_least_once, and only after that does the next transaction begin.  So
 * at most the latest committed transaction is not recorded, and its record
 * says how to record it:
 *
 * At every start of a producer, before anything is read, the relay calls
 * init_transactions (which fences any older producer of its id and aborts
 * what that one left open), reads its latest record (read_committed), and
 * if outbox.relay_cursor is still at "from", moves it to "to" and records
 * "sent" and "held", provided this server's WAL history holds the
 * record's WAL position (in_history).  A cursor at "to" is in step.  A cursor anywhere else
 * (a restored database, a standby that lost commits in a failover, a
 * progress topic emptied by hand) is kept, and said: what follows it may
 * go again, never a loss.
 *
 * An event the broker refuses, or that stays unanswered while later ones
 * are acknowledged (a stuck partition, see flight.c), aborts the
 * transaction: read_committed consumers see nothing of it.  The event is
 * recorded as failed (backoff, then dead as in at_least_once) and the rest
 * is read again, the later events of its key held behind it.  After a
 * stuck one, every event of its topic is held until it is due again
 * (flight.c): otherwise each later transaction carrying one would stall
 * the other topics in turn.  A failure for the broker's sake aborts too,
 * and the relay backs off.
 *
 * A record is taken only if it carries the proof of this very relay and
 * names this database (sender.c; progress_record.c takes it apart): a
 * record a copy of the cluster wrote, one forged by a tenant of another
 * database, or a damaged one moves nothing and marks nothing sent; it is
 * said once, and what follows the cursor may go again, never a loss.
 *
 * A producer fenced by another with the same transactional.id (a copy
 * whose place looks the same, see sender.c) stops, and the relay sends
 * nothing more until a reload: starting again would fence the newer relay
 * in turn.
 *
 * src/exactly_once.c
 */
#include "postgres.h"

#include "access/timeline.h"
#include "access/xlog.h"
#include "commands/dbcommands.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "progress_record.h"
#include "relay.h"

/* Longest one call to Kafka's coordinator makes the loop wait. */
#define TXN_STEP_MS 200

/* Topics asked about when a whole round failed (blame_topics). */
#define BLAME_TOPICS 4

/* Longest a read of the progress topic makes the loop wait. */
#define PROGRESS_READ_MS 5000

/* How long transactions may not start before the relay says why. */
#define PATIENCE_MS 15000

/* How often a refusal for want of an ACL is said again while it lasts. */
#define REFUSAL_REPEAT_MS 60000

/*
 * How long after a commit the next transaction begins, at the soonest.
 * The coordinator answers a commit before it has written the markers that
 * end it; until then it refuses to add partitions to the next transaction
 * (CONCURRENT_TRANSACTIONS), and librdkafka asks again only 20 ms later, a
 * fixed wait.  A relay sending 1,000 events/s on loopback met it in 0.1%
 * to 29% of its transactions when each round began at once (a warm and a
 * cold broker), and in at most 0.4% with 1.5 or 3 ms between (measured
 * 2026-12-06): a few ms against 20.
 */
#define AFTER_COMMIT_MS 2

/* Batches one round sends, at most: retries and first sends. */
#define MAX_BATCHES 8

typedef enum EosState
{
	EOS_INIT,      /* a new producer: fence, read progress, catch up */
	EOS_IDLE,      /* nothing in flight: a round may begin a transaction */
	EOS_READING,   /* the round that began it reads */
	EOS_OPEN,      /* sent: waiting for Kafka's answers, then commit */
	EOS_ABORTING,  /* aborting; what failed is recorded */
	EOS_COMMITTED, /* committed: the round's batches may be recorded */
	EOS_HALTED,    /* fenced: nothing until a reload (relay_eos_halted) */
	EOS_BROKEN     /* a new producer is needed (relay_eos_broken) */
} EosState;

static bool active = false;
static EosState state = EOS_IDLE;
static MemoryContext eos_memory = NULL; /* reset at every transaction */
static char *progress_found = NULL;     /* read at start, not yet applied */
static uint64 failures_at_begin = 0;    /* outbox_kafka_failures() then */
static uint64 acked_at_begin = 0;       /* outbox_kafka_acked_seq() then */
static TimestampTz ending_since = 0;    /* a commit or abort unfinished */
static bool said_slow = false;          /* ... and said so */
static bool progress_read = false;
/* The start waits for the progress topic, not for init_transactions. */
static bool progress_reading = false;
static TimestampTz init_since = 0;
static bool said_waiting = false;
static bool said_foreign = false; /* records not this relay's were found */
static int foreign_found = 0;     /* ... how many, at the latest read */
static bool abort_unreachable = false; /* the abort was for the broker's sake */
static bool progress_queued = false;
static TimestampTz begin_at = 0; /* no transaction begins before */
static OutboxMessage progress_msg;
static char halted_reason[OUTBOX_ERROR_LEN];
/* The latest start refused by an ACL (the id, or the progress topic's). */
static bool start_refused = false;
static TimestampTz id_refused_said = 0;
static TimestampTz create_refused_said = 0;
/* The progress record refused: no transaction before the backoff ends. */
static TimestampTz progress_refused_until = 0;
static int progress_refused_ms = 0;
static TimestampTz progress_refused_said = 0;
static char progress_refused_text[OUTBOX_ERROR_LEN];

static bool prepare(TimestampTz now);
static bool catch_up(void);
static bool in_history(const ProgressRecord *p);
static void move_cursor(const ProgressRecord *p);
static const char *const *proof_marks(void);
static void say_foreign(void);
static char *progress_key_shown(void);
static bool finish(TimestampTz now);
static int in_flight(RelayBatch **out);
static void judge_flight(TimestampTz now, bool *answered, bool *failed,
						 bool *stuck);
static void record_failures(TimestampTz now);
static bool batch_stuck(const RelayBatch *b, TimestampTz now);
static bool blame_topics(RelayBatch **batches, int n);
static void hold_topic(const RelayBatch *b, int i, TimestampTz now);
static void tally_failures(void);
static bool commit(void);
static bool abort_txn(bool *unreachable);
static bool queue_progress(void);
static char *progress_text(void);
static void add_ids(StringInfo buf, const char *label, RelayBatch *batch,
					bool held);
static void give_up(const char *what, const char *why, KafkaTxnResult result);
static void ending(KafkaTxnResult result, const char *doing, const char *why);
static void wait_said(TimestampTz now, const char *why);
static void say_id_refused(TimestampTz now, const char *why);
static void say_create_refused(TimestampTz now, const char *why);
static bool repeat_due(TimestampTz *said, TimestampTz now);
static bool progress_refused(const char *why);

/*
 * relay_eos_transactional_id: the transactional.id of this database's
 * relay in exactly_once, also the key of its progress records: "outbox-",
 * the cluster's system identifier, the database's OID and the relay's
 * sender number (sender.c), which a copy of the cluster running elsewhere
 * does not share.
 */
char *
relay_eos_transactional_id(void)
{
	return psprintf("outbox-" UINT64_FORMAT "-%u-" INT64_FORMAT,
					GetSystemIdentifier(), MyDatabaseId, relay_sender());
}

/*
 * relay_eos_restart: a producer was made, transactional or not; what the
 * last one did is forgotten.
 */
void
relay_eos_restart(bool transactional)
{
	active = transactional;
	state = transactional ? EOS_INIT : EOS_IDLE;
	progress_read = false;
	progress_queued = false;
	init_since = 0;
	said_waiting = false;
	said_foreign = false;
	foreign_found = 0;
	ending_since = 0;
	said_slow = false;
	halted_reason[0] = '\0';
	progress_refused_until = 0;
	progress_refused_ms = 0;
	if (!transactional)
		start_refused = false;
	if (eos_memory == NULL)
		eos_memory = AllocSetContextCreate(TopMemoryContext,
										   "outbox relay exactly once",
										   ALLOCSET_SMALL_SIZES);
}

/*
 * relay_eos_halted: why the relay cannot go on until a reload, or NULL.
 */
const char *
relay_eos_halted(void)
{
	return state == EOS_HALTED ? halted_reason : NULL;
}

/*
 * relay_eos_broken: why this producer cannot go on (a new one can), or
 * NULL.
 */
const char *
relay_eos_broken(void)
{
	return state == EOS_BROKEN ? halted_reason : NULL;
}

/*
 * relay_eos_waiting: whether a new producer's start waits for Kafka's
 * transactions longer than it should (said in the log).
 */
bool
relay_eos_waiting(void)
{
	return active && ((state == EOS_INIT && (said_waiting || start_refused)) ||
					  progress_refused_until != 0);
}

/*
 * relay_eos_refused: whether the latest producer's start was refused by
 * an ACL (its transactional.id, or the progress topic it would create;
 * said in the log), so that a new one waits for an ACL, not for the
 * broker.  A refused read of the progress topic waits instead (wait_said).
 */
bool
relay_eos_refused(void)
{
	return active && start_refused;
}

/*
 * relay_eos_tend: the transaction's next step, if it has one: a new
 * producer's start, the commit or abort of what the round sent.  True if
 * it did something.
 */
bool
relay_eos_tend(TimestampTz now, bool *unreachable)
{
	if (!active)
		return false;
	switch (state)
	{
		case EOS_INIT:
			return prepare(now);
		case EOS_OPEN:
			return finish(now);
		case EOS_ABORTING:
			return abort_txn(unreachable);
		case EOS_COMMITTED:
			if (relay_flight_empty())
				state = EOS_IDLE;
			return false;
		default:
			return false;
	}
}

/*
 * relay_eos_may_read: whether a read may send now: always in
 * at_least_once; in exactly_once once nothing is in flight, beginning a
 * transaction, and again within the round that began it.
 */
bool
relay_eos_may_read(void)
{
	char why[256];
	KafkaTxnResult result;
	TimestampTz now;

	if (!active || state == EOS_READING)
		return true;
	if (state != EOS_IDLE || !relay_flight_empty())
		return false;
	now = GetCurrentTimestamp();
	if (now < begin_at)
		return false; /* the loop waits until then (relay_eos_begin_at) */
	if (progress_refused_until != 0 && now < progress_refused_until)
	{
		/* Over librdkafka's words, which do not name the topic. */
		outbox_status_error(progress_refused_text);
		return false;
	}
	result = outbox_kafka_txn_begin(why, sizeof(why));
	if (result == KAFKA_TXN_DONE)
	{
		state = EOS_READING;
		failures_at_begin = outbox_kafka_failures();
		acked_at_begin = outbox_kafka_acked_seq();
		MemoryContextReset(eos_memory);
		return true;
	}
	if (result == KAFKA_TXN_FENCED || result == KAFKA_TXN_FAILED)
		give_up("could not begin a Kafka transaction", why, result);
	return false;
}

/*
 * relay_eos_reads_more: whether the round may read another batch of first
 * sends into its transaction.  A Kafka transaction costs about the same
 * whatever it holds (its begin, the progress record, the commit's round
 * trips to the coordinator), so a backlog fills it: up to the batches a
 * round keeps, and the flight's room (outbox.max_in_flight_events and
 * _size: relay_first_sends_read reads nothing once it is full).
 */
bool
relay_eos_reads_more(void)
{
	int n = 0;

	if (!active || state != EOS_READING)
		return false;
	for (RelayBatch *b = relay_flight_head(); b != NULL;
		 b = relay_flight_next(b))
		n++;
	/* One slot of MAX_BATCHES is the retries'. */
	return n < MAX_BATCHES - 1;
}

/*
 * relay_eos_reads_done: the round's reads are over: a transaction that
 * sent nothing ends here (librdkafka commits it without a round trip).
 * One that sent takes its progress record now, not once Kafka answered:
 * what the record says is settled by the reads (a failure aborts it with
 * the rest), and sent beside the events, its partition joins the
 * transaction in the same call to the coordinator and its write overlaps
 * theirs, where afterwards each would be one more round trip before the
 * commit.
 */
void
relay_eos_reads_done(void)
{
	char why[256];

	if (!active || state != EOS_READING)
		return;
	/* Committed, or aborted, by relay_eos_tend unless it ends here. */
	state = EOS_OPEN;
	if (!relay_flight_empty())
		(void) queue_progress(); /* else commit() queues it */
	else if (outbox_kafka_txn_commit(TXN_STEP_MS, why, sizeof(why)) ==
			 KAFKA_TXN_DONE)
		state = EOS_IDLE;
}

/*
 * relay_eos_abandon: a round was given up half way (an error in a step):
 * what its transaction holds may be only part of what it read, and is
 * aborted, never committed.
 */
void
relay_eos_abandon(void)
{
	if (active && (state == EOS_READING || state == EOS_OPEN))
	{
		abort_unreachable = false;
		state = EOS_ABORTING;
	}
}

/*
 * relay_eos_begin_at: when the next transaction may begin (after the last
 * commit, AFTER_COMMIT_MS); 0 outside exactly_once.
 */
TimestampTz
relay_eos_begin_at(void)
{
	return active ? begin_at : 0;
}

/*
 * relay_eos_may_settle: whether the batches in flight may be recorded:
 * in exactly_once only once their transaction is committed.
 */
bool
relay_eos_may_settle(void)
{
	return !active || state == EOS_COMMITTED;
}

/*
 * prepare: a new producer's start: fence the older ones, read the latest
 * progress, bring outbox.relay_cursor up to it.  Each part waits a bounded
 * time and is tried again next round if it did not finish.
 */
static bool
prepare(TimestampTz now)
{
	char why[512];
	KafkaTxnResult result;

	if (init_since == 0)
		init_since = now;
	pgstat_report_activity(
		STATE_RUNNING, "initializing Kafka transactions (init_transactions)");
	result = outbox_kafka_txn_init(TXN_STEP_MS, why, sizeof(why));
	progress_reading = result == KAFKA_TXN_DONE && !progress_read;
	if (progress_reading)
	{
		char *id = relay_eos_transactional_id();
		char *found = NULL;

		pgstat_report_activity(STATE_RUNNING, "reading the progress topic");
		if (progress_found != NULL)
			pfree(progress_found);
		progress_found = NULL;
		result = outbox_kafka_progress_read(
			outbox_kafka_brokers, outbox_kafka_properties,
			outbox_progress_topic, id, proof_marks(), PROGRESS_READ_MS, &found,
			&foreign_found, why, sizeof(why));
		pfree(id);
		if (found != NULL)
		{
			/* Kept until applied, across rounds. */
			progress_found = MemoryContextStrdup(TopMemoryContext, found);
			pfree(found);
		}
		progress_read = result == KAFKA_TXN_DONE;
	}
	if (result == KAFKA_TXN_FENCED || result == KAFKA_TXN_FAILED)
	{
		/*
		 * A refused read of the progress topic waits (wait_said); a topic
		 * refused here is the progress topic the start would create.
		 */
		if (outbox_kafka_txn_refusal() == KAFKA_TXN_REFUSED_TRANSACTIONAL_ID)
			say_id_refused(now, why);
		else if (outbox_kafka_txn_refusal() == KAFKA_TXN_REFUSED_TOPIC)
			say_create_refused(now, why);
		start_refused = outbox_kafka_txn_refusal() != KAFKA_TXN_ALLOWED;
		give_up("cannot use Kafka transactions", why, result);
		return false;
	}
	if (result != KAFKA_TXN_DONE)
	{
		wait_said(now, why);
		return false;
	}
	start_refused = false;
	id_refused_said = create_refused_said = 0;
	if (!catch_up())
		return false;
	say_foreign();
	if (said_waiting)
		ereport(LOG, (errmsg("outbox relay: Kafka transactions are ready")));
	state = EOS_IDLE;
	init_since = 0;
	said_waiting = false;
	return true;
}

/*
 * catch_up: record what the latest committed transaction did, if
 * outbox.relay_cursor does not have it yet (see the top of this file);
 * then store the proof this producer's records carry.
 */
static bool
catch_up(void)
{
	ProgressRecord p = {0};
	char *text = progress_found ? pstrdup(progress_found) : NULL;
	const char *proofs[3] = {relay_sender_proof(), relay_sender_proof_seen(),
							 NULL};
	char token[64];

	if (!relay_begin("catching up with the progress Kafka committed"))
		return false;
	if (text != NULL && !progress_record_parse(text, MyDatabaseId, proofs, &p))
	{
		/* Nothing of a record that is not this relay's is trusted. */
		memset(&p, 0, sizeof(p));
		foreign_found++;
	}
	if (p.proof != NULL && !in_history(&p))
		memset(&p, 0, sizeof(p));
	if (p.from != NULL)
		move_cursor(&p);
	if (p.nsent > 0)
		relay_mark_sent(p.sent, p.nsent);
	relay_sender_new_proof(token, p.proof);
	relay_commit();
	relay_sender_proof_committed(token, p.proof);
	relay_first_sends_restart();
	if (progress_found != NULL)
		pfree(progress_found);
	progress_found = NULL;
	return true;
}

/*
 * in_history: whether this server's WAL holds what the WAL of the server
 * that wrote this relay's record p held then: its timeline, up to its
 * insert position, is in this server's history.  The record's "to" says
 * which transactions are done by ids of that server; a standby promoted
 * behind it, or a server restored to before it, hands out those ids again
 * for new transactions, which the cursor moved to "to" would skip.  A
 * record of 0.2.0 says nothing and is taken: it was written before the
 * update, by this server.  Otherwise the record is said and ignored: what
 * follows the cursor may go again, never a loss.
 */
static bool
in_history(const ProgressRecord *p)
{
	TimeLineID timeline = GetWALInsertionTimeLine();
	XLogRecPtr until = GetXLogInsertRecPtr();

	if (p->timeline == 0)
		return true;
	if (p->timeline != timeline)
	{
		List *history = readTimeLineHistory(timeline);

		until = tliInHistory(p->timeline, history)
					? tliSwitchPoint(p->timeline, history, NULL)
					: InvalidXLogRecPtr;
	}
	if (p->wal <= until)
		return true;
	ereport(
		WARNING,
		(errmsg("outbox relay: the latest committed Kafka transaction was made by a server whose history this one does not share"),
		 errdetail(
			 "It was recorded at WAL %X/%X of timeline %u; this server is on timeline %u, and holds that timeline's WAL only up to %X/%X. "
			 "outbox.relay_cursor is kept: events after it may be sent again.",
			 LSN_FORMAT_ARGS((XLogRecPtr) p->wal), p->timeline, timeline,
			 LSN_FORMAT_ARGS(until)),
		 errhint(
			 "Make consumers claim events with outbox.claim, which refuses an event applied before.")));
	return false;
}

/*
 * move_cursor: the latest committed transaction's record p is this
 * relay's: bring outbox.relay_cursor to its end if it is still at its
 * start.  Inside relay_begin.
 */
static void
move_cursor(const ProgressRecord *p)
{
	char *place = relay_first_sends_place();

	if (strcmp(place, p->to) == 0)
		return;
	if (strcmp(place, p->from) == 0 && relay_first_sends_move(p->to))
	{
		for (int i = 0; i < p->nheld; i++)
			relay_set_state(p->held[i], "new", 0, 0, NULL);
		ereport(
			LOG,
			(errmsg("outbox relay: the latest Kafka transaction was committed but not recorded"),
			 errdetail(
				 "outbox.relay_cursor was moved to the transaction's end, so that its events are not sent again.")));
		return;
	}
	ereport(
		WARNING,
		(errmsg("outbox relay: outbox.relay_cursor is not where the latest committed Kafka transaction began or ended"),
		 errdetail(
			 "The cursor is kept: %s; the transaction went from %s to %s. "
			 "After a restore or a failover that lost commits, events after the cursor may be sent again.",
			 place, p->from, p->to),
		 errhint(
			 "Make consumers claim events with outbox.claim, which refuses an event applied before.")));
}

/*
 * proof_marks: the texts a record of this relay carries ("; proof TOKEN",
 * for the current token and the one of its latest record found), as a
 * NULL-terminated list.
 */
static const char *const *
proof_marks(void)
{
	const char **marks = palloc0(sizeof(char *) * 3);
	const char *tokens[2] = {relay_sender_proof(), relay_sender_proof_seen()};
	int n = 0;

	for (int i = 0; i < 2; i++)
	{
		if (tokens[i][0] != '\0')
			marks[n++] = psprintf("; proof %s", tokens[i]);
	}
	return marks;
}

/*
 * say_foreign: records under this relay's key that it did not write (a
 * copy of the cluster sending as this database, a forged or damaged
 * record) are ignored; say so once per producer, in the log and in
 * relay_status().
 */
static void
say_foreign(void)
{
	char text[OUTBOX_ERROR_LEN];

	if (foreign_found == 0 || said_foreign)
		return;
	said_foreign = true;
	snprintf(
		text, sizeof(text),
		foreign_found == 1
			? "ignored %d record of progress topic \"%s\" that this relay did not write"
			: "ignored %d records of progress topic \"%s\" that this relay did not write",
		foreign_found, outbox_progress_topic);
	outbox_status_error(text);
	ereport(
		WARNING,
		(errmsg_plural(
			 "outbox relay: ignored %d record of progress topic \"%s\" that this relay did not write",
			 "outbox relay: ignored %d records of progress topic \"%s\" that this relay did not write",
			 foreign_found, foreign_found, outbox_progress_topic),
		 errdetail(
			 "They are under this relay's key (%s) but do not carry its proof: another server sending as this database's relay, a record written to the topic by hand, or a damaged one. None moves the cursor or marks an event sent; events after the cursor may be sent again.",
			 progress_key_shown()),
		 errhint(
			 "Make sure no other server runs a copy of this cluster against the same Kafka cluster with the same host name, port and data directory, and that only the relay's principal may write to the progress topic.")));
}

/*
 * progress_key_shown: this relay's progress key, for a message.
 */
static char *
progress_key_shown(void)
{
	return relay_eos_transactional_id();
}

/*
 * finish: once Kafka answered for everything the round sent, commit; as
 * soon as an event failed or is stuck, abort.
 */
static bool
finish(TimestampTz now)
{
	bool answered;
	bool failed;
	bool stuck;

	judge_flight(now, &answered, &failed, &stuck);
	if (failed || stuck)
	{
		if (!relay_begin("recording failed events in outbox.event_state"))
			return false;
		record_failures(now);
		relay_commit();
		tally_failures();
		state = EOS_ABORTING;
		return true;
	}
	if (!answered)
		return false;
	return commit();
}

/*
 * in_flight: the batches the round sent (at most MAX_BATCHES: a round
 * reads one batch of retries and the rest are first sends, see
 * relay_eos_reads_more).
 */
static int
in_flight(RelayBatch **out)
{
	int n = 0;

	for (RelayBatch *b = relay_flight_head(); b != NULL && n < MAX_BATCHES - 1;
		 b = relay_flight_next(b))
		out[n++] = b;
	if (relay_flight_retry() != NULL)
		out[n++] = relay_flight_retry();
	return n;
}

/*
 * judge_flight: whether Kafka answered for every event in flight, whether
 * one failed, and whether one is stuck (unanswered while a later one was
 * acknowledged, for long: flight.c).  A failure for the broker's sake
 * alone makes the abort one (abort_unreachable).
 */
static void
judge_flight(TimestampTz now, bool *answered, bool *failed, bool *stuck)
{
	RelayBatch *batches[MAX_BATCHES];
	int n = in_flight(batches);

	*answered = true;
	*failed = false;
	*stuck = false;
	abort_unreachable = true;
	for (int k = 0; k < n; k++)
	{
		RelayBatch *b = batches[k];

		if (!relay_batch_all_answered(b))
		{
			*answered = false;
			*stuck |= batch_stuck(b, now);
		}
		/* Called at each wake-up: look for failures only if there are. */
		if (outbox_kafka_failures() == failures_at_begin)
			continue;
		for (int i = 0; i < b->count; i++)
		{
			OutboxMessage *msg = &b->msgs[i];

			if (b->fate[i] != FATE_IN_BATCH || !msg->done || msg->error == 0)
				continue;
			*failed = true;
			abort_unreachable &= msg->transient;
		}
	}
	if (*failed && abort_unreachable && blame_topics(batches, n))
		abort_unreachable = false;
	if (*stuck)
		abort_unreachable = false;
}

/*
 * blame_topics: every event of the round failed for what librdkafka calls
 * a transient reason.  If the cluster reports an error for the topic of one
 * of them (not authorized, unknown: the coordinator then refuses to add
 * its partitions, and the whole transaction fails), the failure is that
 * topic's, not an outage: its events are marked refused, to be recorded
 * and their topic held (record_failures), and the rest goes on.  At most
 * BLAME_TOPICS topics are asked about (each answer is kept a while).
 */
static bool
blame_topics(RelayBatch **batches, int n)
{
	const char *asked[BLAME_TOPICS];
	int nasked = 0;
	bool blamed = false;
	char reported[256];

	for (int k = 0; k < n; k++)
	{
		for (int i = 0; i < batches[k]->count; i++)
		{
			OutboxMessage *msg = &batches[k]->msgs[i];
			bool seen = false;

			if (batches[k]->fate[i] != FATE_IN_BATCH || !msg->done ||
				msg->error == 0)
				continue;
			for (int a = 0; a < nasked && !seen; a++)
				seen = strcmp(asked[a], msg->topic) == 0;
			if (!seen && nasked == BLAME_TOPICS)
				continue;
			if (!seen)
				asked[nasked++] = msg->topic;
			if (outbox_kafka_topic_refused(msg->topic, reported,
										   sizeof(reported)))
			{
				msg->transient = false;
				msg->timed_out = true; /* failure_text: the cluster's report */
				blamed = true;
			}
		}
	}
	return blamed;
}

/*
 * batch_stuck: whether b's unanswered events are stuck (flight.c), by a
 * later acknowledgement or, when the round's events come last, by Kafka
 * answering for the others and falling silent.
 */
static bool
batch_stuck(const RelayBatch *b, TimestampTz now)
{
	return relay_flight_may_hand_over(b, now) ||
		   relay_flight_round_stuck(b, acked_at_begin, now);
}

/*
 * record_failures: the events the broker refused, failed once more; those
 * stuck, failed for the broker's sake (they come back after a backoff, and
 * hold their key meanwhile).  Inside relay_begin.
 */
static void
record_failures(TimestampTz now)
{
	RelayBatch *batches[MAX_BATCHES];
	int n = in_flight(batches);

	for (int k = 0; k < n; k++)
	{
		RelayBatch *b = batches[k];
		bool stuck = !relay_batch_all_answered(b) && batch_stuck(b, now);

		for (int i = 0; i < b->count; i++)
		{
			OutboxMessage *msg = &b->msgs[i];

			if (b->fate[i] != FATE_IN_BATCH)
				continue;
			if (msg->done && msg->error != 0 && !msg->transient)
			{
				relay_record_failure(b, i);
				/* blame_topics, or a topic that does not exist (yet) */
				if (msg->timed_out || msg->topic_unknown)
					hold_topic(b, i, now);
			}
			else if (stuck && !relay_batch_answered(b, i))
			{
				msg->error = OUTBOX_KAFKA_GAVE_UP;
				msg->transient = true;
				msg->timed_out = true;
				msg->error_text =
					"not acknowledged in time while later events were "
					"(the Kafka transaction was aborted)";
				relay_record_failure(b, i);
				hold_topic(b, i, now);
			}
		}
	}
}

/*
 * hold_topic: event i of b is stuck, or refused for its topic's sake: the
 * topic's events are held until it is due again (flight.c).
 */
static void
hold_topic(const RelayBatch *b, int i, TimestampTz now)
{
	int backoff = relay_backoff_ms(&b->settings, b->attempts[i] + 1);

	relay_flight_hold_topic(b->msgs[i].topic,
							TimestampTzPlusMilliseconds(now, backoff));
}

/*
 * tally_failures: count, for relay_status(), the failures record_failures
 * recorded.
 */
static void
tally_failures(void)
{
	RelayBatch *batches[MAX_BATCHES];
	int n = in_flight(batches);

	for (int k = 0; k < n; k++)
	{
		for (int i = 0; i < batches[k]->count; i++)
		{
			OutboxMessage *msg = &batches[k]->msgs[i];

			if (batches[k]->fate[i] == FATE_IN_BATCH && msg->error != 0 &&
				(msg->done || msg->error == OUTBOX_KAFKA_GAVE_UP))
				relay_tally(msg, batches[k]->attempts[i]);
		}
	}
}

/*
 * commit: add the progress record to the transaction and commit it.
 */
static bool
commit(void)
{
	char why[512];
	KafkaTxnResult result;

	if (!progress_queued && !queue_progress())
		return false;
	pgstat_report_activity(STATE_RUNNING, "committing a Kafka transaction");
	result = outbox_kafka_txn_commit(TXN_STEP_MS, why, sizeof(why));
	ending(result, "committing", why);
	switch (result)
	{
		case KAFKA_TXN_DONE:
			progress_queued = false;
			state = EOS_COMMITTED;
			begin_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												   AFTER_COMMIT_MS);
			progress_refused_until = 0;
			progress_refused_ms = 0;
			progress_refused_said = 0;
			break;
		case KAFKA_TXN_AGAIN:
			break;
		case KAFKA_TXN_ABORT:
			abort_unreachable = !progress_refused(why);
			state = EOS_ABORTING;
			break;
		default:
			give_up("could not commit a Kafka transaction", why, result);
	}
	return true;
}

/*
 * abort_txn: abort the round's transaction; then what it sent is read
 * again (what failed was recorded first).
 */
static bool
abort_txn(bool *unreachable)
{
	char why[512];
	KafkaTxnResult result;

	pgstat_report_activity(STATE_RUNNING, "aborting a Kafka transaction");
	result = outbox_kafka_txn_abort(TXN_STEP_MS, why, sizeof(why));
	ending(result, "aborting", why);
	if (result == KAFKA_TXN_AGAIN)
		return true;
	if (result != KAFKA_TXN_DONE)
	{
		give_up("could not abort a Kafka transaction", why, result);
		return true;
	}
	relay_flight_drop_all(false);
	relay_first_sends_restart();
	progress_queued = false;
	state = EOS_IDLE;
	*unreachable |= abort_unreachable;
	return true;
}

/*
 * queue_progress: send the progress record in the open transaction; false
 * if librdkafka's queue is full (tried again next round).
 */
static bool
queue_progress(void)
{
	MemoryContext old = MemoryContextSwitchTo(eos_memory);

	memset(&progress_msg, 0, sizeof(progress_msg));
	progress_msg.topic = pstrdup(outbox_progress_topic);
	progress_msg.key = relay_eos_transactional_id();
	progress_msg.key_len = strlen(progress_msg.key);
	progress_msg.value = progress_text();
	progress_msg.value_len = strlen(progress_msg.value);
	progress_msg.progress = true;
	MemoryContextSwitchTo(old);
	switch (outbox_kafka_send(&progress_msg))
	{
		case KAFKA_FULL:
			return false;
		case KAFKA_REFUSED:
			/* The commit fails, and the transaction is aborted. */
		case KAFKA_QUEUED:
			break;
	}
	outbox_kafka_push();
	progress_queued = true;
	return true;
}

/*
 * progress_text: the record of what the round's transaction does (see the
 * top of this file).
 */
static char *
progress_text(void)
{
	RelayBatch *batches[MAX_BATCHES];
	int n = in_flight(batches);
	RelayBatch *first_sends = NULL;
	StringInfoData buf;
	char *from = relay_first_sends_recorded();

	initStringInfo(&buf);
	appendStringInfo(&buf,
					 PROGRESS_FORMAT "; database %u; proof %s; timeline %u"
									 "; wal " UINT64_FORMAT,
					 MyDatabaseId, relay_sender_proof(),
					 GetWALInsertionTimeLine(), (uint64) GetXLogInsertRecPtr());
	for (int k = 0; k < n; k++)
	{
		if (!batches[k]->retry)
			first_sends = batches[k];
	}
	if (first_sends != NULL && from != NULL)
		appendStringInfo(&buf, "; from %s; to %s", from,
						 relay_pos_text(&first_sends->after));
	for (int k = 0; k < n; k++)
		add_ids(&buf, batches[k]->retry ? "sent" : "held", batches[k],
				!batches[k]->retry);
	return buf.data;
}

/*
 * add_ids: a line of the ids of batch's events sent in it (or held back
 * from it), if it has any.
 */
static void
add_ids(StringInfo buf, const char *label, RelayBatch *batch, bool held)
{
	bool any = false;

	for (int i = 0; i < batch->count; i++)
	{
		bool wanted =
			held ? batch->fate[i] == FATE_HELD
				 : batch->fate[i] == FATE_IN_BATCH && batch->msgs[i].queued;

		if (!wanted)
			continue;
		if (!any)
			appendStringInfo(buf, "; %s", label);
		appendStringInfo(buf, " " INT64_FORMAT, batch->msgs[i].event_id);
		any = true;
	}
}

/*
 * ending: a step of a commit or abort returned result.  One that Kafka
 * has not finished after PATIENCE_MS is said once, with why: librdkafka
 * goes on trying, and the coordinator aborts a transaction left open after
 * transaction.timeout.ms (then the commit fails and the relay aborts).
 */
static void
ending(KafkaTxnResult result, const char *doing, const char *why)
{
	TimestampTz now = GetCurrentTimestamp();
	char text[OUTBOX_ERROR_LEN];

	if (result != KAFKA_TXN_AGAIN)
	{
		if (said_slow)
			ereport(LOG,
					(errmsg("outbox relay: Kafka finished %s the transaction",
							doing)));
		ending_since = 0;
		said_slow = false;
		return;
	}
	if (ending_since == 0)
		ending_since = now;
	if (said_slow || !TimestampDifferenceExceeds(ending_since, now, PATIENCE_MS))
		return;
	said_slow = true;
	snprintf(text, sizeof(text), "Kafka has not finished %s a transaction: %s",
			 doing, why);
	outbox_status_error(text);
	ereport(
		LOG,
		(errmsg("outbox relay: Kafka has not finished %s a transaction in %d s",
				doing, PATIENCE_MS / 1000),
		 errdetail(
			 "The cause Kafka gave: %s. The relay goes on trying; the coordinator aborts a transaction left open past transaction.timeout.ms.",
			 why),
		 errhint("Check the transaction coordinator's broker and its log.")));
}

/*
 * give_up: the relay cannot go on with this producer.  Fenced, it waits
 * for a reload (relay_eos_halted): a new producer would fence, in turn,
 * the relay that fenced this one.  Any other failure (an error librdkafka
 * made fatal, such as a coordinator answering INVALID_TXN_STATE after a
 * broker's restart) is this producer's: the loop makes a new one after a
 * backoff (relay_eos_broken), whose init_transactions ends what was open.
 */
static void
give_up(const char *what, const char *why, KafkaTxnResult result)
{
	snprintf(halted_reason, sizeof(halted_reason), "%s: %s", what, why);
	state = result == KAFKA_TXN_FENCED ? EOS_HALTED : EOS_BROKEN;
}

/*
 * wait_said: a new producer's start did not finish: after PATIENCE_MS,
 * say once why, and what to do.
 */
static void
wait_said(TimestampTz now, const char *why)
{
	char text[OUTBOX_ERROR_LEN];

	bool refused = outbox_kafka_txn_refusal() != KAFKA_TXN_ALLOWED;

	/* A refusal is the ACLs' answer: waiting would not change it. */
	if (said_waiting ||
		(!refused && !TimestampDifferenceExceeds(init_since, now, PATIENCE_MS)))
		return;
	said_waiting = true;
	if (progress_reading && refused)
	{
		snprintf(text, sizeof(text), "the progress topic cannot be read: %s",
				 why);
		outbox_status_error(text);
		ereport(
			LOG,
			(errmsg("outbox relay: the relay's principal may not read the progress topic \"%s\"",
					outbox_progress_topic),
			 errdetail(
				 "The cause Kafka gave: %s. In exactly_once the relay sends nothing before it has read where its last transaction ended.",
				 why),
			 errhint("Grant the relay's principal Read and Write on topic \"%s\" (Describe comes with them), or set outbox.delivery = at_least_once.",
					 outbox_progress_topic)));
		return;
	}
	if (progress_reading)
	{
		snprintf(text, sizeof(text), "the progress topic cannot be read: %s",
				 why);
		outbox_status_error(text);
		ereport(
			LOG,
			(errmsg("outbox relay: the progress topic \"%s\" could not be read within %d s",
					outbox_progress_topic, PATIENCE_MS / 1000),
			 errdetail(
				 "The cause Kafka gave: %s. In exactly_once the relay sends nothing before it has read where its last transaction ended.",
				 why),
			 errhint("Grant the relay's principal Read and Write on topic \"%s\" and Write on its transactional.id, or set outbox.delivery = at_least_once.",
					 outbox_progress_topic)));
		return;
	}
	snprintf(text, sizeof(text), "Kafka transactions cannot start: %s", why);
	outbox_status_error(text);
	ereport(
		LOG,
		(errmsg("outbox relay: outbox.delivery is exactly_once, but Kafka transactions could not start within %d s",
				PATIENCE_MS / 1000),
		 errdetail("The cause Kafka gave: %s.", why),
		 errhint(
			 "The cluster needs a transaction coordinator: transaction.state.log.replication.factor and transaction.state.log.min.isr must not exceed the brokers running; or set outbox.delivery = at_least_once.")));
}

/*
 * say_id_refused: the cluster refused the relay's principal its
 * transactional.id: say so, with the ACL that is missing, once a minute
 * while the refusal lasts (each new producer is refused again).
 */
static void
say_id_refused(TimestampTz now, const char *why)
{
	char *id;
	char cause[512];
	size_t len;

	if (!repeat_due(&id_refused_said, now))
		return;
	id = relay_eos_transactional_id();
	/* librdkafka ends this one with a period; the DETAIL adds its own. */
	strlcpy(cause, why, sizeof(cause));
	len = strlen(cause);
	while (len > 0 && cause[len - 1] == '.')
		cause[--len] = '\0';
	ereport(
		LOG,
		(errmsg("outbox relay: the relay's principal may not use transactional.id \"%s\"",
				id),
		 errdetail(
			 "The cause Kafka gave: %s. In exactly_once the relay sends nothing without it; it asks again with a new producer after a backoff.",
			 cause),
		 errhint("Grant the relay's principal Write on the transactional id \"%s\", or on every id beginning with \"outbox-\" (a prefixed ACL), or set outbox.delivery = at_least_once.",
				 id)));
	pfree(id);
}

/*
 * say_create_refused: the cluster refused to create the progress topic
 * for want of an ACL; said as say_id_refused is.
 */
static void
say_create_refused(TimestampTz now, const char *why)
{
	if (!repeat_due(&create_refused_said, now))
		return;
	ereport(
		LOG,
		(errmsg("outbox relay: the relay's principal may not create the progress topic \"%s\"",
				outbox_progress_topic),
		 errdetail(
			 "The cause Kafka gave: %s. In exactly_once the relay sends nothing before the topic exists; it asks again with a new producer after a backoff.",
			 why),
		 errhint("Create topic \"%s\" with one partition and cleanup.policy=compact, or grant the relay's principal Create on it, or set outbox.delivery = at_least_once.",
				 outbox_progress_topic)));
}

/*
 * repeat_due: whether a refusal last said at *said (0: never) is due to be
 * said again, REFUSAL_REPEAT_MS on; if so, *said becomes now.
 */
static bool
repeat_due(TimestampTz *said, TimestampTz now)
{
	if (*said != 0 && !TimestampDifferenceExceeds(*said, now, REFUSAL_REPEAT_MS))
		return false;
	*said = now;
	return true;
}

/*
 * progress_refused: a commit failed, for abort, with why.  Every event of
 * the round was acknowledged before the commit, so if the cluster refused
 * a topic, it is the progress topic, where the record was written last:
 * say so (once a minute while it lasts), and begin no transaction before
 * a backoff.  False if the failure is another's.
 */
static bool
progress_refused(const char *why)
{
	TimestampTz now = GetCurrentTimestamp();

	if (outbox_kafka_txn_refusal() != KAFKA_TXN_REFUSED_TOPIC)
		return false;
	progress_refused_ms = progress_refused_ms == 0
							  ? outbox_backoff_min
							  : Min(progress_refused_ms * 2, outbox_backoff_max);
	progress_refused_until =
		TimestampTzPlusMilliseconds(now, progress_refused_ms);
	snprintf(progress_refused_text, sizeof(progress_refused_text),
			 "the progress topic \"%s\" refused the record: %s",
			 outbox_progress_topic, why);
	outbox_status_error(progress_refused_text);
	if (progress_refused_said != 0 &&
		!TimestampDifferenceExceeds(progress_refused_said, now,
									REFUSAL_REPEAT_MS))
		return true;
	progress_refused_said = now;
	ereport(
		LOG,
		(errmsg("outbox relay: the relay's principal may not write to the progress topic \"%s\"",
				outbox_progress_topic),
		 errdetail(
			 "The cause Kafka gave: %s. Each transaction is aborted at its commit; its events are sent again after a backoff, and none is charged an attempt.",
			 why),
		 errhint("Grant the relay's principal Write and Read on topic \"%s\", or set outbox.delivery = at_least_once.",
				 outbox_progress_topic)));
	return true;
}
