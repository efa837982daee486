/*
 * step.c
 *		The transaction bracket around every step of relaying, the way
 *		worker_spi brackets a unit of work, running a kept plan, and
 *		waiting until what a step read is on the synchronous standbys.
 *
 * src/step.c
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"

#include "outbox.h"
#include "relay.h"

/* The extension this relay serves, by its pg_extension OID. */
static Oid served_extension = InvalidOid;

/* Whether its version is the one this library relays; said once if not. */
static bool version_ok = false;
static bool version_said = false;

/* Set when the extension was created again; taken by relay_recreated. */
static bool recreated = false;

/* Whether the last step found no extension at all. */
static bool absent = false;

/* What the current step is doing, as pg_stat_activity shows it. */
static const char *current_activity = "";

static const char *const paused_sql = "SELECT paused FROM outbox.relay_control";
static SPIPlanPtr paused_plan = NULL;

static bool version_current(Oid ext);
static bool replicated(XLogRecPtr lsn);
static bool standbys_named(void);

/*
 * relay_begin: start a transaction for one step.  False, with no
 * transaction open, if the extension is not installed or is being
 * dropped: the lock is taken conditionally, so the relay never makes DROP
 * EXTENSION wait for it.
 *
 * False too when the extension was dropped and created again since the
 * last step (relay_recreated then says so once): what is in flight was
 * read from the old one and must not be recorded in the new one, whose
 * cursor and event ids start afresh.
 */
bool
relay_begin(const char *activity)
{
	Oid ext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ext = get_extension_oid("outbox", true);
	absent = !OidIsValid(ext);
	if (absent || !ConditionalLockDatabaseObject(ExtensionRelationId, ext, 0,
												 AccessShareLock))
	{
		CommitTransactionCommand();
		return false;
	}
	if (ext != served_extension)
	{
		recreated = OidIsValid(served_extension);
		served_extension = ext;
		version_ok = false;
		version_said = false;
		if (recreated)
		{
			CommitTransactionCommand();
			return false;
		}
	}
	if (!version_ok && !(version_ok = version_current(ext)))
	{
		CommitTransactionCommand();
		return false;
	}
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	current_activity = activity;
	pgstat_report_activity(STATE_RUNNING, activity);
	return true;
}

/*
 * version_current: whether the extension's installed version is the one
 * this library's relay reads and writes; if not, say once that it waits
 * for ALTER EXTENSION ... UPDATE (its events wait too: nothing is lost).
 */
static bool
version_current(Oid ext)
{
	Relation rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple tuple;
	char *version = NULL;
	bool isnull;

	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		Datum d = heap_getattr(tuple, Anum_pg_extension_extversion,
							   RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (version != NULL && strcmp(version, OUTBOX_VERSION) == 0)
		return true;
	if (!version_said)
	{
		ereport(
			WARNING,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("outbox relay: the extension here is version %s, the server's library is %s",
					version ? version : "unknown", OUTBOX_VERSION),
			 errdetail(
				 "The relay waits: events are kept and sent once the extension is updated."),
			 errhint("Run ALTER EXTENSION outbox UPDATE in this database.")));
		version_said = true;
	}
	return false;
}

/*
 * relay_extension_absent: whether the last step found the extension not
 * installed (dropped, or never created): the relay has nothing to do here.
 */
bool
relay_extension_absent(void)
{
	return absent;
}

/*
 * relay_extension_installed: whether the extension is installed here, as
 * a relay asks once as it starts.
 */
bool
relay_extension_installed(void)
{
	bool installed;

	StartTransactionCommand();
	installed = OidIsValid(get_extension_oid("outbox", true));
	CommitTransactionCommand();
	return installed;
}

/*
 * relay_needs_update: whether the relay waits for ALTER EXTENSION UPDATE.
 */
bool
relay_needs_update(void)
{
	return OidIsValid(served_extension) && !version_ok;
}

/*
 * relay_recreated: whether the extension was created again since the
 * last call; the caller drops everything it holds.
 */
bool
relay_recreated(void)
{
	bool was = recreated;

	recreated = false;
	return was;
}

/*
 * relay_commit: end the step's transaction.
 */
void
relay_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * relay_activity: what the current or latest step was doing.
 */
const char *
relay_activity(void)
{
	return current_activity;
}

