-- test/fuzz/race.sql: several sessions hammering the same keys at once.
--
-- test/fuzz/run starts one psql per worker, all calling the same keys in
-- the same order, each call in its own transaction; some transactions
-- hold their row a moment before committing (so that the others wait on
-- it), some roll back, and some workers run under REPEATABLE READ.  Every
-- call's outcome is committed to fuzz.race, and fuzz.race_problems()
-- then compares them with what is left in the outbox tables.

CREATE TABLE fuzz.race (
    kind      text    NOT NULL,    -- enqueue or claim
    worker    integer NOT NULL,
    round     integer NOT NULL,
    iso       text    NOT NULL,    -- the transaction's isolation level
    diff      boolean NOT NULL,    -- enqueue: each worker its own payload; claim: by biz key
    payload   jsonb,
    consumer  text,
    event_id  bigint,
    outcome   text    NOT NULL,    -- ok or the SQLSTATE
    id        bigint,              -- enqueue: the id returned
    first     boolean,             -- claim: what it returned
    committed boolean NOT NULL,
    waited    boolean NOT NULL     -- the call took long enough to have waited for another
);

CREATE TABLE fuzz.race_gate (kind text, worker integer);

-- Wait until all workers of kind have arrived, so that they start together.
CREATE PROCEDURE fuzz.race_start(kind text, worker integer, workers integer)
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO fuzz.race_gate VALUES (kind, worker);
    COMMIT;
    WHILE (SELECT count(*) FROM fuzz.race_gate g WHERE g.kind = race_start.kind) < workers LOOP
        PERFORM pg_sleep(0.01);
        COMMIT;
    END LOOP;
END $fn$;

-- Wait until every worker has recorded round r - 1, so that all start
-- round r together and meet on its key.
CREATE PROCEDURE fuzz.race_barrier(kind text, r integer, workers integer)
LANGUAGE plpgsql AS $fn$
BEGIN
    WHILE (SELECT count(*) FROM fuzz.race x
            WHERE x.kind = race_barrier.kind AND x.round = r - 1) < workers AND r > 1 LOOP
        PERFORM pg_sleep(0.0005);
        COMMIT;
    END LOOP;
END $fn$;

