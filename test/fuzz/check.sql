-- test/fuzz/check.sql: running a fuzz case and judging its outcome.
--
-- For each case the arguments are first evaluated on their own.  If some
-- fail to evaluate (invalid JSON or UTF-8, stack depth...), the call must
-- fail with one of their SQLSTATEs.  Otherwise a model of the README's rules,
-- written without looking at the C code's structure, says what must
-- happen: accepted (and with which id, for a repeated key), or rejected
-- with one of a set of SQLSTATEs.  Then the call runs, with the arguments
-- passed one of four ways (typed expressions, unknown-typed literals,
-- bound parameters, text parameters cast in the statement), and the rows
-- it left behind are checked.

CREATE TABLE fuzz.result (
    case_no   integer PRIMARY KEY,
    kind      text NOT NULL,
    mode      text,
    phase     text NOT NULL,   -- setting, input, parse or call: where it was answered
    sqlstate  text,            -- NULL: accepted
    returned  text,            -- what an accepted call returned
    expected  text[] NOT NULL, -- what the model allowed; 'ok': accepted
    problem   text,            -- NULL: as predicted, and the rows are right
    statement text,            -- the call, for a case with a problem
    ms        numeric          -- how long the case took
);

-- The README's limits.
CREATE FUNCTION fuzz.key_codes(v text, lim integer) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL THEN '{22004}'
                WHEN v = '' THEN '{22023}'
                WHEN octet_length(v) > lim THEN '{22001}'
                ELSE '{}' END::text[]
$$;

