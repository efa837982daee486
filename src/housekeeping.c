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

/* Rows one retention round may delete of each kind. */
#define PURGE_BATCH 10000
#define PURGE_EVERY_MS 10000
#define ALERT_CHECK_EVERY_MS 5000
#define ALERT_REPEAT_MS 60000

static const char *const paused_sql = "SELECT paused FROM outbox.relay_control";
static const char *const purge_sql =
	"SELECT outbox._purge($1 * interval '1 second', $2 * interval '1 second', $3)";
static const char *const delay_sql =
	"SELECT max_delay_sec::float8, backlog FROM outbox.stats";

static SPIPlanPtr paused_plan = NULL;
static SPIPlanPtr purge_plan = NULL;
static SPIPlanPtr delay_plan = NULL;

static TimestampTz next_purge = 0;
static TimestampTz next_alert_check = 0;
static TimestampTz last_warning = 0;
static bool alerting = false;

static void purge(TimestampTz now);
static void check_delay(TimestampTz now);
static Datum first_value(SPIPlanPtr *cache, const char *sql, int nargs,
						 Oid *types, Datum *values, int col, bool *isnull);

/*
 * relay_paused: whether an operator paused the relay.
 */
bool
relay_paused(void)
{
	bool isnull;
	bool paused;

	if (!relay_begin("checking pause"))
		return false;
	paused = DatumGetBool(
		first_value(&paused_plan, paused_sql, 0, NULL, NULL, 1, &isnull));
	relay_commit();
	return paused && !isnull;
}

/*
 * relay_housekeeping: retention and the backlog alert, each when due.
 */
void
relay_housekeeping(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (now >= next_purge)
		purge(now);
	relay_check_alert();
}

/*
 * relay_check_alert: the backlog alert, when due; also called while the
 * relay waits for a broker that does not answer, which is when it matters.
 */
void
relay_check_alert(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (outbox_alert_delay > 0 && now >= next_alert_check)
		check_delay(now);
}

/*
 * purge: one retention batch; soon again if it found a full batch.
 */
static void
purge(TimestampTz now)
{
	Oid types[3] = {INT4OID, INT4OID, INT4OID};
	Datum values[3];
	bool isnull;
	int64 removed;

	values[0] = Int32GetDatum(outbox_sent_retention);
	values[1] = Int32GetDatum(outbox_dedup_retention);
	values[2] = Int32GetDatum(PURGE_BATCH);
	if (!relay_begin("removing what retention no longer keeps"))
		return;
	removed = DatumGetInt64(
		first_value(&purge_plan, purge_sql, 3, types, values, 1, &isnull));
	relay_commit();
	next_purge = removed >= PURGE_BATCH
					 ? now
					 : TimestampTzPlusMilliseconds(now, PURGE_EVERY_MS);
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
	if (!relay_begin("checking the backlog"))
		return;
	delay = DatumGetFloat8(
		first_value(&delay_plan, delay_sql, 0, NULL, NULL, 1, &isnull));
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
				 errhint("See outbox.relay_status() and outbox.stats.")));
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

/*
 * first_value: run a kept plan and return column col of its first row.
 */
static Datum
first_value(SPIPlanPtr *cache, const char *sql, int nargs, Oid *types,
			Datum *values, int col, bool *isnull)
{
	SPIPlanPtr plan = outbox_keep_plan(cache, sql, nargs, types, false);
	int rc = SPI_execute_plan(plan, values, NULL, false, 1);

	if (rc < 0 || SPI_processed != 1)
		elog(ERROR, "outbox relay: \"%s\" failed: %s", sql,
			 SPI_result_code_string(rc));
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col,
						 isnull);
}
