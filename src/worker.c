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

#ifdef __GLIBC__
#include <malloc.h>
#endif

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

#include "compat.h"
#include "kafka.h"
#include "outbox.h"
#include "relay.h"

/* Longest a relay statement waits for a lock an application may hold. */
#define RELAY_LOCK_TIMEOUT_MS 5000
/* Longest a starting relay waits for the lock on its database, in ms. */
#define CONNECT_LOCK_TIMEOUT "1000"

/* Steps whose lock waits are said apart: relaying, retention, alert. */
#define RELAY_GUARDED_STEPS 4

/*
 * How often an idle relay makes sure the extension is still installed:
 * DROP EXTENSION wakes it, but a relay with nothing to read may not look.
 */
#define PRESENCE_CHECK_MS 5000

/* Longest a changed producer waits for its batches before it is remade. */
#define DRAIN_MS 5000

/*
 * After a read that took everything committed, and more than one event,
 * the next read waits until some milliseconds after it started, more as
 * events come faster (gap_for): 1 ms at 1,000 events/s, 3 at 2,000, the
 * most, READ_GAP_MAX_MS, from 3,000.  Each read is a transaction whose
 * cost does not depend on how many events it takes; reading a few at a
 * time when thousands come a second spends CPU that the application
 * committing them needs, and the whole machine's latency suffers.  Side by
 * side at 5,000 events/s asked (2026-12-04, 2 cores, 2 runs each), against
 * a fixed 1 ms gap: the relay's CPU 18-23% of a core against 35%, pgbench
 * reached 2,900-4,550 commits/s against 3,100-3,300, the p99 15-17 ms
 * against 40-64; at 1,000 events/s the p50 was the same (2.3-2.6 ms).
 * A commit that finds the relay reading one event at a time is read at once.
 */
#define READ_GAP_MAX_MS 5
#define RATE_WINDOW_MS 50

/*
 * First sends wait for a batch of retries in flight (relay_retries_first)
 * this long at most since they began to: a healthy broker answers sooner,
 * and while one topic's refusals keep the retry step busy, the events of
 * other topics wait no longer than that for it.
 */
#define RETRIES_FIRST_MS 200

/*
 * Freed memory malloc may keep (keep_freed_memory); glibc takes no larger
 * mmap threshold on 64-bit systems.
 */
#define KEEP_FREED_BYTES (32 * 1024 * 1024)

PGDLLEXPORT void outbox_relay_main(Datum main_arg);

/*
 * What a producer is made with: the Kafka settings, and a fingerprint of
 * the files they name (outbox_kafka_files_fingerprint), which a renewed
 * certificate, key or CA changes under the same path.
 */
typedef struct ProducerSettings
{
	char *brokers;
	char *properties;
	int delivery;
	char *progress_topic;
	uint64 files;
} ProducerSettings;

/* What one round did, for the loop's pacing and status. */
typedef struct Round
{
	bool worked;      /* recorded or sent something: go on at once */
	bool unreachable; /* a batch failed at once for the broker's sake */
	bool paused;
	bool full; /* the flight is full: wait for Kafka */
} Round;

/* What the latest producer was made with; brokers NULL before the first. */
static ProducerSettings used = {NULL, NULL, -1, NULL, 0};
static uint64 files_now = 0; /* the files' fingerprint at the latest reload */
static bool wait_for_reload = false; /* settings unusable as they are */
static char *db_settings = NULL;     /* ALTER DATABASE's, as at start */
static bool stalled = false;         /* said that Kafka does not acknowledge */
static bool started = false; /* 'sending' rows of the last relay reset */
static TimestampTz drain_since = 0; /* the producer waits to be remade */
static TimestampTz remake_at = 0;   /* after a fatal error: not before */
static TimestampTz reads_at = 0;    /* first sends: not before (a backoff) */
static TimestampTz retries_at = 0;  /* retries: not before */
static TimestampTz read_at = 0;     /* first sends: last read */
static TimestampTz retries_first_since = 0; /* first sends wait for retries */
static TimestampTz present_at = 0;          /* the extension was last seen */
static bool read_wanted = true;             /* a commit may wait to be read */
static int read_gap_ms = 0;                 /* the next read waits this long */
static int64 rate_taken = 0;                /* events read since rate_since */
static TimestampTz rate_since = 0;
static int rate_per_10ms = 0; /* events per 10 ms, the last window */
static bool paused = false;   /* as the latest read found */
static int unreachable_ms = 0;
static TimestampTz seen_ack = 0;
static const char *lock_waiting[RELAY_GUARDED_STEPS]; /* steps said waiting */

