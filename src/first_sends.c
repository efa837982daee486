/*
 * first_sends.c
 *		First sends: committed events, read in windows, sent in order, and
 *		the relay's progress recorded in outbox.relay_cursor.
 *
 * relay_cursor.done_snapshot says which transactions are fully relayed.  A
 * window is opened by taking the current snapshot; the events visible in
 * it but not in done_snapshot are exactly those committed in between,
 * however their ids interleave, so none is skipped (a plain "id > last
 * sent" poller skips rows committed out of id order) and none is read
 * twice.  They are read as PgQ reads a batch: the transactions that were
 * running at done_snapshot (its xip list) one by one, then the range from
 * its xmax to the window's; so a transaction left open for hours costs one
 * index probe, not a scan of everything enqueued since it began.
 *
 * A window is sent in (tx, id) order, in batches of outbox.batch_size, and
 * several batches are in flight at once (flight.c).  Progress is recorded
 * from the oldest batch on, once Kafka has answered for it, as the place
 * (window_last_tx, window_last_id) its last event had, so a crash repeats
 * at most what was in flight.  A failure for the broker's sake ends the
 * batch there: the events from it on are read again after a backoff.
 *
 * src/first_sends.c
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/memutils.h"
#include "utils/xid8.h"

#include "outbox.h"
#include "relay.h"

/* Rows fetched at a time while reading a batch. */
#define FETCH_ROWS 256

/* Batches recorded in one transaction, at most. */
#define SETTLE_BATCHES 64

/*
 * Batches answered in full are recorded together, at most every
 * RECORD_EVERY_MS: a record is a durable commit, and under a steady
 * stream of small batches one per batch was half the relay's
 * transactions and WAL flushes.  Recording later delays nothing that is
 * sent; a crash sends again what was answered since the last record, as
 * it does anything in flight.
 */
#define RECORD_EVERY_MS 10

/* The open window's parts, in reading order. */
typedef struct Window
{
	uint64 *xip; /* transactions running at done, committed in window */
	int nxip;
	uint64 done_xmax;
	uint64 window_xmax;
	int64 rows; /* read from it so far */
} Window;

/*
 * Every statement here runs as a superuser: functions and operators are
 * named with their schema, and parameters have exact types, so none
 * resolves to an object a database owner could create.
 */
static const char *const cursor_sql =
	"SELECT done_snapshot, window_snapshot, window_last_tx, window_last_id"
	"  FROM outbox.relay_cursor";

/*
 * The cursor row as after CREATE EXTENSION, but with nothing relayed: no
 * transaction id is visible in the snapshot '3:3:' (3 is the first normal
 * one), so every kept event not known to be sent is sent again.
 */
static const char *const recreate_cursor_sql =
	"INSERT INTO outbox.relay_cursor (done_snapshot)"
	" VALUES (CAST('3:3:' AS pg_catalog.pg_snapshot)) ON CONFLICT DO NOTHING";

/* A window: the given snapshot, or the current one if that is null. */
static const char *const window_sql =
	"SELECT w, pg_catalog.pg_snapshot_xmax($1), pg_catalog.pg_snapshot_xmax(w),"
	"       ARRAY(SELECT x FROM pg_catalog.pg_snapshot_xip($1) x"
	"              WHERE pg_catalog.pg_visible_in_snapshot(x, w) ORDER BY x)"
	"  FROM COALESCE($2, pg_catalog.pg_current_snapshot()) w";

/*
 * One part of a window: the events after ($1, $2) in transactions below
 * $3, as seen by the window $4.  The caller's start is never below the
 * part's first transaction: a lower bound of its own on tx would leave
 * the index scan to start from the row comparison, which btree cannot
 * weigh against it, and walk every event before the part.
 *
 * An event with a delivery state of its own is the retries' business; in
 * a window read as usual there is none, but after the cursor was
 * recreated (recreate_cursor_sql) the window holds every kept event.
 */
