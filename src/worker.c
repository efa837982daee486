/*
 * worker.c
 *		The relay worker: one process per relayed database, started by the
 *		launcher, looping over rounds of retries and first sends.
 *
 * The loop follows worker_spi: wait on the latch (set at commit by the
 * backends that enqueued, or by the poll timeout), reset it, serve
 * interrupts and reloads, then work.  An ERROR ends the process and the
 * launcher starts it again; since every round reads its place from the
 * tables, a restart anywhere loses nothing and repeats at most the batch
 * that was in flight.
 *
 * Only this loop applies a reload and starts or stops the producer: a
 * round that sees a reload coming ends early and leaves both to the loop,
 * so nothing below it ever holds a producer that is gone.  Every step's
 * lock waits are bounded (RELAY_LOCK_TIMEOUT_MS): a step that times out is
 * rolled back, shown as "waiting for lock", and tried again next round.
 *
 * src/worker.c
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/elog.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "kafka.h"
#include "outbox.h"
#include "relay.h"

/* Longest a relay statement waits for a lock an application may hold. */
#define RELAY_LOCK_TIMEOUT_MS 5000

/* Steps whose lock waits are said apart: relaying, retention, alert. */
#define RELAY_GUARDED_STEPS 4

PGDLLEXPORT void outbox_relay_main(Datum main_arg);

static MemoryContext round_context = NULL;
static char *used_brokers = NULL; /* settings the producer was made with */
static char *used_properties = NULL;
static bool wait_for_reload = false; /* settings unusable as they are */
static bool stalled = false;         /* said that Kafka does not acknowledge */
static const char *lock_waiting[RELAY_GUARDED_STEPS]; /* steps said waiting */

static void pin_settings(void);
static void apply_reload(void);
static bool producer_outdated(void);
static bool ensure_producer(void);
static void settle_producer(void);
static void round_step(void *arg);
static RelayOutcome relay_round(void);
static void lock_waited(const char *what, ErrorData *edata);
static void lock_got(const char *what);
static int pause_after(RelayOutcome outcome, int *unreachable_ms);
static void log_stall(bool now_stalled);
static void stop_producer(int code, Datum arg);
static void set_state(OutboxRelayState state);
static void log_start(void);

/*
 * outbox_relay_main: entry point of the relay process for the database
 * whose OID is main_arg.
 */
