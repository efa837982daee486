# test/integration/real_broker.sh: the relay against a real Apache Kafka
# broker.  Every case uses a topic of its own and checks what a real
# consumer read, not what the outbox tables claim.

# Events arrive once each with the exact key, headers (the relay's own,
# outbox_source naming this database, then the event's) and compact payload.
t_delivery() {
    local topic=it.delivery out=$IT_TMP/delivery.tsv
    sql "SELECT count(outbox.enqueue('OrderCreated', 'd-' || i,
            jsonb_build_object('order_id', i, 'note', E'caf\u00e9 \"quoted\" \\\\ tab\t', 'items', jsonb_build_array(1, 2.50, true, null)),
            topic => '$topic',
            headers => jsonb_build_object('traceparent', '00-' || i, 'tenant', 'acme'),
            msg_key => 'order-' || (i % 7)))
         FROM generate_series(1, 50) i" >/dev/null
    consume $topic 50 >"$out" || fail "not all 50 events arrived ($(wc -l <"$out"))"
    load_consumed got_delivery "$out"
    expect "messages matching their event exactly" "$(sql "
        SELECT count(*) FROM got_delivery g JOIN outbox.event_log l ON l.id = g.event_id
         WHERE g.key = l.msg_key
           AND g.value::jsonb = l.payload
           AND g.value !~ '\": |, '
           AND g.headers = 'event_id=' || l.id || ',biz_type=' || l.biz_type || ',biz_key=' || l.biz_key
                           || ',outbox_source=' || $(source_of l)
                           || ',tenant=acme,traceparent=' || (l.headers->>'traceparent')")" 50
    expect "distinct events" "$(sql "SELECT count(DISTINCT event_id) FROM got_delivery")" 50
    wait_until 10 "$(all_sent $topic 50)" || fail "events not all marked sent"
}

# dashboard_names metrics|labels: the metric or label names
# contrib/grafana/outbox.json's queries, variables and legends use.
dashboard_names() {
    python3 - "$1" contrib/grafana/outbox.json <<'PY'
import json, re, sys
what, path = sys.argv[1], sys.argv[2]
exprs, legends = [], []
def walk(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("expr", "definition") and isinstance(v, str):
                exprs.append(v)
            elif k == "legendFormat" and isinstance(v, str):
                legends.append(v)
            else:
                walk(v)
    elif isinstance(node, list):
        for v in node:
            walk(v)
walk(json.load(open(path)))
names = set()
for e in exprs:
    if what == "metrics":
        names |= set(re.findall(r"\b(outbox_[a-z_]+)\b", e))
    else:
        for group in re.findall(r"\bby\s*\(([^)]*)\)", e):
            names |= {n.strip() for n in group.split(",") if n.strip()}
        names |= set(re.findall(r"([a-z_]+)\s*=~?\s*\"", e))
        names |= set(re.findall(r"label_values\([a-z_]+,\s*([a-z_]+)\)", e))
if what == "labels":
    for l in legends:
        names |= set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", l))
print(" ".join(sorted(names)))
PY
}

# enqueue_bytes: every byte value, NUL, tab and newline among them, arrives
# as it was given, between JSON events of the same keys in their order.
t_raw_payload() {
    local topic=it.raw out=$IT_TMP/raw.tsv
    sql "SELECT count(CASE WHEN i % 3 = 0
                      THEN outbox.enqueue('Json', 'rj-' || i, jsonb_build_object('i', i), topic => '$topic', msg_key => 'k' || (i % 4))
                      ELSE outbox.enqueue_bytes('Raw', 'rb-' || i,
                               decode(md5(i::text) || 'ff00090a0d5c7f', 'hex') || int4send(i)
                               || CASE WHEN i = 1 THEN (SELECT string_agg(set_byte('\x00'::bytea, 0, b), ''::bytea)
                                                          FROM generate_series(0, 255) b)
                                       ELSE ''::bytea END,
                               topic => '$topic', msg_key => 'k' || (i % 4),
                               headers => '{\"content-type\": \"application/octet-stream\"}')
                 END)
           FROM generate_series(1, 30) i" >/dev/null
    sql "SELECT outbox.enqueue_bytes('Raw', 'rb-empty', '', topic => '$topic', msg_key => 'k0')" >/dev/null
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t $topic -n 31 -T 30000 -x >"$out" 2>/dev/null \
        || fail "not all 31 events arrived ($(wc -l <"$out"))"
    load_consumed got_raw "$out"
    expect "bytes arrived as given" "$(sql "
        SELECT count(*) FROM got_raw g JOIN outbox.event_log l ON l.id = g.event_id
         WHERE l.payload_bytes IS NOT NULL AND g.value = '\\x' || encode(l.payload_bytes, 'hex')
           AND g.key = l.msg_key AND g.headers LIKE '%,content-type=application/octet-stream'")" 20
    expect "the empty value arrived empty" "$(sql "
        SELECT g.value FROM got_raw g JOIN outbox.event_log l ON l.id = g.event_id WHERE l.biz_key = 'rb-empty'")" '\x'
    expect "JSON between them, as compact JSON" "$(sql "
        SELECT count(*) FROM got_raw g JOIN outbox.event_log l ON l.id = g.event_id
         WHERE CASE WHEN l.payload IS NOT NULL
                    THEN convert_from(decode(substr(g.value, 3), 'hex'), 'UTF8')::jsonb = l.payload END")" 10
    expect "order per key" "$(sql "
        SELECT count(*) FROM (SELECT event_id - lag(event_id) OVER (PARTITION BY key ORDER BY off) AS step
                                FROM got_raw) s WHERE step <= 0")" 0
    wait_until 10 "$(all_sent $topic 31)" || fail "events not all marked sent"
}

# Concurrent writers, a fifth of them rolling back: every committed event
# arrives, no rolled-back one does.
t_concurrent_rollbacks() {
    local topic=it.concurrent out=$IT_TMP/concurrent.tsv script=$IT_TMP/orders.pgbench
    sql "CREATE TABLE IF NOT EXISTS shop_orders (id bigserial PRIMARY KEY, ref text)"
    cat >"$script" <<SQL
\set r random(1, 100)
\set n random(1, 1000000000)
BEGIN;
INSERT INTO shop_orders (ref) VALUES (:client_id || '-' || :n);
\if :r <= 20
SELECT outbox.enqueue('OrderCreated', 'rb-' || :client_id || '-' || :n, '{"n": 1}', topic => '$topic');
ROLLBACK;
\else
SELECT outbox.enqueue('OrderCreated', 'c-' || :client_id || '-' || :n, '{"n": 1}', topic => '$topic');
COMMIT;
\endif
SQL
    "$PGBIN/pgbench" -n -c 8 -j 2 -t 150 -f "$script" "$IT_DB" >"$IT_TMP/pgbench.log" 2>&1 \
        || fail "pgbench failed: $(tail -3 "$IT_TMP/pgbench.log")"
    local committed
    committed=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$topic'")
    [ "$committed" -gt 800 ] || fail "only $committed committed events"
    consume $topic "$committed" 30000 >"$out" || fail "not all $committed committed events arrived ($(wc -l <"$out"))"
    load_consumed got_concurrent "$out"
    expect "rolled-back events delivered" "$(sql "SELECT count(*) FROM got_concurrent WHERE headers LIKE '%biz_key=rb-%'")" 0
    expect "committed events missing" "$(sql "SELECT count(*) FROM outbox.event_log l WHERE topic = '$topic'
        AND NOT EXISTS (SELECT 1 FROM got_concurrent g WHERE g.event_id = l.id)")" 0
    expect "deliveries of unknown events" "$(sql "SELECT count(*) FROM got_concurrent g
        WHERE NOT EXISTS (SELECT 1 FROM outbox.event_log l WHERE l.id = g.event_id)")" 0
}

# Events of one key arrive in enqueue order, across many transactions and
# sessions.
t_per_key_order() {
    local topic=it.order out=$IT_TMP/order.tsv pids=()
    for s in 1 2 3 4; do
        sql "DO \$\$ BEGIN FOR i IN 1..100 LOOP
               PERFORM outbox.enqueue('StockMoved', 's$s-' || i, jsonb_build_object('seq', i),
                                      topic => '$topic', msg_key => 'sku-$s');
               COMMIT; END LOOP; END \$\$" &
        pids+=($!)
    done
    wait "${pids[@]}"
    consume $topic 400 >"$out" || fail "not all 400 events arrived"
    load_consumed got_order "$out"
    expect_delivered "events delivered" got_order "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    expect "order violations" "$(sql "SELECT count(*) FROM (
        SELECT (value::jsonb->>'seq')::int - lag((value::jsonb->>'seq')::int) OVER (PARTITION BY key ORDER BY part, off) AS step
          FROM got_order) s WHERE step <> 1")" 0
    expect "one partition per key" "$(sql "SELECT count(DISTINCT (key, part)) FROM got_order")" 4
}

