# test/integration/late_topics.sh: topics created late (issue 32), on a
# real broker of their own that does not create topics on first use
# (auto.create.topics.enable=false): the suite's broker creates them, and
# must keep doing so for the other cases.
#
# Uses the helpers of lib.sh, faults.sh (log_count, reset_properties),
# relay_core.sh (reset_setting, properties_applied, consumed_in_order),
# relay_hardening.sh (got_every_event, setting_applied) and
# exactly_once.sh (set_delivery).

# A healthy topic's events, enqueued with the missing topic's, are all
# sent within this many seconds (they take well under one alone).
LATE_HEALTHY_BOUND_S=5

# How long the missing topic's events must wait undead: the old rule made
# them dead after outbox.max_attempts (3) x (topic.metadata.propagation.max.ms
# (2 s) + outbox.backoff_max (1 s)), 9 s at most.
LATE_WAIT_S=10

# late_broker_start: a one-node broker with auto.create.topics.enable=false,
# the relay sending to it; LATE_BROKERS is its address.
late_broker_start() {
    kcluster_setup "$IT_TMP/klate" 1 || return 1
    sed -i 's/^auto.create.topics.enable=.*/auto.create.topics.enable=false/' "$IT_TMP/klate/1/server.properties"
    kcluster_start || return 1
    LATE_BROKERS=$KCLUSTER_BROKERS
    late_create_topic it.late.ready || return 1
    setting_applied outbox.kafka_brokers "$LATE_BROKERS"
    # librdkafka's 30 s for a topic's metadata to propagate would make the
    # old rule's deaths slow to come; 2 s keeps the case short.
    properties_applied "topic.metadata.propagation.max.ms=2000"
    sql "SELECT outbox.enqueue('T', 'late-ready-' || clock_timestamp(), '{}', topic => 'it.late.ready')" >/dev/null
    wait_until 30 "SELECT count(*) = 0 FROM outbox.events WHERE topic = 'it.late.ready' AND status <> 'sent'"
}

# late_broker_stop: the relay back on the suite's broker, settings as
# they were.
late_broker_stop() {
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    reset_properties
    reset_setting outbox.missing_topic_dead
    kcluster_stop
}

# late_create_topic TOPIC... : create each TOPIC (3 partitions) with Kafka's
# Java admin client (test/tools/create-topic, compiled once per run).
late_create_topic() {
    local classes=$IT_TMP/create-topic
    [ -f "$classes/CreateTopic.class" ] ||
        javac --release 17 -d "$classes" -cp "$KAFKA_CP" "$TOOLS/create-topic/CreateTopic.java" \
        || { fail "could not compile CreateTopic"; return 1; }
    java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$KAFKA_CP:$classes" CreateTopic \
        "$LATE_BROKERS" 3 "$@" >"$IT_TMP/late_topic.log" 2>&1 \
        || { fail "could not create topics $*: $(tail -3 "$IT_TMP/late_topic.log")"; return 1; }
}

# late_enqueue TOPIC KEYS PER_KEY: PER_KEY events on each of KEYS keys of
# TOPIC, in one transaction, key after key in turn.
late_enqueue() {
    sql "SELECT count(outbox.enqueue('T', '$1-' || n || '-' || k, jsonb_build_object('n', n),
                                      topic => '$1', msg_key => 'k' || k))
           FROM generate_series(1, $3) n, generate_series(1, $2) k" >/dev/null
}

# late_in_key_order FILE TOPIC: the keys of TOPIC whose events FILE
# (consumer output) holds out of id order, or twice; empty if none.
late_in_key_order() {
    load_consumed late_got "$1"
    sql "SELECT key FROM (SELECT key, event_id, lag(event_id) OVER (PARTITION BY key ORDER BY part, off) AS prev
                            FROM late_got) g
          WHERE prev >= event_id GROUP BY key ORDER BY key"
}

# late_stream TOPIC N: N events of TOPIC, one every 0.2 s, each carrying
# its enqueue time (ms since the epoch) as "t".
late_stream() {
    for n in $(seq 1 "$2"); do
        sql "SELECT outbox.enqueue('T', '$1-' || $n, jsonb_build_object('t', (extract(epoch FROM clock_timestamp()) * 1000)::bigint),
                                   topic => '$1', msg_key => 's' || $n)" >/dev/null
        sleep 0.2
    done
}

# late_latency FILE: "max median" of the delay, in ms, from enqueue to
# the consumer's receipt of the events in FILE (consumer output of
# late_stream's events).
late_latency() {
    load_consumed late_stream_got "$1"
    sql "SELECT max(d)::int || ' ' || (percentile_cont(0.5) WITHIN GROUP (ORDER BY d))::int
           FROM (SELECT received_us / 1000 - (value::jsonb ->> 't')::bigint AS d FROM late_stream_got) g"
}

