/*
 * status.c
 *		The relays' status in shared memory: each relay writes its own
 *		slot; outbox.relay_status() reads them all, the outbox.stats view
 *		its database's.
 *
 * Counts for the last minute are kept per second in a ring of 60 slots, so
 * "sent in the last minute" costs no table writes and no scan.  A relay's
 * last error may quote its topics and brokers: it is shown to sessions of
 * the relay's own database and to pg_read_all_stats, as pg_stat_activity
 * shows a query only to its own role and to that role.
 *
 * src/status.c
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox.h"

#define STATUS_COLUMNS 13

static const char *const state_names[] = {
	[RELAY_STATE_STARTING] = "starting",
	[RELAY_STATE_IDLE] = "idle",
	[RELAY_STATE_SENDING] = "sending",
	[RELAY_STATE_UNREACHABLE] = "broker unreachable",
	[RELAY_STATE_UNCONFIGURED] = "not configured",
	[RELAY_STATE_BACKING_OFF] = "backing off",
	[RELAY_STATE_PAUSED] = "paused",
	[RELAY_STATE_WAITING_FOR_LOCK] = "waiting for lock",
	[RELAY_STATE_NO_TRANSACTIONS] = "waiting for Kafka transactions",
	[RELAY_STATE_FENCED] = "fenced",
};

static int64 unix_second(TimestampTz t);
static void status_row(ReturnSetInfo *rsinfo, int n, bool all_errors);
static void waiting_rows(ReturnSetInfo *rsinfo);
static void last_minute(const OutboxRelaySlot *slot, int64 now, uint64 *sent,
						uint64 *failed);
static Datum nullable_time(TimestampTz t, bool *isnull);

PG_FUNCTION_INFO_V1(outbox_relay_status);
PG_FUNCTION_INFO_V1(outbox_wake_at_commit);

/*
 * outbox_status_started: a relay starts; reset what describes the last.
 */
void
outbox_status_started(void)
{
	OutboxRelaySlot *me = outbox_my_relay;

	SpinLockAcquire(&outbox_shared->mutex);
	me->started_at = GetCurrentTimestamp();
	me->last_batch_at = 0;
	me->last_error_at = 0;
	me->last_error[0] = '\0';
	strlcpy(me->broker_state, "unknown", sizeof(me->broker_state));
	memset(me->seconds, 0, sizeof(me->seconds));
	me->state = RELAY_STATE_STARTING;
	SpinLockRelease(&outbox_shared->mutex);
	pg_atomic_write_u64(&me->sent_total, 0);
	pg_atomic_write_u64(&me->failed_total, 0);
	pg_atomic_write_u64(&me->retried_total, 0);
}

/*
 * outbox_status_state: publish what the relay is doing.
 */
void
outbox_status_state(OutboxRelayState state)
{
	outbox_my_relay->state = state;
}

/*
 * outbox_status_current: what the relay published it is doing.
 */
OutboxRelayState
outbox_status_current(void)
{
	return outbox_my_relay->state;
}

/*
 * outbox_status_error: publish the relay's latest error.
 */