# The broker stopped for seconds mid-flow, then started again: nothing
# enqueued meanwhile is recorded as sent while it is down, and a consumer
# then receives every event, by id.  The topic exists before the broker
# stops: on a loaded machine, a topic not yet created when the broker
# died was answered "Local: Unknown topic" once it came back (over a
# minute later), a refusal, and every event went dead.
t_broker_down() {
    local topic=it.down out=$IT_TMP/down.tsv
    sql "SELECT count(outbox.enqueue('T', 'before-' || i, '{}', topic => '$topic')) FROM generate_series(1, 100) i" >/dev/null
    wait_until 60 "$(all_sent $topic 100)" || fail "the events before the outage were not sent"
    kafka_kill
    sql "SELECT count(outbox.enqueue('T', 'during-' || i, '{}', topic => '$topic')) FROM generate_series(1, 100) i" >/dev/null
    holds 4 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND biz_key LIKE 'during-%' AND status = 'sent'" \
        || fail "events marked sent while the broker was down"
    kafka_start || fail "broker did not restart"
    wait_until 60 "$(all_sent $topic 200)" || fail "events not all marked sent after the broker came back"
    expect "events dead" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'dead'")" 0
    expect_arrived down $topic "$out"
}

# expect_arrived NAME TOPIC FILE: once the relay says every event of TOPIC
# is sent, a consumer reads TOPIC to its end (into FILE) and receives each
# of them, by id, and nothing else (duplicates allowed: after a fault the
# relay may send an event again).
expect_arrived() {
    consume "$2" 1000000 30000 3000 >"$3"
    load_consumed "got_$1" "$3"
    expect_delivered "$1: events delivered" "got_$1" "SELECT id FROM outbox.event_log WHERE topic = '$2'"
}

# The broker frozen (SIGSTOP) while the relay sends, then let go: nothing is
# recorded as sent while it is frozen, and a consumer then receives every
# event, by id.
t_broker_paused() {
    local topic=it.paused out=$IT_TMP/paused.tsv
    kafka_pause
    sql "SELECT count(outbox.enqueue('T', 'p-' || i, '{}', topic => '$topic')) FROM generate_series(1, 100) i" >/dev/null
    wait_until 20 "SELECT count(*) > 0 FROM pg_stat_activity
                    WHERE backend_type = 'outbox relay' AND query = 'waiting for Kafka acknowledgements'" \
        || fail "the relay never waited for the frozen broker"
    holds 3 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "events marked sent while the broker was frozen"
    kafka_resume
    wait_until 60 "$(all_sent $topic 100)" || fail "events not all marked sent after the broker resumed"
    expect_arrived paused $topic "$out"
}

# The broker frozen longer than message.timeout.ms while a writer goes on
# committing events of a few keys: librdkafka fails the oldest messages
# (timed out) while younger ones of their partitions wait, and would
# deliver those once the broker is back (its idempotent producer keeps no
# order across a timeout).  Per-key order must hold all the same: no event
# may reach Kafka after a later event of its key.
t_timeout_gap_order() {
    timeout_gap it.timeout_gap said
}

# The same gap while the relay cannot serve librdkafka's reports: held in
# its wait for a synchronous standby (as when the standby is cut off), it
# cannot take back a younger event of a key before librdkafka, its older
# one timed out, sends it once the broker is back.  Event a1 of key k is
# queued to a frozen broker, a2 of k 2.5 s later; the relay is then held,
# the broker let go after a1's message.timeout.ms (4 s) but before a2's,
# and the relay let go 4 s later: a1 must still arrive before a2.
t_timeout_gap_relay_held() {
    local topic=it.gap_held out=$IT_TMP/gap_held.tsv mark
    mark=$(log_mark)
    set_setting outbox.kafka_properties "message.timeout.ms=4000"
    wait_log "$mark" 20 '  parameter "outbox.kafka_properties"' || fail "the properties were not taken"
    sql "SELECT outbox.enqueue('T', 'held-0', '{}', topic => '$topic', msg_key => 'k')" >/dev/null
    wait_until 30 "$(all_sent $topic 1)" || fail "the first event was not sent"
    kafka_pause
    for i in 1 2 3 4 5 6; do
        sql "SELECT outbox.enqueue('T', 'fill-$i', '{}', topic => '$topic', msg_key => 'fill')" >/dev/null
        sleep 0.1
    done
    sql "SELECT outbox.enqueue('T', 'held-1', '{}', topic => '$topic', msg_key => 'k')" >/dev/null
    sleep 2.5
    sql "SELECT outbox.enqueue('T', 'held-2', '{}', topic => '$topic', msg_key => 'k')" >/dev/null
    sleep 0.3
    mark=$(log_mark)
    set_setting synchronous_standby_names it_nobody
    wait_log "$mark" 20 'parameter "synchronous_standby_names"' || fail "the standby's name was not taken"
    sql "SET synchronous_commit = local;
         SELECT outbox.enqueue('T', 'held-3', '{}', topic => '$topic', msg_key => 'other')" >/dev/null
    wait_until 5 "SELECT count(*) = 1 FROM pg_stat_activity
                  WHERE backend_type = 'outbox relay' AND wait_event = 'SyncRep'" \
        || fail "the relay did not wait for the standby"
    sleep 1.5
    kafka_resume
    sleep 4
    reset_setting synchronous_standby_names
    wait_until 60 "$(all_sent $topic 10)" || fail "events not all marked sent once the relay was let go"
    consume $topic 1000000 30000 3000 >"$out"
    load_consumed got_gap_held "$out"
    expect_first_copies_in_key_order got_gap_held
    echo "#   received: $(sql "SELECT string_agg(event_id::text || '@' || off, ' ' ORDER BY off) FROM got_gap_held")"
    reset_setting outbox.kafka_properties
}

# expect_first_copies_in_key_order TABLE: no event of the consumed TABLE
# whose first copy arrived after a later event of its key.
expect_first_copies_in_key_order() {
    expect "events arriving (first) after a later event of their key" "$(sql "
        SELECT count(*) FROM (
          SELECT event_id < max(event_id) OVER (PARTITION BY key ORDER BY part, off
                                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS late
            FROM (SELECT DISTINCT ON (event_id) * FROM $1 ORDER BY event_id, part, off) f) o
         WHERE late")" 0
}

# timeout_gap TOPIC UNTIL: the check above, in the current delivery mode,
# with events of TOPIC; the broker frozen for UNTIL seconds or, with UNTIL
# "said", until the relay says Kafka did not acknowledge (three times):
# it has just given up on the oldest events then, and what it sends next
# reaches the broker at once, ahead of anything sent again later.
timeout_gap() {
    local topic=$1 out=$IT_TMP/$1.tsv mark n=1500 writer
    [ "$2" = said ] && n=4000
    mark=$(log_mark)
    sql "ALTER SYSTEM SET outbox.kafka_properties = 'message.timeout.ms=1500'"
    set_batch_size 20
    wait_log "$mark" 20 '  parameter "outbox.kafka_properties" \(value hidden\)' \
        || fail "the properties were not taken"
    "$PGBIN/psql" -X -q -d "$IT_DB" -c "DO \$\$ BEGIN
        FOR i IN 1..$n LOOP
            PERFORM outbox.enqueue('T', '$topic-' || i, jsonb_build_object('seq', i), topic => '$topic',
                                   msg_key => 'k' || i % 4);
            COMMIT;
            PERFORM pg_sleep(0.004);
        END LOOP; END \$\$" &
    writer=$!
    sleep 2
    if [ "$2" = said ]; then
        # Three times: whether the relay has a commit to read in that
        # moment is a race (a mutation that reads past a failed send was
        # caught in about half of the runs).
        for i in 1 2 3; do
            mark=$(log_mark)
            kafka_pause
            wait_log "$mark" 20 'Kafka did not acknowledge the events sent' || fail "the relay never gave up on an event"
            kafka_resume
            sleep 1
        done
    else
        kafka_pause
        sleep "$2"
        kafka_resume
    fi
    wait "$writer" || fail "the writer failed"
    n=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$topic'")
    wait_until 90 "$(all_sent "$topic" "$n")" || fail "events not all marked sent after the broker resumed"
    consume "$topic" 1000000 30000 3000 >"$out"
    load_consumed got_timeout_gap "$out"
    expect_delivered "events delivered" got_timeout_gap "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    expect_first_copies_in_key_order got_timeout_gap
    echo "#   $n events, $(duplicates got_timeout_gap) sent again"
    reset_batch_size
    sql "ALTER SYSTEM RESET outbox.kafka_properties" && sql "SELECT pg_reload_conf()" >/dev/null
}

# set_batch_size N: outbox.batch_size set to N and reloaded; waits for the
# postmaster's line saying so (it signals the relay right after), so that
# a window opened from now on is sent N events at a time.
set_batch_size() {
    local mark
    mark=$(log_mark)
    set_setting outbox.batch_size "$1"
    wait_log "$mark" 20 "parameter \"outbox.batch_size\" changed to \"$1\"" \
        || fail "the reload of outbox.batch_size = $1 was not logged"
}

# set_in_flight N: outbox.max_in_flight_events set to N and reloaded, as
# set_batch_size.
set_in_flight() {
    local mark
    mark=$(log_mark)
    set_setting outbox.max_in_flight_events "$1"
    wait_log "$mark" 20 "parameter \"outbox.max_in_flight_events\" changed to \"$1\"" \
        || fail "the reload of outbox.max_in_flight_events = $1 was not logged"
}

# reset_batch_size: outbox.batch_size (and the flight bound) back to their
# defaults.
reset_batch_size() {
    sql "ALTER SYSTEM RESET outbox.batch_size" && sql "ALTER SYSTEM RESET outbox.max_in_flight_events" \
        && sql "SELECT pg_reload_conf()" >/dev/null
}

# mid_flow TOPIC N MIN: wait until the relay has recorded at least MIN of
# the N events of TOPIC as sent, and fail unless some are still unsent:
# the fault that follows must hit a window part sent, part not.  The N
# events are the newest, sent in id order: the MIN-th and the last are
# looked up by id (a count over the topic took a second under load, while
# the relay recorded the rest).
mid_flow() {
    local hi first sent deadline=$((SECONDS + 60))
    hi=$(sql "SELECT max(id) FROM outbox.event_log")
    first=$((hi - $2 + $3))
    while [ $SECONDS -lt $deadline ]; do
        sent=$(sql "SELECT string_agg(status, ' ' ORDER BY id) FROM outbox.events WHERE id IN ($first, $hi)")
        case "$sent" in
            "sent sent") fail "all $2 events were sent before the fault: not mid-flow"; return ;;
            "sent "*) return ;;
        esac
        sleep 0.1
    done
    fail "the relay never recorded $3 events of $1 as sent"
}