# late_case DELIVERY: the case below, in outbox.delivery DELIVERY; its
# topics are named after it.
late_case() {
    local missing=it.late.$1.missing healthy=it.late.$1.healthy stream=it.late.$1.stream
    local mark started took consumer streamer latency out=$IT_TMP/late.tsv streamed=$IT_TMP/late_stream.tsv
    late_create_topic $healthy $stream || return 1
    [ "$1" = at_least_once ] || set_delivery "$1"
    sql "SELECT outbox.enqueue('T', 'late-ready-' || clock_timestamp(), '{}', topic => 'it.late.ready')" >/dev/null
    wait_until 60 "SELECT count(*) = 0 FROM outbox.events WHERE topic = 'it.late.ready' AND status <> 'sent'" \
        || { fail "nothing sent in $1"; return 1; }
    mark=$(log_mark)
    started=$(us_now)
    sql "BEGIN; SELECT count(outbox.enqueue('T', '$healthy-' || n, '{}', topic => '$healthy', msg_key => 'h' || n))
                  FROM generate_series(1, 100) n;
                SELECT count(outbox.enqueue('T', '$missing-' || n || '-' || k, jsonb_build_object('n', n),
                                            topic => '$missing', msg_key => 'k' || k))
                  FROM generate_series(1, 4) n, generate_series(1, 5) k;
         COMMIT" >/dev/null
    wait_until $((LATE_HEALTHY_BOUND_S + 5)) "$(all_sent $healthy 100)" \
        || fail "the existing topic's events were not all sent: $(sql "SELECT count(*) FROM outbox.events WHERE topic = '$healthy' AND status = 'sent'") of 100"
    took=$((($(us_now) - started) / 1000))
    echo "#   $1: the existing topic's 100 events sent $took ms after the commit"
    [ "$took" -le $((LATE_HEALTHY_BOUND_S * 1000)) ] || fail "the existing topic's events took $took ms, bound ${LATE_HEALTHY_BOUND_S} s"

    wait_until 20 "SELECT count(*) > 0 FROM outbox.events WHERE topic = '$missing'
                     AND last_error LIKE 'waiting for topic \"$missing\" to be created%'" \
        || fail "no event says it waits for the topic: $(sql "SELECT DISTINCT status || ': ' || coalesce(last_error, '') FROM outbox.events WHERE topic = '$missing'")"
    sql "SELECT last_error FROM outbox.relay_status()" | grep -q "waiting for topic \"$missing\" to be created" \
        || fail "relay_status() does not say what the events wait for: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"
    # Meanwhile another topic streams: its delay is what the missing one costs.
    IT_BROKERS=$LATE_BROKERS consume $stream 50 $((LATE_WAIT_S * 1000 + 20000)) >"$streamed" &
    consumer=$!
    late_stream $stream 50 &
    streamer=$!
    holds $LATE_WAIT_S "SELECT count(*) FILTER (WHERE status IN ('dead', 'sent')) = 0 FROM outbox.events WHERE topic = '$missing'" \
        || fail "events of the missing topic dead or sent: $(sql "SELECT status || ' ' || count(*) FROM outbox.events WHERE topic = '$missing' GROUP BY status")"
    wait "$streamer" "$consumer"
    latency=$(late_latency "$streamed")
    echo "#   $1: after ${LATE_WAIT_S} s, attempts of the missing topic's events: $(sql "SELECT min(attempts) || '..' || max(attempts) FROM outbox.events WHERE topic = '$missing'"); another topic's 50 events meanwhile: delay max ${latency% *} ms, median ${latency#* } ms"
    expect "events of the stream received" "$(sql "SELECT count(DISTINCT event_id) FROM late_stream_got")" 50
    [ "${latency% *}" -le $((LATE_HEALTHY_BOUND_S * 1000)) ] || fail "another topic's events took up to ${latency% *} ms, bound ${LATE_HEALTHY_BOUND_S} s"
    expect "log lines naming the missing topic" \
        "$(log_since "$mark" | grep -c "\"$missing\"")" 1
    log_since "$mark" | grep -A2 "events wait for topic \"$missing\" to be created" | grep -q "HINT:  Create the topic in Kafka" \
        || fail "the log line has no HINT to create the topic: $(log_since "$mark" | grep -A2 "$missing")"

    late_create_topic $missing || return 1
    started=$(us_now)
    wait_until 30 "$(all_sent $missing 20)" \
        || fail "the missing topic's events were not all sent once it was created: $(sql "SELECT status || ' ' || count(*) FROM outbox.events WHERE topic = '$missing' GROUP BY status")"
    echo "#   $1: delivered $((($(us_now) - started) / 1000)) ms after the topic was created"
    IT_BROKERS=$LATE_BROKERS consume $missing 1000 15000 3000 >"$out"
    load_consumed late_got "$out"
    expect_delivered "the missing topic's events" late_got "SELECT id FROM outbox.events WHERE topic = '$missing'"
    expect "duplicates" "$(duplicates late_got)" 0
    expect "keys out of order" "$(late_in_key_order "$out")" ""
}