static void keep_freed_memory(void);
static void pin_settings(void);
static void apply_reload(void);
static char *kafka_settings(void);
static bool read_files(bool warn);
static bool settings_changed(void);
static bool settings_equal(const ProducerSettings *a, const ProducerSettings *b);
static void settings_keep(void);
static bool producer_outdated(void);
static bool ensure_producer(void);
static void check_sizes(void);
static bool know_sender(void);
static void load_sender_step(void *arg);
static void tend_producer(TimestampTz now);
static void halt_producer(const char *why);
static void stop_producer_now(void);
static void round_step(void *arg);
static void settle(Round *round, TimestampTz now);
static void read_more(Round *round, TimestampTz now);
static RelayRead read_first_sends(int *taken);
static bool wait_for_retries(TimestampTz now);
static bool read_paused(RelayRead read, bool was);
static void housekeeping(TimestampTz now);
static void leave_if_absent(TimestampTz now);
static void after_round(const Round *round, TimestampTz now);
static int wait_ms(const Round *round, TimestampTz now);
static int gap_for(RelayRead read, int taken, TimestampTz now);
static TimestampTz read_gap_end(TimestampTz now);
static void wait_for_news(int timeout, bool latch);
static void lock_waited(const char *what, ErrorData *edata);
static void lock_got(const char *what);
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
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	keep_freed_memory();
	BackgroundWorkerUnblockSignals();
	/*
	 * Connecting waits for a lock on the database, which a RENAME in an
	 * open transaction holds as long as it likes: the launcher does not
	 * start a relay then, but one may slip in first.  It gives up (an
	 * error, restarted later) rather than keep its slots meanwhile.
	 * pin_settings sets the relay's own limit once connected.
	 */
	SetConfigOption("lock_timeout", CONNECT_LOCK_TIMEOUT, PGC_SUSET,
					PGC_S_OVERRIDE);
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(main_arg),
											  InvalidOid, 0);
	outbox_relay_attach((OutboxRelayStart *) MyBgworkerEntry->bgw_extra);
	if (!relay_extension_installed())
		outbox_relay_absent();
	pin_settings();
	db_settings = relay_db_settings();
	relay_flight_init();
	outbox_status_started();
	on_proc_exit(stop_producer, (Datum) 0);
	log_start();

	for (;;)
	{
		Round round = {0};
		TimestampTz now;
		int timeout;

		CHECK_FOR_INTERRUPTS();
		if (outbox_relay_held())
			proc_exit(0);
		if (ConfigReloadPending)
			apply_reload();
		/*
		 * A commit sets the latch after it is visible: reset before the
		 * round reads, the latch cannot lose one.  Without it, a round
		 * (Kafka's answers, a timer) reads only if the last read left
		 * more, or once per poll interval.
		 */
		if (MyLatch->is_set)
		{
			ResetLatch(MyLatch);
			read_wanted = true;
		}
		outbox_relay_paused_flag(false);
		/* A replay, say, after the operator granted a refused topic. */
		if (outbox_relay_told())
			outbox_kafka_judge_again();
		now = GetCurrentTimestamp();
		tend_producer(now);
		outbox_kafka_serve();
		if (!relay_guarded(round_step, &round, "relaying"))
		{
			relay_first_sends_abandon();
			relay_retries_abandon();
			relay_eos_abandon();
			read_wanted = true; /* what was given up is read again */
		}
		outbox_kafka_serve();
		leave_if_absent(now);
		outbox_relay_paused_flag(round.paused);
		after_round(&round, now);
		if (!round.worked)
			housekeeping(now);
		timeout = wait_ms(&round, now);
		if (timeout == 0)
			continue;
		pgstat_report_stat(true);
		/* Say what the wait is for. */
		if (!relay_flight_idle())
			pgstat_report_activity(STATE_RUNNING,
								   "waiting for Kafka acknowledgements");
		wait_for_news(timeout, !read_wanted || timeout > READ_GAP_MAX_MS);
		pgstat_report_activity(STATE_IDLE, NULL);
	}
}

/*
 * keep_freed_memory: let malloc keep what the relay frees, up to
 * KEEP_FREED_BYTES, rather than give it back to the system.  Each batch
 * allocates and frees arrays of a megabyte or more; glibc's defaults hand
 * such chunks back (mmap, or trimming the heap) and the next batch has its
 * pages faulted in and cleared again: a tenth of the relay's CPU in a
 * drain.  Kept, they cost no more than the in-flight bounds already allow
 * at the peak.
 */
