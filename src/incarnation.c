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
 * by them would skip the second.  So shared memory, made anew at every
 * start of the server and every restart after a crash, holds a random
 * number drawn then, and each event stores it.  Two events that share it
 * were enqueued by one running server, whose history never forks: the
 * fork is another server's, or comes through a start (a restore, a
 * rewound primary), and a standby, which cannot write, enqueues nothing
 * before its promotion.  The number is mixed with the database's OID
 * (a dump restored into another database of the same server keeps its
 * source).  An event keeps the incarnation it was enqueued
 * in, so sent again by any server it keeps its identity.  Events stored
 * before 0.3.0 have 0, and their header stays the source alone.
 *
 * src/incarnation.c
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_incarnation);

/*
 * outbox_incarnation: SQL entry point (event_log.incarnation's default):
 * the server's incarnation mixed with this database's OID, so that two
 * databases of one server whose histories fork (a dump restored beside
 * its original keeps the source, sender.c) never share one either.
 * Without shared memory (the library not preloaded: nothing relays then)
 * the backend draws one of its own, as unique.
 */
Datum
outbox_incarnation(PG_FUNCTION_ARGS)
{
	static uint64 own = 0;
	static uint64 mixed = 0;
	uint64 server;

	if (outbox_shared != NULL)
		server = outbox_shared->incarnation;
	else
	{
		if (own == 0)
			own = outbox_draw_incarnation();
		server = own;
	}
	if (mixed == 0)
	{
		mixed = hash_bytes_uint32_extended((uint32) MyDatabaseId, server) &
				PG_INT64_MAX;
		if (mixed == 0)
			mixed = 1;
	}
	PG_RETURN_INT64((int64) mixed);
}

/*
 * outbox_draw_incarnation: a random incarnation, positive (it is stored
 * as bigint and written in hex) and never 0, which means "before 0.3.0".
 */
uint64
outbox_draw_incarnation(void)
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
