/*
 * launcher.c
 *		The launcher: keeps one relay running in every database where the
 *		extension is installed (or only in outbox.database, when set).
 *
 * The launcher is connected to no database, so it cannot read another
 * database's pg_extension: it learns where the extension is by starting a
 * relay in each database it has not heard of, which leaves at once,
 * saying so in its slot, where the extension is not installed.  Such a
 * database gets no relay again until a CREATE EXTENSION outbox commits
 * there (the committing session wakes the launcher for that database
 * alone), or ABSENT_RECHECK_MS has passed.  DROP EXTENSION makes the
 * relay leave the same way; DROP DATABASE holds the launcher off
 * (utility.c).  No database's relay starts more than once a second,
 * whatever the statements run meanwhile.
 *
 * A relay that keeps failing is restarted with a growing delay.  At most
 * outbox.max_relays relays run, each in a shared-memory slot the launcher
 * hands out; each also needs a background worker slot.  When either runs
 * short, the slots are shared between database owners: a free slot goes
 * to the waiting database whose owner runs the fewest relays, and a
 * database whose owner runs at least two fewer than another owner takes
 * that owner's newest relay's slot.  So no owner, making copies of its
 * database, leaves another's without a relay.  A database left waiting is
 * named in the log (once a minute) and shown by relay_status().  Nor does
 * a relay start in a database another session holds locked (an ALTER
 * DATABASE ... RENAME in an open transaction), where it would wait on the
 * lock holding its slots.  The launcher starts once recovery has
 * finished, so a standby relays nothing until promoted.
 *
 * src/launcher.c
 */
#include "postgres.h"

#include <signal.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox.h"

PGDLLEXPORT void outbox_launcher_main(Datum main_arg);

/* A relay that lived shorter than this counts as failing at start. */
#define RELAY_HEALTHY_MS 10000
/* Also the least time between two starts of one database's relay. */
#define RELAY_RESTART_MIN_MS 1000
#define RELAY_RESTART_MAX_MS 60000
/* How often pg_database is read for new and dropped databases. */
#define LAUNCHER_CHECK_MS 5000
/* A database without the extension is looked at again after this. */
#define ABSENT_RECHECK_MS 300000
/* How long a new launcher waits for the relays of the last to leave. */
#define ORPHAN_WAIT_MS 10000
/* A database left without a relay is named in the log this often. */
#define WAITING_LOG_MS 60000

/* A database the launcher keeps a relay in, or may. */
typedef struct Database
{
	Oid oid;
	Oid owner;
	char name[NAMEDATALEN];
	bool listed;                   /* seen in pg_database at the last look */
	BackgroundWorkerHandle *relay; /* NULL: no relay started */
	int slot;                      /* the relay's slot in outbox_shared */
	TimestampTz started;
	TimestampTz next_start;    /* no relay before this */
	int restart_ms;            /* the next delay after a failing relay */
	bool absent;               /* the last relay found no extension */
	bool yielding;             /* its relay was stopped for another owner's */
	TimestampTz waiting_since; /* 0: not left without a relay */
	OutboxWaitReason waiting_for;
	TimestampTz said_waiting; /* when the log last named it */
} Database;

static List *databases = NIL;
/* A look everywhere asked for (too many CREATE EXTENSIONs at once). */
static bool look_everywhere = false;
static TimestampTz looked_everywhere = 0;
/* The database held at the last look (utility.c), if any. */
static Oid seen_hold = InvalidOid;
/* Said once until a reload: outbox.database names no database. */
static bool said_missing = false;

static bool take_wakes(TimestampTz now);
static bool hold_ended(void);
static void launcher_attach(void);
static void launcher_detach(int code, Datum arg);
static void stop_orphans(void);
static void list_databases(void);
static bool wanted(Form_pg_database db);
static Database *find_database(Oid oid);
static List *list_append_in(MemoryContext context, List *list, void *item);
static long tend(Database *db, TimestampTz now);
static bool wants_relay(Database *db);
static void reap(Database *db, TimestampTz now);
static long start_waiting(TimestampTz now);
static Database *next_ready(TimestampTz now);
static int owner_relays(Oid owner);
static void make_room(Database *db);
static void wait_all(OutboxWaitReason reason, TimestampTz now);
static void wait_for(Database *db, OutboxWaitReason reason, TimestampTz now);
static void publish_waiting(void);
static void forget_unlisted(void);
static bool held(Oid dboid);
static bool locked(Oid dboid);
static bool start_relay(Database *db, TimestampTz now);
static int take_slot(Oid dboid, uint32 *generation);
static void free_slot(int slot);