void
outbox_status_error(const char *error)
{
	SpinLockAcquire(&outbox_shared->mutex);
	strlcpy(outbox_my_relay->last_error, error, OUTBOX_ERROR_LEN);
	outbox_my_relay->last_error_at = GetCurrentTimestamp();
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * outbox_status_clear_error: publish that the relay has no error now, as
 * when the settings its last error came from were changed.
 */
void
outbox_status_clear_error(void)
{
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_my_relay->last_error[0] = '\0';
	outbox_my_relay->last_error_at = 0;
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * outbox_status_broker: publish what the relay knows of the broker.
 */
void
outbox_status_broker(const char *state)
{
	SpinLockAcquire(&outbox_shared->mutex);
	strlcpy(outbox_my_relay->broker_state, state,
			sizeof(outbox_my_relay->broker_state));
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * outbox_status_batch: count a batch's deliveries in this second's slot.
 */
void
outbox_status_batch(uint64 sent, uint64 failed)
{
	TimestampTz now = GetCurrentTimestamp();
	int64 second = unix_second(now);
	OutboxSecond *slot = &outbox_my_relay->seconds[second % OUTBOX_MINUTE_SLOTS];

	SpinLockAcquire(&outbox_shared->mutex);
	if (slot->second != second)
	{
		slot->second = second;
		slot->sent = 0;
		slot->failed = 0;
	}
	slot->sent += sent;
	slot->failed += failed;
	if (sent > 0)
		outbox_my_relay->last_batch_at = now;
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * outbox_status_totals: add a round's deliveries to the relay's totals.
 */
void
outbox_status_totals(uint64 sent, uint64 failed, uint64 retried)
{
	pg_atomic_fetch_add_u64(&outbox_my_relay->sent_total, sent);
	pg_atomic_fetch_add_u64(&outbox_my_relay->failed_total, failed);
	pg_atomic_fetch_add_u64(&outbox_my_relay->retried_total, retried);
}

/*
 * outbox_relay_status: SQL outbox.relay_status(): one row per running
 * relay, of every database, then one per database left without a relay
 * (none when the extension is not preloaded).
 */
Datum
outbox_relay_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool all_errors;

	InitMaterializedSRF(fcinfo, 0);
	if (outbox_shared == NULL)
		PG_RETURN_VOID();
	all_errors = has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS);
	for (int i = 0; i < outbox_shared->nslots; i++)
		status_row(rsinfo, i, all_errors);
	waiting_rows(rsinfo);
	PG_RETURN_VOID();
}

/*
 * waiting_rows: a row for each database the launcher left without a
 * relay (no pid): its state says what it waits for, last_error why, and
 * last_error_at since when.
 */
static void
waiting_rows(ReturnSetInfo *rsinfo)
{
	OutboxWaiting waiting[OUTBOX_MAX_WAITING];
	int n;

	SpinLockAcquire(&outbox_shared->mutex);
	n = Min(outbox_shared->nwaiting, OUTBOX_MAX_WAITING);
	memcpy(waiting, outbox_shared->waiting, n * sizeof(OutboxWaiting));
	SpinLockRelease(&outbox_shared->mutex);
	for (int i = 0; i < n; i++)
	{
		Datum values[STATUS_COLUMNS] = {0};
		bool nulls[STATUS_COLUMNS] = {0};
		char *dbname = get_database_name(waiting[i].database);

		if (dbname == NULL)
			continue;
		for (int c = 0; c < STATUS_COLUMNS; c++)
			nulls[c] = true;
		values[1] = DirectFunctionCall1(namein, CStringGetDatum(dbname));
		values[2] =
			CStringGetTextDatum(waiting[i].reason == WAIT_LOCK
									? state_names[RELAY_STATE_WAITING_FOR_LOCK]
									: "waiting for a relay slot");
		values[6] = CStringGetTextDatum(outbox_wait_reason(waiting[i].reason));
		values[7] = TimestampTzGetDatum(waiting[i].since);
		nulls[1] = nulls[2] = nulls[6] = nulls[7] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

/*
 * outbox_wait_reason: why a database waits, in the words of the log.
 */
const char *
outbox_wait_reason(OutboxWaitReason reason)
{
	switch (reason)
	{
		case WAIT_RELAY_SLOT:
			return "every relay slot (outbox.max_relays) is taken";
		case WAIT_WORKER_SLOT:
			return "no background worker slot is free (max_worker_processes)";
		case WAIT_LOCK:
			return "another session holds the database locked";
	}
	return "";
}

/*
 * status_row: slot n's row, if a relay runs there; its last error only to
 * its own database's sessions unless all_errors.
 */
static void
status_row(ReturnSetInfo *rsinfo, int n, bool all_errors)
{
	OutboxRelaySlot *slot = &outbox_shared->slots[n];
	OutboxRelaySlot copy;
	Datum values[STATUS_COLUMNS];
	bool nulls[STATUS_COLUMNS] = {0};
	uint64 sent_minute;
	uint64 failed_minute;
	char *dbname;

	SpinLockAcquire(&outbox_shared->mutex);
	memcpy(&copy, slot, sizeof(copy));
	SpinLockRelease(&outbox_shared->mutex);
	if (copy.pid == 0)
		return;
	if (!all_errors && copy.database != MyDatabaseId)
	{
		copy.last_error[0] = '\0';
		copy.last_error_at = 0;
	}

	last_minute(slot, unix_second(GetCurrentTimestamp()), &sent_minute,
				&failed_minute);
	dbname = get_database_name(copy.database);
	values[0] = Int32GetDatum(copy.pid);
	nulls[1] = (dbname == NULL);
	values[1] = nulls[1] ? (Datum) 0
						 : DirectFunctionCall1(namein, CStringGetDatum(dbname));
	values[2] = CStringGetTextDatum(state_names[copy.state]);
	values[3] = CStringGetTextDatum(copy.broker_state);
	values[4] = nullable_time(copy.started_at, &nulls[4]);
	values[5] = nullable_time(copy.last_batch_at, &nulls[5]);
	values[6] = CStringGetTextDatum(copy.last_error);
	nulls[6] = (copy.last_error[0] == '\0');
	values[7] = nullable_time(copy.last_error_at, &nulls[7]);
	values[8] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->sent_total));
	values[9] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->failed_total));
	values[10] = Int64GetDatum((int64) pg_atomic_read_u64(&slot->retried_total));
	values[11] = Int64GetDatum((int64) sent_minute);
	values[12] = Int64GetDatum((int64) failed_minute);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * outbox_wake_at_commit: SQL outbox._wake_at_commit(): wake the relay
 * when the calling transaction commits (after pause, resume, replay).
 */
Datum
outbox_wake_at_commit(PG_FUNCTION_ARGS)
{
	outbox_wake_relay_at_commit();
	PG_RETURN_VOID();
}

/*
 * unix_second: t as whole seconds since the Unix epoch.
 */
static int64
unix_second(TimestampTz t)
{
	return (int64) (timestamptz_to_time_t(t));
}

/*
 * last_minute: relay's deliveries counted in the 60 seconds up to now.
 */
static void
last_minute(const OutboxRelaySlot *relay, int64 now, uint64 *sent, uint64 *failed)
{
	*sent = 0;
	*failed = 0;
	SpinLockAcquire(&outbox_shared->mutex);
	for (int i = 0; i < OUTBOX_MINUTE_SLOTS; i++)
	{
		const OutboxSecond *slot = &relay->seconds[i];

		if (slot->second > now - OUTBOX_MINUTE_SLOTS && slot->second <= now)
		{
			*sent += slot->sent;
			*failed += slot->failed;
		}
	}
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * nullable_time: a timestamp datum, NULL for 0 (never).
 */
static Datum
nullable_time(TimestampTz t, bool *isnull)
{
	*isnull = (t == 0);
	return TimestampTzGetDatum(t);
}