# expect_one_flight_of_duplicates NAME TOPIC FILE BOUND: what a consumer
# read of TOPIC after one crash (FILE) is every committed event of TOPIC by
# id and nothing else, no event more than twice, and at most BOUND
# duplicates: the README's "at most outbox.max_in_flight_events per
# crash".  Prints the figures.
expect_one_flight_of_duplicates() {
    local table=got_$1 dups
    load_consumed "$table" "$3"
    expect_delivered "$1: events delivered" "$table" "SELECT id FROM outbox.event_log WHERE topic = '$2'"
    expect "$1: events delivered more than twice" \
        "$(sql "SELECT count(*) FROM (SELECT event_id FROM $table GROUP BY event_id HAVING count(*) > 2) x")" 0
    dups=$(duplicates "$table")
    [ "$dups" -le "$4" ] || fail "$1: $dups duplicates after one crash, more than were in flight (outbox.max_in_flight_events = $4)"
    echo "#   $1: $(sql "SELECT count(DISTINCT event_id) FROM $table") events, $dups duplicates (bound: what may be in flight, $4)"
}

# The relay SIGKILLed mid-window (the server restarts its processes):
# every committed event arrives, and at most what may be in flight twice.
# The window is 100,000 events sent 500 at a time, at most 1,000 in flight,
# and at least 4 batches of it recorded before the kill: a relay that
# re-sent the window from its start, or all it had sent, would exceed the
# bound.
t_relay_killed() {
    local topic=it.killed out=$IT_TMP/killed.tsv n=100000 batch=500 flight=1000 pid
    set_batch_size $batch
    set_in_flight $flight
    sql "SELECT count(outbox.enqueue('T', 'k-' || i, jsonb_build_object('i', i), topic => '$topic')) FROM generate_series(1, $n) i" >/dev/null
    pid=$(relay_pid)
    [ -n "$pid" ] || fail "no relay running"
    mid_flow $topic $n $((4 * batch))
    kill -KILL "$pid"
    wait_until 120 "$(all_sent $topic $n)" || fail "events not all sent after the relay was killed"
    consume $topic $((2 * n)) 60000 3000 >"$out"
    expect_one_flight_of_duplicates killed $topic "$out" $flight
    reset_batch_size
}

# The server stopped with pg_ctl stop -m immediate mid-window and started
# again: every committed event arrives, and at most what may be in flight
# twice (as t_relay_killed).
t_server_crash() {
    local topic=it.crash out=$IT_TMP/crash.tsv n=100000 batch=500 flight=1000
    set_batch_size $batch
    set_in_flight $flight
    sql "SELECT count(outbox.enqueue('T', 'x-' || i, jsonb_build_object('i', i), topic => '$topic')) FROM generate_series(1, $n) i" >/dev/null
    mid_flow $topic $n $((4 * batch))
    cluster_ctl -m immediate stop >/dev/null
    cluster_start
    wait_until 120 "$(all_sent $topic $n)" || fail "events not all sent after the crash"
    consume $topic $((2 * n)) 60000 3000 >"$out"
    expect_one_flight_of_duplicates crash $topic "$out" $flight
    reset_batch_size
}

# hold_early_event TOPIC: a session enqueues one event of TOPIC and keeps
# its transaction open until the table backlog_go has a row (at most two
# minutes): its event id is lower than those enqueued meanwhile, yet it
# commits after a window holding them opened.
hold_early_event() {
    sql "SET client_min_messages = warning; DROP TABLE IF EXISTS backlog_go; CREATE TABLE backlog_go (go int)"
    PGAPPNAME=outbox_it_early "$PGBIN/psql" -X -q -d "$IT_DB" -v ON_ERROR_STOP=1 -c "BEGIN" \
        -c "SELECT outbox.enqueue('T', 'bl-early', '{}', topic => '$1')" \
        -c "DO \$\$ BEGIN FOR i IN 1..1200 LOOP EXIT WHEN EXISTS (SELECT 1 FROM backlog_go);
                 PERFORM pg_sleep(0.1); END LOOP; END \$\$" -c "COMMIT" >/dev/null 2>&1 &
    EARLY_PID=$!
    wait_until 10 "SELECT count(*) = 1 FROM pg_stat_activity
                    WHERE application_name = 'outbox_it_early' AND wait_event = 'PgSleep'" \
        || fail "the session holding an early event did not start"
}

# commit_early_event: let the session of hold_early_event commit.
commit_early_event() {
    sql "INSERT INTO backlog_go VALUES (1)"
    wait "$EARLY_PID" || fail "the session holding an early event failed"
}

# outbox.stats.backlog while a window is open and part of it relayed: it is
# exactly the events a consumer has not received, counting the event just
# after the window's place (window_last_tx, window_last_id) and not the one
# at it, an event with a lower id that committed after the window opened,
# and events committed since.  The relay is paused mid-window (it shows
# "paused" once the batches in flight are answered and recorded), so what
# Kafka holds is exactly what was relayed.
t_backlog_open_window() {
    local topic=it.backlog out=$IT_TMP/backlog.tsv n=30000 batch=100 want
    wait_until 30 "SELECT backlog = 0 FROM outbox.stats" \
        || { fail "backlog not 0 before the case: $(sql "SELECT backlog FROM outbox.stats")"; return; }
    set_batch_size $batch
    # Two batches in flight at most: the window drains slowly enough for
    # the pause to land in the middle of it.
    set_in_flight $((2 * batch))
    hold_early_event $topic
    sql "SELECT count(outbox.enqueue('T', 'bl-w-' || i, '{}', topic => '$topic')) FROM generate_series(1, $n) i" >/dev/null
    mid_flow $topic $((n + 1)) $((10 * batch))
    sql "SELECT outbox.pause()" >/dev/null
    wait_until 20 "SELECT state = 'paused' FROM outbox.relay_status()" || fail "relay not paused"
    expect "window open, part of it relayed" "$(sql "SELECT window_snapshot IS NOT NULL
        AND window_last_id > (SELECT min(id) FROM outbox.event_log WHERE topic = '$topic' AND biz_key LIKE 'bl-w-%')
        AND EXISTS (SELECT 1 FROM outbox.event_log l WHERE pg_visible_in_snapshot(l.tx, window_snapshot)
                       AND ROW(l.tx, l.id) > ROW(window_last_tx, window_last_id))
        FROM outbox.relay_cursor")" t
    commit_early_event
    sql "SELECT count(outbox.enqueue('T', 'bl-late-' || i, '{}', topic => '$topic')) FROM generate_series(1, 5) i" >/dev/null

    consume $topic $((n + 6)) 30000 3000 >"$out"
    load_consumed got_backlog "$out"
    expect_delivered "delivered while paused: the window up to its place" got_backlog \
        "SELECT l.id FROM outbox.event_log l, outbox.relay_cursor c WHERE l.topic = '$topic' AND l.biz_key LIKE 'bl-w-%'
            AND ROW(l.tx, l.id) <= ROW(c.window_last_tx, c.window_last_id)"
    want=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$topic'
                   AND id NOT IN (SELECT event_id FROM got_backlog WHERE event_id IS NOT NULL)")
    expect "outbox.stats.backlog with a window open (events not received)" "$(sql "SELECT backlog FROM outbox.stats")" "$want"
    echo "#   backlog with the window open: $want of $((n + 6)) events, $(sql "SELECT count(*) FROM got_backlog") received"

    sql "SELECT outbox.resume()" >/dev/null
    consume $topic $((n + 6)) 60000 >"$out" || fail "not all $((n + 6)) events arrived after resume ($(wc -l <"$out"))"
    load_consumed got_backlog "$out"
    expect_delivered "delivered after resume" got_backlog "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    wait_until 30 "SELECT backlog = 0 FROM outbox.stats" || fail "backlog not 0 after everything arrived"
    sql "DROP TABLE backlog_go"
    reset_batch_size
}

# set_brokers ADDRESS: outbox.kafka_brokers set and reloaded; waits for the
# postmaster's line saying so (it signals the relay right after).
set_brokers() {
    local mark
    mark=$(log_mark)
    set_setting outbox.kafka_brokers "$1"
    wait_log "$mark" 20 "parameter \"outbox.kafka_brokers\" changed to \"$1\"" \
        || fail "the reload of outbox.kafka_brokers = $1 was not logged"
}

