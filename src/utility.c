/*
 * utility.c
 *		The ProcessUtility hook: the statements the relays and the launcher
 *		must hear of from the sessions that run them.
 *
 * A statement that needs a database with no other session in it (DROP
 * DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE, CREATE DATABASE
 * ... TEMPLATE) stops that database's relay first, so it does not fail on
 * the relay's connection, and holds the launcher off until it is over.
 * It does so only once the checks the statement makes before its own
 * wait have passed (the caller owns the database, no transaction block),
 * so that a role without rights cannot stop a relay with a statement that
 * is refused anyway; and the hold belongs to the process running it,
 * released however that process ends.  The same holds for a statement
 * that would change nothing (a RENAME to a name taken, a SET TABLESPACE
 * to the database's own): an owner looping it would make the relay start
 * again and again.
 *
 * A CREATE EXTENSION that created outbox wakes the launcher as it
 * commits, so the new database's relay starts at once; a DROP EXTENSION
 * that dropped it wakes the relay, so it leaves.  One that changed
 * nothing (IF NOT EXISTS, IF EXISTS), which any role may run, wakes
 * nobody: every wake costs the launcher or the relay work.  COMMIT
 * PREPARED wakes the relay.
 *
 * src/utility.c
 */
#include "postgres.h"

#include <signal.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "commands/tablespace.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/syscache.h"

#include "compat.h"
#include "outbox.h"

/* How long a statement waits for the relay to leave. */
#define HOLD_WAIT_MS 10000

static ProcessUtility_hook_type prev_utility_hook = NULL;
/* Whether this backend registered release_at_exit. */
static bool release_registered = false;

static void outbox_utility(PlannedStmt *pstmt, const char *queryString,
						   bool readOnlyTree, ProcessUtilityContext context,
						   ParamListInfo params, QueryEnvironment *queryEnv,
						   DestReceiver *dest, QueryCompletion *qc);
static bool may_change_extension(Node *stmt);
static bool extension_here(void);
static void wake_if_changed(bool had);
static Oid database_to_hold(Node *stmt, bool isTopLevel);
static bool statement_goes_on(Node *stmt, Oid dboid);
static bool moves_tablespace(AlterDatabaseStmt *stmt, Oid dboid);
static const char *exclusive_database(Node *stmt, bool *in_block_ok);
static bool relayed_database(Oid dboid);
static pid_t relay_pid_in(Oid dboid);
static void hold_database(Oid dboid);
static void release_database(void);
static void release_at_exit(int code, Datum arg);

/*
 * outbox_utility_init: chain the hook (preload only).
 */