static void
keep_freed_memory(void)
{
#ifdef __GLIBC__
	mallopt(M_MMAP_THRESHOLD, KEEP_FREED_BYTES);
	mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES);
#endif
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
	/*
	 * A window is read as an ordered range of (tx, id), a batch at a time.
	 * Statistics that lag a burst make a bitmap scan and a sort look
	 * cheaper: they sort the whole rest of the window for every batch.
	 */
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_sort", "off", PGC_SUSET, PGC_S_OVERRIDE);
	/*
	 * Durable records keep duplicates within a crash's bound, and a window
	 * is sent once the synchronous standbys have it: neither may be
	 * weakened by a database owner's ALTER DATABASE ... SET.
	 */
	SetConfigOption("synchronous_commit", "on", PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * apply_reload: serve a pending reload; here only, between rounds.  The
 * database's own settings are not reloaded by the server: when they
 * changed, the relay restarts to take them (db_settings.c).
 */
static void
apply_reload(void)
{
	char *now_set;
	char *kafka_before = kafka_settings();
	char *kafka_after;
	bool same_text;
	bool files_changed;

	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	wait_for_reload = false;
	kafka_after = kafka_settings();
	same_text = strcmp(kafka_before, kafka_after) == 0;
	/* A new text's files are read by its producer's start, and said there. */
	files_changed = read_files(same_text && outbox_kafka_running());
	if (files_changed && same_text && outbox_kafka_running() &&
		settings_changed())
		ereport(
			LOG,
			(errmsg("outbox relay: making a new Kafka producer"),
			 errdetail(
				 "A file that the Kafka properties name changed since the producer read it. The producer's events in flight are answered first, for %d ms at most.",
				 DRAIN_MS)));
	if (files_changed || !same_text)
	{
		/* The error said what the settings now gone did. */
		outbox_status_clear_error();
		outbox_kafka_forget_problem();
	}
	pfree(kafka_before);
	pfree(kafka_after);
	now_set = relay_db_settings();
	if (strcmp(now_set, db_settings) != 0)
	{
		ereport(
			LOG,
			(errmsg("outbox relay: restarting to apply changed outbox settings"),
			 errdetail(
				 "Outbox settings set with ALTER DATABASE or ALTER ROLE take effect when the relay starts.")));
		proc_exit(0);
	}
	pfree(now_set);
	check_sizes();
}

/*
 * kafka_settings: the settings a producer is made with, in one string.
 */
static char *
kafka_settings(void)
{
	return psprintf("%s\n%s\n%d\n%s", outbox_kafka_brokers,
					outbox_kafka_properties, outbox_delivery,
					outbox_progress_topic);
}

/*
 * read_files: take the fingerprint of the files the Kafka properties name,
 * at a reload (and only then, besides a producer's start: a reload is when
 * an operator says a renewal is complete), into files_now; true if it
 * changed.  A file that cannot be read leaves files_now as it was, so the
 * running producer goes on with what it read; with warn, that is said.
 */
static bool
read_files(bool warn)
{
	char problem[OUTBOX_ERROR_LEN];
	uint64 files = files_now;

	if (!outbox_kafka_files_fingerprint(outbox_kafka_properties, &files,
										problem, sizeof(problem)))
	{
		if (warn)
			ereport(
				WARNING,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("outbox relay: %s", problem),
				 errdetail("The relay keeps its Kafka producer, made with the "
						   "file as it was when the producer started."),
				 errhint("Make the file readable by the operating system user "
						 "the server runs as, and reload.")));
		return false;
	}
	if (files == files_now)
		return false;
	files_now = files;
	return true;
}

/*
 * producer_outdated: whether the running producer was made with other
 * Kafka settings than the current ones.
 */
static bool
producer_outdated(void)
{
	return outbox_kafka_running() && settings_changed();
}

/*
 * settings_changed: whether the Kafka settings, or the files they name as
 * of the latest reload, differ from those the latest producer was made
 * with (true before the first).
 */
static bool
settings_changed(void)
{
	ProducerSettings now = {outbox_kafka_brokers, outbox_kafka_properties,
							outbox_delivery, outbox_progress_topic, files_now};

	return used.brokers == NULL || !settings_equal(&used, &now);
}

/*
 * settings_equal: whether a producer made with a would be one made with b.
 */