# A reload pointing the relay at a wrong address holds events back; one
# pointing it back delivers them, by id.  Properties with a secret,
# accepted, re-create the producer, which delivers; refused at reload, they
# are reported, the relay keeps the accepted ones; neither secret reaches
# the server log.
t_reload() {
    local topic=it.reload out=$IT_TMP/reload.tsv mark start
    set_brokers 127.0.0.1:9
    sql "SELECT count(outbox.enqueue('T', 'r-' || i, '{}', topic => '$topic')) FROM generate_series(1, 20) i" >/dev/null
    holds 3 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "events marked sent while the brokers were wrong"
    set_brokers "$IT_BROKERS"
    wait_until 30 "$(all_sent $topic 20)" || fail "events not all marked sent after the brokers were fixed"
    expect_arrived reload $topic "$out"

    start=$(log_mark)
    set_setting outbox.kafka_properties "linger.ms=1;sasl.password=TopSecret-42"
    # PostgreSQL's "changed to" line, its value cut by the module.
    wait_log "$start" 20 '  parameter "outbox.kafka_properties" \(value hidden\)' \
        || fail "the accepted properties were not taken"
    sql "SELECT outbox.enqueue('T', 'r-after-properties', '{}', topic => '$topic')" >/dev/null
    wait_until 30 "$(all_sent $topic 21)" || fail "no delivery after the properties changed"
    expect_arrived reload $topic "$out"

    # PostgreSQL applies, and so checks, only the last occurrence of a
    # setting, and postgresql.auto.conf comes last: the accepted value must
    # leave it, or the refused one below is never parsed.  ALTER SYSTEM
    # takes no refused value, hence postgresql.conf.
    mark=$(log_mark)
    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    echo "outbox.kafka_properties = 'no.such.thing=TopSecret-43'" >>"$CLUSTER_DATA/postgresql.conf"
    sql "SELECT pg_reload_conf()" >/dev/null
    wait_log "$mark" 20 'invalid value for parameter "outbox.kafka_properties" \(value hidden\)' \
        || fail "the refused properties were not reported"
    log_since "$mark" | grep -q 'Entry 1 names no property librdkafka knows' \
        || fail "the refusal does not name the entry: $(log_since "$mark" | grep -A2 'outbox.kafka_properties')"
    sql "SELECT outbox.enqueue('T', 'r-after-refused', '{}', topic => '$topic')" >/dev/null
    wait_until 30 "$(all_sent $topic 22)" || fail "no delivery after properties were refused"
    expect_arrived reload $topic "$out"
    sed -i '/no.such.thing/d' "$CLUSTER_DATA/postgresql.conf"
    sql "SELECT pg_reload_conf()" >/dev/null
    ! log_since "$start" | grep -q 'TopSecret' || fail "a secret from outbox.kafka_properties is in the server log"
}

# DROP EXTENSION is not blocked by the relay, which leaves until CREATE
# EXTENSION brings one back; DROP DATABASE of another database is not
# blocked.
t_drop_extension() {
    local topic=it.drop out=$IT_TMP/drop.tsv
    sql "CREATE DATABASE outbox_other" && timeout 20 "$PGBIN/psql" -X -q -d "$IT_DB" -c "DROP DATABASE outbox_other" \
        || fail "DROP DATABASE of another database failed or hung"
    timeout 20 "$PGBIN/psql" -X -q -d "$IT_DB" -c "DROP EXTENSION outbox CASCADE" || fail "DROP EXTENSION failed or hung"
    sql "CREATE EXTENSION outbox"
    sql "SELECT outbox.enqueue('T', 'after-recreate', '{}', topic => '$topic')" >/dev/null
    consume $topic 1 20000 >"$out" || fail "no delivery after the extension was created again"
    load_consumed got_drop "$out"
    expect_delivered "events delivered after the extension was created again" got_drop \
        "SELECT id FROM outbox.event_log WHERE biz_key = 'after-recreate'"
}

# DROP DATABASE of the database the relay serves is not refused because
# of the relay's connection; the launcher then waits for it to exist.
# Before, the relay delivers the served database's event; after, back on
# $IT_DB, the event there: checked by id against what consumers received.
t_drop_relay_database() {
    local topic=it.drop_relayed out=$IT_TMP/drop_relayed.tsv victim home
    sql "CREATE DATABASE outbox_victim"
    "$PGBIN/psql" -X -q -d outbox_victim -c "CREATE EXTENSION outbox"
    set_setting outbox.database outbox_victim
    wait_until 20 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = 'outbox_victim'" \
        || fail "no relay started for outbox_victim"
    victim=$(IT_DB=outbox_victim sql "SELECT outbox.enqueue('T', 'victim-1', '{}', topic => '$topic.victim')")
    IT_DB=outbox_victim wait_until 20 "SELECT status = 'sent' FROM outbox.events WHERE id = $victim" \
        || fail "the relay of outbox_victim did not send its event"
    timeout 30 "$PGBIN/psql" -X -q -d "$IT_DB" -c "DROP DATABASE outbox_victim" || fail "DROP DATABASE of the relayed database failed"
    set_setting outbox.database "$IT_DB"
    wait_until 20 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = '$IT_DB'" \
        || fail "the relay did not come back for $IT_DB"
    home=$(sql "SELECT outbox.enqueue('T', 'drop-relayed-home', '{}', topic => '$topic')")
    wait_until 20 "SELECT status = 'sent' FROM outbox.events WHERE id = $home" || fail "the relay back on $IT_DB did not send"
    consume $topic.victim 100 20000 3000 >"$out"
    load_consumed got_drop_victim "$out"
    expect_delivered "events of outbox_victim delivered" got_drop_victim "SELECT $victim AS id"
    consume $topic 100 20000 3000 >"$out"
    load_consumed got_drop_home "$out"
    expect_delivered "events of $IT_DB delivered" got_drop_home "SELECT $home AS id"
}

# A streaming standby relays nothing; promoted after the primary dies, it
# relays the events the primary had committed but not sent.
t_promotion() {
    local topic=it.failover out=$IT_TMP/failover.tsv standby=$CLUSTER_DIR/standby sport=5433
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR lsn deadline promoted_ms
    cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$standby" -R -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; return; }
    echo "port = $sport" | cluster_run tee -a "$standby/postgresql.conf" >/dev/null
    cluster_run "$server_bin/pg_ctl" -D "$standby" -l "$CLUSTER_DIR/it/standby.log" -w start >/dev/null \
        || { fail "standby did not start"; return; }
    standby_sql() { "$PGBIN/psql" -X -q -At -p $sport -d "$IT_DB" -c "$1"; }
    expect "standby in recovery" "$(standby_sql "SELECT pg_is_in_recovery()")" t

    # The primary stops sending (a wrong broker), takes 100 events, dies.
    # The standby has them, and its own outbox.kafka_brokers is the real
    # broker: a relay there would have delivered them before the promotion
    # (the producer's timestamp of each message tells).
    set_brokers 127.0.0.1:9
    sql "SELECT count(outbox.enqueue('T', 'f-' || i, '{}', topic => '$topic')) FROM generate_series(1, 100) i" >/dev/null
    lsn=$(sql "SELECT pg_current_wal_lsn()")
    deadline=$((SECONDS + 60))
    until [ "$(standby_sql "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ]; do
        if [ $SECONDS -ge $deadline ]; then
            fail "the standby did not replay up to $lsn within 60 s: $(standby_sql "SELECT pg_last_wal_replay_lsn()")"
            cluster_run "$server_bin/pg_ctl" -D "$standby" -m fast stop >/dev/null
            set_setting outbox.kafka_brokers "$IT_BROKERS"
            return
        fi
        sleep 0.1
    done
    holds 5 "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type LIKE 'outbox%'" standby_sql \
        || fail "an outbox worker ran on the standby"
    cluster_ctl -m immediate stop >/dev/null

    promoted_ms=$(date +%s%3N)
    cluster_run "$server_bin/pg_ctl" -D "$standby" -w promote >/dev/null || fail "promotion failed"
    consume $topic 100 60000 >"$out" || fail "the promoted standby did not relay the primary's events ($(wc -l <"$out"))"
    cluster_run "$server_bin/pg_ctl" -D "$standby" -m fast stop >/dev/null

    # Back to the old primary, which has the same events, by id, and sends
    # its copy too (duplicates, by design).
    cluster_start
    load_consumed got_failover "$out"
    expect_delivered "relayed by the promoted standby" got_failover "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    expect "messages produced before the promotion" "$(sql "SELECT count(*) FROM got_failover WHERE created_ms < $promoted_ms")" 0
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    wait_until 30 "$(all_sent $topic 100)" || fail "the old primary did not catch up"
}

# An asynchronous standby promoted after the primary sent events it never
# received: those commits are lost with the primary, as asynchronous
# replication allows, but no event the promoted standby enqueues may reach
# Kafka under an identity (outbox_source, event_id) that one of the lost
# events had, or a consumer claiming by it skips the new event.  The
# events both servers had keep their identity when sent again.
# t_eos_async_promotion (exactly_once.sh) runs it in exactly_once.
t_async_promotion() {
    async_promotion it.async_failover
}

