/*
 * launcher.c
 *		The launcher: keeps one relay running for outbox.database, and gets
 *		it out of the way of DROP DATABASE.
 *
 * The launcher is connected to no database, so it can look a database up
 * before anything connects to it: a relay is started only where the
 * database exists, and restarted with a growing delay if it keeps failing,
 * instead of looping through "database does not exist" errors.  It starts
 * once recovery has finished, so a standby relays nothing until promoted.
 * DROP DATABASE of the relayed database stops the relay first and holds
 * the launcher off until the command is over.  It does so only once the
 * checks DROP DATABASE makes before its own wait have passed (the caller
 * owns the database, no transaction block), so that a role without rights
 * cannot stop the relay with a DROP that is refused anyway; and the hold
 * belongs to the dropping process, released however that process ends.
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
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "outbox.h"

PGDLLEXPORT void outbox_launcher_main(Datum main_arg);

/* A relay that lived shorter than this counts as failing at start. */
#define RELAY_HEALTHY_MS 10000
#define RELAY_RESTART_MIN_MS 1000
#define RELAY_RESTART_MAX_MS 60000
#define LAUNCHER_CHECK_MS 5000
/* How long DROP DATABASE waits for the relay to leave. */
#define HOLD_WAIT_MS 10000

static ProcessUtility_hook_type prev_utility_hook = NULL;
/* Whether this backend registered release_at_exit. */
static bool release_registered = false;

static Oid wanted_database(bool *said_missing);
static Oid lookup_database(const char *name);
static BackgroundWorkerHandle *start_relay(Oid dboid);
static bool relay_alive(BackgroundWorkerHandle *relay);
static void drop_orphan_hold(Oid dboid);
static Oid database_to_hold(DropdbStmt *stmt, bool isTopLevel);
static bool relayed_database(Oid dboid);
static void hold_database(Oid dboid);
static void release_database(void);
static void release_at_exit(int code, Datum arg);
static void outbox_utility(PlannedStmt *pstmt, const char *queryString,
						   bool readOnlyTree, ProcessUtilityContext context,
						   ParamListInfo params, QueryEnvironment *queryEnv,
						   DestReceiver *dest, QueryCompletion *qc);

/*
 * outbox_launcher_register: register the launcher and the DROP DATABASE
 * hook (preload only).
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

	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = outbox_utility;
}

/*
 * outbox_relay_held: whether this relay's database is being dropped.
 */
bool
outbox_relay_held(void)
{
	bool held;

	SpinLockAcquire(&outbox_shared->mutex);
	held = outbox_shared->hold_database == MyDatabaseId;
	SpinLockRelease(&outbox_shared->mutex);
	return held;
}

/*
 * outbox_launcher_main: entry point of the launcher.
 */
void
outbox_launcher_main(Datum main_arg)
{
	BackgroundWorkerHandle *relay = NULL;
	Oid relay_db = InvalidOid;
	TimestampTz started = 0;
	TimestampTz next_start = 0;
	int restart_ms = RELAY_RESTART_MIN_MS;
	bool said_missing = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);

	for (;;)
	{
		Oid want;
		TimestampTz now = GetCurrentTimestamp();
		long wait_ms = LAUNCHER_CHECK_MS;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			said_missing = false;
		}
		want = wanted_database(&said_missing);

		if (relay != NULL && relay_alive(relay))
		{
			if (relay_db != want)
				TerminateBackgroundWorker(relay);
		}
		else
		{
			if (relay != NULL)
			{
				/*
				 * It stopped: back off if it failed, i.e. did not last in a
				 * database still wanted.  One stopped because its database
				 * is being dropped or is no longer outbox.database did not
				 * fail: counting it would delay the next relay for nothing.
				 */
				bool healthy =
					relay_db != want ||
					TimestampDifferenceExceeds(started, now, RELAY_HEALTHY_MS);

				restart_ms = healthy
								 ? RELAY_RESTART_MIN_MS
								 : Min(restart_ms * 2, RELAY_RESTART_MAX_MS);
				next_start =
					TimestampTzPlusMilliseconds(now, healthy ? 0 : restart_ms);
				pfree(relay);
				relay = NULL;
			}
			if (OidIsValid(want) && now >= next_start)
			{
				relay = start_relay(want);
				relay_db = want;
				started = now;
			}
			else if (OidIsValid(want))
				wait_ms =
					Min(wait_ms,
						TimestampDifferenceMilliseconds(now, next_start) + 1);
		}

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * wanted_database: the OID of outbox.database, or InvalidOid if it does
 * not exist (said once in the log) or is being dropped.
 */
