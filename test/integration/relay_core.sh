# test/integration/relay_core.sh: the relay core of issue 11 (one loop,
# several batches in flight): a topic the broker refuses beside a healthy
# one, reloads while batches and retries are in flight, the relay's memory
# with large payloads, and the cost of a wake-up while an old transaction
# holds an xid.
#
# Uses the helpers of lib.sh, faults.sh (LOG_MARK, log_count, replay,
# reset_properties, relay_steady, ...), relay_hardening.sh (hold_open,
# got_every_event, setting_applied, no_crash) and launcher_cases.sh
# (consumed_ids).  Every delivery check is on the event ids a consumer read.

# us_now: the wall clock in microseconds, as outbox-consume's received_us.
us_now() {
    echo "${EPOCHREALTIME/./}"
}

# reset_setting NAME: NAME back to the suite's value (postgresql.conf).
reset_setting() {
    sql "ALTER SYSTEM RESET $1" && sql "SELECT pg_reload_conf()" >/dev/null
}

# --- a refused topic beside a healthy one (mock broker) ------------------

# The bound on a healthy topic's delivery while another is refused: its
# normal latency is well under a second; a relay that lets the refused
# topic hold it back makes it wait for librdkafka's message.timeout.ms
# (30 s here, 5 min by librdkafka's default).
HEALTHY_BOUND_S=10

