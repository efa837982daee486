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
 * 0.3.0) has source '', and a claim with one also counts those as its
 * own: upgrades keep what existing claims meant.  The claim commits or rolls back with the consumer's
 * business effect, so a failed attempt leaves nothing behind and the
 * redelivered event is applied then.  A claim held by a concurrent
 * uncommitted transaction makes the caller wait for its outcome.
 *
 * src/claim.c
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "outbox.h"

#define CLAIM_ARGS 5

static const Oid claim_argtypes[CLAIM_ARGS] = {TEXTOID, INT8OID, TEXTOID,
											   TEXTOID, TEXTOID};

/*
 * Without a source (the four-argument form, a NULL source) the statements
 * name only the columns of 0.2.0, so that a new library serves a database
 * not updated yet; source takes its default, ''.  No conflict target: a
 * clash on either unique key means "seen before".
 */
static const char *const claim_sql =
	"INSERT INTO outbox.consumer_dedup (consumer, event_id, biz_type, biz_key)"
	" VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

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

PG_FUNCTION_INFO_V1(outbox_claim);

/*
 * outbox_claim: SQL entry point, see the file header.
 */
Datum
outbox_claim(PG_FUNCTION_ARGS)
{
	Datum values[CLAIM_ARGS];
	char nulls[CLAIM_ARGS];
	text *source;
	int nargs;
	SPIPlanPtr plan;
	int rc;
	bool first;

	check_claim_args(fcinfo);
	source = claim_source(fcinfo);
	nargs = source ? CLAIM_ARGS : CLAIM_ARGS - 1;
	for (int i = 0; i < CLAIM_ARGS - 1; i++)
	{
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	nulls[CLAIM_ARGS - 1] = ' ';
	values[CLAIM_ARGS - 1] = PointerGetDatum(source);

	SPI_connect();
	plan = source ? outbox_keep_plan(&claim_source_plan, claim_source_sql,
									 nargs, claim_argtypes, false)
				  : outbox_keep_plan(&claim_plan, claim_sql, nargs,
									 claim_argtypes, false);
	rc = SPI_execute_plan(plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "outbox claim failed: %s", SPI_result_code_string(rc));
	first = (SPI_processed == 1);
	if (!first)
	{
		plan = source
				   ? outbox_keep_plan(&claimed_source_plan, claimed_source_sql,
									  nargs, claim_argtypes, false)
				   : outbox_keep_plan(&claimed_plan, claimed_sql, nargs,
									  claim_argtypes, false);
		rc = SPI_execute_plan(plan, values, nulls, false, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "outbox claim look-up failed: %s",
				 SPI_result_code_string(rc));
	}
	SPI_finish();
	PG_RETURN_BOOL(first);
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
