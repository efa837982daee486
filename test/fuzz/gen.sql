-- test/fuzz/gen.sql: the case generator of the enqueue/claim fuzz.
--
-- A case is a fuzz.case_t: which function, how its arguments are passed,
-- and the SQL source of each argument.  It depends on nothing but the seed
-- and the case number (fuzz.gen_case sets the random seed from both), so a
-- case can be shown again from those two numbers.  Argument sources are
-- text-valued SQL expressions that evaluate the same way every time: no
-- random() and no clock in them.

SET client_min_messages = warning;
CREATE SCHEMA fuzz;

-- Roles a case may call as: one granted what the README grants a
-- service, one granted nothing (42501).
CREATE ROLE fuzz_app;
CREATE ROLE fuzz_none;
GRANT USAGE ON SCHEMA outbox TO fuzz_app;
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, jsonb, text),
                          outbox.claim(text, bigint, text, text),
                          outbox.claim(text, bigint, text, text, text) TO fuzz_app;

CREATE TYPE fuzz.case_t AS (
    case_no      integer,
    kind         text,      -- enqueue, claim, call (a malformed call)
    mode         text,      -- typed, literal, params, textparams
    notation     text,      -- positional, named, mixed
    args         text[],    -- SQL source of each argument; NULL: left out
    role         text,      -- NULL: the superuser; fuzz_app; fuzz_none
    max_payload  text,      -- SET outbox.max_payload_size first (NULL: no)
    payload_cap  integer,   -- the byte value it must give; NULL: invalid
    default_topic text,     -- SET outbox.default_topic first (NULL: no)
    allowed_topics text,    -- SET outbox.allowed_topics first (NULL: no)
    allowed_consumers text, -- SET outbox.allowed_consumers first (NULL: no)
    hostile      boolean,   -- call with fuzz_trap first in search_path
    stmt         text,      -- kind call: the statement
    phase        text,      -- kind call: parse or call
    expect       text[]     -- kind call: the SQLSTATEs it may raise, 'ok'
);

-- Random helpers; every one draws from random(), seeded per case.

CREATE FUNCTION fuzz.r(n integer) RETURNS integer
LANGUAGE sql AS $$ SELECT floor(random() * n)::integer $$;

CREATE FUNCTION fuzz.pick(VARIADIC a text[]) RETURNS text
LANGUAGE sql AS $$ SELECT a[1 + fuzz.r(cardinality(a))] $$;

CREATE FUNCTION fuzz.rand_str(alphabet text, n integer) RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce(string_agg(substr(alphabet, 1 + fuzz.r(length(alphabet)), 1), ''), '')
      FROM generate_series(1, n)
$$;

-- Characters a key or a header name may surprise a parser with.
CREATE FUNCTION fuzz.odd_alphabet() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'abcXYZ019 -_.:/@#{}%$''"\|,;=~*?!<>()[]&^+é€🎉ключ' || E'\t\n\r' || chr(1) || chr(127)
$$;

