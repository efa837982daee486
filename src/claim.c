/*
 * claim.c
 *		outbox.claim(): record, in the consumer's own transaction, that the
 *		consumer applies an event.
 *
 * The first claim of (consumer, source, event_id), or of (consumer,
 * source, biz_type, biz_key), returns true; a later one returns false and
 * the consumer skips the duplicate.  The source is the event's
 * outbox_source header: event ids and business keys are unique within one
 * database, so the claims of events of two databases on one topic must
 * not meet.  A claim without a source (the four-argument form, as before
 * 0.3.0) has source '' and is a duplicate of a claim of any source; a
 * claim with source S is a duplicate of one of S or of ''.  So upgrades
 * keep what existing claims meant, and the old and new consumer instances
 * of a rolling deploy never both apply an event.  The claim commits or
 * rolls back with the consumer's business effect, so a failed attempt
 * leaves nothing behind and the redelivered event is applied then.  A
 * claim held by a concurrent uncommitted transaction, of either form,
 * makes the caller wait for its outcome.
 *
 * src/claim.c
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "outbox.h"

#define CLAIM_ARGS 5

/*
 * pg_locks.objsubid of the claims' lock (an advisory lock tag's last
 * field): pg_advisory_lock and its kin use 1 and 2, so an application's
 * advisory locks never meet it.
 */
#define CLAIM_LOCK_FIELD4 0x6F62

static const Oid claim_argtypes[CLAIM_ARGS] = {TEXTOID, INT8OID, TEXTOID,
											   TEXTOID, TEXTOID};

/*
 * Without a source (the four-argument form, a NULL source) the statements
 * name only the columns of 0.2.0, so that a new library serves a database
 * not updated yet; source takes its default, ''.  Seen before if a claim
 * of any source has the event id or business key (on 0.2.0 every claim
 * has source '').  No conflict target: a clash on either unique key means
 * "seen before".
 */
static const char *const claim_sql =
	"INSERT INTO outbox.consumer_dedup (consumer, event_id, biz_type, biz_key)"
	" SELECT $1, $2, $3, $4"
	"  WHERE NOT EXISTS (SELECT FROM outbox.consumer_dedup"
	"                     WHERE consumer OPERATOR(pg_catalog.=) $1"
	"                       AND (event_id OPERATOR(pg_catalog.=) $2"
	"                            OR (biz_type OPERATOR(pg_catalog.=) $3"
	"                                AND biz_key OPERATOR(pg_catalog.=) $4)))"
	" ON CONFLICT DO NOTHING";

/*
 * With a source: seen before too if a claim made without one ('') has its
 * event id or business key.
 */
static const char *const claim_source_sql =
	"INSERT INTO outbox.consumer_dedup"
	"       (consumer, event_id, biz_type, biz_key, source)"
	" SELECT $1, $2, $3, $4, $5"
	"  WHERE NOT EXISTS (SELECT FROM outbox.consumer_dedup"
	"                     WHERE consumer OPERATOR(pg_catalog.=) $1"
	"                       AND source OPERATOR(pg_catalog.=) ''"
	"                       AND (event_id OPERATOR(pg_catalog.=) $2"
	"                            OR (biz_type OPERATOR(pg_catalog.=) $3"
	"                                AND biz_key OPERATOR(pg_catalog.=) $4)))"
	" ON CONFLICT DO NOTHING";

/*
 * Both statements run with the rights of the extension's owner, under the
 * caller's search_path: the table is schema-qualified, every operator is
 * pg_catalog's and the parameters are typed, so nothing the caller can
 * create is resolved.
 *
 * Lock the claim that made ours a duplicate.  The lock is WAL-logged, so
 * the caller's COMMIT waits for synchronous replication as a first claim's
 * would: a transaction that wrote no WAL commits without waiting, and the
 * claim seen may exist only on a primary just recovered from a crash.
 * Lost in a failover, it would take the business effect with it while the
 * consumer moved past the event.
 */
static const char *const claimed_sql =
	"SELECT 1 FROM outbox.consumer_dedup"
	" WHERE consumer OPERATOR(pg_catalog.=) $1"
	"   AND (event_id OPERATOR(pg_catalog.=) $2"
	"        OR (biz_type OPERATOR(pg_catalog.=) $3"
	"            AND biz_key OPERATOR(pg_catalog.=) $4))"
	" FOR KEY SHARE";

static const char *const claimed_source_sql =
	"SELECT 1 FROM outbox.consumer_dedup"
	" WHERE consumer OPERATOR(pg_catalog.=) $1"
	"   AND source OPERATOR(pg_catalog.=) ANY (ARRAY[$5, ''])"
	"   AND (event_id OPERATOR(pg_catalog.=) $2"
	"        OR (biz_type OPERATOR(pg_catalog.=) $3"
	"            AND biz_key OPERATOR(pg_catalog.=) $4))"
	" FOR KEY SHARE";

static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr claimed_plan = NULL;
static SPIPlanPtr claim_source_plan = NULL;
static SPIPlanPtr claimed_source_plan = NULL;

static void check_claim_args(FunctionCallInfo fcinfo);
static text *claim_source(FunctionCallInfo fcinfo);
static void lock_claim_form(text *consumer, bool with_source);
static bool claim_insert(Datum *values, char *nulls, bool with_source);
static void lock_duplicate(Datum *values, char *nulls, bool with_source);
static void execute_latest(SPIPlanPtr plan, Datum *values, char *nulls,
						   int expected);

PG_FUNCTION_INFO_V1(outbox_claim);