# healthy_flow TOPIC N: N events of TOPIC (one key each) while a consumer
# reads it; fail unless a consumer has every one of them, by id, within
# HEALTHY_BOUND_S of their enqueue.  Prints when the last arrived.
healthy_flow() {
    local topic=$1 n=$2 out=$IT_TMP/$1.tsv start cpid ids
    mock create "$topic" 1
    # The consumer's deadline starts before the enqueue: what it read came
    # within the bound.
    mock_consume "$topic" "$n" $((HEALTHY_BOUND_S * 1000)) >"$out" &
    cpid=$!
    start=$(us_now)
    ids=$(sql "SELECT string_agg(outbox.enqueue('T', '$topic-' || i, '{}', topic => '$topic', msg_key => 'h' || i)::text, ',')
                 FROM generate_series(1, $n) i")
    wait "$cpid"
    load_consumed got_healthy "$out"
    expect_delivered "events of $topic within $HEALTHY_BOUND_S s" got_healthy "SELECT unnest(ARRAY[$ids]::bigint[]) AS id"
    echo "#   $topic: $(wc -l <"$out") of $n events within ${HEALTHY_BOUND_S} s, the last" \
        "$(sql "SELECT coalesce(((max(received_us) - $start) / 1000)::text || ' ms', 'never') FROM got_healthy")" \
        "after the enqueue began"
}

# The bound on a refusal becoming visible, from the refused event's
# enqueue: at the latest when its first try ends (message.timeout.ms, 30 s
# here), plus 10 s.
VISIBLE_BOUND_S=40

# refusal_visible TOPIC ID ERROR: event ID of TOPIC, refused, waits in
# sight: not sent nor dead, relay_status and one log line since LOG_MARK
# name the error (ERROR, a regular expression), the log line the topic,
# within VISIBLE_BOUND_S of REFUSED_AT.
refusal_visible() {
    local left=$((REFUSED_AT + VISIBLE_BOUND_S - SECONDS))
    [ "$left" -gt 0 ] || left=1
    expect "status of the refused event $2" "$(sql "SELECT status IN ('new', 'sending') FROM outbox.events WHERE id = $2")" t
    wait_until "$left" "SELECT last_error ~* '$3' FROM outbox.relay_status()" \
        || fail "relay_status does not show the refusal: $(relay_state)"
    wait_log "$LOG_MARK" 1 "$1.*($3)|($3).*$1" \
        || fail "no line in the server log names $1 and '$3'"
    log_at_most 2 "$1.*($3)|($3).*$1"
}

# refused_event TOPIC CODE KEY: make the mock's Metadata answer CODE for
# TOPIC and enqueue one event of TOPIC with KEY; its id in REFUSED_ID,
# when in REFUSED_AT (SECONDS).
refused_event() {
    mock create "$1" 1
    mock topic-error "$1" "$2"
    REFUSED_AT=$SECONDS
    REFUSED_ID=$(sql "SELECT outbox.enqueue('T', '$1-first', '{\"seq\": 1}', topic => '$1', msg_key => '$3')")
}

# properties_applied VALUE: outbox.kafka_properties set to VALUE; waits
# until the server logged the change (the value itself is hidden there).
properties_applied() {
    local mark
    mark=$(log_mark)
    set_setting outbox.kafka_properties "$1"
    wait_log "$mark" 10 'parameter "outbox.kafka_properties"' || fail "the change of outbox.kafka_properties was not logged"
}

# A topic whose metadata the broker refuses (TOPIC_AUTHORIZATION_FAILED:
# one missing ACL) gets one event; then 100 events to a healthy topic all
# arrive within HEALTHY_BOUND_S.  The refused event is dead after
# outbox.max_attempts (3), well before librdkafka's message.timeout.ms
# (30 s) would have ended its first try, and one line of the server log
# names the topic and the error.  Two events of another key in one
# transaction, the first refused at once: the second is held behind it,
# not tried while the first waits for its retries (per-key order).  Once
# the broker allows the topic, the first event, replayed, arrives.
t_refused_topic_isolated() {
    local topic=mock.refused.auth id pid first second seen
    skip_case "$(mock_topic_errors_crash)" && return
    pid=$(relay_pid)
    # librdkafka's timeout as the relay's default, set explicitly: on a
    # relay that isolates nothing the healthy topic waits for it.
    properties_applied "message.timeout.ms=30000"
    LOG_MARK=$(log_mark)
    refused_event $topic 29 K
    id=$REFUSED_ID
    healthy_flow mock.refused.auth.healthy 100
    wait_until $((REFUSED_AT + 25 - SECONDS)) "SELECT status = 'dead' AND attempts = 3 FROM outbox.events WHERE id = $id" \
        || fail "event $id not dead within 25 s: $(sql "SELECT status || '/' || attempts FROM outbox.events WHERE id = $id")"
    status_shows 'Topic authorization failed'
    wait_log "$LOG_MARK" 5 "$topic.*[Aa]uthorization|[Aa]uthorization.*$topic" \
        || fail "no line in the server log names $topic and the authorization failure"
    IFS='|' read -r first second <<<"$(sql "SELECT outbox.enqueue('T', '$topic-k2-1', '{\"seq\": 1}', topic => '$topic', msg_key => 'K2'),
                                                  outbox.enqueue('T', '$topic-k2-2', '{\"seq\": 2}', topic => '$topic', msg_key => 'K2')")"
    seen=
    for _ in $(seq 1 200); do
        seen=$(sql "SELECT CASE WHEN s.attempts > 0 AND f.status <> 'dead' THEN 'tried while the first waited'
                                WHEN f.status = 'dead' THEN 'held behind the first' END
                      FROM outbox.events f, outbox.events s WHERE f.id = $first AND s.id = $second")
        [ -n "$seen" ] && break
        sleep 0.05
    done
    expect "event $second of K2, enqueued with $first" "$seen" "held behind the first"

    mock topic-error $topic 0
    # Replayed at once, within the 5 s the relay trusts a refusal: the
    # replay has it ask the broker again, so one replay delivers.
    replay $topic >/dev/null
    wait_until 20 "SELECT status IN ('sent', 'dead') FROM outbox.events WHERE id = $id" \
        && expect "event $id after one replay at once" "$(sql "SELECT status FROM outbox.events WHERE id = $id")" sent
    got_every_event $topic "SELECT $id" 30 "$MOCK_BROKERS"
    relay_steady "$pid"
    reset_properties
}

# The bound on a refused topic's event being dead, from its enqueue: the
# broker names the refusal, so outbox.max_attempts (3) tries and their
# backoffs (at most 1 s each here) are all it takes; message.timeout.ms
# (30 s, the relay's default) is not waited for, not even once.
REFUSED_DEAD_BOUND_S=10

# refused_dies_fast MODE TOPIC CODE ERROR [BOUND [alone]]: in
# outbox.delivery MODE, the mock's Metadata answers CODE for TOPIC, whose
# one event is dead with attempts = 3 and last_error matching ERROR (a
# regular expression) within BOUND (REFUSED_DEAD_BOUND_S) s of its
# enqueue, while a healthy topic flows (unless alone).
refused_dies_fast() {
    local mode=$1 topic=$2 id dead_ms bound=${5:-$REFUSED_DEAD_BOUND_S}
    refused_event "$topic" "$3" K
    id=$REFUSED_ID
    [ "${6:-}" = alone ] || healthy_flow "$topic.healthy" 50
    if wait_until $((REFUSED_AT + bound - SECONDS))         "SELECT status = 'dead' AND attempts = 3 AND last_error ~* '$4' FROM outbox.events WHERE id = $id"; then
        dead_ms=$(sql "SELECT (extract(epoch FROM s.updated_at - l.created_at) * 1000)::int
                         FROM outbox.event_state s JOIN outbox.event_log l USING (id) WHERE id = $id")
        echo "#   $mode: event of $topic dead $dead_ms ms after its enqueue"
    else
        fail "$mode: event $id of $topic not dead with '$4' within $bound s:" \
            "$(sql "SELECT status || '/' || attempts || '/' || coalesce(last_error, '(no error)') FROM outbox.events WHERE id = $id")"
    fi
}

# Topics the broker refuses for good (TOPIC_AUTHORIZATION_FAILED: one
# missing ACL; INVALID_TOPIC_EXCEPTION) each get one event, in both
# delivery modes: each is dead with the cluster's error after
# outbox.max_attempts tries, within seconds of its enqueue (with 6 s
# backoffs, within 20 s), while a healthy topic keeps flowing.  Before, the event waited 'sending', with
# no attempt and no error, for minutes.
t_refused_topic_dead_fast() {
    local pid
    skip_case "$(mock_topic_errors_crash)" && return
    pid=$(relay_pid)
    reset_properties
    LOG_MARK=$(log_mark)
    refused_dies_fast at_least_once mock.dead.auth 29 '[Aa]uthoriz'
    refused_dies_fast at_least_once mock.dead.invalid 17 'invalid'
    # Alone: no later acknowledgement shows the event stuck.
    refused_dies_fast at_least_once mock.dead.alone 29 '[Aa]uthoriz' $REFUSED_DEAD_BOUND_S alone
    # Tries further apart than the relay believes a refusal (5 s): each
    # asks the cluster again, none waits for message.timeout.ms.
    set_setting outbox.backoff_min 6000
    set_setting outbox.backoff_max 6000
    refused_dies_fast at_least_once mock.dead.auth.slow 29 '[Aa]uthoriz' 20
    reset_setting outbox.backoff_min
    reset_setting outbox.backoff_max
    mock_eos_ready mock.dead.eos.ready || return
    refused_dies_fast exactly_once mock.dead.eos.auth 29 '[Aa]uthoriz'
    refused_dies_fast exactly_once mock.dead.eos.invalid 17 'invalid'
    set_delivery at_least_once
    log_shows 'outbox relay: event [0-9]+ is dead after 3 failed attempts: .*mock.dead.auth'
    relay_steady "$pid"
}

# A topic the broker says does not exist (UNKNOWN_TOPIC_OR_PART: created
# late, auto-create off) holds an event of key K, which waits for it (not
# dead: outbox.missing_topic_dead is off); the healthy topic flows as
# above, and a second event of K waits behind the first.  Once the topic
# exists both arrive, the first before the second.
t_unknown_topic_isolated() {
    local topic=mock.refused.unknown first second pid out=$IT_TMP/unknown.tsv
    pid=$(relay_pid)
    properties_applied "message.timeout.ms=30000"
    LOG_MARK=$(log_mark)
    refused_event $topic 3 K
    first=$REFUSED_ID
    healthy_flow mock.refused.unknown.healthy 100
    second=$(sql "SELECT outbox.enqueue('T', '$topic-second', '{\"seq\": 2}', topic => '$topic', msg_key => 'K')")
    refusal_visible $topic "$first" 'to be created'
    # Per-key order: the second does not overtake the first that waits.
    holds 3 "SELECT (SELECT status FROM outbox.events WHERE id = $second) <> 'sent'" \
        || fail "event $second of key K was sent while event $first of K waited"

    mock topic-error $topic 0
    got_every_event $topic "SELECT unnest(ARRAY[$first, $second])" 90 "$MOCK_BROKERS"
    # All acknowledged: read until nothing more comes, in offset order.
    mock_consume $topic 100 20000 3000 >"$out"
    expect "events of K in offset order" "$(consumed_in_order "$out" | tr '\n' ' ')" "$first $second "
    relay_steady "$pid"
    reset_properties
}

# How late a healthy topic's events may leave (the relay's send, from
# their enqueue) while a batch of retries waits for its answer: first
# sends wait for it RETRIES_FIRST_MS (200) at most.
RETRIES_WAIT_BOUND_MS=600

# A batch of retries that Kafka answers late (the broker answers 1.5 s
# late from the moment the retry of a missing topic's event is due, the
# topic created meanwhile), while 200 events/s of a healthy topic are
# enqueued: they leave within RETRIES_WAIT_BOUND_MS of their enqueue.
# First sends wait for a batch of retries in flight (held_chain_ends),
# not for as long as it is.
t_retries_answered_late() {
    local topic=mock.retries.late healthy=mock.retries.healthy script=$IT_TMP/retries_late.pgbench
    local out=$IT_TMP/retries_late.tsv writer from to n worst
    mock create $healthy 1
    sql "SELECT outbox.enqueue('T', 'rl-0', '{}', topic => '$healthy')" >/dev/null
    wait_until 20 "$(all_sent $healthy 1)" || { fail "the healthy topic's first event was not sent"; return; }
    # librdkafka holds a missing topic's message 2 s (not 30) before it
    # fails it.
    properties_applied "topic.metadata.propagation.max.ms=2000"
    refused_event $topic 3 K
    wait_until 20 "SELECT attempts >= 1 FROM outbox.events WHERE id = $REFUSED_ID" \
        || { fail "event $REFUSED_ID did not fail once"; return; }
    mock create $topic 1
    mock topic-error $topic 0
    mock rtt 1500
    cat >"$script" <<SQL
\set k random(0, 19)
SELECT outbox.enqueue('T', 'rl-' || gen_random_uuid(), '{}', topic => '$healthy', msg_key => 'h' || :k);
SQL
    from=$(sql "SELECT max(id) FROM outbox.event_log")
    "$PGBIN/pgbench" -n -c 2 -j 2 -R 200 -T 4 -f "$script" "$IT_DB" >"$IT_TMP/retries_late.log" 2>&1 \
        || fail "pgbench failed: $(tail -3 "$IT_TMP/retries_late.log")"
    to=$(sql "SELECT max(id) FROM outbox.event_log")
    n=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$healthy' AND id > $from AND id <= $to")
    mock_consume $healthy "$((n + 1))" 30000 >"$out" || fail "not all $n events of $healthy arrived"
    mock rtt 0
    wait_until 20 "SELECT status = 'sent' FROM outbox.events WHERE id = $REFUSED_ID" \
        || fail "event $REFUSED_ID was not sent once its topic existed"
    load_consumed got_retries_late "$out"
    worst=$(sql "SELECT round(max(g.created_ms - extract(epoch FROM l.created_at) * 1000))
                   FROM outbox.event_log l JOIN got_retries_late g ON g.event_id = l.id
                  WHERE l.topic = '$healthy' AND l.id > $from AND l.id <= $to")
    echo "#   $n events of $healthy enqueued while the retry of event $REFUSED_ID waited 1.5 s for its answer:" \
         "sent within $worst ms of their enqueue"
    [ "${worst:-99999}" -le "$RETRIES_WAIT_BOUND_MS" ] \
        || fail "an event of $healthy left $worst ms after its enqueue (bound $RETRIES_WAIT_BOUND_MS ms)"
    reset_properties
}

# consumed_in_order FILE: the event ids of FILE (one partition) in offset
# order, each once.
consumed_in_order() {
    sort -t $'\t' -k3,3n "$1" | cut -f5 | sed -n 's/^event_id=\([0-9]*\).*/\1/p' | awk '!seen[$0]++'
}

# --- reloads while batches and retries are in flight (mock broker) -------

# flight_stream TOPIC ROUNDS: ROUNDS transactions of 20 events of TOPIC
# on 8 keys, one every 0.1 s; their ids go to table it_flight_ids.
flight_stream() {
    for r in $(seq 1 "$2"); do
        sql "INSERT INTO it_flight_ids SELECT outbox.enqueue('T', 'rf-$r-' || j, jsonb_build_object('r', $r, 'j', j),
                                                             topic => '$1', msg_key => 'k' || (j % 8))
               FROM generate_series(1, 20) j" || echo "round $r failed"
        sleep 0.1
    done
}

# reload_step N: the Nth reload of the cycle: outbox.batch_size up and
# down, outbox.kafka_brokers between two spellings of the mock's one
# broker (each a new producer), outbox.kafka_properties between linger.ms
# values; now and then the broker refuses a produce request (a retry with
# backoff) or answers some with a retriable error (librdkafka's own retry).
reload_step() {
    case $(($1 % 10)) in
        0) set_setting outbox.batch_size 500 ;;
        1) set_setting outbox.kafka_brokers "$MOCK_BROKERS,$MOCK_BROKERS"; mock request-errors 0 1 10 ;;
        2) set_setting outbox.kafka_properties "linger.ms=50" ;;
        3) set_setting outbox.batch_size 20 ;;
        4) set_setting outbox.kafka_brokers "$MOCK_BROKERS"; mock produce-errors 3 6 ;;
        5) set_setting outbox.kafka_properties "linger.ms=0" ;;
        6) set_setting outbox.batch_size 200; mock request-errors 0 1 10 ;;
        7) set_setting outbox.kafka_properties "linger.ms=5;client.id=outbox-relay-flight" ;;
        8) set_setting outbox.batch_size 50 ;;
        9) set_setting outbox.kafka_brokers "$MOCK_BROKERS,$MOCK_BROKERS"; mock produce-errors 3 6 ;;
    esac
}