# The cluster does not create topics on first use.  Events of a topic not
# created yet (20 on 5 keys) are enqueued in one transaction with 100
# events of an existing topic: those are sent within
# LATE_HEALTHY_BOUND_S.  The missing topic's wait, none dead after
# LATE_WAIT_S (the old rule: dead within 9 s), each saying what it waits
# for in outbox.events, relay_status() saying it too, and one line of the
# server log naming the topic, with a HINT to create it; another topic's
# events, streamed meanwhile, arrive within LATE_HEALTHY_BOUND_S.  Once the
# topic is created every event arrives once, in id order per key.  With
# outbox.missing_topic_dead on, events of another missing topic become
# dead after outbox.max_attempts.
t_topic_created_late() {
    local dead=it.late.dead mark
    late_broker_start || { fail "the broker without auto-create did not start"; late_broker_stop; return; }
    late_case at_least_once || { late_broker_stop; return; }

    setting_applied outbox.missing_topic_dead on
    mark=$(log_mark)
    sql "SELECT count(outbox.enqueue('T', '$dead-' || n, '{}', topic => '$dead', msg_key => 'd' || n))
           FROM generate_series(1, 3) n" >/dev/null
    wait_until 30 "SELECT count(*) FILTER (WHERE status = 'dead') = 3 FROM outbox.events WHERE topic = '$dead'" \
        || fail "with outbox.missing_topic_dead on, events of a missing topic are not dead: $(sql "SELECT status || ' ' || attempts || ' ' || coalesce(last_error, '') FROM outbox.events WHERE topic = '$dead'")"
    log_since "$mark" | grep -q "outbox.missing_topic_dead is on, become dead after" \
        || fail "the log does not say the events become dead: $(log_since "$mark" | grep -A2 "$dead" | head -6)"
    late_broker_stop
}

# A missing topic's word that the cluster has not confirmed, with
# outbox.missing_topic_dead on: three events of a missing topic die after
# their attempts (the cluster says it is unknown); the topic is created,
# and they are replayed while the broker is frozen (SIGSTOP) for 3 s, so
# that the relay's question about the topic goes unanswered.  librdkafka
# still holds the topic as unknown until an answer comes and fails each
# try at once: that is not the cluster's word, and must not make the
# replayed events dead again (before, they died again within a second).
# Once the broker answers, they are sent.
t_missing_topic_unconfirmed() {
    local topic=it.late.unconfirmed
    late_broker_start || { fail "the broker without auto-create did not start"; late_broker_stop; return; }
    setting_applied outbox.missing_topic_dead on
    sql "SELECT count(outbox.enqueue('T', '$topic-' || n, '{}', topic => '$topic', msg_key => 'u' || n))
           FROM generate_series(1, 3) n" >/dev/null
    wait_until 30 "SELECT count(*) FILTER (WHERE status = 'dead') = 3 FROM outbox.events WHERE topic = '$topic'" \
        || { fail "the missing topic's events are not dead: $(sql "SELECT status || ' ' || attempts FROM outbox.events WHERE topic = '$topic'")"; late_broker_stop; return; }
    late_create_topic $topic || { late_broker_stop; return; }
    kill -STOP "${KCLUSTER_PIDS[1]}"
    expect "events replayed" "$(replay "$topic")" 3
    sleep 3
    echo "#   while the broker was frozen: $(sql "SELECT string_agg(status || '/' || attempts || ': ' || coalesce(last_error, ''), '; ' ORDER BY id) FROM outbox.events WHERE topic = '$topic'")"
    kill -CONT "${KCLUSTER_PIDS[1]}"
    wait_until 30 "$(all_sent $topic 3)" \
        || fail "the replayed events were not all sent once the broker answered: $(sql "SELECT string_agg(status || '/' || attempts || ': ' || coalesce(last_error, ''), '; ' ORDER BY id) FROM outbox.events WHERE topic = '$topic'")"
    late_broker_stop
}

# The same in exactly_once, where an event that does not answer aborts its
# Kafka transaction: the missing topic must not abort every one, nor stall
# the other topics.
t_eos_topic_created_late() {
    late_broker_start || { fail "the broker without auto-create did not start"; late_broker_stop; return; }
    late_case exactly_once
    set_delivery at_least_once
    late_broker_stop
}
