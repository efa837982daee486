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

static const char *const cursor_sql =
	"SELECT done_snapshot, window_snapshot, window_last_id, window_max_id"
	"  FROM outbox.relay_cursor";

static const char *const any_new_sql =
	"SELECT EXISTS (SELECT 1 FROM outbox.event_log l"
	"  WHERE l.tx >= pg_snapshot_xmin($1)"
	"    AND NOT pg_visible_in_snapshot(l.tx, $1))";

/*
 * The statement's own snapshot is the window: all it sees is committed.
 * The window's id range bounds the batch reads to its own part of the table.
 * "l.id + 0" keeps the planner from answering min/max by walking the
 * primary key from one end, past every event already relayed and kept for
 * outbox.sent_retention; the tx range is the narrow one.
 */
static const char *const open_window_sql =
	"UPDATE outbox.relay_cursor SET window_snapshot = pg_current_snapshot(),"
	"  updated_at = now(), (window_last_id, window_max_id) ="
	"  (SELECT COALESCE(min(l.id + 0) - 1, 0), COALESCE(max(l.id + 0), 0)"
	"     FROM outbox.event_log l"
	"    WHERE l.tx >= pg_snapshot_xmin($1)"
	"      AND NOT pg_visible_in_snapshot(l.tx, $1))"
	" RETURNING window_snapshot, window_last_id, window_max_id";

static const char *const window_batch_sql =
	"SELECT l.id, l.topic, l.msg_key, l.payload, l.headers, l.biz_type, l.biz_key"
	"  FROM outbox.event_log l"
	" WHERE l.id > $3 AND l.id <= $4"
	"   AND l.tx >= pg_snapshot_xmin($1)"
	"   AND pg_visible_in_snapshot(l.tx, $2)"
	"   AND NOT pg_visible_in_snapshot(l.tx, $1)"
	" ORDER BY l.id LIMIT $5";

static const char *const advance_sql =
	"UPDATE outbox.relay_cursor SET window_last_id = $1, updated_at = now()";

static const char *const close_window_sql =
	"UPDATE outbox.relay_cursor SET done_snapshot = window_snapshot,"
	"  window_snapshot = NULL, window_last_id = 0, window_max_id = 0,"
	"  updated_at = now()";

static SPIPlanPtr cursor_plan = NULL;
static SPIPlanPtr any_new_plan = NULL;
static SPIPlanPtr open_window_plan = NULL;
static SPIPlanPtr window_batch_plan = NULL;
static SPIPlanPtr advance_plan = NULL;
static SPIPlanPtr close_window_plan = NULL;

static bool read_cursor(RelayCursor *cur);
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

	if (!relay_begin("reading the outbox"))
		return RELAY_IDLE;
	if (!read_cursor(&cur) || (!cur.open && !open_window(&cur)))
	{
		relay_commit();
		return RELAY_IDLE;
	}
	batch = read_window_batch(&cur, &blocked);
	relay_commit();

	if (batch->count > 0)
		relay_batch_send(batch, blocked);

	if (!relay_begin("recording deliveries"))
		return RELAY_IDLE;
	return record_window_batch(batch, &cur);
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

	values[0] = cur->done;
	values[1] = cur->window;
	values[2] = Int64GetDatum(cur->last_id);
	values[3] = Int64GetDatum(cur->max_id);
	values[4] = Int64GetDatum(outbox_batch_size);
	run_plan(&window_batch_plan, window_batch_sql, 5, types, values,
			 SPI_OK_SELECT);

	old = MemoryContextSwitchTo(relay_batch_context());
	batch = relay_batch_load(SPI_tuptable, SPI_processed);
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
 * broker unreachable) are settled; that one and the rest are read again.
 */
static RelayOutcome
record_window_batch(RelayBatch *batch, RelayCursor *cur)
{
	int cut = first_transient(batch);
	bool full = batch->count >= outbox_batch_size;

	for (int i = 0; i < cut; i++)
	{
		if (batch->held[i])
			relay_set_state(batch->msgs[i].event_id, "new", 0, 0, NULL);
		else if (batch->msgs[i].error != 0)
			relay_record_failure(&batch->msgs[i], 0);
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
 * sake, or count if none did.
 */
static int
first_transient(RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
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