# A steady stream (about 150 events/s, batches of 50, a broker answering
# 200 ms late: several batches would be in flight) while outbox.batch_size,
# outbox.kafka_brokers and outbox.kafka_properties are reloaded every
# 0.7 s and produce requests are refused now and then.  Every committed
# event arrives, by id; the server never restarted (a relay crash restarts
# every process: pg_postmaster_start_time() changes) and the relay process
# never ended.  outbox.max_attempts is raised: a refusal must not kill an
# event here, it is a retry in flight.
t_reload_in_flight() {
    local topic=mock.reload.flight started pid stream steps=0 busy=0 pids
    mock create $topic 4
    started=$(sql "SELECT pg_postmaster_start_time()")
    pid=$(relay_pid)
    pids=$pid
    LOG_MARK=$(log_mark)
    set_setting outbox.max_attempts 100
    setting_applied outbox.batch_size 50
    mock rtt 200
    sql "SET client_min_messages = warning; DROP TABLE IF EXISTS it_flight_ids; CREATE TABLE it_flight_ids (id bigint)"
    flight_stream $topic 200 >"$IT_TMP/flight.log" 2>&1 &
    stream=$!
    while kill -0 "$stream" 2>/dev/null; do
        reload_step $steps
        steps=$((steps + 1))
        [ "$(sql "SELECT count(*) > 0 FROM outbox.events WHERE topic = '$topic' AND status <> 'sent'")" = t ] && busy=$((busy + 1))
        [[ " $pids " == *" $(relay_pid) "* ]] || pids="$pids $(relay_pid)"
        sleep 0.7
    done
    wait "$stream"
    mock clear
    mock rtt 0
    echo "#   $steps reloads, $busy of them with events of $topic unsent; relay pids seen: $pids"
    [ "$(grep -c failed "$IT_TMP/flight.log")" = 0 ] || fail "enqueues failed: $(head -3 "$IT_TMP/flight.log")"
    [ $((busy * 2)) -ge "$steps" ] || fail "only $busy of $steps reloads came while events were in flight"
    got_every_event $topic "SELECT id FROM it_flight_ids" 120 "$MOCK_BROKERS"
    echo "#   $(sql "SELECT count(*) FROM it_flight_ids") events delivered, $(duplicates got_every) duplicates"
    expect "postmaster start time" "$(sql "SELECT pg_postmaster_start_time()")" "$started"
    no_crash
    relay_steady "$pid"
    for s in outbox.batch_size outbox.max_attempts outbox.kafka_properties; do
        sql "ALTER SYSTEM RESET $s"
    done
    set_setting outbox.kafka_brokers "$MOCK_BROKERS"
}