static bool
settings_equal(const ProducerSettings *a, const ProducerSettings *b)
{
	return strcmp(a->brokers, b->brokers) == 0 &&
		   strcmp(a->properties, b->properties) == 0 &&
		   a->delivery == b->delivery &&
		   strcmp(a->progress_topic, b->progress_topic) == 0 &&
		   a->files == b->files;
}

/*
 * settings_keep: remember the current settings and files_now as those the
 * latest producer was made with.
 */
static void
settings_keep(void)
{
	if (used.brokers != NULL)
	{
		pfree(used.brokers);
		pfree(used.properties);
		pfree(used.progress_topic);
	}
	used.brokers = MemoryContextStrdup(TopMemoryContext, outbox_kafka_brokers);
	used.properties =
		MemoryContextStrdup(TopMemoryContext, outbox_kafka_properties);
	used.delivery = outbox_delivery;
	used.progress_topic =
		MemoryContextStrdup(TopMemoryContext, outbox_progress_topic);
	used.files = files_now;
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

	snprintf(error, sizeof(error), "gave up waiting for a lock while %s",
			 relay_activity());
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
	ereport(WARNING,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("outbox relay: gave up waiting for a lock while %s", what),
			 errdetail("The relay waited %d ms and tries again later.",
					   RELAY_LOCK_TIMEOUT_MS),
			 edata->context ? errcontext("%s", edata->context) : 0,
			 errhint("Find the session holding the lock in pg_locks and end its "
					 "transaction. A message follows when the relay gets its locks "
					 "again.")));
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
			ereport(LOG, (errmsg("outbox relay: got its locks again while %s",
								 what)));
			set_state(RELAY_STATE_SENDING);
		}
	}
}

/*
 * ensure_producer: a producer made from the current settings, if they
 * allow one.
 */
static bool
ensure_producer(void)
{
	char *transactional_id;

	if (outbox_kafka_running() && !outbox_kafka_fatal())
		return true;
	outbox_kafka_stop();
	if (wait_for_reload)
		return false;
	if (outbox_kafka_brokers[0] == '\0')
		ereport(
			LOG,
			(errmsg("outbox relay: outbox.kafka_brokers is not set"),
			 errdetail("The relay sends nothing until it is."),
			 errhint("Set outbox.kafka_brokers in postgresql.conf and reload.")));
	if (!know_sender())
		return false;
	transactional_id = outbox_delivery == OUTBOX_DELIVERY_EXACTLY_ONCE
						   ? relay_eos_transactional_id()
						   : NULL;
	/*
	 * The files as this producer will find them, read before librdkafka
	 * does: a renewal in between makes a needless producer at the next
	 * reload, never a missed one.  An unreadable file is said by the start.
	 */
	(void) read_files(false);
	if (outbox_kafka_brokers[0] == '\0' ||
		!outbox_kafka_start(outbox_kafka_brokers, outbox_kafka_properties,
							transactional_id))
	{
		char text[OUTBOX_ERROR_LEN];

		/* Said once in the log; tried again after the next reload. */
		wait_for_reload = true;
		snprintf(text, sizeof(text), "unusable Kafka settings: %s",
				 outbox_kafka_start_problem());
		outbox_status_error(outbox_kafka_brokers[0] == '\0'
								? "outbox.kafka_brokers is not set"
								: text);
		set_state(RELAY_STATE_UNCONFIGURED);
		return false;
	}
	if (settings_changed())
	{
		/* What the old producer said (while it drained) is no news now. */
		outbox_status_clear_error();
		outbox_kafka_forget_problem();
	}
	settings_keep();
	relay_eos_restart(transactional_id != NULL);
	check_sizes();
	return true;
}

/*
 * check_sizes: warn when outbox.max_payload_size lets enqueue accept events
 * the producer's message.max.bytes makes it refuse, each pair of values
 * once: such events are accepted and then always dead.  Checked when a
 * producer is made and after each reload.
 */
static void
check_sizes(void)
{
	static int said_payload = 0;
	static int said_max = 0;
	int max_bytes = outbox_kafka_max_message_bytes();

	if (max_bytes <= 0 || outbox_max_payload_size <= max_bytes ||
		(said_payload == outbox_max_payload_size && said_max == max_bytes))
		return;
	said_payload = outbox_max_payload_size;
	said_max = max_bytes;
	ereport(
		WARNING,
		(errmsg("outbox relay: outbox.max_payload_size (%d bytes) exceeds the "
				"producer's message.max.bytes (%d bytes)",
				outbox_max_payload_size, max_bytes),
		 errdetail("Events that enqueue accepts above message.max.bytes are "
				   "refused by the producer and become dead."),
		 errhint("Lower outbox.max_payload_size, or raise message.max.bytes in "
				 "outbox.kafka_properties and the topics' max.message.bytes "
				 "on the brokers to match.")));
}