# async_promotion TOPIC: the case above, on TOPIC, in the current mode.
async_promotion() {
    local topic=$1 out=$IT_TMP/$1.tsv standby=$CLUSTER_DIR/async.$1 sport=5433 got=got_${1//./_}
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR lsn deadline
    cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$standby" -R -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; return; }
    echo "port = $sport" | cluster_run tee -a "$standby/postgresql.conf" >/dev/null
    async_ctl() { cluster_run "$server_bin/pg_ctl" -D "$standby" -l "$IT_TMP/async_standby.log" "$@" >/dev/null; }
    async_sql() { "$PGBIN/psql" -X -q -At -p $sport -d "$IT_DB" -c "$1"; }
    async_ctl -w start || { fail "standby did not start"; return; }

    # Both have these; the primary sends them.
    sql "SELECT count(outbox.enqueue('T', '$topic-shared-' || i, '{}', topic => '$topic')) FROM generate_series(1, 40) i" >/dev/null
    wait_until 60 "$(all_sent $topic 40)" || fail "the shared events were not sent"
    lsn=$(sql "SELECT pg_current_wal_lsn()")
    deadline=$((SECONDS + 60))
    until [ "$(async_sql "SELECT pg_last_wal_replay_lsn() >= '$lsn'")" = t ]; do
        [ $SECONDS -lt $deadline ] || { fail "the standby did not replay up to $lsn in 60 s"; break; }
        sleep 0.1
    done
    # The standby falls behind (stopped); the primary uses transaction ids
    # the standby never sees, sends 60 more events, dies.  In exactly_once
    # its latest progress record begins where the standby's cursor is, and
    # ends past ids the promoted standby hands out again.
    async_ctl -m fast -w stop
    for i in $(seq 20); do sql "SELECT pg_current_xact_id()" >/dev/null; done
    sql "SELECT count(outbox.enqueue('T', '$topic-lost-' || i, '{}', topic => '$topic')) FROM generate_series(1, 60) i" >/dev/null
    wait_until 60 "$(all_sent $topic 100)" || fail "the events the standby lacks were not sent"
    cluster_ctl -m immediate stop >/dev/null

    async_ctl -w start && async_ctl -w promote || { fail "the standby was not promoted"; return; }
    async_sql "SELECT count(outbox.enqueue('T', '$topic-new-' || i, '{}', topic => '$topic')) FROM generate_series(1, 60) i" >/dev/null
    deadline=$((SECONDS + 60))
    until [ "$(async_sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'sent'")" = 100 ]; do
        [ $SECONDS -lt $deadline ] || { fail "the promoted standby did not send its events in 60 s"; break; }
        sleep 0.2
    done
    consume $topic 1000 30000 3000 >"$out"
    async_ctl -m fast -w stop
    cluster_start

    cluster_run rm -rf "$standby"
    load_consumed $got "$out"
    sql "CREATE OR REPLACE VIEW ${got}_v AS SELECT event_id, substring(headers from 'outbox_source=([^,]*)') AS source,
                                                      substring(headers from 'biz_key=([^,]*)') AS biz_key FROM $got"
    expect "async failover: new events in Kafka" "$(sql "SELECT count(DISTINCT biz_key) FROM ${got}_v WHERE biz_key LIKE '$topic-new-%'")" 60
    expect "async failover: identities shared by two different events" "$(sql "SELECT count(*) FROM (
        SELECT source, event_id FROM ${got}_v GROUP BY 1, 2 HAVING count(DISTINCT biz_key) > 1) d")" 0
    expect "async failover: events sent again under another identity" "$(sql "SELECT count(*) FROM (
        SELECT biz_key FROM ${got}_v GROUP BY 1 HAVING count(DISTINCT (source, event_id)) > 1) d")" 0
}

# The old primary of an asynchronous failover rewound and rejoined: the
# standby falls behind, the primary sends events it lacks, the standby is
# promoted and enqueues, the old primary is rewound onto the promoted
# server's timeline (pg_rewind), catches up as its standby, and is
# promoted back in a switchover.  The rewind takes away what the old
# primary committed after the fork, as asynchronous replication allows;
# every event either primary enqueued after its promotion reaches Kafka,
# no two different events share an identity (outbox_source, event_id),
# the events both servers had keep theirs, and each promoted server,
# having begun as a standby, keeps the relay's sender and source.
# pg_rewind needs wal_log_hints (the test cluster has no data checksums)
# and the old primary's WAL from the last checkpoint before the fork
# (wal_keep_size here; an archive and --restore-target-wal elsewhere):
# both set for this case, from before the base backup, reset at its end.
t_rewind_rejoin() {
    local topic=it.rewind out=$IT_TMP/rewind.tsv standby=$CLUSTER_DIR/rewind sport=5433 got=got_rewind
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR lsn ckpt sender source conf=$IT_TMP/rewind_primary.conf
    rewind_ctl() { cluster_run "$server_bin/pg_ctl" -D "$standby" -l "$IT_TMP/rewind_standby.log" "$@" >/dev/null; }
    rewind_sql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -p $sport -d "$IT_DB" -c "$1"; }
    sql "ALTER SYSTEM SET wal_log_hints = on" && sql "ALTER SYSTEM SET wal_keep_size = '128MB'"
    cluster_ctl -m fast -w stop >/dev/null && cluster_start || { fail "the primary did not restart"; rewind_end; return; }
    expect "wal_log_hints" "$(sql "SHOW wal_log_hints")" on
    topic_ready $topic || { rewind_end; return; }
    cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$standby" -R -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; rewind_end; return; }
    echo "port = $sport" | cluster_run tee -a "$standby/postgresql.conf" >/dev/null
    rewind_ctl -w start || { fail "the standby did not start"; rewind_end; return; }

    # Both have these; the primary sends them.
    sql "SELECT count(outbox.enqueue('T', 'shared-' || i, '{}', topic => '$topic')) FROM generate_series(1, 40) i" >/dev/null
    wait_until 60 "$(all_sent $topic 40)" || fail "the shared events were not sent"
    sender=$(sql "SELECT sender FROM outbox.relay_cursor")
    source=$(sql "SELECT source FROM outbox.relay_cursor")
    replayed rewind_sql "$(sql "SELECT pg_current_wal_lsn()")" || fail "the standby did not catch up"
    # The standby falls behind (stopped); the primary sends 60 more.
    rewind_ctl -m fast -w stop
    sql "SELECT count(outbox.enqueue('T', 'lost-' || i, '{}', topic => '$topic')) FROM generate_series(1, 60) i" >/dev/null
    wait_until 60 "$(all_sent $topic 100)" || fail "the events the standby lacks were not sent"

    # The standby, started cut off from the primary (no primary_conninfo),
    # promoted (timeline 2), enqueues; then the old primary stops.
    rewind_ctl -w -o "-c primary_conninfo=" start && rewind_ctl -w promote || { fail "the standby was not promoted"; rewind_end; return; }
    rewind_sql "SELECT count(outbox.enqueue('T', 'new-' || i, '{}', topic => '$topic')) FROM generate_series(1, 60) i" >/dev/null
    rewind_wait "SELECT count(*) = 100 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "the promoted standby did not send its events in 60 s"
    expect "sender after the first promotion" "$(rewind_sql "SELECT sender FROM outbox.relay_cursor")" "$sender"
    expect "source after the first promotion" "$(rewind_sql "SELECT source FROM outbox.relay_cursor")" "$source"
    cluster_ctl -m fast -w stop >/dev/null

    # pg_rewind onto the promoted server's timeline.  Its control file
    # names the new timeline only from the checkpoint that follows the
    # promotion (without one pg_rewind says "no rewind required").  It
    # copies the source's configuration files, so the old primary's own
    # postgresql.conf is put back; -R writes standby.signal and
    # primary_conninfo.
    rewind_sql "CHECKPOINT"
    cluster_run cp "$CLUSTER_DATA/postgresql.conf" "$conf"
    cluster_run "$server_bin/pg_rewind" -D "$CLUSTER_DATA" -R \
        --source-server="host=$CLUSTER_DIR port=$sport user=postgres dbname=postgres" >"$IT_TMP/rewind.log" 2>&1 \
        || { fail "pg_rewind failed: $(tail -n 3 "$IT_TMP/rewind.log")"; rewind_end; return; }
    cluster_run cp "$conf" "$CLUSTER_DATA/postgresql.conf"
    cluster_start || { fail "the rewound primary did not start"; rewind_end; return; }
    expect "rewound primary in recovery" "$(sql "SELECT pg_is_in_recovery()")" t
    replayed sql "$(rewind_sql "SELECT pg_current_wal_lsn()")" || fail "the rewound primary did not catch up"
    expect "events the rewind took away" "$(sql "SELECT count(*) FROM outbox.event_log WHERE biz_key LIKE 'lost-%'")" 0

    # Switchover: the promoted server stopped cleanly, its shutdown
    # checkpoint replayed, the rewound one promoted (timeline 3).
    rewind_ctl -m fast -w stop
    ckpt=$(cluster_run "$server_bin/pg_controldata" -D "$standby" | sed -n 's/^Latest checkpoint location: *//p')
    replayed sql "$ckpt" || fail "the rewound primary did not replay the shutdown checkpoint $ckpt"
    cluster_ctl -w promote >/dev/null || { fail "the rewound primary was not promoted"; rewind_end; return; }
    sql "SELECT count(outbox.enqueue('T', 'back-' || i, '{}', topic => '$topic')) FROM generate_series(1, 60) i" >/dev/null
    wait_until 60 "SELECT count(*) = 160 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "the primary promoted back did not send its events in 60 s"
    expect "sender after the switchover" "$(sql "SELECT sender FROM outbox.relay_cursor")" "$sender"
    expect "source after the switchover" "$(sql "SELECT source FROM outbox.relay_cursor")" "$source"

    consume $topic 1000 30000 3000 >"$out"
    load_consumed $got "$out"
    sql "CREATE OR REPLACE VIEW ${got}_v AS SELECT event_id, substring(headers from 'outbox_source=([^,]*)') AS source,
                                                      substring(headers from 'biz_key=([^,]*)') AS biz_key FROM $got"
    expect "rewind: events in Kafka per kind" "$(sql "SELECT string_agg(k || '=' || n, ' ' ORDER BY k) FROM (
        SELECT split_part(biz_key, '-', 1) k, count(DISTINCT biz_key) n FROM ${got}_v GROUP BY 1) c")" \
        "back=60 lost=60 new=60 shared=40"
    # Ids the promoted standby handed out again: what the check below is about.
    [ "$(sql "SELECT count(*) FROM (SELECT event_id FROM ${got}_v WHERE biz_key ~ '^(lost|new)-'
                                     GROUP BY 1 HAVING count(DISTINCT biz_key) > 1) d")" -gt 0 ] \
        || fail "no event id of a lost event was handed out again: the case checks nothing"
    expect "rewind: identities shared by two different events" "$(sql "SELECT count(*) FROM (
        SELECT source, event_id FROM ${got}_v GROUP BY 1, 2 HAVING count(DISTINCT biz_key) > 1) d")" 0
    expect "rewind: events sent again under another identity" "$(sql "SELECT count(*) FROM (
        SELECT biz_key FROM ${got}_v GROUP BY 1 HAVING count(DISTINCT (source, event_id)) > 1) d")" 0
    rewind_end
}