# --- the relay's memory with large payloads (real broker) ----------------

# The bound on the relay's anonymous memory while it relays 100 events of
# 1 MiB: the issue's target is "well under a few hundred MB whatever the
# payloads"; with every event of a batch held at once the relay of 0.2.0
# reached 320 MB of RSS.
PEAK_RSS_ANON_BOUND_MB=200

# topic_max_message_bytes TOPIC BYTES: the real broker's limit for TOPIC.
topic_max_message_bytes() {
    java -cp "$KAFKA_CP" kafka.admin.ConfigCommand --bootstrap-server "$KAFKA_BROKERS" \
        --entity-type topics --entity-name "$1" --alter --add-config "max.message.bytes=$2" >>"$IT_TMP/config.log" 2>&1
}

# topic_default_max_message_bytes TOPIC: the broker's default limit for TOPIC again.
topic_default_max_message_bytes() {
    java -cp "$KAFKA_CP" kafka.admin.ConfigCommand --bootstrap-server "$KAFKA_BROKERS" \
        --entity-type topics --entity-name "$1" --alter --delete-config max.message.bytes >>"$IT_TMP/config.log" 2>&1
}

# sample_memory PID: every 50 ms, "RssAnon VmHWM" (kB) of process PID,
# until it is gone.  RssAnon, not VmRSS: shared buffers the relay touches
# count in VmRSS and VmHWM, and are not the relay's own.
sample_memory() {
    while [ -r "/proc/$1/status" ]; do
        awk '/^RssAnon:/ { a = $2 } /^VmHWM:/ { h = $2 } END { if (a) print a, h }' "/proc/$1/status" 2>/dev/null
        sleep 0.05
    done
}