-- A legal Kafka topic: 1-249 of [A-Za-z0-9._-], not "." or "..", and
-- not one of Kafka's internal ones (starting with "__").
CREATE FUNCTION fuzz.topic_ok(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT t <> '' AND octet_length(t) <= 249 AND t NOT IN ('.', '..') AND left(t, 2) <> '__'
       AND translate(t, 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-', '') = ''
$$;

-- Headers are a flat object of at most 61 strings with non-empty names
-- other than event_id, biz_type and biz_key in any ASCII case.
CREATE FUNCTION fuzz.headers_ok(h jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(h) = 'object'
       AND (SELECT count(*) FROM jsonb_object_keys(h)) <= 61
       AND NOT EXISTS (SELECT 1 FROM jsonb_each(h) e
                        WHERE jsonb_typeof(e.value) <> 'string' OR e.key = ''
                           OR translate(e.key, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
                              IN ('event_id', 'biz_type', 'biz_key'))
$$;

-- The length of j as compact JSON text: jsonb's own output without the
-- blanks it puts after ":" and ",", which are the only ones outside strings.
CREATE FUNCTION fuzz.compact_len(j jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(regexp_replace(j::text, '("(?:[^"\\]|\\.)*")|[ ]', '\1', 'g'))
$$;

-- The bytes of a length written as a Kafka record's varint (zig-zag:
-- seven bits a byte, of twice the length).
CREATE FUNCTION fuzz.varint_len(n bigint) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN n < 64 THEN 1 WHEN n < 8192 THEN 2 WHEN n < 1048576 THEN 3
                WHEN n < 134217728 THEN 4 ELSE 5 END
$$;

-- The bytes of one header as librdkafka counts them: name and value, and
-- their lengths as varints.
CREATE FUNCTION fuzz.header_len(name_len bigint, value_len bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT name_len + value_len + fuzz.varint_len(name_len) + fuzz.varint_len(value_len)
$$;

-- The bytes of headers' names and values, as librdkafka counts them.
CREATE FUNCTION fuzz.header_bytes(h jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN h IS NULL OR jsonb_typeof(h) <> 'object' THEN 0
                ELSE (SELECT coalesce(sum(fuzz.header_len(octet_length(e.key), octet_length(e.value #>> '{}'))), 0)
                        FROM jsonb_each(h) e) END
$$;

-- What the relay adds to every message, as librdkafka counts it: 36
-- bytes of record framing at most, and the headers event_id (a bigint:
-- at most 19 digits), biz_type, biz_key and outbox_source (a uuid, "/" and 16 hex digits).
CREATE FUNCTION fuzz.relay_bytes(bt text, bk text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT 36 + fuzz.header_len(8, 19) + fuzz.header_len(8, octet_length(bt))
              + fuzz.header_len(7, octet_length(bk)) + fuzz.header_len(13, 53)
$$;

-- An entry list of outbox.allowed_topics / allowed_consumers: blank (no
-- restriction) or comma-separated non-empty names, "*" only at an end;
-- topic names of topic characters, at most 249, consumers at most 256.
CREATE FUNCTION fuzz.list_ok(list text, topics boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT btrim(list, E' \t\r\n') = ''
        OR NOT EXISTS (
            SELECT 1 FROM unnest(string_to_array(list, ',')) e(x),
                   LATERAL (SELECT btrim(e.x, E' \t\r\n') AS t) b,
                   LATERAL (SELECT CASE WHEN right(b.t, 1) = '*' THEN left(b.t, -1) ELSE b.t END AS n) c
             WHERE b.t = '' OR position('*' IN c.n) > 0
                OR octet_length(c.n) > CASE WHEN topics THEN 249 ELSE 256 END
                OR (topics AND translate(c.n, 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-', '') <> ''))
$$;

-- Whether name is in such a list (a trailing "*": a prefix); blank: yes.
CREATE FUNCTION fuzz.name_allowed(list text, name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT btrim(coalesce(list, ''), E' \t\r\n') = ''
        OR EXISTS (SELECT 1 FROM unnest(string_to_array(list, ',')) e(x),
                          LATERAL (SELECT btrim(e.x, E' \t\r\n') AS t) b
                    WHERE CASE WHEN right(b.t, 1) = '*' THEN starts_with(name, left(b.t, -1))
                               ELSE name = b.t END)
$$;

CREATE FUNCTION fuzz.payload_cap() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT setting::integer FROM pg_settings WHERE name = 'outbox.max_payload_size'
$$;

-- What enqueue must answer: SQLSTATEs it may raise, or {ok}; same_id is
-- the id a repeated call with the same content must return.
CREATE FUNCTION fuzz.model_enqueue(bt text, bk text, p jsonb, tp text, h jsonb, mk text,
                                   OUT codes text[], OUT same_id bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    t text;
    same boolean;
BEGIN
    codes := fuzz.key_codes(bt, 1024) || fuzz.key_codes(bk, 1024);
    -- The size of the message: payload as compact JSON, key, headers,
    -- the relay's included.
    IF p IS NULL THEN
        codes := codes || '22004'::text;
    ELSIF fuzz.compact_len(p) + octet_length(coalesce(mk, bk)) + fuzz.header_bytes(h)
          + fuzz.relay_bytes(bt, bk) > fuzz.payload_cap() THEN
        codes := codes || '22001'::text;
    END IF;
    t := coalesce(tp, replace(current_setting('outbox.default_topic'), '{biz_type}', bt));
    IF t IS NOT NULL AND NOT fuzz.topic_ok(t) THEN
        codes := codes || '22023'::text;
    ELSIF t IS NOT NULL AND NOT fuzz.name_allowed(current_setting('outbox.allowed_topics', true), t) THEN
        codes := codes || '42501'::text;
    END IF;
    IF h IS NOT NULL AND NOT fuzz.headers_ok(h) THEN
        codes := codes || '22023'::text;
    END IF;
    IF mk IS NOT NULL THEN
        codes := codes || fuzz.key_codes(mk, 1024);
    END IF;
    IF cardinality(codes) > 0 THEN
        RETURN;
    END IF;
    -- No headers, '{}' or NULL, are stored as NULL.
    SELECT l.id, l.topic = t AND l.msg_key = coalesce(mk, bk) AND l.payload = p
                 AND l.headers IS NOT DISTINCT FROM nullif(h, '{}')
      INTO same_id, same
      FROM outbox.event_log l WHERE l.biz_type = bt AND l.biz_key = bk;
    IF NOT FOUND THEN
        codes := '{ok}';
    ELSIF same THEN
        codes := '{ok}';
    ELSE
        codes := '{23505}';
        same_id := NULL;
    END IF;
END $fn$;

-- What claim must answer: SQLSTATEs, or {ok} with the boolean it returns.
CREATE FUNCTION fuzz.model_claim(cons text, eid bigint, bt text, bk text,
                                 OUT codes text[], OUT first boolean)
LANGUAGE plpgsql AS $fn$
BEGIN
    codes := fuzz.key_codes(cons, 256);
    IF cardinality(codes) = 0
       AND NOT fuzz.name_allowed(current_setting('outbox.allowed_consumers', true), cons) THEN
        codes := codes || '42501'::text;
    END IF;
    IF eid IS NULL THEN
        codes := codes || '22004'::text;
    END IF;
    IF (bt IS NULL) <> (bk IS NULL) THEN
        codes := codes || '22004'::text;
    ELSIF bt IS NOT NULL THEN
        codes := codes || fuzz.key_codes(bt, 1024) || fuzz.key_codes(bk, 1024);
    END IF;
    IF cardinality(codes) > 0 THEN
        RETURN;
    END IF;
    codes := '{ok}';
    first := NOT EXISTS (SELECT 1 FROM outbox.consumer_dedup d
                          WHERE d.consumer = cons AND d.event_id = eid)
             AND (bt IS NULL
                  OR NOT EXISTS (SELECT 1 FROM outbox.consumer_dedup d
                                  WHERE d.consumer = cons AND d.biz_type = bt AND d.biz_key = bk));
END $fn$;

-- The argument list of a call: each argument as expr[i], in the case's
-- notation; an argument left out (args[i] NULL) is not passed, or passed
-- as NULL where later ones are positional.
CREATE FUNCTION fuzz.arg_list(c fuzz.case_t, names text[], expr text[]) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    last integer := 0;
    npos integer;
    pos text[] := '{}';
    named text[] := '{}';
BEGIN
    FOR i IN 1..cardinality(names) LOOP
        IF c.args[i] IS NOT NULL THEN
            last := i;
        END IF;
    END LOOP;
    npos := CASE c.notation WHEN 'positional' THEN last WHEN 'named' THEN 0
                            ELSE least(last, 1 + fuzz.r(3)) END;
    FOR i IN 1..npos LOOP
        pos := pos || coalesce(CASE WHEN c.args[i] IS NOT NULL THEN expr[i] END, 'NULL');
    END LOOP;
    SELECT coalesce(array_agg(format('%s => %s', names[i], expr[i]) ORDER BY random()), '{}')
      INTO named
      FROM generate_series(npos + 1, last) i WHERE c.args[i] IS NOT NULL;
    RETURN array_to_string(pos || named, ', ');
END $fn$;

-- The expression passing argument i in the case's mode; v is its value
-- as text when it evaluated, bad whether it failed to.
CREATE FUNCTION fuzz.arg_expr(c fuzz.case_t, i integer, typ text, v text, bad boolean) RETURNS text
LANGUAGE sql AS $$
    SELECT CASE
        WHEN c.mode = 'typed' OR (c.mode = 'literal' AND bad) THEN format('(%s)::%s', c.args[i], typ)
        WHEN c.mode = 'literal' AND typ = 'bigint' AND v ~ '^-?[0-9]{1,18}$' AND fuzz.r(2) = 0 THEN v
        WHEN c.mode = 'literal' THEN quote_nullable(v)
        WHEN c.mode = 'params' THEN '$' || i
        ELSE format('$%s::%s', i, typ)
    END
$$;

-- Evaluate the case's argument sources as text; codes collects the
-- SQLSTATEs of those that fail, also when cast to the argument's type.
CREATE FUNCTION fuzz.eval_args(c fuzz.case_t, types text[], OUT v text[], OUT bad boolean[],
                               OUT codes text[])
LANGUAGE plpgsql AS $fn$
DECLARE
    x text;
BEGIN
    v := array_fill(NULL::text, ARRAY[cardinality(types)]);
    bad := array_fill(false, ARRAY[cardinality(types)]);
    codes := '{}';
    FOR i IN 1..cardinality(types) LOOP
        CONTINUE WHEN c.args[i] IS NULL;
        BEGIN
            EXECUTE format('SELECT (%s)::text', c.args[i]) INTO x;
            v[i] := x;
            IF types[i] <> 'text' THEN
                EXECUTE format('SELECT $1::%s', types[i]) USING x;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            codes := codes || SQLSTATE;
            bad[i] := true;
        END;
    END LOOP;
END $fn$;

-- Apply the case's settings; the SQLSTATE if SET failed, and a problem if
-- that, or the value it gave, is not what the case expected.
CREATE FUNCTION fuzz.apply_settings(c fuzz.case_t, OUT code text, OUT expected text[], OUT problem text)
LANGUAGE plpgsql AS $fn$
BEGIN
    IF c.max_payload IS NOT NULL THEN
        -- A superuser setting: refused to the case's roles.
        expected := CASE WHEN c.role IS NOT NULL AND c.payload_cap IS NULL THEN '{42501,22023}'
                         WHEN c.role IS NOT NULL THEN '{42501}'
                         WHEN c.payload_cap IS NULL THEN '{22023}' ELSE '{ok}' END;
        BEGIN
            IF c.role IS NOT NULL THEN
                EXECUTE format('SET LOCAL ROLE %I', c.role);
            END IF;
            PERFORM set_config('outbox.max_payload_size', c.max_payload, true);
            RESET ROLE;
        EXCEPTION WHEN OTHERS THEN
            code := SQLSTATE;
        END;
        IF coalesce(code, 'ok') <> ALL (expected) THEN
            problem := format('SET outbox.max_payload_size = %L: got %s, expected %s',
                              c.max_payload, coalesce(code, 'ok'), expected);
        ELSIF code IS NULL AND fuzz.payload_cap() <> c.payload_cap THEN
            problem := format('SET outbox.max_payload_size = %L gave %s bytes, expected %s',
                              c.max_payload, fuzz.payload_cap(), c.payload_cap);
        END IF;
        IF code IS NOT NULL OR problem IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    -- Also for superusers only: the case's role is refused.
    SELECT * INTO code, expected, problem
      FROM fuzz.apply_setting(c, 'outbox.default_topic', c.default_topic,
                              fuzz.topic_ok(replace(c.default_topic, '{biz_type}', 'x')));
    IF code IS NOT NULL OR problem IS NOT NULL THEN
        RETURN;
    END IF;
    SELECT * INTO code, expected, problem
      FROM fuzz.apply_setting(c, 'outbox.allowed_topics', c.allowed_topics,
                              fuzz.list_ok(c.allowed_topics, true));
    IF code IS NOT NULL OR problem IS NOT NULL THEN
        RETURN;
    END IF;
    SELECT * INTO code, expected, problem
      FROM fuzz.apply_setting(c, 'outbox.allowed_consumers', c.allowed_consumers,
                              fuzz.list_ok(c.allowed_consumers, false));
END $fn$;

-- Set a superuser's setting for the case (as its role, if it has one,
-- which must be refused); val NULL: leave it.
CREATE FUNCTION fuzz.apply_setting(c fuzz.case_t, name text, val text, valid boolean,
                                   OUT code text, OUT expected text[], OUT problem text)
LANGUAGE plpgsql AS $fn$
BEGIN
    IF val IS NULL THEN
        RETURN;
    END IF;
    expected := CASE WHEN c.role IS NOT NULL THEN '{42501}'
                     WHEN valid THEN '{ok}' ELSE '{22023}' END;
    BEGIN
        IF c.role IS NOT NULL THEN
            EXECUTE format('SET LOCAL ROLE %I', c.role);
        END IF;
        PERFORM set_config(name, val, true);
        RESET ROLE;
    EXCEPTION WHEN OTHERS THEN
        code := SQLSTATE;
    END;
    IF coalesce(code, 'ok') <> ALL (expected) THEN
        problem := format('SET %s = %L: got %s, expected %s', name, val, coalesce(code, 'ok'), expected);
    END IF;
END $fn$;

-- Run statement as the case's role, with the arguments bound as given;
-- returns the SQLSTATE (NULL: it succeeded) and the message; the value
-- it returned goes to res.
CREATE FUNCTION fuzz.try_call(c fuzz.case_t, stmt text, types text[], OUT code text, OUT msg text,
                              OUT res text)
LANGUAGE plpgsql AS $fn$
DECLARE
    u text[];
    j3 jsonb;
    j5 jsonb;
    b2 bigint;
BEGIN
    BEGIN
        IF c.mode IN ('params', 'textparams') THEN
            -- Evaluated here, so that bad input is this call's outcome.
            u := array_fill(NULL::text, ARRAY[6]);
            FOR i IN 1..cardinality(types) LOOP
                IF c.args[i] IS NOT NULL THEN
                    EXECUTE format('SELECT (%s)::text', c.args[i]) INTO res;
                    u[i] := res;
                END IF;
            END LOOP;
            res := NULL;
        END IF;
        IF c.role IS NOT NULL THEN
            EXECUTE format('SET LOCAL ROLE %I', c.role);
        END IF;
        -- The hostile path is set just around the call: under it, even
        -- this function's own "=" would be the trap's.
        IF c.mode = 'params' AND c.kind = 'enqueue' THEN
            j3 := u[3]::jsonb;
            j5 := u[5]::jsonb;
            PERFORM pg_catalog.set_config('search_path', CASE WHEN c.hostile
                THEN 'fuzz_trap, pg_catalog, public' ELSE pg_catalog.current_setting('search_path') END, true);
            EXECUTE stmt INTO res USING u[1], u[2], j3, u[4], j5, u[6];
        ELSIF c.mode = 'params' AND c.kind = 'claim' THEN
            b2 := u[2]::bigint;
            PERFORM pg_catalog.set_config('search_path', CASE WHEN c.hostile
                THEN 'fuzz_trap, pg_catalog, public' ELSE pg_catalog.current_setting('search_path') END, true);
            EXECUTE stmt INTO res USING u[1], b2, u[3], u[4];
        ELSIF c.mode = 'textparams' THEN
            PERFORM pg_catalog.set_config('search_path', CASE WHEN c.hostile
                THEN 'fuzz_trap, pg_catalog, public' ELSE pg_catalog.current_setting('search_path') END, true);
            EXECUTE stmt INTO res USING u[1], u[2], u[3], u[4], u[5], u[6];
        ELSE
            PERFORM pg_catalog.set_config('search_path', CASE WHEN c.hostile
                THEN 'fuzz_trap, pg_catalog, public' ELSE pg_catalog.current_setting('search_path') END, true);
            EXECUTE stmt INTO res;
        END IF;
        RESET search_path;
        IF c.role IS NOT NULL THEN
            RESET ROLE;
        END IF;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        res := NULL;
    END;
END $fn$;

-- A call that the model says is accepted or rejected, and rows that must
-- (not) have changed: the first problem found, or NULL.
CREATE FUNCTION fuzz.judge(code text, msg text, expected text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN coalesce(code, 'ok') <> ALL (expected)
                THEN format('got %s, expected one of %s', coalesce(code || ' (' || left(msg, 200) || ')', 'ok'), expected)
           END
$$;

CREATE FUNCTION fuzz.exec_enqueue(c fuzz.case_t, INOUT r fuzz.result)
LANGUAGE plpgsql AS $fn$
DECLARE
    names constant text[] := '{biz_type,biz_key,payload,topic,headers,msg_key}';
    types constant text[] := '{text,text,jsonb,text,jsonb,text}';
    e record;
    m record;
    call record;
    expr text[] := '{}';
    prev_max bigint := coalesce((SELECT max(id) FROM outbox.event_log), 0);
    before text;
    ev outbox.event_log;
    t text;
BEGIN
    SELECT * INTO e FROM fuzz.eval_args(c, types);
    FOR i IN 1..6 LOOP
        expr := expr || fuzz.arg_expr(c, i, types[i], e.v[i], e.bad[i]);
    END LOOP;
    r.statement := format('SELECT outbox.enqueue(%s)', fuzz.arg_list(c, names, expr));

    IF c.role = 'fuzz_none' THEN
        r.expected := '{42501}'::text[] || e.codes;
    ELSIF cardinality(e.codes) > 0 THEN
        r.expected := e.codes;
    ELSE
        SELECT * INTO m FROM fuzz.model_enqueue(e.v[1], e.v[2], e.v[3]::jsonb, e.v[4], e.v[5]::jsonb, e.v[6]);
        r.expected := m.codes;
    END IF;
    SELECT l::text INTO before FROM outbox.event_log l WHERE biz_type = e.v[1] AND biz_key = e.v[2];

    SELECT * INTO call FROM fuzz.try_call(c, r.statement, types);
    r.sqlstate := call.code;
    r.returned := call.res;
    r.phase := CASE WHEN call.code = ANY (e.codes) THEN 'input' ELSE 'call' END;
    r.problem := fuzz.judge(call.code, call.msg, r.expected);

    IF r.problem IS NULL AND call.code IS NULL THEN
        -- Accepted: the id names a row with exactly these arguments, the
        -- one that was there already if the key existed.
        t := coalesce(e.v[4], replace(current_setting('outbox.default_topic'), '{biz_type}', e.v[1]));
        SELECT * INTO ev FROM outbox.event_log WHERE id = call.res::bigint;
        IF NOT FOUND THEN
            r.problem := format('returned id %s is not in outbox.event_log', call.res);
        ELSIF ev.biz_type IS DISTINCT FROM e.v[1] OR ev.biz_key IS DISTINCT FROM e.v[2] THEN
            r.problem := format('event %s has another biz_type or biz_key', call.res);
        ELSIF m.same_id IS NOT NULL AND ev.id <> m.same_id THEN
            r.problem := format('repeated key returned id %s, not the first id %s', ev.id, m.same_id);
        ELSIF m.same_id IS NOT NULL AND EXISTS (SELECT 1 FROM outbox.event_log WHERE id > prev_max) THEN
            r.problem := 'repeated key inserted a row';
        ELSIF m.same_id IS NULL AND (ev.payload::text IS DISTINCT FROM e.v[3]::jsonb::text
                                     OR ev.topic IS DISTINCT FROM t
                                     OR ev.msg_key IS DISTINCT FROM coalesce(e.v[6], e.v[2])
                                     OR ev.headers::text IS DISTINCT FROM nullif(e.v[5]::jsonb, '{}')::text
                                     OR ev.tx <> pg_current_xact_id()) THEN
            r.problem := format('event %s is not what was enqueued: %s', ev.id, left(ev::text, 300));
        ELSIF m.same_id IS NULL AND (SELECT count(*) FROM outbox.event_log WHERE id > prev_max) <> 1 THEN
            r.problem := 'a new event did not add exactly one row';
        ELSIF (SELECT status FROM outbox.events WHERE id = ev.id) IS DISTINCT FROM 'new' THEN
            r.problem := format('event %s is not new in outbox.events', ev.id);
        END IF;
    ELSIF r.problem IS NULL THEN
        -- Rejected: nothing written, the existing event untouched.
        IF EXISTS (SELECT 1 FROM outbox.event_log WHERE id > prev_max) THEN
            r.problem := 'a rejected call left a row';
        ELSIF before IS DISTINCT FROM (SELECT l::text FROM outbox.event_log l
                                         WHERE biz_type = e.v[1] AND biz_key = e.v[2]) THEN
            r.problem := 'a rejected call changed the existing event';
        END IF;
    END IF;
END $fn$;

CREATE FUNCTION fuzz.exec_claim(c fuzz.case_t, INOUT r fuzz.result)
LANGUAGE plpgsql AS $fn$
DECLARE
    names constant text[] := '{consumer,event_id,biz_type,biz_key}';
    types constant text[] := '{text,bigint,text,text}';
    e record;
    m record;
    call record;
    expr text[] := '{}';
    n_before bigint;
    n_after bigint;
BEGIN
    -- Arguments left out of a short args array count as left out.
    c.args := c.args || array_fill(NULL::text, ARRAY[4 - cardinality(c.args)]);
    SELECT * INTO e FROM fuzz.eval_args(c, types);
    FOR i IN 1..4 LOOP
        expr := expr || fuzz.arg_expr(c, i, types[i], e.v[i], e.bad[i]);
    END LOOP;
    r.statement := format('SELECT outbox.claim(%s)', fuzz.arg_list(c, names, expr));

    IF c.role = 'fuzz_none' THEN
        r.expected := '{42501}'::text[] || e.codes;
    ELSIF cardinality(e.codes) > 0 THEN
        r.expected := e.codes;
    ELSE
        SELECT * INTO m FROM fuzz.model_claim(e.v[1], e.v[2]::bigint, e.v[3], e.v[4]);
        r.expected := m.codes;
    END IF;
    n_before := (SELECT count(*) FROM outbox.consumer_dedup WHERE consumer = e.v[1]);

    SELECT * INTO call FROM fuzz.try_call(c, r.statement, types);
    r.sqlstate := call.code;
    r.returned := call.res;
    r.phase := CASE WHEN call.code = ANY (e.codes) THEN 'input' ELSE 'call' END;
    r.problem := fuzz.judge(call.code, call.msg, r.expected);
    n_after := (SELECT count(*) FROM outbox.consumer_dedup WHERE consumer = e.v[1]);

    IF r.problem IS NULL AND call.code IS NULL THEN
        IF call.res::boolean IS DISTINCT FROM m.first THEN
            r.problem := format('claim returned %s, expected %s', call.res, m.first);
        ELSIF n_after <> n_before + m.first::integer THEN
            r.problem := format('claim returned %s but the claims went from %s to %s',
                                call.res, n_before, n_after);
        ELSIF m.first AND NOT EXISTS (SELECT 1 FROM outbox.consumer_dedup d
                                       WHERE d.consumer = e.v[1] AND d.event_id = e.v[2]::bigint
                                         AND d.biz_type IS NOT DISTINCT FROM e.v[3]
                                         AND d.biz_key IS NOT DISTINCT FROM e.v[4]) THEN
            r.problem := 'a first claim left no matching row';
        END IF;
    ELSIF r.problem IS NULL AND n_after <> n_before THEN
        r.problem := 'a rejected claim left a row';
    END IF;
END $fn$;

CREATE FUNCTION fuzz.exec_call(c fuzz.case_t, INOUT r fuzz.result)
LANGUAGE plpgsql AS $fn$
DECLARE
    call record;
BEGIN
    c.mode := 'typed';
    r.mode := NULL;
    r.statement := c.stmt;
    r.expected := CASE WHEN c.role = 'fuzz_none' THEN c.expect || '{42501}'::text[] ELSE c.expect END;
    SELECT * INTO call FROM fuzz.try_call(c, c.stmt, '{}');
    r.sqlstate := call.code;
    r.returned := call.res;
    r.phase := CASE WHEN call.code = '42501' THEN 'call' ELSE c.phase END;
    r.problem := fuzz.judge(call.code, call.msg, r.expected);
END $fn$;

-- One case, start to end.
CREATE FUNCTION fuzz.run_case(seed bigint, case_no integer) RETURNS fuzz.result
LANGUAGE plpgsql AS $fn$
DECLARE
    c fuzz.case_t := fuzz.gen_case(seed, case_no);
    r fuzz.result;
    s record;
BEGIN
    r.case_no := case_no;
    r.kind := c.kind;
    r.mode := c.mode;
    SELECT * INTO s FROM fuzz.apply_settings(c);
    IF s.code IS NOT NULL OR s.problem IS NOT NULL THEN
        r.phase := 'setting';
        r.sqlstate := s.code;
        r.expected := s.expected;
        r.problem := s.problem;
        r.statement := format('SET outbox.max_payload_size = %L / outbox.default_topic = %L'
                              ' / outbox.allowed_topics = %L / outbox.allowed_consumers = %L',
                              c.max_payload, c.default_topic, c.allowed_topics, c.allowed_consumers);
        RETURN r;
    END IF;
    CASE c.kind
    WHEN 'enqueue' THEN r := fuzz.exec_enqueue(c, r);
    WHEN 'claim' THEN r := fuzz.exec_claim(c, r);
    ELSE r := fuzz.exec_call(c, r);
    END CASE;
    IF r.problem IS NULL THEN
        r.statement := NULL;
    ELSE
        r.statement := left(r.statement, 2000);
    END IF;
    RETURN r;
END $fn$;

-- Cases first..last, each committed with its result, so that after a
-- crash the table says how far the run got.
CREATE PROCEDURE fuzz.run(seed bigint, first integer, last integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    r fuzz.result;
    t0 timestamptz;
BEGIN
    FOR i IN first..last LOOP
        t0 := clock_timestamp();
        BEGIN
            r := fuzz.run_case(seed, i);
        EXCEPTION WHEN OTHERS THEN
            -- A failure of the harness itself counts against the run too.
            r := ROW(i, 'harness', NULL, 'harness', SQLSTATE, NULL, '{}', 'harness error: ' || SQLERRM,
                     NULL, NULL);
        END;
        r.ms := round(extract(epoch FROM clock_timestamp() - t0) * 1000, 1);
        INSERT INTO fuzz.result VALUES (r.*);
        COMMIT;
    END LOOP;
END $fn$;

-- The statement of case case_no, for a report.
CREATE FUNCTION fuzz.show_case(seed bigint, case_no integer) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    c fuzz.case_t := fuzz.gen_case(seed, case_no);
BEGIN
    RETURN format('%s mode=%s notation=%s role=%s%s max_payload_size=%s default_topic=%s'
                  ' allowed_topics=%s allowed_consumers=%s args=%s%s',
                  c.kind, c.mode, c.notation, coalesce(c.role, '-'),
                  CASE WHEN c.hostile THEN ' (hostile search_path)' ELSE '' END,
                  coalesce(c.max_payload, '-'), coalesce(c.default_topic, '-'),
                  coalesce(c.allowed_topics, '-'), coalesce(c.allowed_consumers, '-'),
                  left(c.args::text, 1500), coalesce(' ' || c.stmt, ''));
END $fn$;