/*
 * know_sender: read the relay's source and sender (sender.c) before a
 * producer is made: its messages name the one, a transactional producer's
 * id the other; false if they could not be read now.
 */
static bool
know_sender(void)
{
	volatile bool loaded = false;

	if (!relay_guarded(load_sender_step, (void *) &loaded,
					   "reading the relay's Kafka identity"))
		return false;
	return loaded;
}

/*
 * load_sender_step: know_sender's step; *arg is set if it was read.
 */
static void
load_sender_step(void *arg)
{
	if (!relay_begin("reading the relay's Kafka identity"))
		return;
	*(volatile bool *) arg = relay_sender_load();
	relay_commit();
}

/*
 * tend_producer: remake the producer when its settings or the files they
 * name changed (after its batches in flight are answered, or DRAIN_MS at
 * most; in exactly_once its open transaction is committed meanwhile, or
 * aborted by the next producer's init_transactions) or it failed
 * fatally; make one if there is none.  Only here does a producer end, so
 * nothing below the loop ever holds one that is gone.
 */
static void
tend_producer(TimestampTz now)
{
	KafkaFence fence = outbox_kafka_txn_fenced();

	if (fence == KAFKA_FENCE_OUTLIVED)
		ereport(LOG, (errmsg("outbox relay: making a new Kafka producer"),
					  errdetail("The producer failed: %s. None of the "
								"transaction's events was committed: they are "
								"sent again.",
								OUTBOX_TXN_OUTLIVED)));
	else if (fence == KAFKA_FENCED_BY_OTHER)
		halt_producer(
			"this relay's producer was fenced: another relay took over its transactional.id");
	else if (outbox_kafka_running() && relay_eos_halted() != NULL)
		halt_producer(relay_eos_halted());
	if (outbox_kafka_running() && relay_eos_broken() != NULL)
	{
		/* A refused transactional.id was said, with what to grant. */
		if (!relay_eos_refused())
			ereport(LOG,
					(errmsg("outbox relay: making a new Kafka producer"),
					 errdetail("The producer failed: %s.", relay_eos_broken())));
		outbox_status_error(relay_eos_broken());
	}
	if (outbox_kafka_running() &&
		(outbox_kafka_fatal() || relay_eos_broken() != NULL))
	{
		/* Made again after a backoff, as for an unreachable broker. */
		stop_producer_now();
		unreachable_ms = unreachable_ms == 0
							 ? outbox_backoff_min
							 : Min(unreachable_ms * 2, outbox_backoff_max);
		remake_at = TimestampTzPlusMilliseconds(now, unreachable_ms);
		if (!relay_eos_refused()) /* not the broker's fault: said */
			log_stall(true);
	}
	if (outbox_kafka_running() && producer_outdated())
	{
		if (drain_since == 0)
			drain_since = now;
		if (relay_flight_empty() ||
			TimestampDifferenceExceeds(drain_since, now, DRAIN_MS))
			stop_producer_now();
	}
	else
		drain_since = 0; /* a reload undone while the producer drained */
	if (!outbox_kafka_running() && now >= remake_at)
		(void) ensure_producer();
}

/*
 * halt_producer: stop a producer that was fenced (exactly_once) and send
 * nothing until a reload: making another would fence, in turn, the relay
 * that fenced this one.
 */
static void
halt_producer(const char *why)
{
	ereport(
		LOG,
		(errmsg("outbox relay: stopped sending until a reload"),
		 errdetail(
			 "The producer cannot go on: %s. A relay with the same transactional.id (%s) started elsewhere: the relay of a promoted standby, or a copy of this cluster.",
			 why, relay_eos_transactional_id()),
		 errhint(
			 "Set outbox.delivery = at_least_once, or fix the cause, and reload.")));
	stop_producer_now();
	wait_for_reload = true;
	outbox_status_error(why);
	set_state(RELAY_STATE_FENCED);
}

/*
 * stop_producer_now: stop the producer; what it did not answer for is
 * read again (batches) or due again (handed-over events).
 */
static void
stop_producer_now(void)
{
	outbox_kafka_stop();
	relay_flight_drop_all(false);
	relay_first_sends_restart();
	read_wanted = true;
	drain_since = 0;
}

/*
 * round_step: one round, as a guarded step: record what Kafka answered,
 * then read and send more, if there is room.
 */