/*
 * outbox_launcher_register: register the launcher and the statement hook
 * (preload only).
 */
void
outbox_launcher_register(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags =
		BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "outbox_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "outbox launcher");
	RegisterBackgroundWorker(&worker);

	outbox_utility_init();
}

/*
 * outbox_launcher_main: entry point of the launcher.
 */
void
outbox_launcher_main(Datum main_arg)
{
	TimestampTz listed_at = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	launcher_attach();
	stop_orphans();

	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		long wait_ms = LAUNCHER_CHECK_MS;
		long start_wait_ms;
		ListCell *lc;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			listed_at = 0;
			said_missing = false;
		}
		/*
		 * A database new to us may have been created with the extension;
		 * one held may be gone, and must not be started in.
		 */
		if (take_wakes(now) | hold_ended())
			listed_at = 0;
		if (TimestampDifferenceExceeds(listed_at, now, LAUNCHER_CHECK_MS))
		{
			list_databases();
			listed_at = now;
		}
		/* Not Min(wait_ms, tend(...)): the macro would call it twice. */
		foreach (lc, databases)
		{
			long db_wait_ms = tend((Database *) lfirst(lc), now);

			wait_ms = Min(wait_ms, db_wait_ms);
		}
		start_wait_ms = start_waiting(now);
		wait_ms = Min(wait_ms, start_wait_ms);
		publish_waiting();
		forget_unlisted();

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Max(wait_ms, 1), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * take_wakes: the databases where a CREATE EXTENSION outbox committed
 * are looked at again; every database only if too many came at once, and
 * then not more often than LAUNCHER_CHECK_MS.  True if one of them is not
 * known yet.
 */
static bool
take_wakes(TimestampTz now)
{
	Oid created_in[OUTBOX_WAKE_SLOTS];
	int n;
	bool unknown = false;
	ListCell *lc;

	SpinLockAcquire(&outbox_shared->mutex);
	n = outbox_shared->ncreated;
	memcpy(created_in, outbox_shared->created_in, n * sizeof(Oid));
	look_everywhere |= outbox_shared->created_more;
	outbox_shared->ncreated = 0;
	outbox_shared->created_more = false;
	SpinLockRelease(&outbox_shared->mutex);

	for (int i = 0; i < n; i++)
	{
		Database *db = find_database(created_in[i]);

		if (db != NULL)
			db->absent = false;
		unknown |= db == NULL;
	}
	if (look_everywhere &&
		TimestampDifferenceExceeds(looked_everywhere, now, LAUNCHER_CHECK_MS))
	{
		foreach (lc, databases)
			((Database *) lfirst(lc))->absent = false;
		look_everywhere = false;
		looked_everywhere = now;
		unknown = true;
	}
	return unknown;
}

/*
 * hold_ended: whether the DROP DATABASE (or RENAME...) hold seen at the
 * last look has ended since.
 */
static bool
hold_ended(void)
{
	Oid hold;
	bool ended;

	SpinLockAcquire(&outbox_shared->mutex);
	hold = outbox_shared->hold_database;
	SpinLockRelease(&outbox_shared->mutex);
	ended = OidIsValid(seen_hold) && hold != seen_hold;
	seen_hold = hold;
	return ended;
}

/*
 * launcher_attach: publish the launcher, so a CREATE EXTENSION can wake
 * it; undone at exit.
 */
static void
launcher_attach(void)
{
	pg_atomic_write_u64(&outbox_shared->launcher, (uint64) MyProc);
	on_shmem_exit(launcher_detach, (Datum) 0);
}

/*
 * launcher_detach: forget the launcher at its exit.
 */
static void
launcher_detach(int code, Datum arg)
{
	pg_atomic_write_u64(&outbox_shared->launcher, 0);
}

/*
 * stop_orphans: stop the relays a previous launcher left (it exited on an
 * error; they run on, but nobody would restart or stop them), wait a
 * bounded time for them to leave, and free every slot.  Freeing bumps
 * each slot's generation, so a relay registered by the last launcher and
 * not yet started cannot take a slot handed out since.
 */
