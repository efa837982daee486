/*
 * sender.c
 *		Who this relay is to Kafka: the source its messages name, and in
 *		exactly_once a sender number and the proof that a progress record
 *		is its own.
 *
 * A physical copy of a cluster (a base backup started as staging, a
 * standby promoted in a split brain) holds the same system identifier,
 * database OIDs and outbox.relay_cursor row as the original.  Were the
 * transactional.id made of those alone, the copy's relay would fence the
 * original's, and each would take the other's progress records for its
 * own: events marked sent that Kafka never got.  Two defences:
 *
 * The sender.  outbox.relay_cursor.sender joins the system identifier and
 * the database OID in the transactional.id and the progress key; beside it
 * sender_place says where the relay that chose it runs (host name, port,
 * data directory), sender_timeline on which WAL timeline and
 * sender_system in which cluster (system identifier).  The relay keeps the
 * sender where it is the same sender: the same place (a restart, or a
 * restore in place), another cluster (pg_upgrade makes a new system
 * identifier, and so a new transactional.id), or a later timeline reached
 * by the promotion of a standby (standby.signal was there when the server
 * started, shmem.c): that relay fences the relay of the primary it
 * replaced, and takes its latest progress where this server's WAL has it
 * (exactly_once.c).  Anywhere else it is a copy or a restore that may run
 * beside the original: a base backup or a stopped data directory started
 * as a server of its own (same timeline), or archive recovery and
 * recovery to a point in time (a later timeline, without standby.signal).
 * Before it makes a producer it takes a new sender, so that it never
 * fences the original nor takes the original's progress.  A move costs at
 * most the latest Kafka transaction sent again, never a loss.
 *
 * The source.  Every message names this database in its outbox_source
 * header, relay_cursor.source, so that consumers of several databases on
 * one topic keep their claims apart (claim.c).  The source is the
 * database's history, not a server's: failover, copies, restores (a dump's
 * too, see _relay_cursor_restore) and pg_upgrade keep it, so an event sent
 * again by any of them keeps its identity and a claiming consumer refuses
 * it.  Events enqueued apart never share one: the header also names the
 * event's incarnation (incarnation.c).
 *
 * The proof.  Each producer's start draws a random token and stores it in
 * relay_cursor.proof (in the transaction that catches up, so it is
 * committed, and replicated, before any record carries it); every progress
 * record it writes carries the token, and a record is taken only if it
 * carries a token PostgreSQL holds: the current one, or proof_seen, the
 * token of the latest record of this relay found at a start (so that a
 * producer that wrote nothing leaves the older records readable).  No role can read relay_cursor but
 * a superuser, and enqueue refuses the progress topic, so neither a copy
 * whose place looks the same, nor a tenant of another database, nor a
 * damaged record can move the cursor or mark an event sent.
 *
 * src/sender.c
 */
#include "postgres.h"

#include <unistd.h>

#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "postmaster/postmaster.h"
#include "utils/builtins.h"

#include "outbox.h"
#include "relay.h"

/* A uuid as text: 32 hex digits and 4 hyphens. */
#define UUID_TEXT_LEN 36

/* Random bytes in a proof; it is written as twice as many hex digits. */
#define PROOF_BYTES 16

static const char *const read_sql =
	"SELECT sender, sender_place, proof, sender_timeline, proof_seen,"
	"       source::pg_catalog.text, sender_system"
	"  FROM outbox.relay_cursor";
static const char *const claim_sql =
	"UPDATE outbox.relay_cursor"
	"   SET sender = $1, sender_place = $2, sender_timeline = $3,"
	"       sender_system = $4,"
	"       proof = CASE WHEN sender = $1 THEN proof END,"
	"       proof_seen = CASE WHEN sender = $1 THEN proof_seen END";
static const char *const proof_sql =
	"UPDATE outbox.relay_cursor SET proof = $1, proof_seen = $2";

static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr proof_plan = NULL;

static int64 sender = 0;
static char source[UUID_TEXT_LEN + 1] = "";
static char proof[PROOF_BYTES * 2 + 1] = "";
static char proof_seen[PROOF_BYTES * 2 + 1] = "";

