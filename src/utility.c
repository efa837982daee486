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
 * released however that process ends.  CREATE EXTENSION outbox wakes the
 * launcher as it commits, so the new database's relay starts at once;
 * DROP EXTENSION and COMMIT PREPARED wake the relay.
 *
 * src/utility.c
 */
#include "postgres.h"

#include <signal.h>

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "storage/spin.h"
#include "tcop/utility.h"
#include "utils/acl.h"

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
static void wake_for(Node *stmt);
static Oid database_to_hold(Node *stmt, bool isTopLevel);
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

	if (outbox_shared != NULL)
		dboid = database_to_hold(stmt, context == PROCESS_UTILITY_TOPLEVEL);
	wake_for(stmt);

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
 * wake_for: COMMIT PREPARED wakes the relay: the prepared transaction may
 * have enqueued, its PREPARE could not wake it, and the commit happens
 * here, in a session that may never have enqueued (a spurious wake costs
 * the relay one round).  CREATE EXTENSION outbox wakes the launcher, so
 * the database gets a relay; DROP EXTENSION the relay, so it leaves.
 */
static void
wake_for(Node *stmt)
{
	if (IsA(stmt, TransactionStmt) &&
		((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED)
		outbox_wake_relay_at_commit();
	if (IsA(stmt, CreateExtensionStmt) &&
		strcmp(((CreateExtensionStmt *) stmt)->extname, "outbox") == 0)
		outbox_wake_launcher_at_commit();
	if (IsA(stmt, DropStmt) &&
		((DropStmt *) stmt)->removeType == OBJECT_EXTENSION)
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
	if (!database_ownercheck(dboid, GetUserId()))
		return InvalidOid;
	return relayed_database(dboid) ? dboid : InvalidOid;
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