# replayed RUNNER LSN: until the server RUNNER queries replayed LSN, 60 s at most.
replayed() {
    local deadline=$((SECONDS + 60))
    until [ "$("$1" "SELECT pg_last_wal_replay_lsn() >= '$2'" 2>/dev/null)" = t ]; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

# rewind_wait SQL: until SQL returns t on t_rewind_rejoin's standby, 60 s at most.
rewind_wait() {
    local deadline=$((SECONDS + 60))
    until [ "$(rewind_sql "$1" 2>/dev/null)" = t ]; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.2
    done
}

# rewind_end: the original cluster back as other cases expect it, however
# far t_rewind_rejoin got: a primary without the case's settings, its
# relay running; the other server gone.
rewind_end() {
    rewind_ctl -m fast -w stop 2>/dev/null
    [ ! -f "$conf" ] || cluster_run cp "$conf" "$CLUSTER_DATA/postgresql.conf"
    cluster_ctl status >/dev/null 2>&1 || cluster_start
    [ "$(sql "SELECT pg_is_in_recovery()")" = f ] || cluster_ctl -w promote >/dev/null
    sql "ALTER SYSTEM RESET wal_log_hints" && sql "ALTER SYSTEM RESET wal_keep_size"
    sql "ALTER SYSTEM RESET primary_conninfo"
    cluster_ctl -m fast -w stop >/dev/null
    cluster_start || fail "the cluster did not start again"
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "no relay after the case"
    cluster_run rm -rf "$standby" "$conf"
}

# A server restored beside production on the same Kafka, from a backup
# holding events production has since sent: to a point in time (PITR, a
# later timeline), or a base backup started later (the same timeline).
# Its relay must not fence production's (exactly_once) nor take its
# progress; its events sent again keep their identity, its new ones take
# none another event had; a consumer claiming as the README says applies
# every event exactly once, and production keeps delivering.
# t_eos_pitr_beside and t_eos_backup_beside (exactly_once.sh) run them in
# exactly_once.
t_pitr_beside() {
    restored_beside it.pitr pitr
}

t_backup_beside() {
    restored_beside it.backup backup
}

# restored_beside TOPIC KIND: the case above, KIND pitr or backup, on
# TOPIC, in the current mode.
restored_beside() {
    local topic=$1 kind=$2 dir=$CLUSTER_DIR/restored.$1 rport=5434 got=got_${1//./_} out=$IT_TMP/$1.tsv
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR mark deadline
    restored_ctl() { cluster_run "$server_bin/pg_ctl" -D "$dir" -l "$IT_TMP/$topic.restored.log" "$@" >/dev/null; }
    restored_sql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -p $rport -d "$IT_DB" -c "$1"; }
    enqueue_on() { $1 "SELECT count(outbox.enqueue('T', '$topic-$2-' || i, '{}', topic => '$topic')) FROM generate_series(1, 30) i" >/dev/null; }
    base_backup() {
        cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$dir" -X stream --checkpoint=fast
    }
    mark=$(log_mark)
    # The archive a restore to a point in time reads: the primary's pg_wal, kept.
    set_setting wal_keep_size 1GB
    if [ $kind = pitr ]; then base_backup || { fail "pg_basebackup failed"; return; }; fi
    enqueue_on sql early
    wait_until 60 "$(all_sent $topic 30)" || fail "the early events were not sent"
    # Pending where the restore ends: production sends them afterwards.
    sql "SELECT outbox.pause()" >/dev/null
    enqueue_on sql pending
    if [ $kind = pitr ]; then
        sql "SELECT pg_create_restore_point('$topic')" >/dev/null
    else
        base_backup || { fail "pg_basebackup failed"; return; }
    fi
    sql "SELECT outbox.resume()" >/dev/null
    enqueue_on sql later
    wait_until 60 "$(all_sent $topic 90)" || fail "production did not send the pending and later events"
    sql "SELECT pg_switch_wal()" >/dev/null

    echo "port = $rport" | cluster_run tee -a "$dir/postgresql.conf" >/dev/null
    if [ $kind = pitr ]; then
        printf "%s\n" "restore_command = 'cp $CLUSTER_DATA/pg_wal/%f %p'" "recovery_target_name = '$topic'" \
            "recovery_target_action = 'promote'" | cluster_run tee -a "$dir/postgresql.conf" >/dev/null
        cluster_run touch "$dir/recovery.signal"
    fi
    # docs/ha.md's way to start a restored server that sends nothing: no
    # relay at the first start, each database paused, started again.
    restored_ctl -o "-c outbox.database=no_relay" -w start || { fail "the restored server did not start"; return; }
    deadline=$((SECONDS + 60))
    until [ "$(restored_sql "SELECT NOT pg_is_in_recovery()")" = t ]; do
        [ $SECONDS -lt $deadline ] || { fail "the restored server did not end its recovery in 60 s"; break; }
        sleep 0.2
    done
    holds 3 "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" restored_sql \
        || fail "a relay ran on the restored server started with outbox.database = no_relay"
    grep -q 'database "no_relay" does not exist' "$IT_TMP/$topic.restored.log" \
        || fail "the restored server's launcher did not say why no relay runs"
    restored_sql "SELECT outbox.pause()" >/dev/null
    restored_ctl -m fast -w stop && restored_ctl -w start || { fail "the restored server did not start again"; return; }
    deadline=$((SECONDS + 30))
    until [ "$(restored_sql "SELECT state = 'paused' FROM outbox.relay_status()")" = t ]; do
        [ $SECONDS -lt $deadline ] || { fail "the restored server's relay is not paused: $(restored_sql "SELECT state FROM outbox.relay_status()")"; break; }
        sleep 0.2
    done
    holds 2 "SELECT count(*) = 30 FROM outbox.events WHERE topic = '$topic' AND status <> 'sent'" restored_sql \
        || fail "$kind beside: the paused restored server sent: $(restored_sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status <> 'sent'")"
    # Its operator resumes it.
    restored_sql "SELECT outbox.resume()" >/dev/null
    enqueue_on restored_sql restored
    enqueue_on sql after
    wait_until 60 "$(all_sent $topic 120)" \
        || fail "production stopped delivering beside the restored server: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"
    deadline=$((SECONDS + 60))
    until [ "$(restored_sql "$(all_sent $topic 90)")" = t ]; do
        [ $SECONDS -lt $deadline ] || { fail "the restored server did not send its events in 60 s: $(restored_sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"; break; }
        sleep 0.2
    done
    [ "$(sql "SELECT sender FROM outbox.relay_cursor")" != "$(restored_sql "SELECT sender FROM outbox.relay_cursor")" ] \
        || fail "the restored server sends under production's Kafka identity"
    consume $topic 100000 30000 3000 >"$out"
    restored_ctl -m fast -w stop
    grep -q "takes a new Kafka identity" "$IT_TMP/$topic.restored.log" \
        || fail "the restored server did not say it took a new identity"
    cluster_run rm -rf "$dir"
    reset_setting wal_keep_size
    if log_since "$mark" | grep -q "fenced"; then fail "a relay was fenced: $(log_since "$mark" | grep fenced | head -2)"; fi

    load_consumed $got "$out"
    sql "CREATE OR REPLACE VIEW ${got}_v AS SELECT part, off, event_id, substring(headers from 'outbox_source=([^,]*)') AS source,
                                                      substring(headers from 'biz_key=([^,]*)') AS biz_key FROM $got"
    expect "$kind beside: events in Kafka" "$(sql "SELECT count(DISTINCT biz_key) FROM ${got}_v")" 150
    expect "$kind beside: identities shared by two different events" "$(sql "SELECT count(*) FROM (
        SELECT source, event_id FROM ${got}_v GROUP BY 1, 2 HAVING count(DISTINCT biz_key) > 1) d")" 0
    expect "$kind beside: events sent again under another identity" "$(sql "SELECT count(*) FROM (
        SELECT biz_key FROM ${got}_v GROUP BY 1 HAVING count(DISTINCT (source, event_id)) > 1) d")" 0
    expect "$kind beside: events a claiming consumer did not apply exactly once" "$(sql "SELECT count(*) FROM (
        SELECT biz_key, count(*) FILTER (WHERE applied) AS n FROM (
            SELECT biz_key, outbox.claim('$topic', event_id, 'T', biz_key, source) AS applied
              FROM ${got}_v ORDER BY part, off) c GROUP BY 1) a WHERE n <> 1")" 0
}