# big_events TOPIC N: N events of TOPIC in one transaction, each payload
# random hex text of 1,048,000 bytes (enqueue measures the compact JSON:
# {"d":"..."} is the text plus 8 bytes); their ids, comma-separated.
big_events() {
    sql "SELECT string_agg(outbox.enqueue('T', 'mem-' || i,
                   jsonb_build_object('d', (SELECT string_agg(md5(i || '-' || g || random()), '')
                                              FROM generate_series(1, 32750) g)),
                   topic => '$1')::text, ',')
           FROM generate_series(1, $2) i"
}

# without_values FILE: outbox-consume output with every value replaced by
# {}, to load 100 MB of messages as their ids.
without_values() {
    awk -F '\t' -v OFS='\t' '{ $6 = "{}"; print }' "$1"
}

# 100 events of 1 MiB: a consumer receives every one, by id, and the
# relay's peak RssAnon, sampled every 50 ms while they are relayed, stays
# under PEAK_RSS_ANON_BOUND_MB.  The topic and librdkafka take messages of
# 1.2 MB (the broker's and librdkafka's defaults are just under 1 MiB),
# and so does outbox.max_payload_size.
t_payload_memory() {
    local topic=it.memory out=$IT_TMP/memory.tsv samples=$IT_TMP/memory.samples pid sampler first ids peak hwm base
    first=$(sql "SELECT outbox.enqueue('T', 'mem-0', '{}', topic => '$topic')")
    wait_until 20 "$(all_sent $topic 1)" || fail "the topic's first event was not sent"
    topic_max_message_bytes $topic 1200000 || fail "could not raise max.message.bytes of $topic: $(tail -3 "$IT_TMP/config.log")"
    properties_applied "message.max.bytes=1200000"
    set_setting outbox.max_payload_size 1200000
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    base=$(awk '/^RssAnon:/ { print $2 }' "/proc/$pid/status")
    sample_memory "$pid" >"$samples" &
    sampler=$!
    ids=$(big_events $topic 100)
    consume $topic 101 120000 >"$out" || fail "not all 101 events arrived ($(wc -l <"$out"))"
    kill "$sampler"
    wait "$sampler" 2>/dev/null
    without_values "$out" >"$out.ids"
    load_consumed got_memory "$out.ids"
    expect_delivered "events of $topic" got_memory "SELECT unnest(ARRAY[$first, $ids]::bigint[]) AS id"
    peak=$(awk '$1 > m { m = $1 } END { print int(m / 1024) }' "$samples")
    hwm=$(awk '$2 > m { m = $2 } END { print int(m / 1024) }' "$samples")
    echo "#   relay RssAnon: $((base / 1024)) MB before, peak $peak MB (bound $PEAK_RSS_ANON_BOUND_MB MB);" \
        "VmHWM $hwm MB; $(wc -l <"$samples") samples"
    [ "$peak" -lt "$PEAK_RSS_ANON_BOUND_MB" ] || fail "the relay's RssAnon peaked at $peak MB, bound $PEAK_RSS_ANON_BOUND_MB MB"
    relay_steady "$pid"
    reset_properties
    reset_setting outbox.max_payload_size
}