/*
 * outbox_claim: SQL entry point, see the file header.
 *
 * Claims of one form meet through the unique keys: ON CONFLICT DO NOTHING
 * waits for a concurrent uncommitted claim of the same key.  Claims of the
 * two forms have different keys (their sources differ), so their NOT
 * EXISTS looks for each other, and lock_claim_form makes one wait for the
 * other form's uncommitted claims of the consumer first.  The look-up then
 * reads the latest snapshot, not the caller's: under REPEATABLE READ the
 * transaction's snapshot may predate the claim it waited for, or one
 * committed since it began.
 */
Datum
outbox_claim(PG_FUNCTION_ARGS)
{
	Datum values[CLAIM_ARGS];
	char nulls[CLAIM_ARGS];
	text *source;
	bool first;

	check_claim_args(fcinfo);
	source = claim_source(fcinfo);
	for (int i = 0; i < CLAIM_ARGS - 1; i++)
	{
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	nulls[CLAIM_ARGS - 1] = ' ';
	values[CLAIM_ARGS - 1] = PointerGetDatum(source);

	lock_claim_form(PG_GETARG_TEXT_PP(0), source != NULL);
	SPI_connect();
	first = claim_insert(values, nulls, source != NULL);
	if (!first)
		lock_duplicate(values, nulls, source != NULL);
	SPI_finish();
	PG_RETURN_BOOL(first);
}

/*
 * lock_claim_form: wait for the consumer's transactions that claim with
 * the other form, and make the other form's wait for ours.
 *
 * One lock per database and consumer (its name hashed: a collision only
 * adds waits), held to the transaction's end: ShareLock for a claim
 * without a source, RowExclusiveLock for one with.  Each mode is
 * compatible with itself and conflicts with the other, so a deployment
 * with one form never waits on it, and the lock queue serves the forms in
 * turn, neither starved.  Taken again in the same transaction it counts in
 * the backend's local lock table only: a transaction of thousands of
 * claims holds one lock-table entry.  A transaction that claims with both
 * forms while another does may deadlock (40P01).
 */
static void
lock_claim_form(text *consumer, bool with_source)
{
	LOCKTAG tag;
	uint64 hash;

	hash = hash_bytes_extended((const unsigned char *) VARDATA_ANY(consumer),
							   VARSIZE_ANY_EXHDR(consumer), 0);
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hash >> 32),
						 (uint32) hash, CLAIM_LOCK_FIELD4);
	(void) LockAcquire(&tag, with_source ? RowExclusiveLock : ShareLock, false,
					   false);
}

/*
 * claim_insert: insert the claim unless one makes it a duplicate; true if
 * it was inserted.
 */
static bool
claim_insert(Datum *values, char *nulls, bool with_source)
{
	SPIPlanPtr plan;

	plan = with_source
			   ? outbox_keep_plan(&claim_source_plan, claim_source_sql,
								  CLAIM_ARGS, claim_argtypes, false)
			   : outbox_keep_plan(&claim_plan, claim_sql, CLAIM_ARGS - 1,
								  claim_argtypes, false);
	execute_latest(plan, values, nulls, SPI_OK_INSERT);
	return SPI_processed == 1;
}

/*
 * lock_duplicate: lock the claims that made ours a duplicate (see
 * claimed_sql).
 */
static void
lock_duplicate(Datum *values, char *nulls, bool with_source)
{
	SPIPlanPtr plan;

	plan = with_source
			   ? outbox_keep_plan(&claimed_source_plan, claimed_source_sql,
								  CLAIM_ARGS, claim_argtypes, false)
			   : outbox_keep_plan(&claimed_plan, claimed_sql, CLAIM_ARGS - 1,
								  claim_argtypes, false);
	execute_latest(plan, values, nulls, SPI_OK_SELECT);
}

/*
 * execute_latest: run a claim statement under the latest snapshot, as
 * PostgreSQL's foreign key checks do, so that it sees every claim
 * committed before it started, and our own.
 */
static void
execute_latest(SPIPlanPtr plan, Datum *values, char *nulls, int expected)
{
	int rc;

	rc = SPI_execute_snapshot(plan, values, nulls, GetLatestSnapshot(),
							  InvalidSnapshot, false, true, 0);
	if (rc != expected)
		elog(ERROR, "outbox claim statement failed: %s",
			 SPI_result_code_string(rc));
}

/*
 * check_claim_args: consumer and event_id are required, and the consumer
 * one outbox.allowed_consumers allows; biz_type and biz_key come together
 * or not at all.
 */
static void
check_claim_args(FunctionCallInfo fcinfo)
{
	text *consumer;

	if (PG_ARGISNULL(0))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("consumer must not be null")));
	consumer = PG_GETARG_TEXT_PP(0);
	outbox_check_consumer(consumer);
	outbox_check_allowed_consumer(consumer);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("event_id must not be null"),
				 errhint("Pass the event_id header of the Kafka message.")));
	if (PG_ARGISNULL(2) != PG_ARGISNULL(3))
		ereport(
			ERROR,
			(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
			 errmsg("biz_type and biz_key must be given together"),
			 errdetail(
				 "Either both identify the business fact, or neither is passed.")));
	if (!PG_ARGISNULL(2))
	{
		outbox_check_key("biz_type", PG_GETARG_TEXT_PP(2));
		outbox_check_key("biz_key", PG_GETARG_TEXT_PP(3));
	}
}

/*
 * claim_source: the source claimed for, the fifth argument; NULL without
 * one (the four-argument form, or a NULL source: an event with no
 * outbox_source header, sent before 0.3.0).
 */
static text *
claim_source(FunctionCallInfo fcinfo)
{
	text *source;

	if (PG_NARGS() < CLAIM_ARGS || PG_ARGISNULL(CLAIM_ARGS - 1))
		return NULL;
	source = PG_GETARG_TEXT_PP(CLAIM_ARGS - 1);
	outbox_check_source(source);
	return source;
}