# A commit PostgreSQL made visible before the synchronous standby had it
# (its wait for the standby canceled, or replayed from the local WAL by a
# restart) is sent only once the standby confirms it: a failover before
# that would leave Kafka holding an event the new primary never had.  The
# relay says what it waits for in pg_stat_activity.
t_sync_standby_unconfirmed() {
    local topic=it.syncrep out=$IT_TMP/syncrep.tsv standby=$CLUSTER_DIR/syncrep sport=5433
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR waiting writer
    cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$standby" -R -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; return; }
    echo "port = $sport" | cluster_run tee -a "$standby/postgresql.conf" >/dev/null
    standby_ctl() { cluster_run "$server_bin/pg_ctl" -D "$standby" -l "$IT_TMP/syncrep.log" "$@" >/dev/null; }
    standby_ctl -w start || { fail "standby did not start"; return; }
    sql "ALTER SYSTEM SET synchronous_standby_names = '*'" && sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 30 "SELECT sync_state = 'sync' FROM pg_stat_replication" || fail "standby not synchronous"
    # The database's owner cannot take the relay's wait away (the writers
    # below ask for synchronous commits themselves).
    sql "ALTER DATABASE $IT_DB SET synchronous_commit = off"
    standby_ctl -m fast -w stop
    waiting="SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query LIKE '%sr-%'"

    # A writer's wait canceled: its event is committed, visible, unconfirmed.
    sql "SET synchronous_commit = on; SELECT outbox.enqueue('T', 'sr-1', '{}', topic => '$topic')" >/dev/null 2>&1 &
    writer=$!
    wait_until 10 "SELECT count(*) = 1 FROM ($waiting) w" || fail "the commit did not wait for the standby"
    sql "SELECT pg_cancel_backend(pid) FROM ($waiting) w" >/dev/null
    wait $writer
    expect "canceled commit visible" "$(sql "SELECT count(*) FROM outbox.event_log WHERE biz_key = 'sr-1'")" 1
    wait_until 10 "SELECT query LIKE '%synchronous standbys%' FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "the relay does not say it waits for the standby: $(sql "SELECT wait_event || ': ' || query FROM pg_stat_activity WHERE backend_type = 'outbox relay'")"

    # A writer waiting when the primary restarts: replayed, visible, unconfirmed.
    sql "SET synchronous_commit = on; SELECT outbox.enqueue('T', 'sr-2', '{}', topic => '$topic')" >/dev/null 2>&1 &
    writer=$!
    wait_until 10 "SELECT count(*) = 1 FROM ($waiting) w" || fail "the second commit did not wait for the standby"
    cluster_ctl -m immediate stop >/dev/null
    wait $writer
    cluster_start
    expect "replayed commit visible" "$(sql "SELECT count(*) FROM outbox.event_log WHERE biz_key = 'sr-2'")" 1
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" || fail "no relay after the restart"
    consume $topic 2 3000 >"$out"
    expect "events sent before the standby confirmed them" "$(wc -l <"$out")" 0

    standby_ctl -w start || fail "standby did not start again"
    consume $topic 2 30000 >"$out"
    load_consumed got_syncrep "$out"
    expect_delivered "sent once the standby confirmed them" got_syncrep \
        "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    sql "ALTER SYSTEM RESET synchronous_standby_names" && sql "SELECT pg_reload_conf()" >/dev/null
    sql "ALTER DATABASE $IT_DB RESET synchronous_commit"
    standby_ctl -m fast -w stop
    cluster_run rm -rf "$standby"
}

# stats and relay_status while the broker is down: the backlog and its age
# grow, the relay says the broker is unreachable and warns in the log; then
# every event arrives, the backlog drains and the warning is followed by a
# recovery line.
t_stats_broker_down() {
    local topic=it.stats out=$IT_TMP/stats.tsv mark
    set_setting outbox.alert_delay 2
    # The topic exists before the outage: events of a topic the producer has
    # no metadata for die of "Local: Unknown topic" if the broker stays down
    # longer than topic.metadata.propagation.max.ms (30 s), which is not what
    # this case is about (reported separately).
    sql "SELECT outbox.enqueue('T', 'st-0', '{}', topic => '$topic')" >/dev/null
    wait_until 20 "$(all_sent $topic 1)" || fail "the first event was not sent"
    kafka_kill
    mark=$(log_mark)
    sql "SELECT count(outbox.enqueue('T', 'st-' || i, '{}', topic => '$topic')) FROM generate_series(1, 50) i" >/dev/null
    wait_until 20 "SELECT backlog >= 50 AND max_delay_sec > 3 FROM outbox.stats" \
        || fail "stats did not show the backlog: $(sql "SELECT backlog || ' ' || max_delay_sec FROM outbox.stats")"
    wait_until 20 "SELECT state = 'broker unreachable' AND broker_state = 'down' FROM outbox.relay_status()" \
        || fail "relay_status did not show the broker down: $(sql "SELECT state || '/' || broker_state FROM outbox.relay_status()")"
    wait_log "$mark" 20 'WARNING:  outbox backlog: the oldest unsent event is' || fail "no backlog warning in the log"
    mark=$(log_mark)
    kafka_start || fail "broker did not restart"
    wait_until 60 "SELECT backlog = 0 AND max_delay_sec = 0 FROM outbox.stats" || fail "backlog did not drain"
    # All acknowledged: read until nothing more comes.
    consume $topic 1000 60000 3000 >"$out"
    load_consumed got_stats "$out"
    expect_delivered "events delivered after the outage" got_stats "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    expect "sent in the last minute, at least 50" "$(sql "SELECT sent_last_minute >= 50 FROM outbox.stats")" t
    expect "relay after recovery" "$(sql "SELECT broker_state || ' ' || (last_batch_at > now() - interval '1 minute') FROM outbox.relay_status()")" "up true"
    wait_log "$mark" 20 'LOG:  outbox backlog recovered' || fail "no recovery line in the log"
    set_setting outbox.alert_delay 60
}