# --- sizes that hold end to end (real broker) ----------------------------

# At the default outbox.max_payload_size (1,000,000 bytes, librdkafka's
# message.max.bytes) and the broker's default max.message.bytes: the
# largest event enqueue accepts is delivered, and one a byte larger is
# refused by enqueue (22001).  librdkafka counts 36 bytes of record
# framing, the key, the value, and each header's name, value and their
# varint lengths: event_id (8 + at most 19 + 2), biz_type T (8 + 1 + 2),
# biz_key (7 + 8 + 2), outbox_source (13 + 53 + 2): 161 bytes and a key
# of 8 leave 999,831 for the value.  Before, enqueue counted neither the relay's headers nor the
# framing, up to 1 MiB: events from about 1,000,000 bytes on were
# accepted and then dead.  Then message.max.bytes below the limit is said
# in the log, with a hint.
t_size_limit_default() {
    local topic=it.size out=$IT_TMP/size.tsv id got mark
    reset_properties
    reset_setting outbox.max_payload_size
    expect "default limit" "$(sql "SHOW outbox.max_payload_size")" 1000000B
    got=$(sql "SELECT outbox.enqueue_bytes('T', 'size-over', decode(repeat('00', 999832), 'hex'), topic => '$topic')" 2>&1)
    [[ $got == *"ERROR:  event is too large"* ]] || fail "an event a byte over the limit: got '$got'"
    got=$(sql "SELECT outbox.enqueue_bytes('T', 'size-max', decode(repeat('5a', 999831), 'hex'), topic => '$topic')" 2>&1)
    [[ $got =~ ^[0-9]+$ ]] || { fail "the largest event was refused: $got"; return; }
    id=$got
    consume $topic 1 30000 >"$out" || fail "the largest event did not arrive"
    load_consumed got_size "$out"
    expect "the largest event's value length" "$(sql "SELECT length(value) FROM got_size WHERE event_id = $id")" 999831
    wait_until 10 "$(all_sent $topic 1)" || fail "the largest event is not sent: $(sql "SELECT status || '/' || coalesce(last_error, '') FROM outbox.events WHERE id = $id")"

    mark=$(log_mark)
    properties_applied "message.max.bytes=500000"
    wait_log "$mark" 20 'WARNING:  outbox relay: outbox.max_payload_size \(1000000 bytes\) exceeds the producer.s message.max.bytes \(500000 bytes\)' \
        || fail "no warning that outbox.max_payload_size exceeds message.max.bytes"
    log_since "$mark" | grep -q 'HINT:  Lower outbox.max_payload_size, or raise message.max.bytes' \
        || fail "the warning has no hint"
    reset_properties
}

