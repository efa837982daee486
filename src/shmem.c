/*
 * shmem.c
 *		Shared memory: what the launcher, the relay and the backends that
 *		enqueue need to know of each other.
 *
 * A backend that enqueued wakes its database's relay when its transaction
 * commits: an XactCallback sets the relay's latch.  SetLatch is a no-op
 * while the latch is already set, so a burst of commits costs the relay
 * one wake-up, and nothing is sent on every commit the way NOTIFY would.
 * CREATE EXTENSION wakes the launcher the same way, so that the new
 * database's relay starts at once.
 *
 * src/shmem.c
 */
#include "postgres.h"

#include <unistd.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"

#include "outbox.h"

OutboxShared *outbox_shared = NULL;
/* In a relay: its slot. */
OutboxRelaySlot *outbox_my_relay = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static bool wake_at_commit = false;
static bool events_at_commit = false;
static bool launcher_at_commit = false;
/* The slot of this database's relay, as last found (a hint). */
static int relay_hint = 0;

static void shmem_request(void);
static void shmem_startup(void);
static void wake_on_commit(XactEvent event, void *arg);
static void relay_detach(int code, Datum arg);
static Size shmem_size(void);
static void wake_launcher(void);

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
 * commits (it changed what the relay must do: paused, resumed, replayed).
 */
void
outbox_wake_relay_at_commit(void)
{
	wake_at_commit = true;
}

/*
 * outbox_events_at_commit: the current transaction added events: wake the
 * relay if it commits, unless the relay is paused.  A paused relay woken
 * by every commit only found itself paused again, in a transaction of its
 * own: at thousands of commits a second, a core's worth of signals and
 * reads for nothing.
 */
void
outbox_events_at_commit(void)
{
	events_at_commit = true;
}

/*
 * outbox_wake_launcher_at_commit: wake the launcher if the current
 * transaction commits (it created the extension in this database).
 */
void
outbox_wake_launcher_at_commit(void)
{
	launcher_at_commit = true;
}

/*
 * outbox_wake_relay: set the latch of this database's relay, if it has
 * one; with only_if_relaying, not if the relay's last read found it
 * paused.  The slots are few; the last one found is looked at first.
 */
void
outbox_wake_relay(bool only_if_relaying)
{
	if (outbox_shared == NULL)
		return;
	for (int i = 0; i < outbox_shared->nslots; i++)
	{
		int n = (relay_hint + i) % outbox_shared->nslots;
		OutboxRelaySlot *slot = &outbox_shared->slots[n];
		PGPROC *relay;

		if (slot->database != MyDatabaseId)
			continue;
		relay = (PGPROC *) pg_atomic_read_u64(&slot->proc);
		if (relay == NULL)
			continue;
		relay_hint = n;
		/*
		 * The relay clears its paused flag before a read and reads after:
		 * either it sees what this backend committed, or this backend
		 * sees the flag cleared (outbox_relay_paused_flag).
		 */
		pg_memory_barrier();
		if (!only_if_relaying)
			pg_atomic_write_u32(&slot->told, 1);
		if (!only_if_relaying || pg_atomic_read_u32(&slot->paused) == 0)
			SetLatch(&relay->procLatch);
		return;
	}
}

/*
 * wake_launcher: set the launcher's latch, if it runs, and have it look
 * again at this database, where the extension was created.  Only this
 * one: looking at every database costs a process each.
 */
static void
wake_launcher(void)
{
	PGPROC *launcher;
	bool known = false;

	if (outbox_shared == NULL)
		return;
	SpinLockAcquire(&outbox_shared->mutex);
	for (int i = 0; i < outbox_shared->ncreated; i++)
		known |= outbox_shared->created_in[i] == MyDatabaseId;
	if (!known && outbox_shared->ncreated < OUTBOX_WAKE_SLOTS)
		outbox_shared->created_in[outbox_shared->ncreated++] = MyDatabaseId;
	else if (!known)
		outbox_shared->created_more = true;
	SpinLockRelease(&outbox_shared->mutex);
	launcher = (PGPROC *) pg_atomic_read_u64(&outbox_shared->launcher);
	if (launcher != NULL)
		SetLatch(&launcher->procLatch);
}

/*
 * outbox_nudge_launcher: set the launcher's latch, if it runs, so that it
 * looks at once at what changed (a hold released).
 */
void
outbox_nudge_launcher(void)
{
	PGPROC *launcher;

	if (outbox_shared == NULL)
		return;
	launcher = (PGPROC *) pg_atomic_read_u64(&outbox_shared->launcher);
	if (launcher != NULL)
		SetLatch(&launcher->procLatch);
}