static void
stop_orphans(void)
{
	for (int waited = 0; waited <= ORPHAN_WAIT_MS; waited += 100)
	{
		bool any = false;

		SpinLockAcquire(&outbox_shared->mutex);
		for (int i = 0; i < outbox_shared->nslots; i++)
		{
			pid_t pid = outbox_shared->slots[i].pid;

			if (pid != 0 && waited == 0)
				kill(pid, SIGTERM);
			any |= pid != 0;
		}
		SpinLockRelease(&outbox_shared->mutex);
		if (!any)
			break;
		if (waited == ORPHAN_WAIT_MS)
			ereport(
				LOG,
				(errmsg("outbox launcher: relays of the previous launcher did not stop within %d ms",
						ORPHAN_WAIT_MS)));
		CHECK_FOR_INTERRUPTS();
		pg_usleep(100000L);
	}
	for (int i = 0; i < outbox_shared->nslots; i++)
		free_slot(i);
}

/*
 * list_databases: mark which databases may have a relay, adding those not
 * known yet.  A heap scan, as the autovacuum launcher does: without a
 * database of our own only shared catalogs can be read, and not through
 * their indexes.
 */
static void
list_databases(void)
{
	Relation rel;
	TableScanDesc scan;
	HeapTuple tup;
	ListCell *lc;
	bool any = false;

	foreach (lc, databases)
		((Database *) lfirst(lc))->listed = false;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tup);
		Database *db;

		if (!wanted(form))
			continue;
		db = find_database(form->oid);
		if (db == NULL)
		{
			db = MemoryContextAllocZero(TopMemoryContext, sizeof(Database));
			db->oid = form->oid;
			db->slot = -1;
			db->restart_ms = RELAY_RESTART_MIN_MS;
			databases = list_append_in(TopMemoryContext, databases, db);
		}
		strlcpy(db->name, NameStr(form->datname), NAMEDATALEN);
		db->owner = form->datdba;
		db->listed = true;
		any = true;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	if (!any && outbox_database[0] != '\0' && !said_missing)
		ereport(
			LOG,
			(errmsg("outbox launcher: database \"%s\" does not exist or takes no connections",
					outbox_database),
			 errdetail("outbox.database names it, so no relay runs."),
			 errhint(
				 "Set outbox.database to a database where CREATE EXTENSION outbox was run, or leave it empty for every such database, and reload.")));
	said_missing |= !any && outbox_database[0] != '\0';
}

/*
 * wanted: whether a relay may run in db: a database that takes
 * connections, no template (CREATE DATABASE copies a template's outbox,
 * events and all: its events belong to no application), not half dropped,
 * and the one outbox.database names if it is set.
 */
static bool
wanted(Form_pg_database db)
{
	if (!db->datallowconn || db->datistemplate ||
		db->datconnlimit == DATCONNLIMIT_INVALID_DB)
		return false;
	return outbox_database[0] == '\0' ||
		   strcmp(NameStr(db->datname), outbox_database) == 0;
}

/*
 * find_database: what the launcher knows of the database oid, or NULL.
 */
static Database *
find_database(Oid oid)
{
	ListCell *lc;

	foreach (lc, databases)
	{
		Database *db = (Database *) lfirst(lc);

		if (db->oid == oid)
			return db;
	}
	return NULL;
}

/*
 * list_append_in: lappend, with the list's cells in context.
 */
static List *
list_append_in(MemoryContext context, List *list, void *item)
{
	MemoryContext old = MemoryContextSwitchTo(context);

	list = lappend(list, item);
	MemoryContextSwitchTo(old);
	return list;
}

/*
 * tend: stop db's relay if it should not run, free its slot once it has
 * stopped; return how long the launcher may sleep as far as db is
 * concerned.  Starting relays is start_waiting's, which weighs the
 * databases against each other.
 */
static long
tend(Database *db, TimestampTz now)
{
	pid_t pid;

	if (db->relay != NULL)
	{
		BgwHandleStatus status = GetBackgroundWorkerPid(db->relay, &pid);

		if (status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED)
		{
			if (!db->listed || held(db->oid))
				TerminateBackgroundWorker(db->relay);
			return LAUNCHER_CHECK_MS;
		}
		reap(db, now);
	}
	if (db->absent &&
		TimestampDifferenceExceeds(db->next_start, now, ABSENT_RECHECK_MS))
		db->absent = false;
	if (!wants_relay(db))
	{
		db->waiting_since = 0;
		return LAUNCHER_CHECK_MS;
	}
	if (now < db->next_start)
		return TimestampDifferenceMilliseconds(now, db->next_start) + 1;
	return LAUNCHER_CHECK_MS;
}