void
outbox_utility_init(void)
{
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
 * outbox_utility: around a statement that needs a database with a relay
 * to itself, stop the relay first so the statement does not fail on its
 * connection; wake whom a statement concerns when it commits.
 */
static void
outbox_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
			   ProcessUtilityContext context, ParamListInfo params,
			   QueryEnvironment *queryEnv, DestReceiver *dest,
			   QueryCompletion *qc)
{
	Node *stmt = pstmt->utilityStmt;
	volatile Oid dboid = InvalidOid;
	volatile bool watch = outbox_shared != NULL && may_change_extension(stmt);
	volatile bool had = watch && extension_here();

	if (outbox_shared != NULL)
		dboid = database_to_hold(stmt, context == PROCESS_UTILITY_TOPLEVEL);
	/*
	 * The prepared transaction may have enqueued, its PREPARE could not
	 * wake the relay, and the commit happens here, in a session that may
	 * never have enqueued (a spurious wake costs the relay one round; only
	 * the role that prepared it, or a superuser, can commit it).
	 */
	if (IsA(stmt, TransactionStmt) &&
		((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED)
		outbox_events_at_commit();

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
	if (watch)
		wake_if_changed(had);
}

/*
 * may_change_extension: whether stmt may create or drop outbox here.
 */
static bool
may_change_extension(Node *stmt)
{
	if (IsA(stmt, CreateExtensionStmt))
		return strcmp(((CreateExtensionStmt *) stmt)->extname, "outbox") == 0;
	return IsA(stmt, DropStmt) &&
		   ((DropStmt *) stmt)->removeType == OBJECT_EXTENSION;
}

/*
 * extension_here: whether outbox is installed in this database, as this
 * transaction sees it.
 */
static bool
extension_here(void)
{
	return OidIsValid(get_extension_oid("outbox", true));
}

/*
 * wake_if_changed: after a CREATE or DROP EXTENSION that succeeded, wake
 * the launcher (so the database gets a relay) if outbox is there now and
 * was not before, the relay (so it leaves) if it was and is gone.
 */
static void
wake_if_changed(bool had)
{
	bool has = extension_here();

	if (has && !had)
		outbox_wake_launcher_at_commit();
	if (had && !has)
		outbox_wake_relay_at_commit();
}

/*
 * database_to_hold: the relayed database this statement needs to itself,
 * or InvalidOid if the statement is going to refuse before it waits for
 * other sessions to leave (the same checks, in the same order) or the
 * database has no relay.  Checks made later (template, replication slots,
 * subscriptions) only the owner can fail, who may stop the relay anyway.
 */
static Oid
database_to_hold(Node *stmt, bool isTopLevel)
{
	bool in_block_ok = false;
	const char *name = exclusive_database(stmt, &in_block_ok);
	Oid dboid;

	if (name == NULL || (!in_block_ok && IsInTransactionBlock(isTopLevel)))
		return InvalidOid;
	dboid = get_database_oid(name, true);
	if (!OidIsValid(dboid) || dboid == MyDatabaseId)
		return InvalidOid;
	if (!database_ownercheck(dboid, GetUserId()) ||
		!statement_goes_on(stmt, dboid))
		return InvalidOid;
	return relayed_database(dboid) ? dboid : InvalidOid;
}

/*
 * statement_goes_on: whether stmt, made by the owner of dboid, passes the
 * checks it makes before it waits for other sessions to leave dboid, and
 * has something to do.  RENAME and CREATE DATABASE need CREATEDB and a
 * name not taken; SET TABLESPACE needs CREATE on a tablespace that is not
 * the database's own already.
 */
static bool
statement_goes_on(Node *stmt, Oid dboid)
{
	const char *name = NULL;

	if (IsA(stmt, RenameStmt))
		name = ((RenameStmt *) stmt)->newname;
	else if (IsA(stmt, CreatedbStmt))
		name = ((CreatedbStmt *) stmt)->dbname;
	else if (IsA(stmt, AlterDatabaseStmt))
		return moves_tablespace((AlterDatabaseStmt *) stmt, dboid);
	if (name == NULL)
		return true;
	return have_createdb_privilege() &&
		   !OidIsValid(get_database_oid(name, true));
}

/*
 * moves_tablespace: whether ALTER DATABASE ... SET TABLESPACE would move
 * dboid: the tablespace exists, the user may create in it, and it is not
 * where dboid is already.
 */
static bool
moves_tablespace(AlterDatabaseStmt *stmt, Oid dboid)
{
	ListCell *lc;
	Oid target = InvalidOid;
	HeapTuple tuple;
	Oid current;

	foreach (lc, stmt->options)
	{
		DefElem *option = (DefElem *) lfirst(lc);

		if (strcmp(option->defname, "tablespace") == 0)
			target = get_tablespace_oid(defGetString(option), true);
	}
	if (!OidIsValid(target) ||
		tablespace_aclcheck(target, GetUserId(), ACL_CREATE) != ACLCHECK_OK)
		return false;
	tuple = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
	if (!HeapTupleIsValid(tuple))
		return false;
	current = ((Form_pg_database) GETSTRUCT(tuple))->dattablespace;
	ReleaseSysCache(tuple);
	return current != target;
}

/*
 * exclusive_database: the database a statement needs no other session
 * in, or NULL: DROP DATABASE, ALTER DATABASE ... RENAME (which may run in
 * a transaction block: *in_block_ok) or SET TABLESPACE, and CREATE
 * DATABASE ... TEMPLATE, which copies its template.
 */
static const char *
exclusive_database(Node *stmt, bool *in_block_ok)
{
	ListCell *lc;
	List *options = NIL;

	if (IsA(stmt, DropdbStmt))
		return ((DropdbStmt *) stmt)->dbname;
	if (IsA(stmt, RenameStmt) &&
		((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
	{
		*in_block_ok = true;
		return ((RenameStmt *) stmt)->subname;
	}
	if (IsA(stmt, AlterDatabaseStmt))
		options = ((AlterDatabaseStmt *) stmt)->options;
	if (IsA(stmt, CreatedbStmt))
		options = ((CreatedbStmt *) stmt)->options;
	foreach (lc, options)
	{
		DefElem *option = (DefElem *) lfirst(lc);

		if (IsA(stmt, AlterDatabaseStmt) &&
			strcmp(option->defname, "tablespace") == 0)
			return ((AlterDatabaseStmt *) stmt)->dbname;
		if (IsA(stmt, CreatedbStmt) &&
			strcmp(option->defname, "template") == 0 && option->arg != NULL)
			return defGetString(option);
	}
	return NULL;
}

/*
 * relayed_database: whether a relay serves dboid, or the launcher may
 * start one there (every database, unless outbox.database names one).
 * Holding no other database keeps the one hold slot free for the
 * databases that matter.
 */
static bool
relayed_database(Oid dboid)
{
	if (outbox_database[0] == '\0')
		return true;
	return relay_pid_in(dboid) != 0 ||
		   dboid == get_database_oid(outbox_database, true);
}

/*
 * relay_pid_in: the process of dboid's relay, or 0.
 */
static pid_t
relay_pid_in(Oid dboid)
{
	pid_t pid = 0;

	SpinLockAcquire(&outbox_shared->mutex);
	for (int i = 0; i < outbox_shared->nslots && pid == 0; i++)
		if (outbox_shared->slots[i].database == dboid)
			pid = outbox_shared->slots[i].pid;
	SpinLockRelease(&outbox_shared->mutex);
	return pid;
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
	pid_t relay_pid;

	if (!release_registered)
	{
		before_shmem_exit(release_at_exit, (Datum) 0);
		release_registered = true;
	}
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_shared->hold_database = dboid;
	outbox_shared->hold_pid = MyProcPid;
	SpinLockRelease(&outbox_shared->mutex);
	relay_pid = relay_pid_in(dboid);
	if (relay_pid == 0)
		return;

	kill(relay_pid, SIGTERM);
	for (int waited = 0; waited < HOLD_WAIT_MS; waited += 10)
	{
		if (relay_pid_in(dboid) != relay_pid)
			return;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000L);
	}
}

/*
 * release_database: DROP DATABASE is over; let the launcher look again,
 * now rather than at its next round.  Only this process's hold: a
 * concurrent DROP may have taken the slot.
 */
static void
release_database(void)
{
	bool mine;

	SpinLockAcquire(&outbox_shared->mutex);
	mine = outbox_shared->hold_pid == MyProcPid;
	if (mine)
	{
		outbox_shared->hold_database = InvalidOid;
		outbox_shared->hold_pid = 0;
	}
	SpinLockRelease(&outbox_shared->mutex);
	if (mine)
		outbox_nudge_launcher();
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
