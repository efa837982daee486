/*
 * shmem.c
 *		Shared memory: what the launcher, the relay and the backends that
 *		enqueue need to know of each other.
 *
 * A backend that enqueued wakes the relay when its transaction commits:
 * an XactCallback sets the relay's latch.  SetLatch is a no-op while the
 * latch is already set, so a burst of commits costs the relay one wake-up,
 * and nothing is sent on every commit the way NOTIFY would.
 *
 * src/shmem.c
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "outbox.h"

OutboxShared *outbox_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static bool wake_at_commit = false;

static void shmem_request(void);
static void shmem_startup(void);
static void wake_on_commit(XactEvent event, void *arg);
static void relay_detach(int code, Datum arg);

/*
 * outbox_shmem_init: chain the shared-memory hooks (preload only).
 */
void
outbox_shmem_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = shmem_startup;
}

/*
 * outbox_wake_init: register the commit callback (every backend).
 */
void
outbox_wake_init(void)
{
	RegisterXactCallback(wake_on_commit, NULL);
}

/*
 * outbox_wake_relay_at_commit: wake the relay if the current transaction
 * commits (it enqueued, or changed what the relay must do).
 */
void
outbox_wake_relay_at_commit(void)
{
	wake_at_commit = true;
}

/*
 * outbox_wake_relay: set the relay's latch, if there is a relay.
 */
void
outbox_wake_relay(void)
{
	PGPROC *relay;

	if (outbox_shared == NULL)
		return;
	relay = (PGPROC *) pg_atomic_read_u64(&outbox_shared->relay_proc);
	if (relay != NULL)
		SetLatch(&relay->procLatch);
}

/*
 * outbox_relay_attach: publish this process as the relay, so commits and
 * operators can wake it; undone at exit.
 */
void
outbox_relay_attach(void)
{
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_shared->relay_pid = MyProcPid;
	outbox_shared->relay_database = MyDatabaseId;
	SpinLockRelease(&outbox_shared->mutex);
	pg_atomic_write_u64(&outbox_shared->relay_proc, (uint64) MyProc);
	on_shmem_exit(relay_detach, (Datum) 0);
}

/*
 * relay_detach: forget the relay at its exit.
 */
static void
relay_detach(int code, Datum arg)
{
	pg_atomic_write_u64(&outbox_shared->relay_proc, 0);
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_shared->relay_pid = 0;
	outbox_shared->relay_database = InvalidOid;
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * wake_on_commit: at commit of a transaction that enqueued, wake the
 * relay.  The events are visible to others by the time this runs.
 */
static void
wake_on_commit(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (wake_at_commit)
				outbox_wake_relay();
			wake_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_at_commit = false;
			break;
		case XACT_EVENT_PREPARE:
			/*
			 * Nothing is visible yet, and no COMMIT or ABORT event follows in
			 * this session: the flag would wake the relay at the session's
			 * next commit.  COMMIT PREPARED wakes it (see outbox_utility).
			 */
			wake_at_commit = false;
			break;
		default:
			break;
	}
}

/*
 * shmem_request: reserve our segment.
 */
static void
shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(OutboxShared)));
}

/*
 * shmem_startup: create or attach to our segment.
 */
static void
shmem_startup(void)
{
	bool found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shared = ShmemInitStruct("outbox", sizeof(OutboxShared), &found);
	if (!found)
	{
		memset(outbox_shared, 0, sizeof(OutboxShared));
		SpinLockInit(&outbox_shared->mutex);
		pg_atomic_init_u64(&outbox_shared->relay_proc, 0);
		pg_atomic_init_u64(&outbox_shared->sent_total, 0);
		pg_atomic_init_u64(&outbox_shared->failed_total, 0);
		pg_atomic_init_u64(&outbox_shared->retried_total, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}