static Oid
wanted_database(bool *said_missing)
{
	Oid dboid;
	Oid held;

	dboid = lookup_database(outbox_database);

	if (!OidIsValid(dboid))
	{
		if (!*said_missing)
			ereport(
				LOG,
				(errmsg("outbox launcher: database \"%s\" does not exist; no relay runs",
						outbox_database),
				 errhint(
					 "Set outbox.database to the database where CREATE EXTENSION outbox was run, and reload.")));
		*said_missing = true;
		return InvalidOid;
	}
	drop_orphan_hold(dboid);
	SpinLockAcquire(&outbox_shared->mutex);
	held = outbox_shared->hold_database;
	SpinLockRelease(&outbox_shared->mutex);
	return held == dboid ? InvalidOid : dboid;
}

/*
 * drop_orphan_hold: release a hold on dboid whose holder has exited
 * without releasing it.  Its exit callback should always have done so;
 * this only keeps a hold from outliving its process if that ever fails.
 */
static void
drop_orphan_hold(Oid dboid)
{
	pid_t holder;

	SpinLockAcquire(&outbox_shared->mutex);
	holder = outbox_shared->hold_database == dboid ? outbox_shared->hold_pid : 0;
	SpinLockRelease(&outbox_shared->mutex);
	if (holder == 0 || BackendPidGetProc(holder) != NULL)
		return;

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
}

/*
 * lookup_database: the OID of the database called name, or InvalidOid.
 * A heap scan, as the autovacuum launcher does: without a database of our
 * own only shared catalogs can be read, and not through their indexes.
 */
static Oid
lookup_database(const char *name)
{
	Relation rel;
	TableScanDesc scan;
	HeapTuple tup;
	Oid dboid = InvalidOid;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (strcmp(NameStr(db->datname), name) == 0)
		{
			dboid = db->oid;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return dboid;
}

/*
 * start_relay: register a relay process for dboid; it notifies us when it
 * starts and stops.
 */
static BackgroundWorkerHandle *
start_relay(Oid dboid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags =
		BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = ObjectIdGetDatum(dboid);
	worker.bgw_notify_pid = MyProcPid;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "outbox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "outbox_relay_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox relay");
	snprintf(worker.bgw_type, BGW_MAXLEN, "outbox relay");
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(
			LOG,
			(errmsg("outbox launcher: could not start the relay: no background worker slot free"),
			 errhint("Raise max_worker_processes.")));
		return NULL;
	}
	return handle;
}

/*
 * relay_alive: whether the relay is starting or running.
 */
static bool
relay_alive(BackgroundWorkerHandle *relay)
{
	pid_t pid;
	BgwHandleStatus status = GetBackgroundWorkerPid(relay, &pid);

	return status == BGWH_STARTED || status == BGWH_NOT_YET_STARTED;
}

/*
 * outbox_utility: around DROP DATABASE of a database with a relay, stop
 * the relay first so the drop does not fail on its connection; at COMMIT
 * PREPARED, wake the relay when it commits.
 */