static const char *const part_sql =
	"SELECT l.id, l.topic, l.msg_key, l.payload, l.payload_bytes, l.headers,"
	"       l.biz_type, l.biz_key, l.incarnation, l.tx"
	"  FROM outbox.event_log l"
	" WHERE ROW(l.tx, l.id) OPERATOR(pg_catalog.>) ROW($1, $2)"
	"   AND l.tx OPERATOR(pg_catalog.<) $3"
	"   AND pg_catalog.pg_visible_in_snapshot(l.tx, $4)"
	"   AND NOT EXISTS (SELECT 1 FROM outbox.event_state s"
	"                    WHERE s.id OPERATOR(pg_catalog.=) l.id)"
	" ORDER BY l.tx, l.id";

static const char *const record_sql =
	"UPDATE outbox.relay_cursor SET done_snapshot = $1, window_snapshot = $2,"
	"  window_last_tx = $3, window_last_id = $4, updated_at = pg_catalog.now()";

static SPIPlanPtr cursor_plan = NULL;
static SPIPlanPtr recreate_cursor_plan = NULL;
static SPIPlanPtr window_plan = NULL;
static SPIPlanPtr part_plan = NULL;
static SPIPlanPtr record_plan = NULL;

static MemoryContext reader_memory = NULL;
static MemoryContext recorded_memory = NULL;
static TimestampTz recorded_at = 0;
static bool reader_valid = false;
static RelayPos reader;            /* where the next batch starts */
static RelayPos recorded;          /* what outbox.relay_cursor holds */
static Window window;              /* the parts of reader.window */
static RelayBatch *reading = NULL; /* a batch being read and sent */

static void load_reader(void);
static void recreate_cursor(void);
static void open_window(Datum given);
static bool read_window(RelayBatch *batch, HTAB *blocked, bool *full);
static int read_part(RelayBatch *batch, HTAB *blocked, uint64 lo, uint64 hi,
					 bool *full);
static bool take_row(RelayBatch *batch, HTAB *blocked, const BatchRow *row);
static int settle_point(RelayBatch *batch);
static bool record_due(TimestampTz now);
static bool record_head(RelayBatch *batch, int cut);
static void apply_settled(RelayBatch *batch, int cut, bool *unreachable);
static RelayPos place_before(RelayBatch *batch, int i);
static bool record_place(const RelayPos *pos);
static void set_reader(const RelayPos *pos);
static void set_recorded(const RelayPos *pos);
static RelayPos copy_pos(const RelayPos *pos, MemoryContext memory);
static Datum xid8_datum(uint64 value);
static bool parse_pos(const char *text, RelayPos *pos);
static bool parse_snapshot(const char *text, Datum *snapshot);

/*
 * relay_first_sends_read: read the next batch of the stream (opening a
 * window if none is open) and send it; *taken is how many events it sent.
 */
RelayRead
relay_first_sends_read(int *taken)
{
	RelaySettings settings = relay_settings_now();
	RelayBatch *batch;
	HTAB *blocked;
	bool full = false;
	bool exhausted;
	int room = relay_flight_room(&settings, NULL);
	RelayPos before;

	*taken = 0;
	if (room == 0 || relay_flight_failed_uncut())
		return READ_FULL;
	if (!relay_begin(
			"reading the outbox from outbox.relay_cursor and outbox.event_log"))
		return READ_GONE;
	if (!reader_valid)
		load_reader();
	before = reader;
	if (reader.window == (Datum) 0)
		open_window((Datum) 0);
	/*
	 * Asked after the window's snapshot is taken: a window that sees an
	 * event committed after a pause() sees the pause too.  A window opened
	 * while paused is let go, so that the first read after resume() sees
	 * everything committed meanwhile.
	 */
	if (relay_pause_set())
	{
		if (before.window == (Datum) 0)
			set_reader(&before);
		relay_commit();
		return READ_PAUSED;
	}

	batch = reading =
		relay_batch_new(false, &settings, Min(settings.batch_size, room));
	batch->before = copy_pos(&reader, batch->memory);
	relay_flight_push(batch);
	blocked = relay_key_set(CurrentMemoryContext);
	relay_pending_keys(blocked);
	relay_flight_held_keys(blocked);
	exhausted = read_window(batch, blocked, &full);
	relay_commit();
	reading = NULL;
	relay_flight_admit(batch);
	if (batch->count > 0)
		outbox_kafka_push();

	if (exhausted)
	{
		MemoryContext old = MemoryContextSwitchTo(batch->memory);

		batch->after.done = datumCopy(reader.window, false, -1);
		batch->after.window = (Datum) 0;
		MemoryContextSwitchTo(old);
	}
	else if (batch->count > 0)
	{
		batch->after = copy_pos(&batch->before, batch->memory);
		batch->after.last_tx = batch->tx[batch->count - 1];
		batch->after.last_id = batch->msgs[batch->count - 1].event_id;
	}
	/* An empty batch is kept only to record a window's end. */
	if (batch->count == 0 && (!exhausted || window.rows == 0))
	{
		if (exhausted)
			set_reader(&batch->after);
		relay_flight_done(batch);
		return full ? READ_FULL : READ_NOTHING;
	}
	*taken = batch->count;
	window.rows += batch->count;
	set_reader(&batch->after);
	if (exhausted)
		window.rows = 0;
	if (full)
		return READ_FULL;
	return exhausted ? READ_ALL : READ_SOME;
}

