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
LATE_WAIT_S=12

# late_broker_start: a one-node broker with auto.create.topics.enable=false,
# the relay sending to it; LATE_BROKERS is its address.
late_broker_start() {
    kcluster_setup "$IT_TMP/klate" 1 || return 1
    sed -i 's/^auto.create.topics.enable=.*/auto.create.topics.enable=false/' "$IT_TMP/klate/1/server.properties"
    kcluster_start || return 1
    LATE_BROKERS=$KCLUSTER_BROKERS
    late_create_topic it.late.ready 1 || return 1
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

# late_create_topic TOPIC PARTITIONS: create TOPIC with Kafka's Java admin
# client (test/tools/create-topic).
late_create_topic() {
    java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$KAFKA_CP" "$TOOLS/create-topic/CreateTopic.java" \
        "$LATE_BROKERS" "$1" "$2" >"$IT_TMP/late_topic.log" 2>&1 \
        || { fail "could not create topic $1: $(tail -3 "$IT_TMP/late_topic.log")"; return 1; }
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

# The cluster does not create topics on first use.  Events of a topic not
# created yet (20 on 5 keys) are enqueued in one transaction with 100
# events of an existing topic: those are sent within
# LATE_HEALTHY_BOUND_S; the missing topic's wait, none dead after
# LATE_WAIT_S (the old rule: dead within 9 s), each saying what it waits
# for in outbox.events, relay_status() saying it too, and one line of the
# server log naming the topic, with a HINT to create it.  Once the topic
# is created every event arrives once, in id order per key.  With
# outbox.missing_topic_dead on, events of another missing topic become
# dead after outbox.max_attempts.
t_topic_created_late() {
    local missing=it.late.missing healthy=it.late.healthy dead=it.late.dead mark started took
    local out=$IT_TMP/late.tsv
    late_broker_start || { fail "the broker without auto-create did not start"; late_broker_stop; return; }
    late_create_topic $healthy 3 || { late_broker_stop; return; }
    mark=$(log_mark)
    started=$(us_now)
    sql "BEGIN; SELECT count(outbox.enqueue('T', 'late-h-' || n, '{}', topic => '$healthy', msg_key => 'h' || n))
                  FROM generate_series(1, 100) n;
                SELECT count(outbox.enqueue('T', '$missing-' || n || '-' || k, jsonb_build_object('n', n),
                                            topic => '$missing', msg_key => 'k' || k))
                  FROM generate_series(1, 4) n, generate_series(1, 5) k;
         COMMIT" >/dev/null
    wait_until $((LATE_HEALTHY_BOUND_S + 5)) "$(all_sent $healthy 100)" \
        || fail "the existing topic's events were not all sent: $(sql "SELECT count(*) FROM outbox.events WHERE topic = '$healthy' AND status = 'sent'") of 100"
    took=$((($(us_now) - started) / 1000))
    echo "#   the existing topic's 100 events sent $took ms after the commit"
    [ "$took" -le $((LATE_HEALTHY_BOUND_S * 1000)) ] || fail "the existing topic's events took $took ms, bound ${LATE_HEALTHY_BOUND_S} s"

    wait_until 20 "SELECT count(*) > 0 FROM outbox.events WHERE topic = '$missing'
                     AND last_error LIKE 'waiting for topic \"$missing\" to be created%'" \
        || fail "no event says it waits for the topic: $(sql "SELECT DISTINCT status || ': ' || coalesce(last_error, '') FROM outbox.events WHERE topic = '$missing'")"
    sql "SELECT last_error FROM outbox.relay_status()" | grep -q "waiting for topic \"$missing\" to be created" \
        || fail "relay_status() does not say what the events wait for: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"
    holds $LATE_WAIT_S "SELECT count(*) FILTER (WHERE status IN ('dead', 'sent')) = 0 FROM outbox.events WHERE topic = '$missing'" \
        || fail "events of the missing topic dead or sent: $(sql "SELECT status || ' ' || count(*) FROM outbox.events WHERE topic = '$missing' GROUP BY status")"
    echo "#   after ${LATE_WAIT_S} s, attempts of the missing topic's events: $(sql "SELECT min(attempts) || '..' || max(attempts) FROM outbox.events WHERE topic = '$missing'")"
    expect "log lines naming the missing topic" \
        "$(log_since "$mark" | grep -c "\"$missing\"")" 1
    log_since "$mark" | grep -A2 "events wait for topic \"$missing\" to be created" | grep -q "HINT:  Create the topic in Kafka" \
        || fail "the log line has no HINT to create the topic: $(log_since "$mark" | grep -A2 "$missing")"

    late_create_topic $missing 3 || { late_broker_stop; return; }
    started=$(us_now)
    wait_until 30 "$(all_sent $missing 20)" \
        || fail "the missing topic's events were not all sent once it was created: $(sql "SELECT status || ' ' || count(*) FROM outbox.events WHERE topic = '$missing' GROUP BY status")"
    echo "#   delivered $((($(us_now) - started) / 1000)) ms after the topic was created"
    IT_BROKERS=$LATE_BROKERS consume $missing 1000 15000 3000 >"$out"
    load_consumed late_got "$out"
    expect_delivered "the missing topic's events" late_got "SELECT id FROM outbox.events WHERE topic = '$missing'"
    expect "duplicates" "$(duplicates late_got)" 0
    expect "keys out of order" "$(late_in_key_order "$out")" ""

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