static char *this_place(void);
static int64 new_sender(void);
static void say_promoted(const char *old, const char *place);
static bool keeps_sender(const char *old, const char *place,
						 TimeLineID old_timeline, TimeLineID timeline,
						 const char *old_system, const char *system);
static void say_copy(const char *old, const char *place, bool later);
static void claim(int64 number, const char *place, TimeLineID timeline,
				  const char *system);
static void keep_proof(char *to, const char *token);

/*
 * relay_sender_load: read the relay's sender and proof from
 * outbox.relay_cursor, taking a new sender first if the relay that chose
 * the one there ran elsewhere.  Inside relay_begin.  False if the cursor
 * row is missing (the reader recreates it; tried again later).
 */
bool
relay_sender_load(void)
{
	char *place = this_place();
	SPIPlanPtr plan = outbox_keep_plan(&read_plan, read_sql, 0, NULL, false);
	int rc = SPI_execute_plan(plan, NULL, NULL, false, 0);
	HeapTuple row;
	TupleDesc desc;
	bool isnull;
	int64 found;
	int64 was;
	char *found_place;
	char *found_proof;
	char *found_source;
	char *found_system;
	char *system = psprintf(UINT64_FORMAT, GetSystemIdentifier());
	TimeLineID found_timeline;
	TimeLineID timeline = GetWALInsertionTimeLine();

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox relay: \"%s\" failed: %s", read_sql,
			 SPI_result_code_string(rc));
	if (SPI_processed != 1)
		return false;
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	found = was = DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
	found_place = SPI_getvalue(row, desc, 2);
	found_proof = SPI_getvalue(row, desc, 3);
	found_source = SPI_getvalue(row, desc, 6);
	found_system = SPI_getvalue(row, desc, 7);
	found_timeline =
		(TimeLineID) DatumGetInt32(SPI_getbinval(row, desc, 4, &isnull));
	if (found == 0 || found_place == NULL)
		found = new_sender();
	else if (!keeps_sender(found_place, place, found_timeline, timeline,
						   found_system, system))
	{
		say_copy(found_place, place, timeline > found_timeline);
		found = new_sender();
	}
	if (found != was || found_place == NULL ||
		strcmp(found_place, place) != 0 || timeline != found_timeline ||
		strcmp(found_system ? found_system : "", system) != 0)
		claim(found, place, timeline, system);
	sender = found;
	strlcpy(source, found_source ? found_source : "", sizeof(source));
	keep_proof(proof, found == was ? found_proof : NULL);
	keep_proof(proof_seen, found == was ? SPI_getvalue(row, desc, 5) : NULL);
	return true;
}

/*
 * say_promoted: the relay keeps its sender on a server promoted from a
 * standby of the one at old.
 */
static void
say_promoted(const char *old, const char *place)
{
	ereport(
		LOG,
		(errmsg("outbox relay: this server keeps the relay's Kafka identity after its promotion"),
		 errdetail(
			 "The identity was chosen at %s; this server is %s, on a later timeline. Its relay fences the relay of the server it replaced.",
			 old, place)));
}

/*
 * keeps_sender: whether the relay at place, on timeline, in the cluster
 * of system identifier system, sends as the relay that chose the sender at
 * old, old_timeline, old_system did: the same server started again, the
 * same cluster after pg_upgrade (a new system identifier), or a standby
 * of it promoted (say_promoted).  Anything else is a copy or a restore.
 */
static bool
keeps_sender(const char *old, const char *place, TimeLineID old_timeline,
			 TimeLineID timeline, const char *old_system, const char *system)
{
	if (strcmp(old, place) == 0 ||
		strcmp(old_system ? old_system : "", system) != 0)
		return true;
	if (timeline > old_timeline && outbox_shared != NULL &&
		outbox_shared->began_as_standby)
	{
		say_promoted(old, place);
		return true;
	}
	return false;
}

/*
 * say_copy: the relay takes a new sender on a copy or a restore of the
 * server at old; later if it is on a later timeline than that one.
 */