/*
 * outbox_relay_attach: publish this process as the relay of the slot the
 * launcher gave it, so commits and operators can wake it; undone at exit.
 * A relay whose slot was freed before it started leaves.
 */
void
outbox_relay_attach(const OutboxRelayStart *start)
{
	OutboxRelaySlot *slot;
	bool ours;

	if (start->slot < 0 || start->slot >= outbox_shared->nslots)
		elog(ERROR, "outbox relay: no slot %d", start->slot);
	slot = &outbox_shared->slots[start->slot];
	SpinLockAcquire(&outbox_shared->mutex);
	ours = slot->database == MyDatabaseId &&
		   slot->generation == start->generation && slot->pid == 0;
	if (ours)
		slot->pid = MyProcPid;
	SpinLockRelease(&outbox_shared->mutex);
	/* Started after its launcher gave the slot up: not wanted any more. */
	if (!ours)
		proc_exit(0);
	outbox_my_relay = slot;
	pg_atomic_write_u32(&slot->paused, 0);
	pg_atomic_write_u32(&slot->told, 0);
	pg_atomic_write_u64(&slot->proc, (uint64) MyProc);
	on_shmem_exit(relay_detach, (Datum) 0);
}

/*
 * outbox_relay_paused_flag: publish whether the relay's last read found it
 * paused (then commits that only add events do not wake it).  Cleared
 * before every round that may read, with a barrier between the store and
 * the read's snapshot: a commit whose backend saw the flag set was visible
 * before the flag was cleared, so that read finds its events.
 */
void
outbox_relay_paused_flag(bool paused)
{
	pg_atomic_write_u32(&outbox_my_relay->paused, paused ? 1 : 0);
	pg_memory_barrier();
}

/*
 * outbox_relay_told: whether an operator's change (pause, resume, replay,
 * DROP EXTENSION) woke the relay since it last asked.
 */
bool
outbox_relay_told(void)
{
	return pg_atomic_exchange_u32(&outbox_my_relay->told, 0) != 0;
}

/*
 * outbox_relay_absent: tell the launcher the extension is not (or no
 * longer) installed here, so it starts no relay again until a CREATE
 * EXTENSION; then exit.
 */
void
outbox_relay_absent(void)
{
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_my_relay->absent = true;
	SpinLockRelease(&outbox_shared->mutex);
	proc_exit(0);
}

/*
 * relay_detach: forget the relay at its exit.  The launcher frees the
 * slot once it sees the process gone.
 */
static void
relay_detach(int code, Datum arg)
{
	pg_atomic_write_u64(&outbox_my_relay->proc, 0);
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_my_relay->pid = 0;
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
			if (wake_at_commit || events_at_commit)
				outbox_wake_relay(!wake_at_commit);
			if (launcher_at_commit)
				wake_launcher();
			wake_at_commit = false;
			events_at_commit = false;
			launcher_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_at_commit = false;
			events_at_commit = false;
			launcher_at_commit = false;
			break;
		case XACT_EVENT_PREPARE:
			/*
			 * Nothing is visible yet, and no COMMIT or ABORT event follows in
			 * this session: the flag would wake the relay at the session's
			 * next commit.  COMMIT PREPARED wakes it (see outbox_utility).
			 */
			wake_at_commit = false;
			events_at_commit = false;
			launcher_at_commit = false;
			break;
		default:
			break;
	}
}

/*
 * shmem_size: the struct and one slot per relay.
 */
static Size
shmem_size(void)
{
	return add_size(offsetof(OutboxShared, slots),
					mul_size(outbox_max_relays, sizeof(OutboxRelaySlot)));
}

/*
 * shmem_request: reserve our segment.
 */
static void
shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(shmem_size()));
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
	outbox_shared = ShmemInitStruct("outbox", shmem_size(), &found);
	if (!found)
	{
		memset(outbox_shared, 0, shmem_size());
		SpinLockInit(&outbox_shared->mutex);
		outbox_shared->incarnation = outbox_draw_incarnation();
		/* The postmaster runs in the data directory. */
		outbox_shared->began_as_standby = access(STANDBY_SIGNAL_FILE, F_OK) == 0;
		pg_atomic_init_u64(&outbox_shared->launcher, 0);
		outbox_shared->nslots = outbox_max_relays;
		for (int i = 0; i < outbox_max_relays; i++)
		{
			OutboxRelaySlot *slot = &outbox_shared->slots[i];

			pg_atomic_init_u64(&slot->proc, 0);
			pg_atomic_init_u32(&slot->paused, 0);
			pg_atomic_init_u32(&slot->told, 0);
			pg_atomic_init_u64(&slot->sent_total, 0);
			pg_atomic_init_u64(&slot->failed_total, 0);
			pg_atomic_init_u64(&slot->retried_total, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}
