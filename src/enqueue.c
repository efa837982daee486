/*
 * enqueue.c
 *		outbox.enqueue(): add an event to the outbox in the caller's
 *		transaction.
 *
 * The row becomes visible to the relay when the caller commits and never
 * exists if it rolls back.  (biz_type, biz_key) is unique: calling again
 * with the same content returns the first id, so an application may retry
 * freely; calling with different content is a conflict (SQLSTATE 23505).
 *
 * src/enqueue.c
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "outbox.h"

/* An enqueue call's arguments, checked and with defaults applied. */
typedef struct EnqueueArgs
{
	Datum values[6]; /* biz_type, biz_key, topic, msg_key,
					  * payload (jsonb or bytea), headers */
	char nulls[6];   /* SPI null flags: ' ' or 'n' */
	bool bytes;      /* enqueue_bytes' */
} EnqueueArgs;

#define ENQUEUE_NARGS 6
#define ARG_PAYLOAD 4
#define ARG_HEADERS 5

/* Index [bytes]: enqueue's, enqueue_bytes'. */
static const Oid enqueue_argtypes[2][ENQUEUE_NARGS] = {
	{TEXTOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID},
	{TEXTOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID}};

/*
 * The statements run with the rights of the extension's owner, under the
 * caller's search_path: every name in them is schema-qualified and every
 * operator is pg_catalog's, so that nothing the caller can create is
 * resolved (parameters are typed, so no operator needs a guess either).
 */

/*
 * The statements of enqueue name the JSON payload column, those of
 * enqueue_bytes the bytes one; the former's work on a schema older than
 * 0.3.0 too, which a new library meets until ALTER EXTENSION UPDATE.
 */

/*
 * Insert unless the key exists.  On a concurrent uncommitted insert of the
 * same key this waits for that transaction, as a unique index does.
 */
#define INSERT_SQL(payload_column)                                            \
	"INSERT INTO outbox.event_log"                                            \
	" (biz_type, biz_key, topic, msg_key, " payload_column ", headers)"       \
	" VALUES ($1, $2, $3, $4, $5, $6)"                                        \
	" ON CONFLICT (biz_type, biz_key) DO NOTHING RETURNING id"

/*
 * The existing event for the key, and whether its content is the same
 * (the payload of the same kind and equal: the other kind's column is NULL,
 * making the answer NULL; headers both none or equal: IS NOT DISTINCT FROM
 * would look up "=" by name; a row stored before 0.3.0 may hold '{}' for
 * none).  The row lock is WAL-logged, so a retry's COMMIT waits for
 * synchronous replication as the first one did (a transaction that wrote
 * no WAL does not wait): the event found may exist only on a primary just
 * recovered from a crash, and an acknowledged retry promises it.
 */
#define EXISTING_SQL(payload_column)                                                 \
	"SELECT id, topic OPERATOR(pg_catalog.=) $3"                                     \
	"       AND msg_key OPERATOR(pg_catalog.=) $4"                                   \
	"       AND " payload_column " OPERATOR(pg_catalog.=) $5"                        \
	"       AND COALESCE(headers OPERATOR(pg_catalog.=) $6,"                         \
	"                    (headers IS NULL"                                           \
	"                     OR headers OPERATOR(pg_catalog.=) '{}'::pg_catalog.jsonb)" \
	"                    AND $6 IS NULL)"                                            \
	"  FROM outbox.event_log"                                                        \
	" WHERE biz_type OPERATOR(pg_catalog.=) $1"                                      \
	"   AND biz_key OPERATOR(pg_catalog.=) $2"                                       \
	"   FOR KEY SHARE"

static const char *const insert_sql[2] = {INSERT_SQL("payload"),
										  INSERT_SQL("payload_bytes")};
static const char *const existing_sql[2] = {EXISTING_SQL("payload"),
											EXISTING_SQL("payload_bytes")};
static SPIPlanPtr insert_plan[2] = {NULL, NULL};
static SPIPlanPtr existing_plan[2] = {NULL, NULL};

static Datum enqueue(FunctionCallInfo fcinfo, bool bytes);
static void read_args(FunctionCallInfo fcinfo, EnqueueArgs *args, bool bytes);
static size_t read_payload(FunctionCallInfo fcinfo, EnqueueArgs *args,
						   bool bytes);