/*
 * wants_relay: whether db should have a relay and has none.
 */
static bool
wants_relay(Database *db)
{
	return db->relay == NULL && db->listed && !db->absent && !held(db->oid);
}

/*
 * reap: db's relay has stopped; free its slot and decide when the next
 * may start.  One that found no extension waits for a CREATE EXTENSION.
 * One that did not last, in a database still wanted, failed: the next
 * waits longer each time.  One stopped because its database is being
 * dropped or no longer wanted, or to give its slot to another owner, did
 * not fail.  Either way, not two starts in a second: statements that stop
 * a relay (utility.c) must not make the launcher start them in a loop.
 */
static void
reap(Database *db, TimestampTz now)
{
	bool failed;
	TimestampTz next;

	SpinLockAcquire(&outbox_shared->mutex);
	db->absent = outbox_shared->slots[db->slot].absent;
	SpinLockRelease(&outbox_shared->mutex);
	free_slot(db->slot);
	pfree(db->relay);
	db->relay = NULL;
	db->slot = -1;

	failed = !db->absent && !db->yielding && db->listed && !held(db->oid) &&
			 !TimestampDifferenceExceeds(db->started, now, RELAY_HEALTHY_MS);
	db->yielding = false;
	db->restart_ms = failed ? Min(db->restart_ms * 2, RELAY_RESTART_MAX_MS)
							: RELAY_RESTART_MIN_MS;
	next = failed ? TimestampTzPlusMilliseconds(now, db->restart_ms) : now;
	db->next_start = Max(
		next, TimestampTzPlusMilliseconds(db->started, RELAY_RESTART_MIN_MS));
	if (db->absent && outbox_database[0] != '\0')
		ereport(
			LOG,
			(errmsg("outbox launcher: database \"%s\" has no extension outbox",
					db->name),
			 errdetail("outbox.database names it, so no relay runs."),
			 errhint(
				 "Run CREATE EXTENSION outbox there, or set outbox.database to the database that has it.")));
}

/*
 * start_waiting: start a relay in each database that wants one and may
 * have it now, fairest first (next_ready), until the slots run out; then
 * the rest wait, and the first of them may take a slot from an owner that
 * has more than its share.  Returns how long the launcher may sleep.
 */
static long
start_waiting(TimestampTz now)
{
	Database *db;
	long wait_ms = LAUNCHER_CHECK_MS;

	while ((db = next_ready(now)) != NULL)
	{
		if (locked(db->oid))
		{
			/* Looked at again in a second, by then perhaps unlocked. */
			wait_for(db, WAIT_LOCK, now);
			db->next_start =
				TimestampTzPlusMilliseconds(now, RELAY_RESTART_MIN_MS);
			wait_ms = RELAY_RESTART_MIN_MS;
			continue;
		}
		if (start_relay(db, now))
			continue;
		make_room(db);
		wait_all(db->waiting_for, now);
		return RELAY_RESTART_MIN_MS;
	}
	return wait_ms;
}

/*
 * wait_all: every database that wants a relay now waits, for reason.
 * Their next start is not put off: the first slot freed goes to the
 * fairest of them, not to whichever was put off the least.
 */
static void
wait_all(OutboxWaitReason reason, TimestampTz now)
{
	ListCell *lc;

	foreach (lc, databases)
	{
		Database *db = (Database *) lfirst(lc);

		if (wants_relay(db) && now >= db->next_start)
			wait_for(db, reason, now);
	}
}

/*
 * next_ready: of the databases that want a relay now, the one whose
 * owner runs the fewest relays; of those, the one waiting longest.
 */
static Database *
next_ready(TimestampTz now)
{
	Database *best = NULL;
	int best_relays = 0;
	ListCell *lc;

	foreach (lc, databases)
	{
		Database *db = (Database *) lfirst(lc);
		int relays;

		if (!wants_relay(db) || now < db->next_start)
			continue;
		relays = owner_relays(db->owner);
		if (best == NULL || relays < best_relays ||
			(relays == best_relays && db->waiting_since != 0 &&
			 (best->waiting_since == 0 ||
			  db->waiting_since < best->waiting_since)))
		{
			best = db;
			best_relays = relays;
		}
	}
	return best;
}

