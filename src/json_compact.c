/*
 * json_compact.c
 *		A jsonb value as compact JSON text: no space after ":" or ",".
 *
 * This is the form the relay sends as the Kafka message value, and the one
 * enqueue measures against outbox.max_payload_size, so the limit applies
 * to exactly the bytes that reach the broker.  Enqueue only measures: the
 * size is counted token by token without building the text.
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
static size_t token_size(JsonbIteratorToken tok, JsonbValue *v,
						 bool *need_comma, bool *raw_scalar);
static size_t scalar_size(JsonbValue *v);
static size_t escaped_size(const char *s, int len);

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

/*
 * outbox_json_compact_size: the length of jb as compact JSON text, in
 * *size; the same bytes outbox_json_compact writes.  Stops and returns
 * false once the length is known to exceed limit, *size then being a
 * length already passed.
 */
bool
outbox_json_compact_size(Jsonb *jb, int64 limit, size_t *size)
{
	JsonbIterator *it;
	JsonbIteratorToken tok;
	JsonbValue v;
	bool need_comma = false;
	bool raw_scalar = false;
	size_t total = 0;

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		total += token_size(tok, &v, &need_comma, &raw_scalar);
		if ((int64) total > limit)
		{
			*size = total;
			return false;
		}
	}
	*size = total;
	return true;
}

/*
 * token_size: the bytes one iterator token adds to compact JSON text,
 * following outbox_json_compact's rules for commas and raw scalars.
 */
static size_t
token_size(JsonbIteratorToken tok, JsonbValue *v, bool *need_comma,
		   bool *raw_scalar)
{
	size_t comma = *need_comma ? 1 : 0;

	switch (tok)
	{
		case WJB_BEGIN_ARRAY:
			*raw_scalar = v->val.array.rawScalar;
			*need_comma = false;
			return *raw_scalar ? 0 : comma + 1;
		case WJB_BEGIN_OBJECT:
			*need_comma = false;
			return comma + 1;
		case WJB_KEY:
			*need_comma = false;
			return comma + scalar_size(v) + 1;
		case WJB_ELEM:
			*need_comma = true;
			return comma + scalar_size(v);
		case WJB_VALUE:
			*need_comma = true;
			return scalar_size(v);
		case WJB_END_ARRAY:
			*need_comma = true;
			return *raw_scalar ? 0 : 1;
		case WJB_END_OBJECT:
			*need_comma = true;
			return 1;
		default:
			elog(ERROR, "unexpected jsonb iterator token %d", (int) tok);
	}
	return 0; /* not reached */
}

/*
 * scalar_size: the bytes of one scalar (or object key) as JSON text.
 */
static size_t
scalar_size(JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return 4;
		case jbvBool:
			return v->val.boolean ? 4 : 5;
		case jbvNumeric:
		{
			char *digits = DatumGetCString(DirectFunctionCall1(
				numeric_out, NumericGetDatum(v->val.numeric)));
			size_t len = strlen(digits);

			pfree(digits);
			return len;
		}
		case jbvString:
			return escaped_size(v->val.string.val, v->val.string.len);
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}
	return 0; /* not reached */
}

/*
 * escaped_size: the bytes escape_json makes of len bytes of a string,
 * quotes included: two for a quote, a backslash, backspace, form feed,
 * newline, carriage return or tab, six for another control character
 * (\u00XX), one for any other byte.
 */
static size_t
escaped_size(const char *s, int len)
{
	size_t size = (size_t) len + 2;

	for (int i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' ||
			c == '\r' || c == '\t')
			size += 1;
		else if (c < ' ')
			size += 5;
	}
	return size;
}
