/*
 * relay.c
 *		First sends: relay committed events to Kafka in windows, in id order.
 *
 * relay_cursor.done_snapshot says which transactions are fully relayed.  A
 * window is opened by taking the current snapshot; the events visible in it
 * but not in done_snapshot are exactly those committed in between, however
 * their ids interleave, so none is skipped (a plain "id > last sent" poller
 * skips rows committed out of id order) and none is read twice.  A window is
 * sent in batches of outbox.batch_size in id order, so a huge backlog or one
 * huge transaction never arrives as one unbounded batch; window_last_id
 * records the progress, one UPDATE per batch rather than one per event.
 *
 * src/relay.c
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/datum.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "relay.h"

/* The relay's place: done_snapshot and the open window, if any. */
typedef struct RelayCursor
{
	Datum done;   /* pg_snapshot */
	Datum window; /* pg_snapshot; valid only if open */
	bool open;
	int64 last_id;
	int64 max_id;
} RelayCursor;

/*
 * Every statement here runs as a superuser: functions and operators are
 * named with their schema, and parameters have exact types, so none
 * resolves to an object a database owner could create.
 */
static const char *const cursor_sql =
	"SELECT done_snapshot, window_snapshot, window_last_id, window_max_id"
	"  FROM outbox.relay_cursor";

/*
 * The cursor row as after CREATE EXTENSION, but with nothing relayed: no
 * transaction id is visible in the snapshot '3:3:' (3 is the first normal
 * one), so every kept event not known to be sent is sent again.
 */
static const char *const recreate_cursor_sql =
	"INSERT INTO outbox.relay_cursor (done_snapshot)"
	" VALUES (CAST('3:3:' AS pg_catalog.pg_snapshot)) ON CONFLICT DO NOTHING";

static const char *const any_new_sql =
	"SELECT EXISTS (SELECT 1 FROM outbox.event_log l"
	"  WHERE l.tx OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin($1)"
	"    AND NOT pg_catalog.pg_visible_in_snapshot(l.tx, $1))";

/*
 * The statement's own snapshot is the window: all it sees is committed.
 * The window's id range bounds the batch reads to its own part of the table.
 * "l.id + 0" keeps the planner from answering min/max by walking the
 * primary key from one end, past every event already relayed and kept for
 * outbox.sent_retention; the tx range is the narrow one.
 */
static const char *const open_window_sql =
	"UPDATE outbox.relay_cursor"
	"   SET window_snapshot = pg_catalog.pg_current_snapshot(),"
	"  updated_at = pg_catalog.now(), (window_last_id, window_max_id) ="
	"  (SELECT COALESCE(pg_catalog.min(l.id OPERATOR(pg_catalog.+) 0::bigint)"
	"                   OPERATOR(pg_catalog.-) 1::bigint, 0::bigint),"
	"          COALESCE(pg_catalog.max(l.id OPERATOR(pg_catalog.+) 0::bigint),"
	"                   0::bigint)"
	"     FROM outbox.event_log l"
	"    WHERE l.tx OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin($1)"
	"      AND NOT pg_catalog.pg_visible_in_snapshot(l.tx, $1))"
	" RETURNING window_snapshot, window_last_id, window_max_id";

/*
 * An event with a delivery state of its own is the retries' business; in a
 * window read as usual there is none, but after the cursor was recreated
 * (recreate_cursor_sql) the window holds every kept event.
 */
static const char *const window_batch_sql =
	"SELECT l.id, l.topic, l.msg_key, l.payload, l.headers, l.biz_type, l.biz_key"
	"  FROM outbox.event_log l"
	" WHERE l.id OPERATOR(pg_catalog.>) $3 AND l.id OPERATOR(pg_catalog.<=) $4"
	"   AND l.tx OPERATOR(pg_catalog.>=) pg_catalog.pg_snapshot_xmin($1)"
	"   AND pg_catalog.pg_visible_in_snapshot(l.tx, $2)"
	"   AND NOT pg_catalog.pg_visible_in_snapshot(l.tx, $1)"
	"   AND NOT EXISTS (SELECT 1 FROM outbox.event_state s"
	"                    WHERE s.id OPERATOR(pg_catalog.=) l.id)"
	" ORDER BY l.id LIMIT $5";

static const char *const advance_sql =
	"UPDATE outbox.relay_cursor SET window_last_id = $1,"
	"  updated_at = pg_catalog.now()";

static const char *const close_window_sql =
	"UPDATE outbox.relay_cursor SET done_snapshot = window_snapshot,"
	"  window_snapshot = NULL, window_last_id = 0, window_max_id = 0,"
	"  updated_at = pg_catalog.now()";