/*
 * owner_relays: how many relays run in the databases owner owns.
 */
static int
owner_relays(Oid owner)
{
	int n = 0;
	ListCell *lc;

	foreach (lc, databases)
	{
		Database *db = (Database *) lfirst(lc);

		n += db->relay != NULL && db->owner == owner;
	}
	return n;
}

/*
 * make_room: db found no slot.  If another owner runs at least two relays
 * more than db's owner, stop that owner's newest relay: its slot goes to
 * db (next_ready puts db first), and the owners end up at most one relay
 * apart.  One at a time, so a slot is never taken twice.
 */
static void
make_room(Database *db)
{
	int mine = owner_relays(db->owner);
	Database *victim = NULL;
	int victim_relays = 0;
	ListCell *lc;

	foreach (lc, databases)
	{
		Database *other = (Database *) lfirst(lc);
		int relays;

		if (other->yielding)
			return;
		if (other->relay == NULL || other->owner == db->owner)
			continue;
		relays = owner_relays(other->owner);
		if (relays < mine + 2)
			continue;
		if (victim == NULL || relays > victim_relays ||
			(relays == victim_relays && other->started > victim->started))
		{
			victim = other;
			victim_relays = relays;
		}
	}
	if (victim == NULL)
		return;
	victim->yielding = true;
	TerminateBackgroundWorker(victim->relay);
	ereport(
		LOG,
		(errmsg("outbox launcher: stopped the relay of database \"%s\" for database \"%s\"",
				victim->name, db->name),
		 errdetail(
			 "The relays are short, and the owner of \"%s\" runs %d of them, the owner of \"%s\" %d: each owner gets an even share.",
			 victim->name, victim_relays, db->name, mine)));
}

/*
 * wait_for: db wants a relay and gets none now, for reason.  Said in the
 * log when it starts waiting and every WAITING_LOG_MS while it does.
 */
static void
wait_for(Database *db, OutboxWaitReason reason, TimestampTz now)
{
	if (db->waiting_since == 0)
		db->waiting_since = now;
	db->waiting_for = reason;
	if (db->said_waiting != 0 &&
		!TimestampDifferenceExceeds(db->said_waiting, now, WAITING_LOG_MS))
		return;
	db->said_waiting = now;
	if (reason == WAIT_LOCK)
		ereport(
			LOG,
			(errmsg("outbox launcher: database \"%s\" is waiting for lock",
					db->name),
			 errdetail(
				 "Another session holds the database locked (ALTER DATABASE ... RENAME in an open transaction, for one); its relay starts once the lock is released.")));
	else if (reason == WAIT_RELAY_SLOT)
		ereport(
			LOG,
			(errmsg("outbox launcher: database \"%s\" is waiting for a relay slot",
					db->name),
			 errdetail(
				 "outbox.max_relays (%d) relays run. If the database has the extension, its events wait.",
				 outbox_max_relays),
			 errhint(
				 "Raise outbox.max_relays (and max_worker_processes with it), and restart the server.")));
	else
		ereport(
			LOG,
			(errmsg("outbox launcher: database \"%s\" is waiting for a relay slot",
					db->name),
			 errdetail(
				 "No background worker slot is free (max_worker_processes = %d). If the database has the extension, its events wait.",
				 max_worker_processes),
			 errhint(
				 "Raise max_worker_processes and restart the server: each relay takes one, besides the launcher, parallel queries and replication workers.")));
}

/*
 * publish_waiting: the databases left without a relay, for
 * relay_status(); those whose owner runs no relay first, so that the
 * databases starved the most are shown when there are too many.
 */