# pause holds events back, across a server restart; resume delivers them:
# a consumer receives every event, by id, and none was produced before
# resume (the producer's timestamp of each message).
t_pause_resume() {
    local topic=it.pause out=$IT_TMP/pause.tsv resumed_ms
    sql "SELECT outbox.pause()" >/dev/null
    sql "SELECT count(outbox.enqueue('T', 'pa-' || i, '{}', topic => '$topic')) FROM generate_series(1, 20) i" >/dev/null
    wait_until 10 "SELECT state = 'paused' FROM outbox.relay_status()" || fail "relay not paused"
    cluster_ctl -m fast restart >/dev/null
    wait_until 30 "SELECT state = 'paused' FROM outbox.relay_status()" \
        || fail "relay not paused after the restart: $(sql "SELECT state FROM outbox.relay_status()")"
    holds 3 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "events marked sent while paused"
    resumed_ms=$(sql "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
    sql "SELECT outbox.resume()" >/dev/null
    wait_until 20 "$(all_sent $topic 20)" || fail "events not all marked sent after resume"
    expect_arrived pause $topic "$out"
    expect "messages produced before resume" "$(sql "SELECT count(*) FROM got_pause WHERE created_ms < $resumed_ms")" 0

    # Paused with nothing new, then events, then resume() with a long poll
    # interval: resume() wakes the relay, and its first read must see the
    # events at once, not a poll interval later (as when a window opened
    # while paused, before them, was read first).  The poll interval is
    # 60 s, so that "within 10 s" tells a wake from a poll however loaded
    # the machine: at 5 s and a 2 s bound a relay resume() left asleep
    # passed two times in five, and a loaded one that woke could fail.
    setting_applied outbox.poll_interval 60000
    sql "SELECT outbox.pause()" >/dev/null
    wait_until 10 "SELECT state = 'paused' FROM outbox.relay_status()" || fail "relay not paused again"
    sleep 1
    sql "SELECT count(outbox.enqueue('T', 'pb-' || i, '{}', topic => '$topic')) FROM generate_series(1, 5) i" >/dev/null
    resumed_ms=$(sql "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
    sql "SELECT outbox.resume()" >/dev/null
    wait_until 20 "$(all_sent $topic 25)" || fail "events enqueued while paused not all sent after resume"
    expect_arrived pause $topic "$out"
    expect "the last event enqueued while paused produced within 10 s of resume (poll interval 60 s)" \
        "$(sql "SELECT max(created_ms) - $resumed_ms < 10000 FROM got_pause")" t
    sql "ALTER SYSTEM RESET outbox.poll_interval" && sql "SELECT pg_reload_conf()" >/dev/null
}

# A paused relay is not woken by commits that only add events: each such
# wake was a signal from the committing backend and a read of the pause
# flag (outbox.relay_control) by the relay, to find itself paused again.
# 300 one-event transactions while paused cost the relay a read per poll
# interval, not one each; resume() still wakes it at once.  The poll
# interval is 60 s throughout: at the suite's 200 ms a loaded machine's
# slow enqueues alone (5 reads a second) would reach the bound of 30
# reads, and "sent within 10 s of resume" tells a wake from a poll only
# when the poll is much later than the bound.
t_paused_not_woken() {
    local topic=it.paused.quiet reads0 reads1 file=$IT_TMP/paused_enqueues.sql
    local reads="SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_all_tables WHERE relid = 'outbox.relay_control'::regclass"
    setting_applied outbox.poll_interval 60000
    sql "SELECT outbox.pause()" >/dev/null
    wait_until 10 "SELECT state = 'paused' FROM outbox.relay_status()" || fail "relay not paused"
    sleep 1.5
    reads0=$(sql "$reads")
    for i in $(seq 1 300); do
        echo "SELECT outbox.enqueue('T', 'pq-$i', '{}', topic => '$topic');"
    done >"$file"
    "$PGBIN/psql" -X -q -d "$IT_DB" -f "$file" >/dev/null
    sleep 1.5
    reads1=$(sql "$reads")
    echo "#   reads of the pause flag while 300 transactions enqueued: $((reads1 - reads0))"
    [ $((reads1 - reads0)) -lt 30 ] || fail "the paused relay read the pause flag $((reads1 - reads0)) times for 300 commits"
    sql "SELECT outbox.resume()" >/dev/null
    wait_until 10 "$(all_sent $topic 300)" || fail "events enqueued while paused not all sent within 10 s of resume (poll interval 60 s)"
    sql "ALTER SYSTEM RESET outbox.poll_interval" && sql "SELECT pg_reload_conf()" >/dev/null
}

# Retention: the relay removes sent events and claims older than their
# retention (outbox.sent_retention, outbox.dedup_retention) and keeps what
# is newer, and an old event that is dead or not sent yet.  Events are aged
# by setting created_at back; each "kept" check follows a purge proven to
# have run (it removed an aged witness in the same statement).  Every event
# is checked by id against what a consumer received.
t_retention() {
    local topic=it.retention out=$IT_TMP/retention.tsv age="interval '55 minutes'" old dead unsent witness kept
    set_setting outbox.sent_retention 3000
    set_setting outbox.dedup_retention 3000
    sql "SELECT count(outbox.enqueue('T', 're-' || i, '{}', topic => '$topic')) FROM generate_series(1, 30) i" >/dev/null
    sql "SELECT count(outbox.claim('retention-test', i)) FROM generate_series(1, 10) i" >/dev/null
    wait_until 20 "$(all_sent $topic 30)" || fail "events not sent"
    old=$(sql "SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.event_log WHERE topic = '$topic'")

    # A dead event: librdkafka refuses a message over message.max.bytes.
    set_setting outbox.kafka_properties "message.max.bytes=1000"
    dead=$(sql "SELECT outbox.enqueue('T', 're-dead', jsonb_build_object('pad', repeat('x', 2000)), topic => '$topic')")
    wait_until 30 "SELECT status = 'dead' FROM outbox.events WHERE id = $dead" \
        || fail "the oversized event is not dead: $(sql "SELECT status || '/' || attempts FROM outbox.events WHERE id = $dead")"
    sql "ALTER SYSTEM RESET outbox.kafka_properties" && sql "SELECT pg_reload_conf()" >/dev/null
    # An unsent event: the relay paused, so its cursor does not reach it.
    sql "SELECT outbox.pause()" >/dev/null
    wait_until 10 "SELECT state = 'paused' FROM outbox.relay_status()" || fail "relay not paused"
    unsent=$(sql "SELECT outbox.enqueue('T', 're-unsent', '{}', topic => '$topic')")

    # Time passes: every event so far (retention relies on ids growing with
    # created_at) older than the retention.  The sent ones and the claims go
    # (the relay purges while paused), the dead and the unsent one stay.
    sql "UPDATE outbox.event_log SET created_at = created_at - $age WHERE id <= $unsent;
         UPDATE outbox.consumer_dedup SET processed_at = processed_at - $age WHERE consumer = 'retention-test'"
    wait_until 60 "SELECT count(*) = 0 FROM outbox.event_log WHERE id IN ($old)" || fail "old sent events were not removed"
    wait_until 30 "SELECT count(*) = 0 FROM outbox.consumer_dedup WHERE consumer = 'retention-test'" || fail "old claims were not removed"
    expect "old events left by the purge" "$(sql "SELECT string_agg(id || '=' || status, ' ' ORDER BY id) FROM outbox.events WHERE topic = '$topic'")" \
        "$dead=dead $unsent=new"
    sql "SELECT outbox.resume()" >/dev/null
    wait_until 20 "SELECT status = 'sent' FROM outbox.events WHERE id = $unsent" || fail "the old unsent event was not sent after resume"

    # New events and claims are kept by the purge that removes an aged witness.
    witness=$(sql "SELECT outbox.enqueue('T', 're-witness', '{}', topic => '$topic')")
    kept=$(sql "SELECT outbox.enqueue('T', 're-kept', '{}', topic => '$topic')")
    sql "SELECT outbox.claim('retention-test', 100), outbox.claim('retention-test', 101)" >/dev/null
    wait_until 20 "SELECT count(*) = 2 FROM outbox.events WHERE id IN ($witness, $kept) AND status = 'sent'" || fail "new events not sent"
    sql "UPDATE outbox.event_log SET created_at = created_at - $age WHERE id <= $witness AND created_at > now() - $age;
         UPDATE outbox.consumer_dedup SET processed_at = processed_at - $age WHERE consumer = 'retention-test' AND event_id = 101"
    wait_until 30 "SELECT NOT EXISTS (SELECT 1 FROM outbox.event_log WHERE id = $witness)
                      AND NOT EXISTS (SELECT 1 FROM outbox.consumer_dedup WHERE consumer = 'retention-test' AND event_id = 101)" \
        || fail "the aged witness event or claim was not removed"
    expect "events kept by the purge" "$(sql "SELECT string_agg(id || '=' || status, ' ' ORDER BY id) FROM outbox.events WHERE id IN ($dead, $kept)")" \
        "$dead=dead $kept=sent"
    expect "claims kept by the purge" "$(sql "SELECT string_agg(event_id::text, ' ') FROM outbox.consumer_dedup WHERE consumer = 'retention-test'")" 100

    # All acknowledged: read until nothing more comes.  The dead one never.
    consume $topic 100 30000 3000 >"$out"
    load_consumed got_retention "$out"
    expect_delivered "events of $topic delivered" got_retention "SELECT unnest(ARRAY[$old, $unsent, $witness, $kept]::bigint[]) AS id"
    sql "DELETE FROM outbox.event_state WHERE id = $dead; DELETE FROM outbox.event_log WHERE id = $dead"
    set_setting outbox.sent_retention 3600
    set_setting outbox.dedup_retention 604800
}

# The postgres_exporter queries run, and every metric is one of their
# columns; sent_total counts the events a consumer received, by id.
t_exporter_queries() {
    local yaml=contrib/postgres_exporter/queries.yaml name query columns metric usage
    local topic=it.exporter out=$IT_TMP/exporter.tsv before produced=" " labels=" instance job server "
    while IFS=$'\t' read -r name query; do
        columns=$("$PGBIN/psql" -X -q -d "$IT_DB" --csv -c "$query" 2>&1 | head -n 1) \
            || { fail "query of $name failed: $columns"; continue; }
        while read -r metric usage; do
            [[ ",$columns," == *",$metric,"* ]] || { fail "$name: metric $metric is not a column ($columns)"; continue; }
            # What postgres_exporter makes of a column: a label, or the
            # metric QUERYNAME_COLUMN.
            if [ "$usage" = LABEL ]; then labels+="$metric "; else produced+="${name}_$metric "; fi
        done < <(awk -v block="$name:" '$0 == block {on=1; next} /^[a-z_]+:$/ {on=0}
                     on && /^    - [a-z_]+:$/ {m=$0; sub(/^    - /, "", m); sub(/:$/, "", m)}
                     on && /^        usage: / {u=$0; gsub(/.*usage: "|"$/, "", u); print m, u}' "$yaml")
    done < <(awk '/^[a-z_]+:$/ {name=$0; sub(/:$/, "", name)}
                  /^  query: / {q=$0; sub(/^  query: "/, "", q); sub(/"$/, "", q); print name "\t" q}' "$yaml")
    # The Grafana dashboard uses only metrics and labels these queries give.
    read -r -a used < <(dashboard_names metrics)
    [ "${#used[@]}" -ge 8 ] || fail "dashboard: only ${#used[@]} metrics found in its expressions"
    for metric in "${used[@]}"; do
        [[ "$produced" == *" $metric "* ]] || fail "dashboard: metric $metric is not produced by $yaml"
    done
    for metric in $(dashboard_names labels); do
        [[ "$labels" == *" $metric "* ]] || fail "dashboard: label $metric is not produced by $yaml"
    done
    expect "relay rows" "$(sql "SELECT count(*) FROM outbox.relay_status()")" 1
    before=$(sql "SELECT sent_total FROM outbox.relay_status()")
    sql "SELECT count(outbox.enqueue('T', 'exp-' || i, '{}', topic => '$topic')) FROM generate_series(1, 5) i" >/dev/null
    wait_until 20 "$(all_sent $topic 5)" || fail "events not sent"
    consume $topic 100 20000 3000 >"$out"
    load_consumed got_exporter "$out"
    expect_delivered "events delivered" got_exporter "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    wait_until 10 "SELECT sent_total >= $before + 5 FROM outbox.relay_status()" \
        || fail "sent_total went from $before to $(sql "SELECT sent_total FROM outbox.relay_status()") for 5 events delivered"
}