static void
round_step(void *arg)
{
	Round *round = (Round *) arg;
	TimestampTz now = GetCurrentTimestamp();

	if (!started &&
		relay_begin("resetting handed-over events in outbox.event_state"))
	{
		relay_reset_sending();
		relay_commit();
		started = true;
	}
	if (relay_recreated())
	{
		ereport(
			LOG,
			(errmsg("outbox relay: the extension was created again"),
			 errdetail(
				 "The relay starts clean: what it was sending from the dropped extension is not recorded in the new one.")));
		relay_flight_drop_all(true);
		relay_first_sends_restart();
		read_wanted = true;
		started = false;
		return;
	}
	if (outbox_kafka_running())
	{
		bool unreachable = false;

		round->worked |= relay_eos_tend(now, &unreachable);
		round->unreachable |= unreachable;
	}
	settle(round, now);
	if (outbox_kafka_running() && drain_since == 0)
		read_more(round, now);
}

/*
 * settle: record what Kafka answered for, oldest first; in exactly_once,
 * once the transaction is committed.
 */
static void
settle(Round *round, TimestampTz now)
{
	bool unreachable = false;

	/* Handed over in at_least_once: answered for alone, in either mode. */
	round->worked |= relay_handed_settle();
	if (!relay_eos_may_settle())
		return;
	if (relay_retries_settle(now, &unreachable))
	{
		round->worked = true;
		retries_at = 0;
	}
	if (relay_first_sends_settle(now, &unreachable))
	{
		round->worked = true;
		retries_at = 0;     /* held or failed events may wait for a retry */
		read_wanted = true; /* a batch cut short is read again */
	}
	round->unreachable |= unreachable;
}

/*
 * read_more: due retries, then the next batch of first sends, unless the
 * relay is paused or backs off from an unreachable broker.  First sends
 * are read when a commit may wait (read_wanted) or once per poll interval;
 * a round for Kafka's answers alone reads nothing.
 */
static void
read_more(Round *round, TimestampTz now)
{
	RelayRead read = READ_NOTHING;
	int taken;

	if (round->unreachable || now < reads_at)
	{
		round->paused = paused = relay_paused();
		return;
	}
	/* exactly_once: the reads of a round share one Kafka transaction. */
	if (!relay_eos_may_read())
		return;
	/* Each read asks whether the relay is paused in its own transaction. */
	if (now >= retries_at)
	{
		read = relay_retries_read();
		round->worked |= read == READ_SOME;
		/*
		 * Paused, asked again each round (commits do not wake the relay
		 * then): the round after resume() sends due retries before first
		 * sends hold their keys' new events.
		 */
		if (read != READ_PAUSED)
			retries_at = TimestampTzPlusMilliseconds(
				now, Min(outbox_backoff_min, outbox_poll_interval));
		paused = read_paused(read, paused);
	}
	/* A refused event retried alone: first sends wait a round for it. */
	if (read != READ_PAUSED && !(read == READ_SOME && relay_retries_alone()) &&
		read_gap_end(now) == 0 &&
		(read_wanted ||
		 now >= TimestampTzPlusMilliseconds(read_at, outbox_poll_interval)) &&
		!wait_for_retries(now))
	{
		retries_first_since = 0;
		read = read_first_sends(&taken);
		read_gap_ms = gap_for(read, taken, now);
		read_at = now;
		/* After the window's end, only a commit brings more. */
		read_wanted =
			read == READ_SOME || read == READ_FULL || read == READ_GONE;
		paused = read_paused(read, paused);
		round->worked |= read == READ_SOME || read == READ_ALL;
		round->full = read == READ_FULL;
	}
	relay_eos_reads_done();
	round->paused = paused;
}

/*
 * wait_for_retries: whether first sends wait for the batch of retries in
 * flight (relay_retries_first), RETRIES_FIRST_MS at most since they began
 * to.
 */
static bool
wait_for_retries(TimestampTz now)
{
	if (!relay_retries_first())
	{
		retries_first_since = 0;
		return false;
	}
	if (retries_first_since == 0)
		retries_first_since = now;
	return now <
		   TimestampTzPlusMilliseconds(retries_first_since, RETRIES_FIRST_MS);
}

/*
 * read_first_sends: the next batch of first sends; in exactly_once, while
 * more is committed than a batch holds, the next ones too, into the same
 * Kafka transaction (relay_eos_reads_more).  *taken counts them all.
 */