static void
publish_waiting(void)
{
	OutboxWaiting waiting[OUTBOX_MAX_WAITING];
	int n = 0;
	ListCell *lc;

	for (int pass = 0; pass < 2; pass++)
	{
		foreach (lc, databases)
		{
			Database *db = (Database *) lfirst(lc);

			if (db->waiting_since == 0 ||
				(owner_relays(db->owner) == 0) != (pass == 0))
				continue;
			if (n == OUTBOX_MAX_WAITING)
				break;
			waiting[n].database = db->oid;
			waiting[n].reason = db->waiting_for;
			waiting[n].since = db->waiting_since;
			n++;
		}
	}
	SpinLockAcquire(&outbox_shared->mutex);
	memcpy(outbox_shared->waiting, waiting, n * sizeof(OutboxWaiting));
	outbox_shared->nwaiting = n;
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * forget_unlisted: drop what the launcher knows of databases gone from
 * pg_database (or no longer wanted) once their relay has stopped.
 */
static void
forget_unlisted(void)
{
	ListCell *lc;

	foreach (lc, databases)
	{
		Database *db = (Database *) lfirst(lc);

		if (db->listed || db->relay != NULL)
			continue;
		databases = foreach_delete_current(databases, lc);
		pfree(db);
	}
}

/*
 * held: whether a DROP DATABASE of dboid is under way.  A hold whose
 * holder has exited without releasing it (its exit callback should always
 * have done so) is released here, so it never outlives its process.
 */
static bool
held(Oid dboid)
{
	pid_t holder;

	SpinLockAcquire(&outbox_shared->mutex);
	holder = outbox_shared->hold_database == dboid ? outbox_shared->hold_pid : 0;
	SpinLockRelease(&outbox_shared->mutex);
	if (holder == 0)
		return false;
	if (BackendPidGetProc(holder) != NULL)
		return true;

	SpinLockAcquire(&outbox_shared->mutex);
	if (outbox_shared->hold_pid == holder)
	{
		outbox_shared->hold_database = InvalidOid;
		outbox_shared->hold_pid = 0;
	}
	SpinLockRelease(&outbox_shared->mutex);
	ereport(
		LOG,
		(errmsg("outbox launcher: released the DROP DATABASE hold of process %d, which has exited",
				(int) holder)));
	return false;
}

/*
 * locked: whether another session holds dboid locked against connections
 * (RENAME, SET TABLESPACE): a relay would wait on that lock, in InitPostgres,
 * holding both its slots for as long as the lock is held.
 */
static bool
locked(Oid dboid)
{
	LOCKTAG tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, dboid, 0);
	if (LockAcquire(&tag, RowExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return true;
	LockRelease(&tag, RowExclusiveLock, true);
	return false;
}

/*
 * start_relay: register a relay process for db in a free slot; it
 * notifies us when it starts and stops.  False if no slot is free, of
 * ours or the server's (db->waiting_for says which).
 */
static bool
start_relay(Database *db, TimestampTz now)
{
	BackgroundWorker worker;
	OutboxRelayStart *start = (OutboxRelayStart *) worker.bgw_extra;
	uint32 generation;
	int slot = take_slot(db->oid, &generation);

	db->waiting_for = WAIT_RELAY_SLOT;
	if (slot < 0)
		return false;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags =
		BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = ObjectIdGetDatum(db->oid);
	worker.bgw_notify_pid = MyProcPid;
	start->slot = slot;
	start->generation = generation;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "outbox_relay_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox relay");
	snprintf(worker.bgw_type, BGW_MAXLEN, "outbox relay");
	if (!RegisterDynamicBackgroundWorker(&worker, &db->relay))
	{
		free_slot(slot);
		db->relay = NULL;
		db->waiting_for = WAIT_WORKER_SLOT;
		return false;
	}
	db->slot = slot;
	db->started = now;
	db->next_start = TimestampTzPlusMilliseconds(now, RELAY_RESTART_MIN_MS);
	db->waiting_since = 0;
	return true;
}

/*
 * take_slot: hand a free slot to dboid's next relay; -1 if none is free.
 */
static int
take_slot(Oid dboid, uint32 *generation)
{
	int found = -1;

	SpinLockAcquire(&outbox_shared->mutex);
	for (int i = 0; i < outbox_shared->nslots && found < 0; i++)
	{
		OutboxRelaySlot *slot = &outbox_shared->slots[i];

		if (OidIsValid(slot->database))
			continue;
		slot->database = dboid;
		slot->absent = false;
		*generation = slot->generation;
		found = i;
	}
	SpinLockRelease(&outbox_shared->mutex);
	return found;
}

/*
 * free_slot: the slot's relay has stopped (or never started); a relay
 * registered for it and started late finds another generation and leaves.
 */
static void
free_slot(int n)
{
	OutboxRelaySlot *slot = &outbox_shared->slots[n];

	SpinLockAcquire(&outbox_shared->mutex);
	slot->database = InvalidOid;
	slot->pid = 0;
	slot->absent = false;
	slot->generation++;
	SpinLockRelease(&outbox_shared->mutex);
}