/*
 * relay_first_sends_settle: record, oldest first, the batches Kafka has
 * answered for (or whose stragglers are stuck, see flight.c).  True if
 * anything was recorded; *unreachable if a batch failed at its first event
 * for the broker's sake.  What is kept in memory changes only once the
 * record is committed: a step given up half way leaves it as it was.
 */
bool
relay_first_sends_settle(TimestampTz now, bool *unreachable)
{
	RelayBatch *settled[SETTLE_BATCHES];
	int cuts[SETTLE_BATCHES];
	int n = 0;

	if (!record_due(now))
		return false;
	for (RelayBatch *head = relay_flight_head();
		 head != NULL && n < SETTLE_BATCHES; head = relay_flight_next(head))
	{
		bool handing = !relay_batch_all_answered(head);

		if (head == reading ||
			(handing && !relay_flight_may_hand_over(head, now)))
			break;
		if (n == 0 && !relay_begin("recording deliveries in outbox.relay_cursor"))
			return false;
		settled[n] = head;
		cuts[n] = settle_point(head);
		if (!record_head(head, cuts[n]))
		{
			/* Someone deleted the row: start over from a new one. */
			recreate_cursor();
			relay_commit();
			relay_flight_drop_from(relay_flight_head(), 0);
			reader_valid = false;
			return true;
		}
		if (cuts[n++] < head->count)
			break;
	}
	if (n == 0)
		return false;
	relay_commit();
	recorded_at = now;
	{
		RelayBatch *last = settled[n - 1];
		RelayPos pos = cuts[n - 1] == last->count
						   ? last->after
						   : place_before(last, cuts[n - 1]);

		set_recorded(&pos);
	}
	for (int k = 0; k < n; k++)
		apply_settled(settled[k], cuts[k], unreachable);
	return true;
}

/*
 * relay_first_sends_record_at: when answered batches waiting to be
 * recorded are due (0 if none wait): the loop's wait ends then.
 */
TimestampTz
relay_first_sends_record_at(void)
{
	RelayBatch *head = relay_flight_head();

	if (head == NULL || head == reading || !relay_batch_all_answered(head))
		return 0;
	return TimestampTzPlusMilliseconds(recorded_at, RECORD_EVERY_MS);
}

/*
 * record_due: whether to record now: RECORD_EVERY_MS after the last record,
 * or at once when the head batch is not answered in full (what is handed
 * over, see flight.c, keeps its own time) or stops short of its end (the
 * rest is read again from there).
 */
static bool
record_due(TimestampTz now)
{
	RelayBatch *head = relay_flight_head();

	if (head == NULL || head == reading)
		return false;
	if (now >= TimestampTzPlusMilliseconds(recorded_at, RECORD_EVERY_MS) ||
		!relay_batch_all_answered(head))
		return true;
	for (; head != NULL && head != reading && relay_batch_all_answered(head);
		 head = relay_flight_next(head))
	{
		if (settle_point(head) < head->count)
			return true;
	}
	return false;
}

/*
 * relay_first_sends_abandon: a batch whose reading failed half way is
 * given up: its events are read again.
 */
void
relay_first_sends_abandon(void)
{
	if (reading != NULL)
		relay_flight_drop_from(reading, 0);
	reading = NULL;
}

/*
 * relay_first_sends_restart: forget where reading was; the next batch
 * starts from outbox.relay_cursor.
 */
