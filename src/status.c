/*
 * status.c
 *		The relay's status in shared memory: written by the relay, read by
 *		outbox.relay_status() and the outbox.stats view.
 *
 * Counts for the last minute are kept per second in a ring of 60 slots, so
 * "sent in the last minute" costs no table writes and no scan.
 *
 * src/status.c
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
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
static void last_minute(int64 now, uint64 *sent, uint64 *failed);
static Datum nullable_time(TimestampTz t, bool *isnull);

PG_FUNCTION_INFO_V1(outbox_relay_status);
PG_FUNCTION_INFO_V1(outbox_wake_at_commit);

/*
 * outbox_status_started: a relay starts; reset what describes the last.
 */
void
outbox_status_started(void)
{
	SpinLockAcquire(&outbox_shared->mutex);
	outbox_shared->started_at = GetCurrentTimestamp();
	outbox_shared->last_batch_at = 0;
	outbox_shared->last_error_at = 0;
	outbox_shared->last_error[0] = '\0';
	strlcpy(outbox_shared->broker_state, "unknown",
			sizeof(outbox_shared->broker_state));
	memset(outbox_shared->seconds, 0, sizeof(outbox_shared->seconds));
	outbox_shared->relay_state = RELAY_STATE_STARTING;
	SpinLockRelease(&outbox_shared->mutex);
	pg_atomic_write_u64(&outbox_shared->sent_total, 0);
	pg_atomic_write_u64(&outbox_shared->failed_total, 0);
	pg_atomic_write_u64(&outbox_shared->retried_total, 0);
}

/*
 * outbox_status_state: publish what the relay is doing.
 */
void
outbox_status_state(OutboxRelayState state)
{
	outbox_shared->relay_state = state;
}

/*
 * outbox_status_error: publish the relay's latest error.
 */
void
outbox_status_error(const char *error)
{
	SpinLockAcquire(&outbox_shared->mutex);
	strlcpy(outbox_shared->last_error, error, OUTBOX_ERROR_LEN);
	outbox_shared->last_error_at = GetCurrentTimestamp();
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * outbox_status_broker: publish what the relay knows of the broker.
 */
void
outbox_status_broker(const char *state)
{
	SpinLockAcquire(&outbox_shared->mutex);
	strlcpy(outbox_shared->broker_state, state,
			sizeof(outbox_shared->broker_state));
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
	OutboxSecond *slot = &outbox_shared->seconds[second % OUTBOX_MINUTE_SLOTS];

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
		outbox_shared->last_batch_at = now;
	SpinLockRelease(&outbox_shared->mutex);
}

/*
 * outbox_relay_status: SQL outbox.relay_status(): one row per running
 * relay (none when the extension is not preloaded or no relay runs).
 */
Datum
outbox_relay_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum values[STATUS_COLUMNS];
	bool nulls[STATUS_COLUMNS] = {0};
	OutboxShared copy;
	uint64 sent_minute;
	uint64 failed_minute;

	InitMaterializedSRF(fcinfo, 0);
	if (outbox_shared == NULL)
		PG_RETURN_VOID();

	SpinLockAcquire(&outbox_shared->mutex);
	memcpy(&copy, outbox_shared, sizeof(copy));
	SpinLockRelease(&outbox_shared->mutex);
	if (copy.relay_pid == 0)
		PG_RETURN_VOID();

	last_minute(unix_second(GetCurrentTimestamp()), &sent_minute,
				&failed_minute);
	values[0] = Int32GetDatum(copy.relay_pid);
	values[1] = CStringGetDatum(get_database_name(copy.relay_database));
	nulls[1] = (values[1] == (Datum) 0);
	values[1] = nulls[1] ? (Datum) 0 : DirectFunctionCall1(namein, values[1]);
	values[2] = CStringGetTextDatum(state_names[copy.relay_state]);
	values[3] = CStringGetTextDatum(copy.broker_state);
	values[4] = nullable_time(copy.started_at, &nulls[4]);
	values[5] = nullable_time(copy.last_batch_at, &nulls[5]);
	values[6] = CStringGetTextDatum(copy.last_error);
	nulls[6] = (copy.last_error[0] == '\0');
	values[7] = nullable_time(copy.last_error_at, &nulls[7]);
	values[8] =
		Int64GetDatum((int64) pg_atomic_read_u64(&outbox_shared->sent_total));
	values[9] =
		Int64GetDatum((int64) pg_atomic_read_u64(&outbox_shared->failed_total));
	values[10] =
		Int64GetDatum((int64) pg_atomic_read_u64(&outbox_shared->retried_total));
	values[11] = Int64GetDatum((int64) sent_minute);
	values[12] = Int64GetDatum((int64) failed_minute);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	PG_RETURN_VOID();
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
 * last_minute: deliveries counted in the 60 seconds up to now.
 */
static void
last_minute(int64 now, uint64 *sent, uint64 *failed)
{
	*sent = 0;
	*failed = 0;
	SpinLockAcquire(&outbox_shared->mutex);
	for (int i = 0; i < OUTBOX_MINUTE_SLOTS; i++)
	{
		OutboxSecond *slot = &outbox_shared->seconds[i];

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