static text *required_key(FunctionCallInfo fcinfo, int argno, const char *name,
						  int *len);
static Datum resolve_topic(FunctionCallInfo fcinfo, text *biz_type,
						   int type_len);
static bool insert_event(EnqueueArgs *args, int64 *id);
static bool existing_event(EnqueueArgs *args, int64 *id);
static bool first_int8(int64 *id);

PG_FUNCTION_INFO_V1(outbox_enqueue);
PG_FUNCTION_INFO_V1(outbox_enqueue_bytes);

/*
 * outbox_enqueue: SQL entry point, see the file header.
 */
Datum
outbox_enqueue(PG_FUNCTION_ARGS)
{
	return enqueue(fcinfo, false);
}

/*
 * outbox_enqueue_bytes: the same with the payload as bytea, sent as the
 * message value byte for byte (Avro, Protobuf, signed bytes).
 */
Datum
outbox_enqueue_bytes(PG_FUNCTION_ARGS)
{
	return enqueue(fcinfo, true);
}

/*
 * enqueue: insert the event, or find the one stored under its key; its id.
 */
static Datum
enqueue(FunctionCallInfo fcinfo, bool bytes)
{
	EnqueueArgs args;
	int64 id = 0;

	read_args(fcinfo, &args, bytes);

	SPI_connect();
	/*
	 * A key that disappears between the failed insert and the look-up
	 * (removed by retention) is inserted again on the second round.
	 */
	for (int round = 0; round < 2; round++)
	{
		if (insert_event(&args, &id) || existing_event(&args, &id))
		{
			SPI_finish();
			outbox_events_at_commit();
			PG_RETURN_INT64(id);
		}
	}
	ereport(ERROR, (errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					errmsg("could not enqueue event (%s, %s): its key was "
						   "removed concurrently",
						   TextDatumGetCString(args.values[0]),
						   TextDatumGetCString(args.values[1])),
					errhint("Retry the transaction.")));
	PG_RETURN_NULL(); /* not reached */
}

/*
 * read_args: check every argument and fill in the defaults for topic
 * (outbox.default_topic) and msg_key (biz_key).  Each argument is fetched
 * (and detoasted) once and checked in place.
 */
static void
read_args(FunctionCallInfo fcinfo, EnqueueArgs *args, bool bytes)
{
	int type_len;
	int key_len;
	text *biz_type = required_key(fcinfo, 0, "biz_type", &type_len);
	text *biz_key = required_key(fcinfo, 1, "biz_key", &key_len);
	int biz_key_len = key_len;
	text *msg_key = biz_key;
	size_t value_len;
	size_t header_len = 0;

	memset(args->nulls, ' ', sizeof(args->nulls));
	args->bytes = bytes;
	value_len = read_payload(fcinfo, args, bytes);
	args->values[0] = PointerGetDatum(biz_type);
	args->values[1] = PointerGetDatum(biz_key);
	args->values[2] = resolve_topic(fcinfo, biz_type, type_len);

	if (!PG_ARGISNULL(5))
	{
		msg_key = PG_GETARG_TEXT_PP(5);
		key_len = outbox_check_key("msg_key", msg_key);
	}
	args->values[3] = PointerGetDatum(msg_key);

	/*
	 * No headers, whether NULL or '{}' (drivers send either for "none", Go's
	 * nil and empty maps for one): one event, stored as NULL, so a retry
	 * spelled the other way is the same call.
	 */
	args->nulls[ARG_HEADERS] = 'n';
	if (!PG_ARGISNULL(4))
	{
		Jsonb *headers = PG_GETARG_JSONB_P(4);

		header_len = outbox_check_headers(headers);
		if (JsonContainerSize(&headers->root) > 0)
		{
			args->values[ARG_HEADERS] = PointerGetDatum(headers);
			args->nulls[ARG_HEADERS] = ' ';
		}
	}
	header_len += outbox_relay_headers_size(type_len, biz_key_len);
	if (bytes)
		outbox_check_bytes_size(value_len, key_len, header_len);
	else
		outbox_check_size(DatumGetJsonbP(args->values[ARG_PAYLOAD]), key_len,
						  header_len);
}