# --- a wake-up's cost with an old transaction open (real broker) ---------

# The bound on the rows of outbox.event_log the relay reads in 10 s in
# which it relays one event, while an old transaction holds back 20,000
# events: a read that depends on the new events only reads a few; one that
# starts from the old transaction's xid reads all 20,000 at each check.
WAKE_ROWS_BOUND=2000

# event_log_reads: rows of outbox.event_log read by every session so far:
# returned by its sequential scans and by scans of its btree indexes (a
# BRIN bitmap scan counts ten per page, whatever it returns).
event_log_reads() {
    sql "SELECT t.seq_tup_read + COALESCE((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                                              JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
                                             WHERE i.relid = t.relid AND a.amname = 'btree'), 0)
           FROM pg_stat_user_tables t WHERE t.relid = 'outbox.event_log'::regclass"
}

# The bound on the index pages of outbox.event_log the relay touches in
# those 10 s.  Rows an index scan passes over without returning them are
# not counted as read: a scan that starts from the index's first page and
# skips to the window touches every page before it at each check.
WAKE_PAGES_BOUND=200

# event_log_index_pages: pages of outbox.event_log's indexes read or found
# in shared buffers by every session so far.
event_log_index_pages() {
    sql "SELECT sum(idx_blks_read + idx_blks_hit) FROM pg_statio_user_indexes
          WHERE relid = 'outbox.event_log'::regclass"
}

# settled_reads [COUNTER]: COUNTER (event_log_reads) once unchanged for
# 2 s (the relay has flushed its statistics), 20 s at most.
settled_reads() {
    local counter=${1:-event_log_reads} last now deadline=$((SECONDS + 20))
    last=$($counter)
    while [ $SECONDS -lt $deadline ]; do
        sleep 2
        now=$($counter)
        [ "$now" = "$last" ] && break
        last=$now
    done
    echo "$last"
}

# prepare_event TOPIC GID: a prepared transaction GID holding one event of
# TOPIC; prints the event's id.
prepare_event() {
    "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$IT_DB" \
        -c "BEGIN" -c "SELECT outbox.enqueue('T', 'ox-prepared', '{}', topic => '$1')" -c "PREPARE TRANSACTION '$2'"
}