static SPIPlanPtr cursor_plan = NULL;
static SPIPlanPtr recreate_cursor_plan = NULL;
static SPIPlanPtr any_new_plan = NULL;
static SPIPlanPtr open_window_plan = NULL;
static SPIPlanPtr window_batch_plan = NULL;
static SPIPlanPtr advance_plan = NULL;
static SPIPlanPtr close_window_plan = NULL;

static bool read_cursor(RelayCursor *cur);
static void recreate_cursor(void);
static bool open_window(RelayCursor *cur);
static RelayBatch *read_window_batch(RelayCursor *cur, HTAB **blocked);
static RelayOutcome record_window_batch(RelayBatch *batch, RelayCursor *cur);
static int first_transient(RelayBatch *batch);
static Datum keep_datum(Datum value);
static void run_plan(SPIPlanPtr *cache, const char *sql, int nargs,
					 const Oid *types, Datum *values, int expect);

/*
 * relay_first_sends: send the next batch of the open window (opening one
 * if new events have committed) and record how far it got.
 */
RelayOutcome
relay_first_sends(void)
{
	RelayCursor cur;
	RelayBatch *batch;
	HTAB *blocked;
	bool interrupted = false;
	RelayOutcome outcome;

	if (!relay_begin(
			"reading the outbox from outbox.relay_cursor and outbox.event_log"))
		return RELAY_IDLE;
	if (!read_cursor(&cur) || (!cur.open && !open_window(&cur)))
	{
		relay_commit();
		return RELAY_IDLE;
	}
	batch = read_window_batch(&cur, &blocked);
	relay_commit();

	if (batch->count > 0 && !relay_batch_send(batch, blocked))
		interrupted = true;

	if (!relay_begin("recording deliveries in outbox.relay_cursor"))
		return RELAY_IDLE;
	outcome = record_window_batch(batch, &cur);
	return interrupted ? RELAY_INTERRUPTED : outcome;
}

/*
 * read_cursor: the relay's place; false if there is nothing to do (no
 * open window and no event committed since done_snapshot).
 */
static bool
read_cursor(RelayCursor *cur)
{
	HeapTuple row;
	TupleDesc desc;
	bool isnull;

	run_plan(&cursor_plan, cursor_sql, 0, NULL, NULL, SPI_OK_SELECT);
	if (SPI_processed == 0)
	{
		recreate_cursor();
		run_plan(&cursor_plan, cursor_sql, 0, NULL, NULL, SPI_OK_SELECT);
	}
	if (SPI_processed != 1)
		elog(ERROR,
			 "outbox relay: outbox.relay_cursor must hold exactly one row");
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	cur->done = keep_datum(SPI_getbinval(row, desc, 1, &isnull));
	cur->window = SPI_getbinval(row, desc, 2, &isnull);
	cur->open = !isnull;
	if (cur->open)
		cur->window = keep_datum(cur->window);
	cur->last_id = DatumGetInt64(SPI_getbinval(row, desc, 3, &isnull));
	cur->max_id = DatumGetInt64(SPI_getbinval(row, desc, 4, &isnull));
	if (cur->open)
		return true;

	{
		Oid types[1] = {PG_SNAPSHOTOID};

		run_plan(&any_new_plan, any_new_sql, 1, types, &cur->done,
				 SPI_OK_SELECT);
		return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 1, &isnull));
	}
}

/*
 * recreate_cursor: put back the cursor row someone deleted, as "nothing
 * relayed yet".  Which events were sent is lost with the row, so all kept
 * events not known to be sent go again: duplicates, never a loss.
 */
static void
recreate_cursor(void)
{
	ereport(
		WARNING,
		(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
		 errmsg("outbox relay: the row of outbox.relay_cursor was deleted; it is created again"),
		 errdetail(
			 "Every kept event not known to be sent is sent again, so consumers may see duplicates."),
		 errhint(
			 "Do not change outbox.relay_cursor; to stop relaying use outbox.pause().")));
	run_plan(&recreate_cursor_plan, recreate_cursor_sql, 0, NULL, NULL,
			 SPI_OK_INSERT);
}

/*
 * open_window: take the current snapshot as the new window.
 */
static bool
open_window(RelayCursor *cur)
{
	Oid types[1] = {PG_SNAPSHOTOID};
	HeapTuple row;
	TupleDesc desc;
	bool isnull;

	run_plan(&open_window_plan, open_window_sql, 1, types, &cur->done,
			 SPI_OK_UPDATE_RETURNING);
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	cur->window = keep_datum(SPI_getbinval(row, desc, 1, &isnull));
	cur->last_id = DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull));
	cur->max_id = DatumGetInt64(SPI_getbinval(row, desc, 3, &isnull));
	cur->open = true;
	return true;
}

