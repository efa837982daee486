/*
 * json_compact.c
 *		A jsonb value as compact JSON text: no space after ":" or ",".
 *
 * This is the form the relay sends as the Kafka message value, and the one
 * enqueue measures against outbox.max_payload_size, so the limit applies
 * to exactly the bytes that reach the broker.
 *
 * src/json_compact.c
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "outbox.h"

static void append_scalar(StringInfo out, JsonbValue *v);
static size_t least_length(JsonbIteratorToken tok, JsonbValue *v);

/*
 * outbox_json_compact: append jb to out as compact JSON text.  With a
 * limit (>= 0), stop and return false as soon as the text is known to be
 * longer than limit bytes, so that measuring an oversized payload costs
 * no more than the limit.
 */
bool
outbox_json_compact(StringInfo out, Jsonb *jb, int limit)
{
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbIteratorToken tok;
	JsonbValue v;
	bool need_comma = false;
	bool raw_scalar = false;

	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (limit >= 0 &&
			(size_t) out->len + least_length(tok, &v) > (size_t) limit)
			return false;
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				raw_scalar = v.val.array.rawScalar;
				if (!raw_scalar)
				{
					if (need_comma)
						appendStringInfoChar(out, ',');
					appendStringInfoChar(out, '[');
				}
				need_comma = false;
				break;
			case WJB_BEGIN_OBJECT:
				if (need_comma)
					appendStringInfoChar(out, ',');
				appendStringInfoChar(out, '{');
				need_comma = false;
				break;
			case WJB_KEY:
				if (need_comma)
					appendStringInfoChar(out, ',');
				append_scalar(out, &v);
				appendStringInfoChar(out, ':');
				need_comma = false;
				break;
			case WJB_ELEM:
				if (need_comma)
					appendStringInfoChar(out, ',');
				/* FALLTHROUGH */
			case WJB_VALUE:
				append_scalar(out, &v);
				need_comma = true;
				break;
			case WJB_END_ARRAY:
				if (!raw_scalar)
					appendStringInfoChar(out, ']');
				need_comma = true;
				break;
			case WJB_END_OBJECT:
				appendStringInfoChar(out, '}');
				need_comma = true;
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d", (int) tok);
		}
	}
	return limit < 0 || out->len <= limit;
}

/*
 * least_length: the fewest bytes the token adds to the text: a string
 * takes at least its length and two quotes.  Known before escaping, which
 * can grow a string sixfold.
 */
static size_t
least_length(JsonbIteratorToken tok, JsonbValue *v)
{
	bool scalar = tok == WJB_KEY || tok == WJB_ELEM || tok == WJB_VALUE;

	if (!scalar || v->type != jbvString)
		return 0;
	return (size_t) v->val.string.len + 2;
}

/*
 * append_scalar: one scalar (or object key) as JSON text.
 */
static void
append_scalar(StringInfo out, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			appendStringInfoString(out, "null");
			break;
		case jbvBool:
			appendStringInfoString(out, v->val.boolean ? "true" : "false");
			break;
		case jbvNumeric:
			appendStringInfoString(
				out, DatumGetCString(DirectFunctionCall1(
						 numeric_out, NumericGetDatum(v->val.numeric))));
			break;
		case jbvString:
		{
			char *s = pnstrdup(v->val.string.val, v->val.string.len);

			escape_json(out, s);
			pfree(s);
			break;
		}
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}
}