-- Valid UTF-8 that is still odd: combining marks, bidi, BOM, format
-- strings, SQL, quotes, whitespace.
CREATE FUNCTION fuzz.odd_string() RETURNS text
LANGUAGE sql AS $$
    SELECT fuzz.pick('ключ', '🎉', 'é', 'e' || U&'\0301', '%s%n%x%%', '{biz_type}', 'it''s',
                     '"quoted"', 'back\slash', E'tab\there', E'new\nline', ' ', '   x   ',
                     'DROP TABLE x; --', ''');DROP TABLE outbox.event_log;--', U&'\00A0',
                     U&'\202E' || 'abc', U&'\200D', U&'\FEFF', U&'\FFFD', U&'\FFFF',
                     U&'\+01D11E', 'NULL', 'null', '\N', '$1', '0', '-1', chr(127), chr(1))
$$;

-- Sources that fail to evaluate: invalid UTF-8 through escapes and
-- convert_from, NUL, lone surrogates.
CREATE FUNCTION fuzz.src_bad() RETURNS text
LANGUAGE sql AS $b$
    SELECT fuzz.pick($$E'\xff'$$, $$E'ab\xc3'$$, $$E'\xed\xa0\x80'$$, $$E'\xc0\xaf'$$,
                     $$E'\xf4\x90\x80\x80'$$, $$E'\u0000'$$, $$E'\uD800'$$, $$U&'\DC00'$$,
                     $$convert_from('\x61ff62', 'UTF8')$$, $$convert_from('\xeda080', 'UTF8')$$,
                     $$convert_from('\x00', 'UTF8')$$, $$chr(0)$$, $$chr(55296)$$,
                     $$'a' || E'\x80'$$, $$'x' || E'\xc3\x28'$$)
$b$;

-- A text argument: biz_type, biz_key, msg_key or consumer.  pool makes
-- a few values recur, so keys collide; lim is the limit to probe.
CREATE FUNCTION fuzz.src_text(pool text, lim integer) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    tag text := fuzz.rand_str('abcdefghijklmnopqrstuvwxyz0123456789', 8);
    d integer := fuzz.r(3) - 1;
BEGIN
    CASE fuzz.r(30)
    WHEN 0 THEN RETURN 'NULL';
    WHEN 1 THEN RETURN quote_literal('');
    WHEN 2, 3, 4, 5, 6, 7, 8, 9 THEN RETURN quote_literal(pool || fuzz.r(8));
    WHEN 10, 11 THEN RETURN quote_literal(fuzz.rand_str(fuzz.odd_alphabet(), 1 + fuzz.r(40)));
    WHEN 12, 13 THEN RETURN quote_literal(fuzz.odd_string());
    WHEN 14 THEN    -- ASCII at the limit, one under, one over
        RETURN format('%L || repeat(%L, %s)', tag, 'k', lim - 8 + d);
    WHEN 15 THEN    -- multibyte at the limit: the limit is in bytes
        RETURN fuzz.pick(format('repeat(%L, %s) || repeat(%L, %s)', '€', lim / 3, 'x', lim % 3 + d),
                         format('repeat(%L, %s)', '🎉', lim / 4 + d),
                         format('repeat(%L, %s) || repeat(%L, %s)', 'é', lim / 2 - 1, 'x', 2 + d));
    WHEN 16 THEN    -- incompressible at the limit
        RETURN format('left((SELECT string_agg(md5(%L || i), %L) FROM generate_series(1, %s) i), %s)',
                      tag, '', lim / 32 + 1, lim + d);
    WHEN 17 THEN    -- far over the limit
        RETURN format('repeat(%L, %s)', fuzz.pick('x', 'é', '🎉'),
                      fuzz.pick('2000', '10000', '100000', '1048576'));
    WHEN 18, 19 THEN RETURN fuzz.src_bad();
    WHEN 20 THEN    -- valid, reached through conversions and casts
        RETURN fuzz.pick($$convert_from('\xe282ac', 'UTF8')$$, $$convert_from('\xe9', 'LATIN1')$$,
                         'chr(233)', 'chr(128512)', $$U&'\+01F389'$$,
                         $$'a' || chr(1) || chr(31) || chr(127)$$, $$E'\t'$$, $$E'line\nbreak'$$,
                         $$'ok'::varchar(2)$$, '123::text', $$md5('x')$$, $$'x'::name::text$$,
                         $$'  '$$, $$(1.5)::numeric::text$$, $$'{"a":1}'::jsonb::text$$);
    ELSE RETURN quote_literal(pool || '-' || tag);
    END CASE;
END $fn$;

-- A topic: mostly left out (the default applies), else legal and
-- illegal Kafka names and lengths.
CREATE FUNCTION fuzz.src_topic() RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    d integer := fuzz.r(3) - 1;
BEGIN
    CASE fuzz.r(24)
    WHEN 0, 1, 2, 3, 4, 5, 6, 7 THEN RETURN NULL;
    WHEN 8 THEN RETURN 'NULL';
    WHEN 9, 10, 11, 12 THEN
        RETURN quote_literal(fuzz.rand_str('abcxyzABCXYZ0189._-', 1 + fuzz.r(60)));
    WHEN 13 THEN RETURN quote_literal('');
    WHEN 14 THEN
        RETURN quote_literal(fuzz.pick('.', '..', '...', '-', '_', '.hidden', 'a..b', '__consumer_offsets'));
    WHEN 15 THEN RETURN format('repeat(%L, %s)', 't', 249 + d);
    WHEN 16 THEN RETURN format('repeat(%L, %s)', 't', fuzz.pick('1000', '100000', '1048576'));
    WHEN 17, 18 THEN
        RETURN quote_literal(fuzz.pick('a b', 'a/b', 'a:b', 'a@b', 'a#b', 'café', E'a\tb', 'a,b',
                                       '{biz_type}', 'orders.{biz_type}', '$x', '*', E'a\nb', 'ä',
                                       '𝄞', 'a+b', 'a\b', 'a''b', ' orders', 'orders ', 'ORDERS%',
                                       U&'\FEFF' || 'orders', 'ｏｒｄｅｒｓ'));
    WHEN 19 THEN RETURN fuzz.src_bad();
    WHEN 20 THEN RETURN format('repeat(%L, %s)', 'é', 249);
    ELSE RETURN quote_literal(fuzz.pick('orders', 'payments', 'outbox.event.T0', 'a', 'A-Z_0.9'));
    END CASE;
END $fn$;

-- JSON text: random valid values, then mutated ones.

CREATE FUNCTION fuzz.json_string() RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    CASE fuzz.r(6)
    WHEN 0 THEN RETURN to_json(fuzz.rand_str(fuzz.odd_alphabet(), fuzz.r(20)))::text;
    WHEN 1 THEN
        RETURN '"' || (SELECT string_agg(fuzz.pick('\n', '\t', '\"', '\\', '\/', '\b', '\f', '\r',
                                                   '\u00e9', '\u20AC', '\ud83d\ude00', '\uD834\uDD1E',
                                                   '\u001f', '\u007f', 'é', '🎉', ' ', 'a'), '')
                         FROM generate_series(0, fuzz.r(6))) || '"';
    WHEN 2 THEN RETURN '""';
    ELSE RETURN to_json(fuzz.rand_str('abcdefghijklmnop', fuzz.r(12)))::text;
    END CASE;
END $fn$;

CREATE FUNCTION fuzz.json_number() RETURNS text
LANGUAGE sql AS $$
    SELECT fuzz.pick('0', '-0', '1', '-1', '42', '3.14', '-2.5e-3', '1e10', '1E+2', '1e308',
                     '-1e-308', '123456789012345678901234567890', '0.000001', '1.0', '1.50',
                     '1e1000', '9223372036854775808', '-9223372036854775809',
                     fuzz.r(100000)::text)
$$;

CREATE FUNCTION fuzz.json_value(depth integer) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    k integer := CASE WHEN depth >= 4 THEN 2 + fuzz.r(8) ELSE fuzz.r(10) END;
BEGIN
    CASE k
    WHEN 0 THEN
        RETURN '{' || coalesce((SELECT string_agg(fuzz.json_string() || fuzz.pick(':', ': ', ' : ')
                                                  || fuzz.json_value(depth + 1), fuzz.pick(',', ', '))
                                  FROM generate_series(1, fuzz.r(5))), '') || '}';
    WHEN 1 THEN
        RETURN '[' || coalesce((SELECT string_agg(fuzz.json_value(depth + 1), fuzz.pick(',', ', '))
                                  FROM generate_series(1, fuzz.r(5))), '') || ']';
    WHEN 2, 3 THEN RETURN fuzz.json_string();
    WHEN 4, 5 THEN RETURN fuzz.json_number();
    WHEN 6 THEN RETURN fuzz.pick('true', 'false', 'null');
    ELSE RETURN fuzz.json_string();
    END CASE;
END $fn$;

-- s with one random edit: truncated, a character inserted, deleted or
-- replaced, or garbage appended.  Often invalid JSON, sometimes not.
CREATE FUNCTION fuzz.mutate(s text) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    p integer := 1 + fuzz.r(length(s) + 1);
    ch text := fuzz.pick('{', '}', '[', ']', ',', ':', '"', '\', 'x', ' ', '0', '-', '.', 'e',
                         'n', E'\t', chr(1), '''', 'é');
BEGIN
    CASE fuzz.r(5)
    WHEN 0 THEN RETURN left(s, p - 1);
    WHEN 1 THEN RETURN overlay(s PLACING ch FROM p FOR 0);
    WHEN 2 THEN RETURN overlay(s PLACING '' FROM p FOR 1);
    WHEN 3 THEN RETURN overlay(s PLACING ch FROM p FOR 1);
    ELSE RETURN s || fuzz.pick(' x', ',', '}', ']', ' ', E'\n', '/**/');
    END CASE;
END $fn$;

-- A payload, lim being the outbox.max_payload_size the case runs with.
CREATE FUNCTION fuzz.src_payload(lim integer) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    d integer := fuzz.r(3) - 1;
    k integer;
    depth integer;
    ch text;
    w integer;
BEGIN
    k := fuzz.r(40);
    -- Payloads near a megabyte cost tens of milliseconds: probe a large
    -- limit less often than a small one, and one over 2 MB (up to 256 MB)
    -- not at all.
    IF k BETWEEN 11 AND 19 AND lim > 65536 AND (fuzz.r(4) > 0 OR lim > 2097152) THEN
        k := 39;
    END IF;
    CASE k
    WHEN 0 THEN RETURN 'NULL';
    WHEN 1, 2, 3, 4 THEN RETURN quote_literal(fuzz.mutate(fuzz.json_value(0)));
    WHEN 5 THEN
        RETURN quote_literal(fuzz.pick('1', '"x"', 'null', 'true', 'false', '[]', '{}', '0', '-0',
                                       '1e308', '123456789012345678901234567890.5', '1e100000',
                                       '1e200000', '{"a":1,"a":2}', '"\ud83d\ude00"', ' {} ',
                                       E'\n[1]\t'));
    WHEN 6, 7 THEN
        RETURN quote_literal(fuzz.pick('', ' ', '{', '}', '{"a":}', '{''a'':1}', 'NaN', 'Infinity',
                                       '-Infinity', '01', '1.', '.5', '[1,]', '{"a" 1}', '"\x"',
                                       '"\u12"', '{} x', 'undefined', 'nul', 'tru', E'"a\tb"',
                                       '/*c*/1', '[1] [2]', '"\u0000"', '{"a":"\u0000"}', '"\ud800"',
                                       '"\udc00"', '"\ud800\u0041"', '"\uDE00\uD83D"', '{"a":1}}',
                                       '[', '"', '\', '{"\ud800":1}'));
    WHEN 8 THEN
        RETURN fuzz.pick($$E'"\xff"'$$, $$E'{"a": "\xc3"}'$$, $$convert_from('\x22ff22', 'UTF8')$$,
                         $$E'{"\xed\xa0\x80": 1}'$$, $$E'"\u0000"'$$, $$'"' || chr(0) || '"'$$);
    WHEN 9, 10 THEN    -- deep nesting: the JSON parser's stack limit answers
        -- (Depths kept clear of the limit, which is near 13,000 levels
        -- with the default max_stack_depth.)
        depth := fuzz.pick('100', '1000', '3000', '5000', '10000', '20000', '100000')::integer;
        RETURN fuzz.pick(format('repeat(%L, %s) || repeat(%L, %s)', '[', depth, ']', depth),
                         format('repeat(%L, %s) || %L || repeat(%L, %s)', '{"a":', depth, '1', '}', depth),
                         format('repeat(%L, %s) || %L || repeat(%L, %s)', '[{"a":', depth, 'null', '}]', depth),
                         format('repeat(%L, %s)', '[', depth));
    WHEN 11, 12 THEN   -- a JSON string of exactly lim + d bytes as compact text
        RETURN format('to_json(repeat(%L, %s))::text', 'x', lim - 2 + d);
    WHEN 13, 14 THEN   -- an object of lim + d bytes compact, with spaces in the input
        RETURN format('%L || repeat(%L, %s) || %L', '{ "s" :  "', 'x', lim - 8 + d, '" }');
    WHEN 15, 16 THEN   -- escapes count as sent: \n 2 bytes, \u0001 6, é 2, € 3
        ch := fuzz.pick('\n', '\u0001', 'é', '\"', '€', '\u00e9');
        w := CASE ch WHEN '\u0001' THEN 6 WHEN '€' THEN 3 ELSE 2 END;
        RETURN format('%L || repeat(%L, %s) || %L', '"', ch, greatest((lim - 2) / w + d, 0), '"');
    WHEN 17 THEN
        RETURN format('(SELECT jsonb_agg(i) FROM generate_series(1, %s) i)::text',
                      fuzz.pick('10', '1000', least(lim / 7, 30000)::text));
    WHEN 18 THEN
        RETURN format('(SELECT jsonb_object_agg(%L || i, i) FROM generate_series(1, %s) i)::text',
                      'k', fuzz.pick('10', '1000', '5000'));
    WHEN 19 THEN       -- far over the limit
        RETURN format('to_json(repeat(%L, %s))::text', fuzz.pick('x', 'é'),
                      fuzz.pick((2 * lim)::text, (lim + 1000)::text, (lim + 1)::text));
    ELSE RETURN quote_literal(fuzz.json_value(0));
    END CASE;
END $fn$;

-- Headers: mostly none or a flat object of strings, then everything a
-- flat object of strings is not.
CREATE FUNCTION fuzz.src_headers(lim integer) RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    CASE fuzz.r(32)
    WHEN 0, 1, 2, 3, 4, 5, 6, 7, 8 THEN RETURN NULL;
    WHEN 9, 10 THEN RETURN 'NULL';
    WHEN 11 THEN RETURN quote_literal('{}');
    WHEN 12, 13, 14, 15, 16 THEN
        RETURN quote_literal(fuzz.flat_headers(1 + fuzz.r(8)));
    WHEN 17 THEN
        RETURN format('(SELECT jsonb_object_agg(%L || i, %L) FROM generate_series(1, %s) i)::text',
                      fuzz.pick('h', 'H-', 'x-trace-'), fuzz.pick('v', ''),
                      fuzz.pick('60', '61', '62', '100', '1000', '10000'));
    WHEN 18 THEN
        RETURN quote_literal(fuzz.pick('[]', '["a"]', '"text"', '1', 'null', 'true', '[{"a": "b"}]',
                                       '""', '1.5', '[[]]'));
    WHEN 19, 20 THEN
        RETURN quote_literal(fuzz.pick('{"a": 1}', '{"a": null}', '{"a": true}', '{"a": [1]}',
                                       '{"a": {"b": "c"}}', '{"a": "ok", "b": 2}', '{"a": 1.5e300}',
                                       '{"a": []}', '{"a": {}}', '{"a": ["x"]}', '{"a": "x", "b": {"c": 1}}'));
    WHEN 21 THEN
        RETURN quote_literal(fuzz.pick('{"event_id": "1"}', '{"EVENT_ID": "1"}', '{"Biz_Key": "x"}',
                                       '{"biz_type": ""}', '{"ok": "1", "bIz_KeY": "2"}',
                                       '{"biz\u005fkey": "x"}', '{"\u0065vent_id": "1"}'));
    WHEN 22 THEN       -- near misses, all legal
        RETURN quote_literal(fuzz.pick('{"event-id": "1"}', '{"event_id ": "x"}', '{" event_id": "x"}',
                                       '{"eventid": "1"}', '{"biz_types": "x"}', '{"bİz_type": "x"}',
                                       '{"event_ıd": "x"}', '{"biz_key\u0000": "x"}', '{"_biz_key": "x"}'));
    WHEN 23 THEN RETURN quote_literal(fuzz.pick('{"": "x"}', '{"a": "1", "": ""}', '{"": ""}'));
    WHEN 24 THEN
        RETURN quote_literal(fuzz.pick('{"a": "\u0000"}', '{"\ud800": "x"}', '{"a"}', '{"a": "b",}',
                                       '{a: "b"}', '{"a": "b"} x', '{"a": "\x"}'));
    WHEN 25 THEN
        RETURN fuzz.pick($$E'{"a": "\xff"}'$$, $$E'{"\xc3": "x"}'$$, $$convert_from('\x7b2261223a2280227d', 'UTF8')$$);
    WHEN 26 THEN       -- a huge value or name: headers count in the size
        RETURN format('json_build_object(%s, %s)::text',
                      fuzz.pick(quote_literal('big'), format('repeat(%L, 100000)', 'n')),
                      fuzz.pick(format('repeat(%L, %s)', 'v', fuzz.pick('1048576', (5 * 1048576)::text)),
                                quote_literal('v')));
    WHEN 29, 30 THEN   -- headers around the size limit
        RETURN format('json_build_object(%L, repeat(%L, %s))::text', fuzz.pick('h', 'trace'),
                      fuzz.pick('v', 'é'), greatest(lim - 20 + fuzz.r(40), 0) / fuzz.pick('1', '2')::integer);
    WHEN 27 THEN RETURN quote_literal(fuzz.mutate(fuzz.flat_headers(1 + fuzz.r(4))));
    ELSE
        RETURN quote_literal(fuzz.pick('{"a b": "1", "ключ": "v", "\n": "x", "=": "", "%s": "%n"}',
                                       '{"\"": "\\", "🎉": "🎉", "a:b": "c=d", "\u0001": "\u001f"}',
                                       '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}',
                                       '{"a": "1", "a": "2"}', '{"x": "", "y": " "}'));
    END CASE;
END $fn$;

-- A flat object of n string headers with random names and values.
CREATE FUNCTION fuzz.flat_headers(n integer) RETURNS text
LANGUAGE sql AS $$
    SELECT '{' || string_agg(to_json(fuzz.pick(fuzz.rand_str(fuzz.odd_alphabet(), 1 + fuzz.r(12)),
                                               'h' || i, 'traceparent', fuzz.odd_string()))::text
                             || ': ' || to_json(fuzz.pick(fuzz.rand_str(fuzz.odd_alphabet(), fuzz.r(30)),
                                                          '', 'v' || i))::text, ', ') || '}'
      FROM generate_series(1, n) i
$$;

-- An event id for claim: colliding small ids, extremes, text that is no
-- bigint.
CREATE FUNCTION fuzz.src_event_id() RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    CASE fuzz.r(20)
    WHEN 0 THEN RETURN 'NULL';
    WHEN 1, 2, 3, 4, 5, 6, 7, 8 THEN RETURN quote_literal((1 + fuzz.r(40))::text);
    WHEN 9 THEN
        RETURN quote_literal(fuzz.pick('0', '-1', '9223372036854775807', '-9223372036854775808',
                                       ' 7 ', '+7', '-0', '007'));
    WHEN 10 THEN
        RETURN quote_literal(fuzz.pick('9223372036854775808', '-9223372036854775809', 'abc', '',
                                       '1e3', '0x1F', '1_000', '1.5', '7 8', 'NaN', '१२', ' '));
    WHEN 11 THEN RETURN fuzz.src_bad();
    WHEN 12 THEN RETURN quote_literal((fuzz.r(2000000000)::bigint * 4611686)::text);
    ELSE RETURN quote_literal((1 + fuzz.r(5000))::text);
    END CASE;
END $fn$;

-- A setting for outbox.max_payload_size, and the bytes it must give
-- (NULL: the value is invalid and SET must fail).
CREATE FUNCTION fuzz.gen_max_payload(OUT val text, OUT bytes integer)
LANGUAGE plpgsql AS $fn$
BEGIN
    CASE fuzz.r(4)
    WHEN 0, 1 THEN
        bytes := 1 + fuzz.r(400);
        val := bytes::text;
    WHEN 2 THEN
        SELECT v, b INTO val, bytes
          FROM (VALUES ('1kB', 1024), ('64kB', 65536), ('1.5kB', 1536), ('1MB', 1048576),
                       ('256MB', 268435456), ('2048B', 2048)) AS t(v, b)
         ORDER BY random() LIMIT 1;
    ELSE
        val := fuzz.pick('0', '-1', '257MB', 'abc', '', '1TB', '1e12', '1 parsec');
        bytes := NULL;
    END CASE;
END $fn$;

-- A malformed call: wrong argument types or counts, bad notation.
CREATE FUNCTION fuzz.gen_call(OUT stmt text, OUT phase text, OUT expect text[])
LANGUAGE sql AS $$
    SELECT stmt, phase, expect::text[] FROM (VALUES
        ($q$SELECT outbox.enqueue()$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}', 't', '{}', 'm', 'extra')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue(1, 2, '{}')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', 42)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}'::json)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}'::text)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}', headers => '{}'::json)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}', topic => 5)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}', bogus => 'x')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue(biz_type => 'a', biz_key => 'b')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', biz_type => 'b', payload => '{}')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', payload => '{}', 't')$q$, 'parse', '{42601}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}', topic => 't', topic => 'u')$q$, 'parse', '{42601}'),
        ($q$SELECT outbox.enqueue(VARIADIC ARRAY['a', 'b'])$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue(ARRAY['a'], 'b', '{}')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue(ROW(1, 2), 'b', '{}')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}', NULL::int)$q$, 'parse', '{42883}'),
        ($q$SELECT 1 WHERE outbox.enqueue('a', 'b', '{}')$q$, 'parse', '{42804}'),
        ($q$SELECT CASE WHEN true THEN outbox.claim('c', 1) ELSE 1 END$q$, 'parse', '{42804}'),
        ($q$SELECT outbox.enqueue('a',, 'b')$q$, 'parse', '{42601}'),
        ($q$SELECT outbox.enqueue('a', 'b', '{}'$q$, 'parse', '{42601}'),
        ($q$SELECT outbox.enqueue$q$, 'parse', '{42P01}'),
        ($q$SELECT enqueue('a', 'b', '{}')$q$, 'parse', '{42883}'),
        ($q$SELECT public.claim('c', 1)$q$, 'parse', '{42883}'),
        ($q$CALL outbox.enqueue('a', 'b', '{}')$q$, 'parse', '{42809}'),
        ($q$SELECT outbox.claim()$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', 1.5)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', 9223372036854775808)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', true)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', 1, 2, 3)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', 1, 't', 'k', 'x', 'y')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', 1, 't', 'k', 'x')$q$, 'call', '{ok}'),
        ($q$SELECT outbox.claim('c', 1, 't', 'k', '')$q$, 'call', '{22023}'),
        ($q$SELECT outbox.claim('c', 1, 't', 'k', repeat('s', 65))$q$, 'call', '{22001}'),
        ($q$SELECT outbox.claim(1, 1)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim(consumer => 'c')$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', event_id => '1', event_id => '2')$q$, 'parse', '{42601}'),
        ($q$SELECT outbox.claim('c', '{}'::jsonb)$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', ARRAY[1])$q$, 'parse', '{42883}'),
        ($q$SELECT outbox.claim('c', $1)$q$, 'parse', '{42P02}'),
        ($q$SELECT * FROM outbox.claim('c', 1) AS t(a int, b int)$q$, 'parse', '{42601}'),
        ($q$SELECT outbox.claim('c', 7::int2)$q$, 'parse', '{ok}'),
        ($q$SELECT outbox.claim('c', '9223372036854775808')$q$, 'input', '{22003}'),
        ($q$SELECT outbox.claim('c', 'x')$q$, 'input', '{22P02}'),
        ($q$SELECT outbox.enqueue('a', 'b', 'not json')$q$, 'input', '{22P02}'),
        ($q$SELECT outbox.enqueue(NULL, NULL, NULL, NULL, NULL, NULL)$q$, 'call', '{22004}'),
        ($q$SELECT outbox.claim(NULL, NULL, NULL, NULL)$q$, 'call', '{22004}'),
        ($q$SELECT outbox.claim('', 1)$q$, 'call', '{22023}'),
        ($q$SELECT outbox.claim('c', 1, 't', NULL)$q$, 'call', '{22004}')
    ) AS t(stmt, phase, expect)
    ORDER BY random() LIMIT 1
$$;

-- Case case_no of the run with this seed.
CREATE FUNCTION fuzz.gen_case(seed bigint, case_no integer) RETURNS fuzz.case_t
LANGUAGE plpgsql AS $fn$
DECLARE
    c fuzz.case_t;
    lim integer := 1000000;    -- outbox.max_payload_size's default
    k integer;
BEGIN
    PERFORM setseed(hashint8(seed * 1000003 + case_no) / 2147483648.0);
    c.case_no := case_no;
    k := fuzz.r(100);
    c.kind := CASE WHEN k < 55 THEN 'enqueue' WHEN k < 88 THEN 'claim' ELSE 'call' END;
    IF current_setting('fuzz.inject', true) = 'internal' AND case_no % 100 = 50 THEN
        c.kind := 'call';
    END IF;
    c.mode := fuzz.pick('typed', 'literal', 'params', 'textparams');
    c.notation := fuzz.pick('positional', 'named', 'mixed');
    k := fuzz.r(50);
    c.role := CASE WHEN k = 0 THEN 'fuzz_none' WHEN k < 8 THEN 'fuzz_app' END;
    -- A role that planted operators and functions first in its path.
    c.hostile := c.role = 'fuzz_app' AND c.kind <> 'call' AND fuzz.r(2) = 0;

    IF c.kind = 'enqueue' THEN
        IF fuzz.r(4) = 0 THEN
            SELECT val, bytes INTO c.max_payload, c.payload_cap FROM fuzz.gen_max_payload();
            lim := coalesce(c.payload_cap, lim);
        END IF;
        IF fuzz.r(12) = 0 THEN
            c.default_topic := fuzz.pick('outbox.event.{biz_type}', '{biz_type}', 'all-events',
                                         'x.{biz_type}.{biz_type}', repeat('{biz_type}', 30),
                                         'bad topic', '', '{biz_type}/x', 'a{biz_typ}', '{BIZ_TYPE}',
                                         't.{biz_type}' || repeat('x', 230), repeat('t', 250),
                                         '{biz_type}{biz_type}', '.{biz_type}', '__{biz_type}',
                                         '_{biz_type}', '__consumer_offsets');
        END IF;
        IF fuzz.r(8) = 0 THEN
            c.allowed_topics := fuzz.pick('', '*', 'orders', 'orders,payments', 'outbox.event.*',
                                          ' outbox.event.P* , orders ', 'o*', 'P*', 'a,,b',
                                          'bad topic', 'or*ders', ',', 'orders.*', '__*');
        END IF;
        IF fuzz.r(5) < 2 THEN
            c.args := fuzz.plain_enqueue();
        ELSE
            c.args := ARRAY[fuzz.src_text('T', 1024), fuzz.src_text('k', 1024), fuzz.src_payload(lim),
                            fuzz.src_topic(), fuzz.src_headers(lim),
                            CASE WHEN fuzz.r(2) = 0 THEN NULL ELSE fuzz.src_text('m', 1024) END];
        END IF;
        IF c.default_topic = '{biz_type}' AND fuzz.r(2) = 0 THEN
            c.args[1] := quote_literal(fuzz.pick('__consumer_offsets', '__T', '_T', 'T__'));
        END IF;
    ELSIF c.kind = 'claim' THEN
        IF fuzz.r(8) = 0 THEN
            c.allowed_consumers := fuzz.pick('', '*', 'c', 'c*', 'c0, c1', 'inventory', ' c* ',
                                             'a*b', ',,', 'ключ*', 'c1*,c2');
        END IF;
        IF fuzz.r(12) = 0 THEN
            -- All three keys incompressible and at their limits: the
            -- claim's unique index on them must still take the row.
            c.args := ARRAY[fuzz.src_incompressible(fuzz.pick('256', '1024')::integer), fuzz.src_event_id(),
                            fuzz.src_incompressible(1024), fuzz.src_incompressible(1024)];
        ELSE
            c.args := ARRAY[fuzz.src_text('c', fuzz.pick('256', '1024')::integer), fuzz.src_event_id()];
            CASE fuzz.r(10)
            WHEN 0, 1, 2, 3, 4 THEN NULL;
            WHEN 5 THEN c.args := c.args || ARRAY['NULL', 'NULL'];
            WHEN 6 THEN c.args := c.args || fuzz.pick('{NULL,''k''}', '{''T0'',NULL}', '{''T0''}')::text[];
            WHEN 7, 8 THEN c.args := c.args || ARRAY[quote_literal('T' || fuzz.r(3)), quote_literal('k' || fuzz.r(8))];
            ELSE c.args := c.args || ARRAY[fuzz.src_text('T', 1024), fuzz.src_text('k', 1024)];
            END CASE;
        END IF;
    ELSIF current_setting('fuzz.inject', true) = 'internal' AND case_no % 100 = 50 THEN
        -- Self-test: a call that fails the way an extension bug would.
        c.role := NULL;
        c.stmt := 'SELECT fuzz.injected_bug()';
        c.phase := 'call';
        c.expect := '{ok}';
    ELSE
        SELECT stmt, phase, expect INTO c.stmt, c.phase, c.expect FROM fuzz.gen_call();
    END IF;
    RETURN c;
END $fn$;

-- Valid arguments from small pools, so that keys recur: the same content
-- again (the first id) or other content (23505).  Payloads include pairs
-- that differ as text but are equal as jsonb.
CREATE FUNCTION fuzz.plain_enqueue() RETURNS text[]
LANGUAGE sql AS $$
    SELECT ARRAY[quote_literal('P' || fuzz.r(3)), quote_literal('k' || fuzz.r(8)),
                 quote_literal(fuzz.pick('{"a": 1}', '{"a":1}', '{"a": 1.0}', '[1, 2]', '"x"', 'null',
                                         '{"b": [true, null]}', '{"b":[true,null]}')),
                 fuzz.pick(NULL, NULL, NULL, quote_literal('orders')),
                 fuzz.pick(NULL, NULL, 'NULL', quote_literal('{}'), quote_literal('{"h": "v"}')),
                 fuzz.pick(NULL, NULL, NULL, quote_literal('m0'))]
$$;

-- An incompressible key of lim bytes, one under or one over.
CREATE FUNCTION fuzz.src_incompressible(lim integer) RETURNS text
LANGUAGE sql AS $$
    SELECT format('left((SELECT string_agg(md5(%L || i), %L) FROM generate_series(1, %s) i), %s)',
                  fuzz.rand_str('abcdefghijklmnopqrstuvwxyz', 8), '', lim / 32 + 1, lim + fuzz.r(3) - 1)
$$;

-- What an extension bug looks like, for FUZZ_INJECT=internal.
CREATE FUNCTION fuzz.injected_bug() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'injected internal error' USING ERRCODE = 'XX000';
END $$;

-- The trap of the hostile cases: a schema of fuzz_app's with operators
-- and functions of every name and argument type enqueue's and claim's
-- statements could resolve through the caller's search_path.  Each records
-- who ran it and tries to make fuzz_app a superuser; run by anyone but
-- fuzz_app itself, it is an escalation (test/fuzz/run checks).
CREATE SCHEMA fuzz_trap AUTHORIZATION fuzz_app;
SET ROLE fuzz_app;
CREATE TABLE fuzz_trap.ran (fn text, as_user name, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION fuzz_trap.hostile(fn text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO fuzz_trap.ran (fn, as_user) VALUES (fn, current_user);
    BEGIN
        EXECUTE 'ALTER ROLE fuzz_app SUPERUSER';
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END;
END $f$;
CREATE FUNCTION fuzz_trap.eq_text(text, text) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('=(text,text)'); RETURN true; END $f$;
CREATE FUNCTION fuzz_trap.eq_jsonb(jsonb, jsonb) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('=(jsonb,jsonb)'); RETURN true; END $f$;
CREATE FUNCTION fuzz_trap.eq_int8(bigint, bigint) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('=(bigint,bigint)'); RETURN true; END $f$;
CREATE FUNCTION fuzz_trap.eq_text_varchar(text, varchar) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('=(text,varchar)'); RETURN true; END $f$;
CREATE FUNCTION fuzz_trap.eq_any(anyelement, anyelement) RETURNS boolean LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('=(anyelement,anyelement)'); RETURN true; END $f$;
CREATE OPERATOR fuzz_trap.= (LEFTARG = text, RIGHTARG = text, FUNCTION = fuzz_trap.eq_text);
CREATE OPERATOR fuzz_trap.= (LEFTARG = jsonb, RIGHTARG = jsonb, FUNCTION = fuzz_trap.eq_jsonb);
CREATE OPERATOR fuzz_trap.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = fuzz_trap.eq_int8);
CREATE OPERATOR fuzz_trap.= (LEFTARG = text, RIGHTARG = varchar, FUNCTION = fuzz_trap.eq_text_varchar);
CREATE OPERATOR fuzz_trap.= (LEFTARG = anyelement, RIGHTARG = anyelement, FUNCTION = fuzz_trap.eq_any);
CREATE FUNCTION fuzz_trap.nextval(regclass) RETURNS bigint LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('nextval(regclass)'); RETURN 1; END $f$;
CREATE FUNCTION fuzz_trap.nextval(text) RETURNS bigint LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('nextval(text)'); RETURN 1; END $f$;
CREATE FUNCTION fuzz_trap.now() RETURNS timestamptz LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('now()'); RETURN '2000-01-01'; END $f$;
CREATE FUNCTION fuzz_trap.pg_current_xact_id() RETURNS xid8 LANGUAGE plpgsql
    AS $f$ BEGIN PERFORM fuzz_trap.hostile('pg_current_xact_id()'); RETURN '1'; END $f$;
RESET ROLE;
