/*
 * incarnation.c
 *		outbox._incarnation(): which life of the server an event is
 *		enqueued in, stored with the event and named in its outbox_source
 *		header.
 *
 * Event ids come from a sequence, and a server whose history forks from
 * another's hands out ids the other already used: a standby promoted
 * behind an asynchronous primary that went on sending, a server restored
 * to a point in time or from a base backup while the original had sent
 * more, either side of a split brain.  Kafka would then hold two
 * different events under one (source, event id), and a consumer claiming
 * by them would skip the second.  Every fork of a history starts a server
 * (a restore, a restart) or changes its WAL timeline (a promotion, the
 * end of a recovery to a point in time), so a random number drawn anew
 * whenever shared memory is made or the timeline is not the one it was
 * drawn on tells the forks apart.  An event keeps the incarnation it was
 * enqueued in, so sent again by any server it keeps its identity.
 * Events stored before 0.3.0 have 0, and their header stays the source
 * alone.
 *
 * src/incarnation.c
 */
#include "postgres.h"

#include "access/xlog.h"
#include "fmgr.h"

#include "outbox.h"

static uint64 draw(void);

PG_FUNCTION_INFO_V1(outbox_incarnation);

/*
 * outbox_incarnation: SQL entry point (event_log.incarnation's default).
 * Without shared memory (the library not preloaded: nothing relays then)
 * the backend draws one of its own, as unique.
 */
Datum
outbox_incarnation(PG_FUNCTION_ARGS)
{
	static uint64 own = 0;
	TimeLineID timeline;
	uint64 incarnation;

	if (RecoveryInProgress())
		ereport(ERROR, (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
						errmsg("cannot enqueue an event during recovery")));
	if (outbox_shared == NULL)
	{
		if (own == 0)
			own = draw();
		PG_RETURN_INT64((int64) own);
	}
	/* Drawn only when there is none: a read of /dev/urandom per event
	 * would cost enqueue. */
	timeline = GetWALInsertionTimeLine();
	incarnation = outbox_shared_incarnation(timeline, 0);
	if (incarnation == 0)
		incarnation = outbox_shared_incarnation(timeline, draw());
	PG_RETURN_INT64((int64) incarnation);
}

/*
 * draw: a random incarnation, positive (it is stored as bigint and
 * written in hex) and never 0, which means "before 0.3.0".
 */
static uint64
draw(void)
{
	uint64 value = 0;

	while (value == 0)
	{
		if (!pg_strong_random(&value, sizeof(value)))
			ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR),
							errmsg("could not generate a random incarnation")));
		value &= PG_INT64_MAX;
	}
	return value;
}