void
relay_first_sends_restart(void)
{
	reader_valid = false;
}

/*
 * relay_first_sends_recorded: the place outbox.relay_cursor holds, as
 * text (relay_pos_text); NULL if it was not read since the relay started
 * or the reader was reset.
 */
char *
relay_first_sends_recorded(void)
{
	return reader_valid ? relay_pos_text(&recorded) : NULL;
}

/*
 * relay_first_sends_place: the place outbox.relay_cursor holds, read now,
 * as text (relay_pos_text).  Inside relay_begin.
 */
char *
relay_first_sends_place(void)
{
	reader_valid = false;
	load_reader();
	return relay_pos_text(&recorded);
}

/*
 * relay_first_sends_move: record the place given as text (relay_pos_text)
 * in outbox.relay_cursor; false, and nothing written, if the text is not
 * one.  The next batch starts from there.  Inside relay_begin.
 */
bool
relay_first_sends_move(const char *text)
{
	RelayPos pos;

	if (!parse_pos(text, &pos) || !record_place(&pos))
		return false;
	reader_valid = false;
	return true;
}

/*
 * relay_pos_text: a place as one line of text, for the progress record of
 * exactly_once.c: done snapshot, window snapshot (- if none), the last
 * transaction and event id of the window taken, separated by '/'.
 */
char *
relay_pos_text(const RelayPos *pos)
{
	char *done =
		DatumGetCString(DirectFunctionCall1(pg_snapshot_out, pos->done));
	char *window =
		pos->window == (Datum) 0
			? "-"
			: DatumGetCString(DirectFunctionCall1(pg_snapshot_out, pos->window));

	return psprintf("%s/%s/" UINT64_FORMAT "/" INT64_FORMAT, done, window,
					pos->last_tx, pos->last_id);
}

/*
 * load_reader: the place recorded in outbox.relay_cursor, and its window's
 * parts if one is open.
 */
static void
load_reader(void)
{
	HeapTuple row;
	TupleDesc desc;
	RelayPos pos;
	bool isnull;

	relay_run_plan(&cursor_plan, cursor_sql, 0, NULL, NULL, SPI_OK_SELECT,
				   false);
	if (SPI_processed == 0)
	{
		recreate_cursor();
		relay_run_plan(&cursor_plan, cursor_sql, 0, NULL, NULL, SPI_OK_SELECT,
					   false);
	}
	if (SPI_processed != 1)
		elog(ERROR,
			 "outbox relay: outbox.relay_cursor must hold exactly one row");
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	pos.done = SPI_getbinval(row, desc, 1, &isnull);
	pos.window = SPI_getbinval(row, desc, 2, &isnull);
	if (isnull)
		pos.window = (Datum) 0;
	pos.last_tx =
		DatumGetFullTransactionId(SPI_getbinval(row, desc, 3, &isnull)).value;
	pos.last_id = DatumGetInt64(SPI_getbinval(row, desc, 4, &isnull));
	set_reader(&pos);
	set_recorded(&pos);
	window.rows = 0;
	if (reader.window != (Datum) 0)
		open_window(reader.window);
	reader_valid = true;
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
	relay_run_plan(&recreate_cursor_plan, recreate_cursor_sql, 0, NULL, NULL,
				   SPI_OK_INSERT, false);
}

/*
 * open_window: the window given (or, if 0, the current snapshot as a new
 * one) after the reader's done snapshot, and its parts; once the
 * synchronous standbys have every commit it sees.
 */