static RelayRead
read_first_sends(int *taken)
{
	RelayRead read = relay_first_sends_read(taken);

	while (read == READ_SOME && relay_eos_reads_more())
	{
		int more;

		read = relay_first_sends_read(&more);
		*taken += more;
	}
	return read;
}

/*
 * read_paused: whether the relay is paused, as a read's outcome says (one
 * that stopped before asking leaves it as it was).
 */
static bool
read_paused(RelayRead read, bool was)
{
	if (read == READ_PAUSED)
		return true;
	if (read == READ_SOME || read == READ_ALL || read == READ_NOTHING)
		return false;
	return was;
}

/*
 * housekeeping: retention and the backlog alert, each when due, while the
 * relay has nothing else to do.
 */
static void
housekeeping(TimestampTz now)
{
	if (relay_purge_due(now))
	{
		int64 removed = 0;

		if (!relay_guarded(relay_purge_step, &removed, "retention"))
			removed = 0;
		relay_purge_done(now, removed);
	}
	if (relay_alert_due(now))
		(void) relay_guarded(relay_alert_step, &now, "the backlog check");
}

/*
 * leave_if_absent: end the relay where the extension is no longer
 * installed (the launcher starts none here until CREATE EXTENSION); asked
 * of the catalog every PRESENCE_CHECK_MS if no step found it out.
 */
static void
leave_if_absent(TimestampTz now)
{
	if (!relay_extension_absent() &&
		!TimestampDifferenceExceeds(present_at, now, PRESENCE_CHECK_MS))
		return;
	if (relay_extension_absent() || !relay_extension_installed())
		outbox_relay_absent();
	present_at = now;
}

/*
 * after_round: publish what the round did, back off from an unreachable
 * broker, and say when Kafka stops or starts acknowledging.
 */
static void
after_round(const Round *round, TimestampTz now)
{
	RelayTally tally = relay_flight_take_tally();
	TimestampTz ack = outbox_kafka_last_ack();
	const char *problem;

	outbox_status_totals(tally.sent, tally.failed, tally.retried);
	if (tally.sent + tally.failed > 0)
		outbox_status_batch(tally.sent, tally.failed);
	if (tally.error != NULL)
		outbox_status_error(tally.error);
	if ((problem = outbox_kafka_new_problem()) != NULL)
		outbox_status_error(problem);
	if (relay_needs_update())
		outbox_status_error("the extension needs ALTER EXTENSION outbox UPDATE");
	outbox_status_broker(outbox_kafka_broker_state());

	if (ack != seen_ack)
	{
		seen_ack = ack;
		unreachable_ms = 0;
		log_stall(false);
	}
	if (round->unreachable)
	{
		unreachable_ms = unreachable_ms == 0
							 ? outbox_backoff_min
							 : Min(unreachable_ms * 2, outbox_backoff_max);
		reads_at = TimestampTzPlusMilliseconds(now, unreachable_ms);
		log_stall(true);
	}

	if (outbox_status_current() == RELAY_STATE_WAITING_FOR_LOCK &&
		!round->worked && !relay_flight_idle())
		return;
	if (round->paused && relay_flight_empty())
		set_state(RELAY_STATE_PAUSED);
	else if (!outbox_kafka_running() && now < remake_at && relay_eos_refused())
		set_state(RELAY_STATE_NO_TRANSACTIONS);
	else if (!outbox_kafka_running() && now < remake_at)
		set_state(RELAY_STATE_UNREACHABLE);
	else if (!outbox_kafka_running())
		return; /* "not configured", said by ensure_producer */
	else if (relay_eos_waiting())
		set_state(RELAY_STATE_NO_TRANSACTIONS);
	else if (now < reads_at || strcmp(outbox_kafka_broker_state(), "down") == 0)
		set_state(RELAY_STATE_UNREACHABLE);
	else if (!relay_flight_idle() || round->worked)
		set_state(RELAY_STATE_SENDING);
	else
		set_state(RELAY_STATE_IDLE);
}

/*
 * wait_ms: how long to wait for the latch (a commit), Kafka's answers or
 * a deadline: none after a round that worked, else until the next
 * handover, record of answered batches, backoff, Kafka transaction's
 * begin (relay_eos_begin_at), read held back (gap_for, RETRIES_FIRST_MS),
 * message given up on (kafka_deadline.c) or outbox.poll_interval.
 */
