/*
 * housekeeping.c
 *		What the relay does besides sending: honour outbox.pause(), remove
 *		what retention no longer keeps, and warn when the backlog ages.
 *
 * Retention runs only when the relay has no backlog to drain, in bounded
 * batches (each its own short transaction), so it never holds long locks
 * and never delays relaying by more than one batch of deletes.
 *
 * src/housekeeping.c
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "relay.h"

/* Rows one retention step may delete of each kind. */
#define PURGE_BATCH 10000
#define PURGE_EVERY_MS 10000
#define ALERT_CHECK_EVERY_MS 5000
#define ALERT_REPEAT_MS 60000

/*
 * Run as a superuser: the retention periods are passed as intervals made
 * here, so the call matches outbox._purge(interval, interval, integer)
 * exactly and no operator is resolved (pg_catalog has no
 * *(integer, interval), so one a database owner made in public would win).
 */
static const char *const purge_sql = "SELECT outbox._purge($1, $2, $3)";
static const char *const delay_sql =
	"SELECT CAST(max_delay_sec AS double precision), backlog FROM outbox.stats";

static SPIPlanPtr purge_plan = NULL;
static SPIPlanPtr delay_plan = NULL;

static TimestampTz next_purge = 0;
static TimestampTz next_alert_check = 0;
static TimestampTz last_warning = 0;
static bool alerting = false;

static Datum seconds_interval(int seconds);
static void check_delay(TimestampTz now);

/*
 * relay_paused: whether an operator paused the relay.
 */
bool
relay_paused(void)
{
	bool paused;

	if (!relay_begin("checking pause in outbox.relay_control"))
		return false;
	paused = relay_pause_set();
	relay_commit();
	return paused;
}

/*
 * relay_purge_due: whether retention is due.
 */
bool
relay_purge_due(TimestampTz now)
{
	return now >= next_purge;
}

/*
 * relay_purge_done: retention removed so many rows: soon again if it found
 * a full batch, else after PURGE_EVERY_MS (also when it gave up waiting
 * for a lock, so that a lock held for long costs one lock timeout per
 * period, not per round).
 */
void
relay_purge_done(TimestampTz now, int64 removed)
{
	next_purge = removed >= PURGE_BATCH
					 ? now
					 : TimestampTzPlusMilliseconds(now, PURGE_EVERY_MS);
}

/*
 * relay_alert_due: whether the backlog alert is due.
 */
bool
relay_alert_due(TimestampTz now)
{
	return outbox_alert_delay > 0 && now >= next_alert_check;
}

/*
 * relay_purge_step: run outbox._purge once; *arg receives the rows it
 * removed.
 */
void
relay_purge_step(void *arg)
{
	Oid types[3] = {INTERVALOID, INTERVALOID, INT4OID};
	Datum values[3];
	bool isnull;

	if (!relay_begin("removing what retention no longer keeps from outbox.event_log,"
					 " outbox.event_state and outbox.consumer_dedup"))
		return;
	/* Made here, in the step's memory, which its end frees. */
	values[0] = seconds_interval(outbox_sent_retention);
	values[1] = seconds_interval(outbox_dedup_retention);
	values[2] = Int32GetDatum(PURGE_BATCH);
	*(int64 *) arg = DatumGetInt64(relay_first_value(
		&purge_plan, purge_sql, 3, types, values, false, &isnull));
	relay_commit();
}

/*
 * seconds_interval: an interval of the given seconds, as a datum.
 */
static Datum
seconds_interval(int seconds)
{
	Interval *interval = palloc0(sizeof(Interval));

	interval->time = (TimeOffset) seconds * USECS_PER_SEC;
	return IntervalPGetDatum(interval);
}

/*
 * relay_alert_step: check_delay at the time *arg, as a guarded step.
 */
void
relay_alert_step(void *arg)
{
	check_delay(*(TimestampTz *) arg);
}

/*
 * check_delay: a WARNING while the oldest unsent event is older than
 * outbox.alert_delay (repeated once a minute), a LOG line when it is not.
 */
static void
check_delay(TimestampTz now)
{
	bool isnull;
	double delay;
	int64 backlog;

	next_alert_check = TimestampTzPlusMilliseconds(now, ALERT_CHECK_EVERY_MS);
	if (!relay_begin("checking the backlog in outbox.stats"))
		return;
	delay = DatumGetFloat8(relay_first_value(&delay_plan, delay_sql, 0, NULL,
											 NULL, false, &isnull));
	backlog = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 2, &isnull));
	relay_commit();

	if (delay > outbox_alert_delay)
	{
		if (!alerting ||
			TimestampDifferenceExceeds(last_warning, now, ALERT_REPEAT_MS))
		{
			ereport(
				WARNING,
				(errmsg("outbox backlog: the oldest unsent event is %.0f s old, %lld events wait",
						delay, (long long) backlog),
				 errdetail("outbox.alert_delay is %d s.", outbox_alert_delay),
				 errhint("See why in the state and last_error of "
						 "outbox.relay_status(), and what waits in "
						 "outbox.stats.")));
			last_warning = now;
		}
		alerting = true;
	}
	else if (alerting)
	{
		ereport(
			LOG,
			(errmsg("outbox backlog recovered: the oldest unsent event is %.0f s old",
					delay)));
		alerting = false;
	}
}
