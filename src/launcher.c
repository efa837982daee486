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
 * hands out; each also needs a background worker slot, and either limit,
 * when reached, is said once in the log.  The launcher starts once
 * recovery has finished, so a standby relays nothing until promoted.
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

/* A database the launcher keeps a relay in, or may. */
typedef struct Database
{
	Oid oid;
	char name[NAMEDATALEN];
	bool listed;                   /* seen in pg_database at the last look */
	BackgroundWorkerHandle *relay; /* NULL: no relay started */
	int slot;                      /* the relay's slot in outbox_shared */
	TimestampTz started;
	TimestampTz next_start; /* no relay before this */
	int restart_ms;         /* the next delay after a failing relay */
	bool absent;            /* the last relay found no extension */
} Database;

static List *databases = NIL;
/* A look everywhere asked for (too many CREATE EXTENSIONs at once). */
static bool look_everywhere = false;
static TimestampTz looked_everywhere = 0;
/* Said once until a relay starts again: which limit stopped one. */
static bool said_slots = false;
static bool said_workers = false;
/* Said once until a reload: outbox.database names no database. */
static bool said_missing = false;

static bool take_wakes(TimestampTz now);
static void launcher_attach(void);
static void launcher_detach(int code, Datum arg);
static void stop_orphans(void);
static void list_databases(void);
static bool wanted(Form_pg_database db);
static Database *find_database(Oid oid);
static List *list_append_in(MemoryContext context, List *list, void *item);
static long tend(Database *db, TimestampTz now);
static void reap(Database *db, TimestampTz now);
static void forget_unlisted(void);
static bool held(Oid dboid);
static void start_relay(Database *db, TimestampTz now);
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
		ListCell *lc;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			listed_at = 0;
			said_missing = false;
		}
		/* A database new to us may have been created with the extension. */
		if (take_wakes(now))
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
			(errmsg("outbox launcher: database \"%s\" does not exist or takes no connections; no relay runs",
					outbox_database),
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
 * tend: keep db's relay running if it should run, stop it if not; return
 * how long the launcher may sleep as far as db is concerned.
 */
static long
tend(Database *db, TimestampTz now)
{
	pid_t pid;
	bool want;

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
	want = db->listed && !db->absent && !held(db->oid);
	if (want && now >= db->next_start)
	{
		start_relay(db, now);
		return db->relay != NULL ? LAUNCHER_CHECK_MS : RELAY_RESTART_MIN_MS;
	}
	if (want)
		return TimestampDifferenceMilliseconds(now, db->next_start) + 1;
	return LAUNCHER_CHECK_MS;
}

/*
 * reap: db's relay has stopped; free its slot and decide when the next
 * may start.  One that found no extension waits for a CREATE EXTENSION.
 * One that did not last, in a database still wanted, failed: the next
 * waits longer each time.  One stopped because its database is being
 * dropped or no longer wanted did not fail.  Either way, not two starts
 * in a second: statements that stop a relay (utility.c) must not make the
 * launcher start them in a loop.
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

	failed = !db->absent && db->listed && !held(db->oid) &&
			 !TimestampDifferenceExceeds(db->started, now, RELAY_HEALTHY_MS);
	db->restart_ms = failed ? Min(db->restart_ms * 2, RELAY_RESTART_MAX_MS)
							: RELAY_RESTART_MIN_MS;
	next = failed ? TimestampTzPlusMilliseconds(now, db->restart_ms) : now;
	db->next_start = Max(
		next, TimestampTzPlusMilliseconds(db->started, RELAY_RESTART_MIN_MS));
	if (db->absent && outbox_database[0] != '\0')
		ereport(
			LOG,
			(errmsg("outbox launcher: database \"%s\" has no extension outbox; no relay runs there",
					db->name),
			 errhint(
				 "Run CREATE EXTENSION outbox there, or set outbox.database to the database that has it.")));
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
 * start_relay: register a relay process for db in a free slot; it
 * notifies us when it starts and stops.  Either limit reached is said
 * once, until a relay starts again.
 */
static void
start_relay(Database *db, TimestampTz now)
{
	BackgroundWorker worker;
	OutboxRelayStart *start = (OutboxRelayStart *) worker.bgw_extra;
	uint32 generation;
	int slot = take_slot(db->oid, &generation);

	db->next_start = TimestampTzPlusMilliseconds(now, RELAY_RESTART_MIN_MS);
	if (slot < 0)
	{
		if (!said_slots)
			ereport(
				LOG,
				(errmsg("outbox launcher: outbox.max_relays (%d) relays run; database \"%s\" gets none (if it has the extension)",
						outbox_max_relays, db->name),
				 errhint(
					 "Raise outbox.max_relays (and max_worker_processes with it), and restart the server.")));
		said_slots = true;
		return;
	}

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
		if (!said_workers)
			ereport(
				LOG,
				(errmsg("outbox launcher: no relay for database \"%s\": no background worker slot free (max_worker_processes = %d)",
						db->name, max_worker_processes),
				 errhint(
					 "Raise max_worker_processes and restart the server: each relay takes one, besides the launcher, parallel queries and replication workers.")));
		said_workers = true;
		free_slot(slot);
		db->relay = NULL;
		return;
	}
	db->slot = slot;
	db->started = now;
	said_slots = false;
	said_workers = false;
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