static int
wait_ms(const Round *round, TimestampTz now)
{
	TimestampTz until = TimestampTzPlusMilliseconds(now, outbox_poll_interval);
	TimestampTz handover = relay_flight_next_handover();
	TimestampTz record = relay_first_sends_record_at();
	TimestampTz gap_end = read_gap_end(now);
	TimestampTz overdue = outbox_kafka_deadline();
	long secs;
	int usecs;

	if (round->worked && !round->full)
		return 0;
	if (handover != 0)
		until = Min(until, handover);
	if (record != 0)
		until = Min(until, record);
	if (reads_at > now)
		until = Min(until, reads_at);
	if (relay_eos_begin_at() > now)
		until = Min(until, relay_eos_begin_at());
	if (gap_end != 0)
		until = Min(until, gap_end);
	if (remake_at > now)
		until = Min(until, remake_at);
	if (overdue != 0)
		until = Min(until, overdue);
	if (retries_first_since != 0 && relay_retries_first())
		until = Min(until, TimestampTzPlusMilliseconds(retries_first_since,
													   RETRIES_FIRST_MS));
	if (until <= now)
		return 1;
	TimestampDifference(now, until, &secs, &usecs);
	return (int) Max(1, secs * 1000 + usecs / 1000);
}

/*
 * wait_for_news: wait up to timeout ms for librdkafka's news and, with
 * latch, for the latch (a commit, a signal).  Without: a read is wanted
 * already and due within READ_GAP_MAX_MS, and each commit meanwhile would
 * only signal the relay (a kill() in the committing backend, a wake here)
 * to wait again; the latch stays set for the next round, and a signal
 * waits that long at most.  The sets of what is waited for are made once,
 * or again when the producer's descriptor first appears, rather than on
 * every wait: under load the loop waits thousands of times a second, and
 * making a set (an epoll descriptor) each time cost a tenth of the loop's
 * CPU (measured 2026-12-03).
 */
static void
wait_for_news(int timeout, bool latch)
{
	static WaitEventSet *sets[2] = {NULL, NULL};
	static pgsocket watched[2] = {PGINVALID_SOCKET, PGINVALID_SOCKET};
	WaitEvent event;
	pgsocket fd = outbox_kafka_wake_fd();

	if (sets[latch] != NULL && fd != PGINVALID_SOCKET && fd != watched[latch])
	{
		FreeWaitEventSet(sets[latch]);
		sets[latch] = NULL;
	}
	if (sets[latch] == NULL)
	{
		sets[latch] = outbox_wait_set_create(3);
		if (latch)
			AddWaitEventToSet(sets[latch], WL_LATCH_SET, PGINVALID_SOCKET,
							  MyLatch, NULL);
		AddWaitEventToSet(sets[latch], WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET,
						  NULL, NULL);
		watched[latch] = fd;
		if (fd != PGINVALID_SOCKET)
			AddWaitEventToSet(sets[latch], WL_SOCKET_READABLE, fd, NULL, NULL);
	}
	(void) WaitEventSetWait(sets[latch], timeout, &event, 1, PG_WAIT_EXTENSION);
}

/*
 * gap_for: the gap after a read, which took taken events: none unless it
 * took everything committed and more than one event; else twice the events
 * that came each millisecond, less one, from 1 to READ_GAP_MAX_MS ms.  The
 * rate is counted over windows of RATE_WINDOW_MS: one read's own count
 * tells how its commits happened to meet, not the rate.
 */
static int
gap_for(RelayRead read, int taken, TimestampTz now)
{
	int64 window_us = now - rate_since;

	rate_taken += taken;
	if (window_us >= RATE_WINDOW_MS * INT64CONST(1000))
	{
		rate_per_10ms = (int) (rate_taken * 10000 / window_us);
		rate_taken = 0;
		rate_since = now;
	}
	if (read != READ_ALL || taken <= 1)
		return 0;
	return Max(1, Min((2 * rate_per_10ms - 10) / 10, READ_GAP_MAX_MS));
}

/*
 * read_gap_end: when a commit's read, held back after a read that took
 * everything committed (gap_for), is due; 0 if none is held back.
 */
static TimestampTz
read_gap_end(TimestampTz now)
{
	TimestampTz end = TimestampTzPlusMilliseconds(read_at, read_gap_ms);

	return read_wanted && read_gap_ms > 0 && now < end ? end : 0;
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
			(errmsg("outbox relay: Kafka did not acknowledge the events sent"),
			 errdetail(
				 "The cause Kafka gave: %s. The events are sent again after a backoff.",
				 reason),
			 errhint(
				 "Check that the brokers in outbox.kafka_brokers run and are reachable from this server. Until Kafka acknowledges again, outbox.relay_status() shows state \"broker unreachable\"; a message follows when it does.")));
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