/*
 * read_window_batch: the next outbox.batch_size events of the window, and
 * the keys that must wait behind a retry.
 */
static RelayBatch *
read_window_batch(RelayCursor *cur, HTAB **blocked)
{
	Oid types[5] = {PG_SNAPSHOTOID, PG_SNAPSHOTOID, INT8OID, INT8OID, INT8OID};
	Datum values[5];
	MemoryContext old;
	RelayBatch *batch;
	RelaySettings settings = relay_settings_now();

	values[0] = cur->done;
	values[1] = cur->window;
	values[2] = Int64GetDatum(cur->last_id);
	values[3] = Int64GetDatum(cur->max_id);
	values[4] = Int64GetDatum(settings.batch_size);
	run_plan(&window_batch_plan, window_batch_sql, 5, types, values,
			 SPI_OK_SELECT);

	old = MemoryContextSwitchTo(relay_batch_context());
	batch = relay_batch_load(SPI_tuptable, SPI_processed, &settings);
	MemoryContextSwitchTo(old);
	*blocked = relay_pending_keys();
	return batch;
}

/*
 * record_window_batch: move the cursor past what was delivered or set
 * aside, and note the events that failed or wait behind a retry.  Called
 * inside relay_begin; commits.
 *
 * Events up to the first one that failed for the broker's sake (timeout,
 * broker unreachable) or was not answered are settled; that one and the
 * rest are read again.  The batch is full if it reached the limit it was
 * read with: a reload since must not close a window it did not finish.
 */
static RelayOutcome
record_window_batch(RelayBatch *batch, RelayCursor *cur)
{
	int cut = first_transient(batch);
	bool full = batch->count >= batch->settings.batch_size;

	for (int i = 0; i < cut; i++)
	{
		if (batch->held[i])
			relay_set_state(batch->msgs[i].event_id, "new", 0, 0, NULL);
		else if (batch->msgs[i].error != 0)
			relay_record_failure(batch, i);
	}

	if (cut < batch->count)
	{
		Datum last = Int64GetDatum(batch->msgs[cut].event_id - 1);
		Oid type = INT8OID;

		run_plan(&advance_plan, advance_sql, 1, &type, &last, SPI_OK_UPDATE);
	}
	else if (full)
	{
		Datum last = Int64GetDatum(batch->msgs[batch->count - 1].event_id);
		Oid type = INT8OID;

		run_plan(&advance_plan, advance_sql, 1, &type, &last, SPI_OK_UPDATE);
	}
	else
		run_plan(&close_window_plan, close_window_sql, 0, NULL, NULL,
				 SPI_OK_UPDATE);
	relay_commit();

	relay_count(batch, cut);
	if (cut == 0 && batch->count > 0)
		return RELAY_UNREACHABLE;
	if (full || cut < batch->count)
		return RELAY_MORE;
	return batch->count > 0 ? RELAY_SENT : RELAY_IDLE;
}

/*
 * first_transient: index of the first event that failed for the broker's
 * sake or was not answered, or count if none.
 */
static int
first_transient(RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		if (relay_unanswered(batch, i))
			return i;
		if (!batch->held[i] && batch->msgs[i].error != 0 &&
			batch->msgs[i].transient)
			return i;
	}
	return batch->count;
}

/*
 * keep_datum: a copy of a varlena value that outlives the transaction.
 */
static Datum
keep_datum(Datum value)
{
	MemoryContext old = MemoryContextSwitchTo(relay_batch_context());
	Datum copy = datumCopy(value, false, -1);

	MemoryContextSwitchTo(old);
	return copy;
}

/*
 * run_plan: execute a kept plan and insist on its result code.  Planned
 * for each call's values: a generic plan cannot see how narrow the range
 * "tx >= pg_snapshot_xmin($1)" is and would scan the whole table.
 */
static void
run_plan(SPIPlanPtr *cache, const char *sql, int nargs, const Oid *types,
		 Datum *values, int expect)
{
	SPIPlanPtr plan = outbox_keep_plan(cache, sql, nargs, types, true);
	int rc = SPI_execute_plan(plan, values, NULL, false, 0);

	if (rc != expect)
		elog(ERROR, "outbox relay: \"%s\" failed: %s", sql,
			 SPI_result_code_string(rc));
}