static void
say_copy(const char *old, const char *place, bool later)
{
	ereport(
		LOG,
		(errmsg("outbox relay: this server takes a new Kafka identity: it is a copy or a restore of the server where the current one was chosen"),
		 errdetail(
			 "The identity was chosen at %s; this server is %s, %s. It sends under an identity of its own, so that it never fences another server's relay nor takes that relay's progress for its own; its events keep their outbox_source. The latest Kafka transaction of the previous identity may be sent again.",
			 old, place,
			 later ? "on a later timeline it did not reach by the promotion of a standby (archive recovery or recovery to a point in time)"
				   : "on the same timeline")));
}

/*
 * relay_source: this database's source, as every message names it in its
 * outbox_source header ("" until relay_sender_load read it).
 */
const char *
relay_source(void)
{
	return source;
}

/*
 * relay_sender: the sender number in the transactional.id (0 until
 * relay_sender_load found one).
 */
int64
relay_sender(void)
{
	return sender;
}

/*
 * relay_sender_proof: the token the latest committed progress record must
 * carry to be this relay's; "" if none can be.
 */
const char *
relay_sender_proof(void)
{
	return proof;
}

/*
 * relay_sender_proof_seen: the token of the latest record of this relay
 * found at a start ("" if none): its records carry it or the current one.
 */
const char *
relay_sender_proof_seen(void)
{
	return proof_seen;
}

/*
 * relay_sender_new_proof: draw the token this producer's records carry and
 * store it, with seen, the token of the latest record of this relay just
 * found (or the one kept so far, if seen is NULL); both take effect once
 * the step commits (relay_sender_proof_committed).  Inside relay_begin.
 */
const char *
relay_sender_new_proof(char *out, const char *seen)
{
	uint8 bytes[PROOF_BYTES];
	Oid types[2] = {TEXTOID, TEXTOID};
	Datum values[2];

	if (!pg_strong_random(bytes, sizeof(bytes)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("outbox relay: could not generate random bytes")));
	for (int i = 0; i < PROOF_BYTES; i++)
		sprintf(out + 2 * i, "%02x", bytes[i]);
	values[0] = CStringGetTextDatum(out);
	values[1] = CStringGetTextDatum(seen ? seen : proof_seen);
	relay_run_plan(&proof_plan, proof_sql, 2, types, values, SPI_OK_UPDATE,
				   false);
	return out;
}

/*
 * relay_sender_proof_committed: what relay_sender_new_proof stored was
 * committed.
 */
void
relay_sender_proof_committed(const char *token, const char *seen)
{
	if (seen != NULL)
		strlcpy(proof_seen, seen, sizeof(proof_seen));
	strlcpy(proof, token, sizeof(proof));
}

/*
 * keep_proof: a token read from outbox.relay_cursor into to ("" if NULL
 * or not one).
 */
static void
keep_proof(char *to, const char *token)
{
	if (token == NULL || strlen(token) != PROOF_BYTES * 2)
		token = "";
	strlcpy(to, token, PROOF_BYTES * 2 + 1);
}

/*
 * this_place: where this relay runs, as sender_place records it.
 */
static char *
this_place(void)
{
	char host[256];

	if (gethostname(host, sizeof(host)) != 0)
		strlcpy(host, "?", sizeof(host));
	host[sizeof(host) - 1] = '\0';
	return psprintf("host %s, port %d, data directory %s", host,
					PostPortNumber, DataDir);
}

/*
 * new_sender: a random sender number, never 0 (which means none).
 */
static int64
new_sender(void)
{
	uint64 n = 0;

	while ((n & INT64CONST(0x7fffffffffffffff)) == 0)
	{
		if (!pg_strong_random(&n, sizeof(n)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("outbox relay: could not generate random bytes")));
	}
	return (int64) (n & INT64CONST(0x7fffffffffffffff));
}

/*
 * claim: record that the relay at place, on timeline, in the cluster of
 * system identifier system, sends as number; a proof holds only for the
 * number it was drawn for.
 */
static void
claim(int64 number, const char *place, TimeLineID timeline, const char *system)
{
	Oid types[4] = {INT8OID, TEXTOID, INT4OID, TEXTOID};
	Datum values[4];

	values[0] = Int64GetDatum(number);
	values[1] = CStringGetTextDatum(place);
	values[2] = Int32GetDatum((int32) timeline);
	values[3] = CStringGetTextDatum(system);
	relay_run_plan(&claim_plan, claim_sql, 4, types, values, SPI_OK_UPDATE,
				   false);
}