/*
 * relay_run_plan: execute a kept plan and insist on its result code.
 * custom plans anew for each call's values, where a generic plan could
 * not see how narrow a parameter's range is.
 */
void
relay_run_plan(SPIPlanPtr *cache, const char *sql, int nargs, const Oid *types,
			   Datum *values, int expect, bool custom)
{
	SPIPlanPtr plan = outbox_keep_plan(cache, sql, nargs, types, custom);
	int rc = SPI_execute_plan(plan, values, NULL, false, 0);

	if (rc != expect)
		elog(ERROR, "outbox relay: \"%s\" failed: %s", sql,
			 SPI_result_code_string(rc));
}

/*
 * relay_pause_set: inside a step, whether an operator paused the relay.
 * Asked in the transaction that would read, so that no event committed
 * after a pause() returned is read, at no transaction of its own.
 */
bool
relay_pause_set(void)
{
	bool isnull;
	Datum paused = relay_first_value(&paused_plan, paused_sql, 0, NULL, NULL,
									 true, &isnull);

	return !isnull && DatumGetBool(paused);
}

/*
 * relay_first_value: run a kept plan, which must return one row, and
 * return that row's first column.
 */
Datum
relay_first_value(SPIPlanPtr *cache, const char *sql, int nargs,
				  const Oid *types, Datum *values, bool read_only, bool *isnull)
{
	SPIPlanPtr plan = outbox_keep_plan(cache, sql, nargs, types, false);
	int rc = SPI_execute_plan(plan, values, NULL, read_only, 1);

	if (rc < 0 || SPI_processed != 1)
		elog(ERROR, "outbox relay: \"%s\" did not return one row: %s", sql,
			 SPI_result_code_string(rc));
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
						 isnull);
}

/*
 * relay_wait_replicated: wait until the synchronous standbys confirm the
 * WAL flushed so far, and so every commit the current snapshot sees.
 *
 * A commit is visible before the standbys confirm it when its wait for
 * them is canceled, or after a crash restart, which replays it from the
 * local WAL.  Sent then, a failover would leave Kafka holding an event
 * the new primary never had; writers whose outcome was unknown enqueue it
 * again under another id, which a consumer's claim refuses by its biz key.
 * The wait is PostgreSQL's own, as for a commit: it shows in
 * pg_stat_activity as wait event SyncRep, and ends with the standby, a
 * change of synchronous_standby_names, or the relay's termination.
 *
 * Commits made with synchronous_commit = off can be visible before they
 * are flushed at all; they are not waited for (README, "Delivery").
 */
void
relay_wait_replicated(void)
{
	XLogRecPtr upto = GetFlushRecPtr(NULL);

	if (replicated(upto))
		return;
	pgstat_report_activity(
		STATE_RUNNING,
		"waiting for the synchronous standbys to confirm the events read");
	SyncRepWaitForLSN(upto, false);
	/* Its wait consumed any wake-up meant for the loop. */
	SetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	pgstat_report_activity(STATE_RUNNING, current_activity);
	if (!replicated(upto))
		ereport(
			ERROR,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("outbox relay: the wait for the synchronous standbys was canceled"),
			 errdetail("Events are sent only once the standbys confirm them.")));
}

/*
 * replicated: whether the synchronous standbys have flushed WAL up to lsn
 * (true when none are named, or replication is off).  The relay runs with
 * synchronous_commit = on (pin_settings), so flushed is what it waits for.
 */
static bool
replicated(XLogRecPtr lsn)
{
	bool done;

	if (!SyncRepRequested())
		return true;
	LWLockAcquire(SyncRepLock, LW_SHARED);
	done = !standbys_named() || lsn <= WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH];
	LWLockRelease(SyncRepLock);
	return done;
}

/*
 * standbys_named: whether synchronous standbys are named, as the
 * checkpointer publishes it; until it has (just after a start), as the
 * setting says.  Minor releases since 2025 keep this in a status word.
 */
static bool
standbys_named(void)
{
#ifdef SYNC_STANDBY_DEFINED
	if (WalSndCtl->sync_standbys_status & SYNC_STANDBY_INIT)
		return (WalSndCtl->sync_standbys_status & SYNC_STANDBY_DEFINED) != 0;
	return SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
#else
	return WalSndCtl->sync_standbys_defined;
#endif
}