void
outbox_relay_main(Datum main_arg)
{
	int unreachable_ms = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg),
											  InvalidOid, 0);
	pin_settings();
	round_context = AllocSetContextCreate(
		TopMemoryContext, "outbox relay round", ALLOCSET_DEFAULT_SIZES);
	outbox_relay_attach();
	outbox_status_started();
	on_proc_exit(stop_producer, (Datum) 0);
	log_start();

	for (;;)
	{
		RelayOutcome outcome = RELAY_IDLE;
		int timeout;

		CHECK_FOR_INTERRUPTS();
		if (outbox_relay_held())
			proc_exit(0);
		if (ConfigReloadPending)
			apply_reload();
		if (producer_outdated())
			outbox_kafka_stop();
		if (ensure_producer() && !relay_guarded(round_step, &outcome, "relaying"))
			outcome = RELAY_LOCKED;
		settle_producer();
		outbox_kafka_serve();
		outbox_status_broker(outbox_kafka_broker_state());
		if (outcome != RELAY_MORE && outcome != RELAY_INTERRUPTED)
			relay_housekeeping();

		timeout = pause_after(outcome, &unreachable_ms);
		if (timeout == 0)
			continue;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * pin_settings: settings every relay statement relies on, over whatever
 * postgresql.conf, ALTER DATABASE or ALTER ROLE set.  The relay runs as a
 * superuser in a database whose owner may not be one: the owner must not
 * reach its statements through search_path, nor stall or fail them
 * through timeouts or a read-only default.
 */
static void
pin_settings(void)
{
	char lock_timeout[32];

	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET,
					PGC_S_OVERRIDE);
	/* The window logic needs a fresh snapshot per statement. */
	SetConfigOption("default_transaction_isolation", "read committed",
					PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET,
					PGC_S_OVERRIDE);
	/* Never wait without bound on a lock an application holds. */
	snprintf(lock_timeout, sizeof(lock_timeout), "%d", RELAY_LOCK_TIMEOUT_MS);
	SetConfigOption("lock_timeout", lock_timeout, PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("statement_timeout", "0", PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * Every relay query reads a narrow index range of a large table.  Right
	 * after a burst of enqueues the statistics lag, and a sequential scan of
	 * the whole outbox can look cheaper to the planner; it never is.  JIT
	 * goes too: the penalty that steers away from sequential scans would
	 * otherwise make every relay query look worth compiling.
	 */
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * apply_reload: serve a pending reload; here only, between rounds.
 */
static void
apply_reload(void)
{
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	wait_for_reload = false;
}

/*
 * producer_outdated: whether the running producer was made with other
 * Kafka settings than the current ones.
 */
static bool
producer_outdated(void)
{
	if (!outbox_kafka_running())
		return false;
	return strcmp(used_brokers, outbox_kafka_brokers) != 0 ||
		   strcmp(used_properties, outbox_kafka_properties) != 0;
}

/*
 * settle_producer: after a round cut short (by a reload or an error), stop
 * the producer if messages are still unanswered.  librdkafka keeps
 * pointers to them, into the round's memory, until it is destroyed, so
 * this must come before the next round resets that memory.  Their events
 * were not recorded as sent: they go again.
 */
static void
settle_producer(void)
{
	if (outbox_kafka_running() && !outbox_kafka_wait(0))
		outbox_kafka_stop();
}

/*
 * relay_guarded: run step (what names it in the log); true if it ran to
 * its end.  If a statement in it gave up waiting for a lock (lock_timeout,
 * SQLSTATE 55P03), its transaction is rolled back, the wait is published
 * and said once, and false is returned: the loop goes on and the step is
 * tried again later.  Any other error propagates and ends the process.
 */
bool
relay_guarded(RelayStep step, void *arg, const char *what)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile bool done = true;

	PG_TRY();
	{
		step(arg);
	}
	PG_CATCH();
	{
		ErrorData *edata;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			PG_RE_THROW();
		HOLD_INTERRUPTS();
		AbortOutOfAnyTransaction();
		FlushErrorState();
		RESUME_INTERRUPTS();
		pgstat_report_activity(STATE_IDLE, NULL);
		lock_waited(what, edata);
		FreeErrorData(edata);
		done = false;
	}
	PG_END_TRY();
	if (done)
		lock_got(what);
	return done;
}

/*
 * lock_waited: publish that step what gave up waiting for a lock, and say
 * so in the log the first time since it last got its locks.
 */
static void
lock_waited(const char *what, ErrorData *edata)
{
	char error[OUTBOX_ERROR_LEN];
	int free_slot = -1;

	snprintf(error, sizeof(error), "waited over %d ms for a lock while %s",
			 RELAY_LOCK_TIMEOUT_MS, relay_activity());
	outbox_status_state(RELAY_STATE_WAITING_FOR_LOCK);
	outbox_status_error(error);
	for (int i = 0; i < RELAY_GUARDED_STEPS; i++)
	{
		if (lock_waiting[i] != NULL && strcmp(lock_waiting[i], what) == 0)
			return;
		if (lock_waiting[i] == NULL && free_slot < 0)
			free_slot = i;
	}
	if (free_slot >= 0)
		lock_waiting[free_slot] = what;
	ereport(
		WARNING,
		(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
		 errmsg("outbox relay: %s %s; it is tried again", what, error),
		 edata->context ? errdetail("%s", edata->context) : 0,
		 errhint("Another session holds a lock the relay needs (see pg_locks); a line follows when %s gets its locks again.",
				 what)));
}

/*
 * lock_got: say once that step what, which had given up waiting for a
 * lock, ran to its end again.
 */
static void
lock_got(const char *what)
{
	for (int i = 0; i < RELAY_GUARDED_STEPS; i++)
	{
		if (lock_waiting[i] != NULL && strcmp(lock_waiting[i], what) == 0)
		{
			lock_waiting[i] = NULL;
			ereport(LOG, (errmsg("outbox relay: %s got its locks again", what)));
		}
	}
}

/*
 * relay_batch_context: memory for the current round, reset before each.
 */
MemoryContext
relay_batch_context(void)
{
	return round_context;
}

/*
 * relay_count: add a batch's first upto outcomes to the shared totals.
 */
void
relay_count(RelayBatch *batch, int upto)
{
	uint64 sent = 0;
	uint64 failed = 0;
	uint64 retried = 0;
	const char *error = NULL;

	for (int i = 0; i < upto; i++)
	{
		if (batch->held[i] || relay_unanswered(batch, i))
			continue;
		if (batch->msgs[i].error == 0)
			sent++;
		else
		{
			failed++;
			error = batch->msgs[i].error_text;
		}
		if (batch->attempts[i] > 0)
			retried++;
	}
	pg_atomic_fetch_add_u64(&outbox_shared->sent_total, sent);
	pg_atomic_fetch_add_u64(&outbox_shared->failed_total, failed);
	pg_atomic_fetch_add_u64(&outbox_shared->retried_total, retried);
	outbox_status_batch(sent, failed);
	if (error != NULL)
		outbox_status_error(error);
}

/*
 * ensure_producer: a producer made from the current settings, if they
 * allow one.
 */
static bool
ensure_producer(void)
{
	if (outbox_kafka_running() && !outbox_kafka_fatal())
		return true;
	outbox_kafka_stop();
	if (wait_for_reload)
		return false;
	if (outbox_kafka_brokers[0] == '\0')
		ereport(
			LOG,
			(errmsg("outbox relay: outbox.kafka_brokers is not set; the relay is idle"),
			 errhint("Set outbox.kafka_brokers in postgresql.conf and reload.")));
	if (outbox_kafka_brokers[0] == '\0' ||
		!outbox_kafka_start(outbox_kafka_brokers, outbox_kafka_properties))
	{
		/* Said once in the log; tried again after the next reload. */
		wait_for_reload = true;
		outbox_status_error(outbox_kafka_brokers[0] == '\0'
								? "outbox.kafka_brokers is not set"
								: "unusable Kafka settings; see the server log");
		set_state(RELAY_STATE_UNCONFIGURED);
		return false;
	}
	if (used_brokers)
		pfree(used_brokers);
	if (used_properties)
		pfree(used_properties);
	used_brokers = MemoryContextStrdup(TopMemoryContext, outbox_kafka_brokers);
	used_properties =
		MemoryContextStrdup(TopMemoryContext, outbox_kafka_properties);
	return true;
}

/*
 * round_step: relay_round as a guarded step; *arg receives its outcome.
 */
static void
round_step(void *arg)
{
	*(RelayOutcome *) arg = relay_round();
}

/*
 * relay_round: due retries first, then the next batch of first sends.  A
 * round cut short by a reload stops there: the loop applies it first.
 */
static RelayOutcome
relay_round(void)
{
	RelayOutcome retries;
	RelayOutcome firsts;

	/* settle_producer ran: librdkafka holds no pointer into this memory. */
	MemoryContextReset(round_context);
	if (relay_paused())
	{
		set_state(RELAY_STATE_PAUSED);
		return RELAY_IDLE;
	}
	/* "waiting for lock" stays until a round gets through (pause_after). */
	if (outbox_shared->relay_state != RELAY_STATE_WAITING_FOR_LOCK)
		set_state(RELAY_STATE_SENDING);
	retries = relay_retries();
	if (retries == RELAY_INTERRUPTED)
		return retries;
	firsts = relay_first_sends();
	if (firsts == RELAY_INTERRUPTED)
		return firsts;
	if (retries == RELAY_UNREACHABLE || firsts == RELAY_UNREACHABLE)
		return RELAY_UNREACHABLE;
	if (retries == RELAY_MORE || firsts == RELAY_IDLE)
		return retries;
	return firsts;
}

/*
 * pause_after: how long to wait before the next round: none while a
 * backlog drains, a growing backoff while the broker is unreachable, else
 * until the next commit or outbox.poll_interval.
 */
static int
pause_after(RelayOutcome outcome, int *unreachable_ms)
{
	switch (outcome)
	{
		case RELAY_INTERRUPTED:
			/* A reload is pending: the loop applies it at once. */
			return 0;
		case RELAY_LOCKED:
			/* State and error were published by relay_guarded. */
			return outbox_poll_interval;
		case RELAY_MORE:
			*unreachable_ms = 0;
			set_state(RELAY_STATE_SENDING);
			log_stall(false);
			return 0;
		case RELAY_UNREACHABLE:
			*unreachable_ms = *unreachable_ms == 0
								  ? outbox_backoff_min
								  : Min(*unreachable_ms * 2, outbox_backoff_max);
			set_state(RELAY_STATE_UNREACHABLE);
			log_stall(true);
			return *unreachable_ms;
		case RELAY_BACKOFF:
			*unreachable_ms = 0;
			set_state(RELAY_STATE_BACKING_OFF);
			return outbox_poll_interval;
		default:
			*unreachable_ms = 0;
			if (outcome == RELAY_SENT)
				log_stall(false);
			/* Paused and "not configured" last until the next round says. */
			if (outbox_shared->relay_state != RELAY_STATE_PAUSED &&
				outbox_shared->relay_state != RELAY_STATE_UNCONFIGURED)
				set_state(RELAY_STATE_IDLE);
			return outbox_poll_interval;
	}
}

/*
 * log_stall: say once when Kafka stops acknowledging, and why; and once
 * when it acknowledges again.  Between the two, relay_status() and
 * librdkafka's own lines tell the rest.
 */
static void
log_stall(bool now_stalled)
{
	if (now_stalled && !stalled)
	{
		char *reason = outbox_kafka_stall_reason();

		ereport(
			LOG,
			(errmsg("outbox relay: Kafka did not acknowledge the events sent; they are sent again after a backoff"),
			 errdetail("%s", reason),
			 errhint(
				 "See outbox.relay_status(); a line follows when Kafka acknowledges again.")));
		outbox_status_error(reason);
		pfree(reason);
	}
	else if (!now_stalled && stalled)
		ereport(
			LOG,
			(errmsg("outbox relay: Kafka acknowledges the events sent again")));
	stalled = now_stalled;
}

/*
 * stop_producer: at exit, let go of librdkafka.
 */
static void
stop_producer(int code, Datum arg)
{
	outbox_kafka_stop();
}

/*
 * log_start: say which database the relay serves.
 */
static void
log_start(void)
{
	StartTransactionCommand();
	ereport(LOG,
			(errmsg("outbox relay started for database \"%s\" (librdkafka %s)",
					get_database_name(MyDatabaseId), outbox_kafka_version())));
	CommitTransactionCommand();
}

/*
 * set_state: publish what the relay is doing.
 */
static void
set_state(OutboxRelayState state)
{
	outbox_status_state(state);
}