# A session holds an xid open and a prepared transaction holds an event
# while 20,000 events are enqueued and relayed.  Then, with
# outbox.poll_interval at 60 s, the relay reads fewer than WAKE_ROWS_BOUND
# rows of outbox.event_log in the 10 s in which one more event is enqueued
# and relayed (its periodic checks included).  No session of the case
# reads outbox.event_log meanwhile: ids are kept in it_oldxid_ids.
# COMMIT PREPARED then wakes the relay: Kafka has the prepared event
# within 10 s (by the producer's timestamp); once the open session ends,
# a consumer has every event exactly once.
t_old_xid_cost() {
    local topic=it.oldxid out=$IT_TMP/oldxid.tsv prepared r0 r1 w0 w1 p0 p1 start committed_ms lag
    sql "SET client_min_messages = warning; DROP TABLE IF EXISTS it_oldxid_ids; CREATE TABLE it_oldxid_ids (id bigint)"
    hold_open "SELECT pg_current_xact_id()"
    prepared=$(prepare_event $topic it_oldxid)
    [ -n "$prepared" ] || fail "could not prepare a transaction"
    r0=$(settled_reads)
    for b in 1 2 3 4; do
        sql "INSERT INTO it_oldxid_ids SELECT outbox.enqueue('T', 'ox-$b-' || i, '{}', topic => '$topic')
               FROM generate_series(1, 5000) i"
    done
    got_every_event $topic "SELECT id FROM it_oldxid_ids" 120
    setting_applied outbox.poll_interval 60000
    r1=$(settled_reads)
    # The relay's reads show in the counters: it read each event once.
    [ $((r1 - r0)) -ge 20000 ] || fail "relaying 20,000 events read $((r1 - r0)) rows of outbox.event_log: statistics not flushed?"

    w0=$(settled_reads)
    p0=$(event_log_index_pages)
    start=$SECONDS
    sql "INSERT INTO it_oldxid_ids SELECT outbox.enqueue('T', 'ox-one', '{}', topic => '$topic')"
    consume $topic 20001 20000 >"$out" || fail "the one event did not arrive ($(wc -l <"$out") of 20,001)"
    [ $((start + 10 - SECONDS)) -le 0 ] || sleep $((start + 10 - SECONDS))
    w1=$(settled_reads)
    p1=$(settled_reads event_log_index_pages)
    echo "#   rows of outbox.event_log read: $((r1 - r0)) to relay 20,000; $((w1 - w0)) in the $((SECONDS - start)) s relaying one more (bound $WAKE_ROWS_BOUND), index pages $((p1 - p0)) (bound $WAKE_PAGES_BOUND)"
    [ $((w1 - w0)) -lt $WAKE_ROWS_BOUND ] || fail "the relay read $((w1 - w0)) rows of outbox.event_log to relay one event"
    [ $((p1 - p0)) -lt $WAKE_PAGES_BOUND ] || fail "the relay touched $((p1 - p0)) index pages of outbox.event_log to relay one event"

    committed_ms=$(($(us_now) / 1000))
    sql "COMMIT PREPARED 'it_oldxid'"
    # The consumer reads the 20,001 before it too: its own time is not the
    # relay's (the lag below is measured from the producer's timestamp).
    consume $topic 20002 30000 >"$out" || fail "the prepared event did not arrive within 30 s"
    load_consumed got_oldxid "$out"
    lag=$(sql "SELECT created_ms - $committed_ms FROM got_oldxid WHERE event_id = ${prepared:-0}")
    echo "#   the prepared event was sent ${lag:-never} ms after COMMIT PREPARED"
    # 10 s, far below the 60 s poll interval a relay not woken waits for;
    # the docs promise a wake at commit, no figure in ms, and a loaded
    # machine's relay may take more than the 2 s this bound was.
    [ -n "$lag" ] && [ "$lag" -le 10000 ] || fail "COMMIT PREPARED did not wake the relay: sent ${lag:-never} ms after"

    release_hold
    sql "SELECT outbox.enqueue('T', 'ox-last', '{}', topic => '$topic')" >/dev/null
    reset_setting outbox.poll_interval
    consume $topic 100000 30000 3000 >"$out"
    load_consumed got_oldxid "$out"
    expect_delivered "events of $topic" got_oldxid \
        "SELECT id FROM it_oldxid_ids UNION ALL SELECT ${prepared:-0} UNION ALL SELECT id FROM outbox.event_log WHERE biz_key = 'ox-last'"
    expect "duplicates" "$(duplicates got_oldxid)" 0
    sql "SELECT gid FROM pg_prepared_xacts WHERE gid = 'it_oldxid'" | grep -q . && sql "ROLLBACK PREPARED 'it_oldxid'"
    sql "DROP TABLE it_oldxid_ids"
}