static void
outbox_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			   ProcessUtilityContext context, ParamListInfo params,
			   QueryEnvironment *queryEnv, DestReceiver *dest,
			   QueryCompletion *qc)
{
	Node *stmt = pstmt->utilityStmt;
	volatile Oid dboid = InvalidOid;

	if (outbox_shared != NULL && IsA(stmt, DropdbStmt))
		dboid = database_to_hold((DropdbStmt *) stmt,
								 context == PROCESS_UTILITY_TOPLEVEL);
	/*
	 * The prepared transaction may have enqueued: its PREPARE could not
	 * wake the relay, and the commit happens here, in a session that may
	 * never have enqueued.  A spurious wake costs the relay one round.
	 */
	if (IsA(stmt, TransactionStmt) &&
		((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED)
		outbox_wake_relay_at_commit();

	if (OidIsValid(dboid))
		hold_database(dboid);
	PG_TRY();
	{
		if (prev_utility_hook)
			prev_utility_hook(pstmt, queryString, readOnlyTree, context,
							  params, queryEnv, dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
									params, queryEnv, dest, qc);
	}
	PG_FINALLY();
	{
		if (OidIsValid(dboid))
			release_database();
	}
	PG_END_TRY();
}

/*
 * database_to_hold: the relayed database this DROP DATABASE will drop, or
 * InvalidOid if DROP DATABASE is going to refuse before it waits for
 * other sessions to leave (the same checks, in the same order) or the
 * database has no relay.  Checks made later (template, replication slots,
 * subscriptions) only the owner can fail, who may stop the relay anyway.
 */
static Oid
database_to_hold(DropdbStmt *stmt, bool isTopLevel)
{
	Oid dboid;

	if (IsInTransactionBlock(isTopLevel))
		return InvalidOid;
	dboid = get_database_oid(stmt->dbname, true);
	if (!OidIsValid(dboid) || dboid == MyDatabaseId)
		return InvalidOid;
	if (!database_ownercheck(dboid, GetUserId()))
		return InvalidOid;
	return relayed_database(dboid) ? dboid : InvalidOid;
}

/*
 * relayed_database: whether a relay serves dboid, or the launcher may
 * start one there.  Holding no other database keeps the one hold slot
 * free for the database that matters.
 */
static bool
relayed_database(Oid dboid)
{
	Oid relay_db;

	SpinLockAcquire(&outbox_shared->mutex);
	relay_db = outbox_shared->relay_database;
	SpinLockRelease(&outbox_shared->mutex);
	return dboid == relay_db || dboid == get_database_oid(outbox_database, true);
}

/*
 * hold_database: keep the launcher from starting a relay in dboid, stop
 * the one there, and wait (bounded) until it has gone.  The hold is this
 * process's: released by release_database, or at its exit however it
 * ends (a FATAL error skips PG_FINALLY).
 */
static void
hold_database(Oid dboid)
{
	pid_t relay_pid = 0;

	if (!release_registered)
	{
		before_shmem_exit(release_at_exit, (Datum) 0);
		release_registered = true;
	}
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_shared->hold_database = dboid;
	outbox_shared->hold_pid = MyProcPid;
	if (outbox_shared->relay_database == dboid)
		relay_pid = outbox_shared->relay_pid;
	SpinLockRelease(&outbox_shared->mutex);
	if (relay_pid == 0)
		return;

	kill(relay_pid, SIGTERM);
	for (int waited = 0; waited < HOLD_WAIT_MS; waited += 10)
	{
		bool gone;

		SpinLockAcquire(&outbox_shared->mutex);
		gone = outbox_shared->relay_pid != relay_pid;
		SpinLockRelease(&outbox_shared->mutex);
		if (gone)
			return;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000L);
	}
}

/*
 * release_database: DROP DATABASE is over; let the launcher look again.
 * Only this process's hold: a concurrent DROP may have taken the slot.
 */
static void
release_database(void)
{
	SpinLockAcquire(&outbox_shared->mutex);
	if (outbox_shared->hold_pid == MyProcPid)
	{
		outbox_shared->hold_database = InvalidOid;
		outbox_shared->hold_pid = 0;
	}
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * release_at_exit: release this process's hold, if it still has one, as
 * the process exits.
 */
static void
release_at_exit(int code, Datum arg)
{
	release_database();
}