static void
open_window(Datum given)
{
	Oid types[2] = {PG_SNAPSHOTOID, PG_SNAPSHOTOID};
	Datum values[2] = {reader.done, given};
	char nulls[2] = {' ', given == (Datum) 0 ? 'n' : ' '};
	SPIPlanPtr plan =
		outbox_keep_plan(&window_plan, window_sql, 2, types, false);
	HeapTuple row;
	TupleDesc desc;
	Datum *xip;
	int nxip;
	bool isnull;
	MemoryContext old;

	if (SPI_execute_plan(plan, values, nulls, true, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox relay: could not open a window");
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	old = MemoryContextSwitchTo(reader_memory);
	if (given == (Datum) 0)
	{
		reader.window =
			datumCopy(SPI_getbinval(row, desc, 1, &isnull), false, -1);
		reader.last_tx = 0;
		reader.last_id = 0;
		window.rows = 0;
	}
	window.done_xmax =
		DatumGetFullTransactionId(SPI_getbinval(row, desc, 2, &isnull)).value;
	window.window_xmax =
		DatumGetFullTransactionId(SPI_getbinval(row, desc, 3, &isnull)).value;
	deconstruct_array(DatumGetArrayTypeP(SPI_getbinval(row, desc, 4, &isnull)),
					  XID8OID, sizeof(uint64), FLOAT8PASSBYVAL,
					  TYPALIGN_DOUBLE, &xip, NULL, &nxip);
	window.nxip = nxip;
	window.xip = palloc(sizeof(uint64) * Max(nxip, 1));
	for (int i = 0; i < nxip; i++)
		window.xip[i] = DatumGetFullTransactionId(xip[i]).value;
	MemoryContextSwitchTo(old);
	relay_wait_replicated();
}

/*
 * read_window: read and send the window's next events into batch, part by
 * part from the reader's place; true if the window has no more.  *full if
 * reading stopped for want of room in flight.
 */
static bool
read_window(RelayBatch *batch, HTAB *blocked, bool *full)
{
	for (int p = 0; p <= window.nxip; p++)
	{
		bool last = p == window.nxip;
		uint64 lo = last ? window.done_xmax : window.xip[p];
		uint64 hi = last ? window.window_xmax : window.xip[p] + 1;

		if (hi <= reader.last_tx)
			continue;
		(void) read_part(batch, blocked, lo, hi, full);
		if (*full || batch->count >= batch->capacity)
			return false;
	}
	return true;
}

/*
 * read_part: read the transactions [lo, hi) of the window after the
 * batch's last event (or the reader's place) until the batch is full;
 * returns the rows taken.
 */
static int
read_part(RelayBatch *batch, HTAB *blocked, uint64 lo, uint64 hi, bool *full)
{
	Oid types[4] = {XID8OID, INT8OID, XID8OID, PG_SNAPSHOTOID};
	Datum values[4];
	uint64 after_tx =
		batch->count > 0 ? batch->tx[batch->count - 1] : reader.last_tx;
	int64 after_id = batch->count > 0 ? batch->msgs[batch->count - 1].event_id
									  : reader.last_id;
	/*
	 * One generic plan: with sequential scans, bitmap scans and sorts
	 * off (pin_settings), the ordered range of event_log_tx_id is the
	 * only plan, and planning it per part cost more than reading it.
	 */
	SPIPlanPtr plan = outbox_keep_plan(&part_plan, part_sql, 4, types, false);
	Portal portal;
	int taken = 0;
	bool more = true;

	/* From the part's first transaction on; no event id is that low. */
	if (after_tx < lo)
	{
		after_tx = lo;
		after_id = PG_INT64_MIN;
	}
	values[0] = xid8_datum(after_tx);
	values[1] = Int64GetDatum(after_id);
	values[2] = xid8_datum(hi);
	values[3] = reader.window;
	portal = SPI_cursor_open(NULL, plan, values, NULL, true);
	while (more && !*full && batch->count < batch->capacity)
	{
		SPI_cursor_fetch(portal, true,
						 Min(FETCH_ROWS, batch->capacity - batch->count));
		more = SPI_processed > 0;
		for (uint64 r = 0; r < SPI_processed && !*full; r++)
		{
			BatchRow row;

			relay_batch_row(&row, SPI_tuptable->vals[r], SPI_tuptable->tupdesc);
			if (!take_row(batch, blocked, &row))
				*full = true;
			else
				taken++;
		}
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	return taken;
}

/*
 * take_row: add one row to the batch and send it, or hold it back if an
 * earlier event of its key waits or its topic is stuck.  False, and the
 * row not taken, if there is no room in flight for it.
 */
static bool
take_row(RelayBatch *batch, HTAB *blocked, const BatchRow *row)
{
	int i;

	if (batch->count > 0 && relay_flight_room(&batch->settings, batch) == 0)
		return false;
	i = relay_batch_add(batch, row);
	if (relay_key_has(blocked, batch->key_hash[i]) ||
		relay_flight_topic_stuck(relay_topic_hash(batch->msgs[i].topic)))
	{
		batch->fate[i] = FATE_HELD;
		relay_key_add(blocked, batch->key_hash[i]);
		return true;
	}
	if (!relay_batch_send(batch, i, row))
	{
		batch->count--;
		return false;
	}
	/* Refused at once: the rest of its key must not overtake it. */
	if (batch->msgs[i].done && batch->msgs[i].error != 0)
		relay_key_add(blocked, batch->key_hash[i]);
	return true;
}

/*
 * settle_point: how far the head batch can be recorded: up to its first
 * event that failed for the broker's sake (count if none).  Unanswered
 * events do not stop it: they are handed over.
 */
static int
settle_point(RelayBatch *batch)
{
	for (int i = 0; i < batch->count; i++)
	{
		OutboxMessage *msg = &batch->msgs[i];

		if (batch->fate[i] == FATE_HELD || !relay_batch_answered(batch, i))
			continue;
		if (msg->error != 0 && msg->transient)
			return i;
	}
	return batch->count;
}

/*
 * record_head: record the head batch's events before cut (held ones wait
 * for a retry, refused ones failed, stuck ones are handed over) and move
 * the cursor past them; false if the cursor's row is gone.  Inside
 * relay_begin.
 */
static bool
record_head(RelayBatch *batch, int cut)
{
	RelayPos pos = cut == batch->count ? batch->after : place_before(batch, cut);

	for (int i = 0; i < cut; i++)
	{
		OutboxMessage *msg = &batch->msgs[i];

		if (batch->fate[i] == FATE_HELD)
			relay_set_state(msg->event_id, "new", 0, 0, NULL);
		else if (!relay_batch_answered(batch, i))
			relay_set_state(msg->event_id, "sending", 0, 0, NULL);
		else if (msg->error != 0)
			relay_record_failure(batch, i);
	}
	return record_place(&pos);
}

/*
 * apply_settled: once recorded, the batch's events before cut are counted
 * or handed over, and the batch leaves the queue; if it stopped short,
 * the rest of it and every later batch are read again from there.
 */
static void
apply_settled(RelayBatch *batch, int cut, bool *unreachable)
{
	for (int i = 0; i < cut; i++)
	{
		if (batch->fate[i] == FATE_HELD)
			continue;
		if (!relay_batch_answered(batch, i))
			relay_flight_hand_over(batch, i);
		else
			relay_tally(&batch->msgs[i], 0);
	}
	if (cut == batch->count)
	{
		relay_flight_done(batch);
		return;
	}
	{
		RelayPos pos = place_before(batch, cut);

		*unreachable = cut == 0;
		set_reader(&pos);
		relay_flight_drop_from(batch, cut);
	}
}

/*
 * place_before: the place in the stream just before event i of batch.
 */
static RelayPos
place_before(RelayBatch *batch, int i)
{
	RelayPos pos = batch->before;

	if (i > 0)
	{
		pos.last_tx = batch->tx[i - 1];
		pos.last_id = batch->msgs[i - 1].event_id;
	}
	return pos;
}

/*
 * record_place: write pos to outbox.relay_cursor; false if its row is
 * gone.  Inside relay_begin.
 */
static bool
record_place(const RelayPos *pos)
{
	Oid types[4] = {PG_SNAPSHOTOID, PG_SNAPSHOTOID, XID8OID, INT8OID};
	Datum values[4] = {pos->done, pos->window, xid8_datum(pos->last_tx),
					   Int64GetDatum(pos->last_id)};
	char nulls[4] = {' ', pos->window == (Datum) 0 ? 'n' : ' ', ' ', ' '};
	SPIPlanPtr plan =
		outbox_keep_plan(&record_plan, record_sql, 4, types, false);

	if (SPI_execute_plan(plan, values, nulls, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox relay: could not record progress");
	return SPI_processed == 1;
}

/*
 * set_reader: the next batch starts at pos (its window's parts are read
 * again if it is not the reader's own window).
 */
static void
set_reader(const RelayPos *pos)
{
	MemoryContext fresh = AllocSetContextCreate(
		TopMemoryContext, "outbox relay reader", ALLOCSET_SMALL_SIZES);
	bool same_window = reader_valid && pos->window != (Datum) 0 &&
					   reader.window != (Datum) 0 &&
					   datumIsEqual(pos->window, reader.window, false, -1);
	Window kept = window;
	RelayPos moved = copy_pos(pos, fresh);

	if (same_window)
	{
		kept.xip =
			MemoryContextAlloc(fresh, sizeof(uint64) * Max(window.nxip, 1));
		memcpy(kept.xip, window.xip, sizeof(uint64) * window.nxip);
	}
	if (reader_memory != NULL)
		MemoryContextDelete(reader_memory);
	reader_memory = fresh;
	reader = moved;
	window = kept;
	if (!same_window && reader.window != (Datum) 0 && reader_valid)
		reader_valid = false; /* its parts are computed on the next read */
}

/*
 * set_recorded: outbox.relay_cursor now holds pos.
 */
static void
set_recorded(const RelayPos *pos)
{
	MemoryContext fresh = AllocSetContextCreate(
		TopMemoryContext, "outbox relay recorded place", ALLOCSET_SMALL_SIZES);

	recorded = copy_pos(pos, fresh);
	if (recorded_memory != NULL)
		MemoryContextDelete(recorded_memory);
	recorded_memory = fresh;
}

/*
 * copy_pos: pos with its snapshots copied into memory.
 */
static RelayPos
copy_pos(const RelayPos *pos, MemoryContext memory)
{
	MemoryContext old = MemoryContextSwitchTo(memory);
	RelayPos copy = *pos;

	copy.done = datumCopy(pos->done, false, -1);
	if (pos->window != (Datum) 0)
		copy.window = datumCopy(pos->window, false, -1);
	MemoryContextSwitchTo(old);
	return copy;
}

/*
 * xid8_datum: a full transaction id as an xid8 datum.
 */
static Datum
xid8_datum(uint64 value)
{
	return FullTransactionIdGetDatum(FullTransactionIdFromU64(value));
}

/*
 * parse_pos: the place a line of relay_pos_text gives; false if the text
 * is not one.  What comes from Kafka is checked before any input function
 * sees it, so a damaged record cannot raise an error here.
 */
static bool
parse_pos(const char *text, RelayPos *pos)
{
	char copy[1024];
	char *parts[4];
	char *cursor = copy;
	char *end;

	if (strlcpy(copy, text, sizeof(copy)) >= sizeof(copy))
		return false;
	for (int k = 0; k < 4; k++)
	{
		parts[k] = strsep(&cursor, "/");
		if (parts[k] == NULL)
			return false;
	}
	if (cursor != NULL || !parse_snapshot(parts[0], &pos->done))
		return false;
	pos->window = (Datum) 0;
	if (strcmp(parts[1], "-") != 0 && !parse_snapshot(parts[1], &pos->window))
		return false;
	errno = 0;
	pos->last_tx = strtou64(parts[2], &end, 10);
	if (errno != 0 || *end != '\0' || end == parts[2])
		return false;
	pos->last_id = strtoi64(parts[3], &end, 10);
	return errno == 0 && *end == '\0' && end != parts[3];
}

/*
 * parse_snapshot: a pg_snapshot from its text, if it is one: xmin:xmax:
 * and transaction ids between them, ascending.
 */
static bool
parse_snapshot(const char *text, Datum *snapshot)
{
	uint64 xmin;
	uint64 xmax;
	uint64 last;
	const char *p = text;
	char *end;

	errno = 0;
	xmin = strtou64(p, &end, 10);
	if (errno != 0 || end == p || *end != ':')
		return false;
	p = end + 1;
	xmax = strtou64(p, &end, 10);
	if (errno != 0 || end == p || *end != ':' ||
		xmin < FirstNormalTransactionId || xmax < xmin)
		return false;
	p = end + 1;
	last = xmin;
	while (*p != '\0')
	{
		uint64 xip = strtou64(p, &end, 10);

		if (errno != 0 || end == p || xip < last || xip >= xmax ||
			(*end != ',' && *end != '\0'))
			return false;
		last = xip;
		p = *end == ',' ? end + 1 : end;
		if (*end == ',' && *p == '\0')
			return false;
	}
	*snapshot = DirectFunctionCall1(pg_snapshot_in, CStringGetDatum(text));
	return true;
}