/*
 * read_payload: the payload argument, never NULL; for bytes, their length.
 */
static size_t
read_payload(FunctionCallInfo fcinfo, EnqueueArgs *args, bool bytes)
{
	if (PG_ARGISNULL(2))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("payload must not be null"),
						errhint(bytes ? "Use an empty bytea ('') for an event "
										"without content."
									  : "Use the JSON value 'null'::jsonb for an "
										"event without content.")));
	if (!bytes)
	{
		args->values[ARG_PAYLOAD] = PointerGetDatum(PG_GETARG_JSONB_P(2));
		return 0;
	}
	args->values[ARG_PAYLOAD] = PointerGetDatum(PG_GETARG_BYTEA_PP(2));
	return VARSIZE_ANY_EXHDR(DatumGetPointer(args->values[ARG_PAYLOAD]));
}

/*
 * required_key: argument argno, which must be a non-null, non-empty key;
 * its length in *len.
 */
static text *
required_key(FunctionCallInfo fcinfo, int argno, const char *name, int *len)
{
	text *value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("%s must not be null", name)));
	value = PG_GETARG_TEXT_PP(argno);
	*len = outbox_check_key(name, value);
	return value;
}

/*
 * resolve_topic: the topic argument, or the one outbox.default_topic
 * gives for biz_type; either way a legal Kafka topic name that the
 * session's outbox.allowed_topics allows.
 */
static Datum
resolve_topic(FunctionCallInfo fcinfo, text *biz_type, int type_len)
{
	bool from_default = PG_ARGISNULL(3);
	text *topic;
	size_t len;

	if (from_default)
	{
		char *name = outbox_topic_from_pattern(
			outbox_default_topic, VARDATA_ANY(biz_type), type_len, &len);

		topic = cstring_to_text_with_len(name, len);
		pfree(name);
	}
	else
	{
		topic = PG_GETARG_TEXT_PP(3);
		len = VARSIZE_ANY_EXHDR(topic);
	}
	outbox_check_topic(VARDATA_ANY(topic), len, from_default);
	outbox_check_allowed_topic(VARDATA_ANY(topic), len);
	return PointerGetDatum(topic);
}

/*
 * insert_event: insert the event; false if its key already exists.
 */
static bool
insert_event(EnqueueArgs *args, int64 *id)
{
	SPIPlanPtr plan =
		outbox_keep_plan(&insert_plan[args->bytes], insert_sql[args->bytes],
						 ENQUEUE_NARGS, enqueue_argtypes[args->bytes], false);
	int rc = SPI_execute_plan(plan, args->values, args->nulls, false, 1);

	if (rc != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "outbox insert failed: %s", SPI_result_code_string(rc));
	return first_int8(id);
}

/*
 * existing_event: the id of the event already stored under the key, if
 * its content is the same; a unique violation if it differs; false if
 * the key is gone.
 */
static bool
existing_event(EnqueueArgs *args, int64 *id)
{
	SPIPlanPtr plan =
		outbox_keep_plan(&existing_plan[args->bytes], existing_sql[args->bytes],
						 ENQUEUE_NARGS, enqueue_argtypes[args->bytes], false);
	int rc = SPI_execute_plan(plan, args->values, args->nulls, false, 1);
	Datum same;
	bool isnull;

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox look-up failed: %s", SPI_result_code_string(rc));
	if (!first_int8(id))
		return false;
	/* NULL: the payload is of the other kind, so not the same. */
	same =
		SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	if (!isnull && DatumGetBool(same))
		return true;

	ereport(ERROR, (errcode(ERRCODE_UNIQUE_VIOLATION),
					errmsg("outbox event (biz_type, biz_key)=(%s, %s) already "
						   "exists with different content",
						   TextDatumGetCString(args->values[0]),
						   TextDatumGetCString(args->values[1])),
					errdetail("The event stored under this key has another "
							  "topic, payload, headers or msg_key."),
					errhint("Use a new biz_key for a new business fact.")));
	return false; /* not reached */
}

/*
 * first_int8: the first column of the first row SPI returned, if any.
 */
static bool
first_int8(int64 *id)
{
	bool isnull;

	if (SPI_processed == 0)
		return false;
	*id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull));
	return true;
}