-- Round r: every worker enqueues ('race', 'k<r>'); in one round of three
-- with a payload of its own, else with the same payload as the others.
CREATE PROCEDURE fuzz.race_enqueue(worker integer, workers integer, rounds integer, seed bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    p jsonb;
    got bigint;
    outcome text;
    hold boolean;
    rollback_it boolean;
    t0 timestamptz;
    took interval;
BEGIN
    PERFORM setseed(hashint8(seed * 7919 + worker) / 2147483648.0);
    CALL fuzz.race_start('enqueue', worker, workers);
    FOR r IN 1..rounds LOOP
        CALL fuzz.race_barrier('enqueue', r, workers);
        p := CASE WHEN r % 3 = 0 THEN jsonb_build_object('round', r, 'worker', worker)
                  ELSE jsonb_build_object('round', r) END;
        hold := random() < 0.3;
        rollback_it := random() < 0.15;
        t0 := clock_timestamp();
        BEGIN
            got := outbox.enqueue('race', 'k' || r, p);
            outcome := 'ok';
        EXCEPTION WHEN OTHERS THEN
            outcome := SQLSTATE;
            got := NULL;
        END;
        took := clock_timestamp() - t0;
        IF hold THEN
            PERFORM pg_sleep(0.003);
        END IF;
        IF rollback_it THEN
            ROLLBACK;
        ELSE
            COMMIT;
        END IF;
        INSERT INTO fuzz.race VALUES ('enqueue', worker, r, current_setting('transaction_isolation'),
                                      r % 3 = 0, p, NULL, NULL, outcome, got, NULL,
                                      NOT rollback_it, took > interval '2 ms');
        COMMIT;
    END LOOP;
END $fn$;

-- Round r: every worker claims (consumer, event) for the same event id,
-- or in every other round for the same (biz_type, biz_key) under an event
-- id of its own.
CREATE PROCEDURE fuzz.race_claim(worker integer, workers integer, rounds integer, seed bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    by_key boolean;
    eid bigint;
    got boolean;
    outcome text;
    hold boolean;
    rollback_it boolean;
    t0 timestamptz;
    took interval;
BEGIN
    PERFORM setseed(hashint8(seed * 104729 + worker) / 2147483648.0);
    CALL fuzz.race_start('claim', worker, workers);
    FOR r IN 1..rounds LOOP
        CALL fuzz.race_barrier('claim', r, workers);
        by_key := r % 2 = 1;
        eid := CASE WHEN by_key THEN 2000000 + r * 10 + worker ELSE 1000000 + r END;
        hold := random() < 0.3;
        rollback_it := random() < 0.15;
        t0 := clock_timestamp();
        BEGIN
            got := outbox.claim('rc' || r % 3, eid,
                                CASE WHEN by_key THEN 'race' END, CASE WHEN by_key THEN 'b' || r END);
            outcome := 'ok';
        EXCEPTION WHEN OTHERS THEN
            outcome := SQLSTATE;
            got := NULL;
        END;
        took := clock_timestamp() - t0;
        IF hold THEN
            PERFORM pg_sleep(0.003);
        END IF;
        IF rollback_it THEN
            ROLLBACK;
        ELSE
            COMMIT;
        END IF;
        INSERT INTO fuzz.race VALUES ('claim', worker, r, current_setting('transaction_isolation'),
                                      by_key, NULL, 'rc' || r % 3, eid, outcome, NULL, got,
                                      NOT rollback_it, took > interval '2 ms');
        COMMIT;
    END LOOP;
END $fn$;

-- Everything the races left that breaks a rule, one line each.
CREATE FUNCTION fuzz.race_problems() RETURNS SETOF text
LANGUAGE sql AS $$
    -- Outcomes: enqueue may meet 23505 only with other content; under
    -- REPEATABLE READ either may meet 40001 (README); nothing else.
    SELECT format('%s round %s worker %s (%s): unexpected outcome %s', kind, round, worker, iso, outcome)
      FROM fuzz.race
     WHERE outcome <> 'ok'
       AND NOT (kind = 'enqueue' AND diff AND outcome = '23505')
       AND NOT (iso = 'repeatable read' AND outcome = '40001')
    UNION ALL
    -- Enqueue: one row per key at most, there if and only if a call that
    -- committed succeeded; every such call returned that row's id and
    -- stored its payload; with a payload per worker, only one succeeded.
    SELECT format('enqueue round %s: %s rows, %s committed successes, ids %s, row id %s, payload %s',
                  g.round, g.nrows, g.ok, g.ids, l.id, l.payload)
      FROM (SELECT round, bool_or(diff) AS diff,
                   count(*) FILTER (WHERE committed AND outcome = 'ok') AS ok,
                   array_agg(DISTINCT id) FILTER (WHERE committed AND outcome = 'ok') AS ids,
                   array_agg(payload) FILTER (WHERE committed AND outcome = 'ok') AS payloads,
                   (SELECT count(*) FROM outbox.event_log l
                     WHERE l.biz_type = 'race' AND l.biz_key = 'k' || round) AS nrows
              FROM fuzz.race WHERE kind = 'enqueue' GROUP BY round) g
      LEFT JOIN outbox.event_log l ON l.biz_type = 'race' AND l.biz_key = 'k' || g.round
     WHERE g.nrows > 1
        OR (g.nrows = 0 AND g.ok > 0)
        OR (g.ok > 0 AND g.ids <> ARRAY[l.id])
        OR (g.ok > 0 AND l.payload <> ALL (g.payloads))
        OR (g.nrows = 1 AND g.ok = 0)
        OR (g.diff AND g.ok > 1)
    UNION ALL
    -- Claim: per contested claim, the committed trues are the rows there
    -- are, at most one; a committed false means a committed true exists.
    SELECT format('claim round %s: %s rows, %s committed true, %s committed false',
                  g.round, g.nrows, g.trues, g.falses)
      FROM (SELECT r.round, bool_or(r.diff) AS by_key,
                   count(*) FILTER (WHERE r.committed AND r.first) AS trues,
                   count(*) FILTER (WHERE r.committed AND NOT r.first) AS falses,
                   (SELECT count(*) FROM outbox.consumer_dedup d
                     WHERE d.consumer = 'rc' || r.round % 3
                       AND CASE WHEN r.round % 2 = 1 THEN d.biz_type = 'race' AND d.biz_key = 'b' || r.round
                                ELSE d.event_id = 1000000 + r.round END) AS nrows
              FROM fuzz.race r WHERE r.kind = 'claim' GROUP BY r.round) g
     WHERE g.nrows > 1 OR g.trues <> g.nrows OR (g.falses > 0 AND g.nrows = 0)
$$;
