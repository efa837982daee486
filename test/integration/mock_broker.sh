# test/integration/mock_broker.sh: faults a real broker cannot make on
# demand, from librdkafka's mock cluster (real Kafka protocol over TCP).

# mock_start: start the mock broker; MOCK_BROKERS is its address.
mock_start() {
    mkfifo "$IT_TMP/mock.in"
    "$TOOLS/outbox-mock-broker" <"$IT_TMP/mock.in" >"$IT_TMP/mock.out" 2>"$IT_TMP/mock.err" &
    MOCK_PID=$!
    exec 8>"$IT_TMP/mock.in"
    for _ in $(seq 1 50); do
        MOCK_BROKERS=$(head -n 1 "$IT_TMP/mock.out" 2>/dev/null)
        [ -n "$MOCK_BROKERS" ] && return 0
        sleep 0.1
    done
    return 1
}

# mock_use: point the relay at the mock broker, and return once it sends
# there: the postmaster signals the reload, the relay takes it when its
# round ends, and an event enqueued before that goes to the broker before.
# Probes are enqueued until one reaches the mock.
mock_use() {
    local i id
    mock create mock.ready 1 || return 1
    # Events the real broker's cases left waiting for a retry would go to
    # the mock broker and use up the faults a mock case sets for its own
    # (dead_letters_discard's refusals, after refused_stream_isolated).
    wait_until 60 "SELECT count(*) = 0 FROM outbox.event_state WHERE status IN ('new', 'sending')" \
        || echo "# events of the real broker's cases still wait for a retry"
    set_setting outbox.kafka_brokers "$MOCK_BROKERS"
    for i in $(seq 1 20); do
        sql "SELECT outbox.enqueue('Probe', 'mock-ready-$i', '{}', topic => 'mock.ready')" >/dev/null
        wait_until 10 "SELECT status = 'sent' FROM outbox.events WHERE biz_key = 'mock-ready-$i'" || continue
        id=$(sql "SELECT id FROM outbox.events WHERE biz_key = 'mock-ready-$i'")
        # (Into a file: fewer than 100 is the consumer's failure.)
        mock_consume mock.ready 100 3000 1000 >"$IT_TMP/ready.tsv"
        grep -q -w "event_id=$id" "$IT_TMP/ready.tsv" && return 0
    done
    echo "# the relay does not send to the mock broker"
    return 1
}

# mock CMD...: send a command to the mock broker and wait for its "ok"
# (see test/tools/mock_broker.c for the commands).
mock() {
    local before
    before=$(wc -l <"$IT_TMP/mock.out")
    echo "$*" >&8
    for _ in $(seq 1 100); do
        [ "$(wc -l <"$IT_TMP/mock.out")" -gt "$before" ] && return 0
        sleep 0.05
    done
    fail "the mock broker did not take '$*': $(tail -n 1 "$IT_TMP/mock.err")"
    return 1
}

# mock_answer CMD...: mock CMD, then what followed its "ok" (broker-errors-left).
mock_answer() {
    mock "$@" && tail -n 1 "$IT_TMP/mock.out" | sed 's/^ok *//'
}

# mock_topic_errors_crash: why librdkafka's topic errors in Metadata crash
# the relay's librdkafka, or nothing.  From 2.1.0 to 2.9.x the mock answers
# a topic error (other than an unknown topic) with the topic's partitions
# too, where a real broker lists none, and the client of those versions
# then reads a partition it never made: SIGSEGV in
# rd_kafka_topic_metadata_update (librdkafka #4907, fixed in 2.10.0).  The
# version is the relay's, from its start line in the server log.
mock_topic_errors_crash() {
    local v
    v=$(grep -o 'outbox relay started for database .* (librdkafka [0-9.]*' "$CLUSTER_DIR/server.log" |
        tail -n 1 | sed 's/.*librdkafka //')
    case $v in
        2.[1-9].*) echo "librdkafka $v's mock answers a topic error with partitions, which crashes its client (librdkafka #4907, fixed in 2.10.0)" ;;
    esac
}

# mock_stop: stop the mock broker.
mock_stop() {
    [ -n "${MOCK_PID:-}" ] || return 0
    echo quit >&8 2>/dev/null
    exec 8>&-
    kill "$MOCK_PID" 2>/dev/null
    MOCK_PID=
}

# mock_consume TOPIC COUNT: messages of TOPIC from the mock broker.
mock_consume() {
    IT_BROKERS=$MOCK_BROKERS consume "$@"
}

# Retriable produce errors are retried (by librdkafka, in order): all
# arrive, in order, and none is recorded as failed.
t_transient_errors() {
    local topic=mock.transient out=$IT_TMP/transient.tsv
    mock create $topic 1
    mock produce-errors 6 6    # NOT_LEADER_OR_FOLLOWER
    sql "SELECT count(outbox.enqueue('T', 'tr-' || i, jsonb_build_object('seq', i), topic => '$topic', msg_key => 'k')) FROM generate_series(1, 50) i" >/dev/null
    mock_consume $topic 50 30000 >"$out" || fail "not all 50 events arrived"
    load_consumed got_transient "$out"
    [ "$IT_CASE_FAILED" -eq 0 ] || echo "#   seqs missing: $(sql "SELECT string_agg(i::text, ' ') FROM generate_series(1, 50) i
                                                         WHERE i NOT IN (SELECT (value::jsonb->>'seq')::int FROM got_transient)")"
    expect "order violations" "$(sql "SELECT count(*) FROM (SELECT (value::jsonb->>'seq')::int - lag((value::jsonb->>'seq')::int) OVER (ORDER BY off) AS step FROM got_transient) s WHERE step <> 1")" 0
    expect "distinct events" "$(sql "SELECT count(DISTINCT event_id) FROM got_transient")" 50
    wait_until 10 "$(all_sent $topic 50)" || fail "events not all marked sent"
}

# Bytes on the retry path: the broker refuses the first attempt (not
# retriable in librdkafka), the relay retries, and the bytes arrive as given.
t_raw_payload_retried() {
    local topic=mock.raw out=$IT_TMP/raw_retried.tsv
    mock create $topic 1
    mock produce-errors 1 10    # MESSAGE_TOO_LARGE, once
    sql "SELECT outbox.enqueue_bytes('Raw', 'rr-1', '\\x00ff0a5c', topic => '$topic')" >/dev/null
    IT_BROKERS=$MOCK_BROKERS "$TOOLS/outbox-consume" -b "$MOCK_BROKERS" -t $topic -n 1 -T 30000 -x >"$out" 2>/dev/null \
        || fail "the event did not arrive"
    expect "value" "$(cut -f6 "$out")" '\x00ff0a5c'
    expect "attempts" "$(sql "SELECT attempts FROM outbox.events WHERE biz_key = 'rr-1'")" 1
    wait_until 10 "$(all_sent $topic 1)" || fail "event not marked sent"
}

# A persistent produce error: each event is retried with backoff until
# outbox.max_attempts, then dead with the broker's error.  Once the broker
# accepts again, the events enqueued then arrive and the dead ones never
# do, by id.  (t_replay_after_fault replays them.)
t_persistent_error() {
    local topic=mock.persistent out=$IT_TMP/persistent.tsv dead
    mock create $topic 1
    mock produce-errors 1000 10    # MESSAGE_TOO_LARGE: refused, not retriable
    sql "SELECT count(outbox.enqueue('T', 'pe-' || i, '{}', topic => '$topic')) FROM generate_series(1, 3) i" >/dev/null
    wait_until 30 "SELECT count(*) = 3 FROM outbox.events WHERE topic = '$topic' AND status = 'dead'" \
        || fail "events not dead: $(sql "SELECT string_agg(status || '/' || attempts, ' ') FROM outbox.events WHERE topic = '$topic'")"
    expect "attempts of dead events" "$(sql "SELECT string_agg(DISTINCT attempts::text, ',') FROM outbox.events WHERE topic = '$topic'")" 3
    expect "last_error" "$(sql "SELECT DISTINCT last_error FROM outbox.events WHERE topic = '$topic'")" "Broker: Message size too large"
    dead=$(sql "SELECT string_agg(id::text, ',') FROM outbox.events WHERE topic = '$topic' AND status = 'dead'")
    mock clear
    sql "SELECT count(outbox.enqueue('T', 'pe-after-' || i, '{}', topic => '$topic')) FROM generate_series(1, 3) i" >/dev/null
    wait_until 20 "SELECT count(*) = 3 FROM outbox.events WHERE topic = '$topic' AND biz_key LIKE 'pe-after-%' AND status = 'sent'" \
        || fail "events enqueued after the fault not sent"
    # All acknowledged: read until nothing more comes.
    mock_consume $topic 100 20000 3000 >"$out"
    load_consumed got_persistent "$out"
    expect "dead events delivered" "$(sql "SELECT count(*) FROM got_persistent WHERE event_id IN (${dead:-0})")" 0
    expect_delivered "events of $topic delivered" got_persistent \
        "SELECT id FROM outbox.event_log WHERE topic = '$topic' AND id NOT IN (${dead:-0})"
}

# An event waiting for its retry holds back the later events of its key,
# while other keys flow; once it is delivered, they follow in order.
t_order_across_retry() {
    local topic=mock.retry out=$IT_TMP/retry.tsv
    mock create $topic 1
    set_setting outbox.backoff_min 2000
    set_setting outbox.backoff_max 2000
    mock produce-errors 1000 10
    sql "SELECT outbox.enqueue('T', 'first', jsonb_build_object('seq', 1), topic => '$topic', msg_key => 'K')" >/dev/null
    wait_until 10 "SELECT attempts = 1 FROM outbox.events WHERE biz_key = 'first'" || fail "first event did not fail once"
    mock clear
    sql "SELECT outbox.enqueue('T', 'second', jsonb_build_object('seq', 2), topic => '$topic', msg_key => 'K'),
                outbox.enqueue('T', 'other', jsonb_build_object('seq', 0), topic => '$topic', msg_key => 'L')" >/dev/null
    wait_until 5 "SELECT status = 'sent' FROM outbox.events WHERE biz_key = 'other'" || fail "another key was held back"
    # Not at one instant: second stays new for as long as first waits
    # (the poll ends when first is sent or second is not new).
    wait_until 10 "SELECT (SELECT status = 'sent' FROM outbox.events WHERE biz_key = 'first')
                       OR (SELECT status <> 'new' FROM outbox.events WHERE biz_key = 'second')"
    expect "first's status when second stopped waiting" "$(sql "SELECT status FROM outbox.events WHERE biz_key = 'first'")" sent
    mock_consume $topic 3 20000 >"$out" || fail "not all 3 events arrived"
    expect "arrival order" "$(cut -f4 "$out" | tr '\n' ' ')" "L K K "
    expect "K in enqueue order" "$(grep -P '\tK\t' "$out" | cut -f6 | tr '\n' ' ')" '{"seq":1} {"seq":2} '
    set_setting outbox.backoff_min 100
    set_setting outbox.backoff_max 1000
}

# A broker that answers every request 1.5 s late: the relay waits, nothing is
# recorded as failed, and all arrive in order.
t_slow_broker() {
    local topic=mock.slow out=$IT_TMP/slow.tsv
    mock create $topic 1
    mock rtt 1500
    sql "SELECT count(outbox.enqueue('T', 'slow-' || i, jsonb_build_object('seq', i), topic => '$topic', msg_key => 'k')) FROM generate_series(1, 20) i" >/dev/null
    holds 1 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "events marked sent within 1 s, before the slow broker (1.5 s) answered"
    mock_consume $topic 20 30000 >"$out" || fail "not all 20 events arrived from the slow broker"
    mock rtt 0
    wait_until 20 "$(all_sent $topic 20)" || fail "events not all marked sent"
    expect "failed attempts recorded" "$(sql "SELECT coalesce(sum(attempts), 0) FROM outbox.events WHERE topic = '$topic'")" 0
    expect "order" "$(cut -f6 "$out" | tr -d '{}"seq:' | tr '\n' ' ')" "$(seq -s ' ' 1 20) "
}

# A broker that answers everything 3 s late while events of 20 new
# topics wait.  The relay asks the cluster about a topic before its first
# send, and about the topic of a batch left unanswered (is it missing?):
# each question is bounded, and one left unanswered stops the others for
# a while, so the relay's loop is blocked a bounded share of the time
# (sampled in pg_stat_activity: no wait event), not once per topic.
t_slow_metadata_bounded() {
    local pid busy n=20
    pid=$(relay_pid)
    mock rtt 3000
    for i in $(seq 1 $n); do
        sql "SELECT outbox.enqueue('T', 'slowmeta-$i', '{}', topic => 'mock.slowmeta.$i')" >/dev/null
        sleep 0.05
    done
    busy=$(relay_busy_percent "$pid" 8)
    echo "#   relay blocked outside its waits: $busy% of 8 s while $n new topics' events waited for a broker answering 3 s late"
    [ "$busy" -lt 30 ] || fail "the relay was blocked $busy% of the time (bound 30%)"
    mock rtt 0
    wait_until 60 "SELECT count(*) FILTER (WHERE status = 'sent') = $n FROM outbox.events WHERE topic LIKE 'mock.slowmeta.%'" \
        || fail "events not all sent once the broker answered in time"
}

# relay_busy_percent PID SECONDS: the share of samples, every 20 ms for
# SECONDS, in which relay PID was not in a wait (pg_stat_activity shows
# no wait event): the time its loop was blocked in a call.
relay_busy_percent() {
    sql "SELECT sum(busy) * 100 / count(*) FROM (
           SELECT pg_sleep(0.02), pg_stat_clear_snapshot(),
                  (SELECT (wait_event IS NULL)::int FROM pg_stat_activity WHERE pid = $1) AS busy
             FROM generate_series(1, $(($2 * 50)))) s"
}

# Dead events, replayed once the fault is gone, arrive once each with
# their ids; attempts start again from zero.
t_replay_after_fault() {
    local topic=mock.persistent out=$IT_TMP/replay.tsv
    expect "dead before replay" "$(sql "SELECT count(*) FROM outbox.dead_letters WHERE topic = '$topic'")" 3
    expect "replayed" "$(sql "SELECT count(*) FILTER (WHERE outbox.replay(id)) FROM outbox.dead_letters WHERE topic = '$topic'")" 3
    wait_until 20 "$(all_sent $topic 6)" || fail "replayed events not marked sent"
    # All acknowledged: read until nothing more comes.
    mock_consume $topic 100 20000 3000 >"$out"
    load_consumed got_replay "$out"
    expect_delivered "events of $topic delivered (replayed and sent before)" got_replay \
        "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    expect "duplicates" "$(duplicates got_replay)" 0
    expect "attempts after replay" "$(sql "SELECT max(attempts) FROM outbox.events WHERE topic = '$topic'")" 0
}

# Dead letters, to the end.  A dead event does not hold its key: a later
# event of the key is delivered while it is dead.  Replayed, it arrives
# after that one and before the event of its key enqueued in the replay's
# transaction (it waits behind the replayed one, as behind a retry).
# Another dead event answers a retried enqueue with its own id until it is
# discarded: then the same enqueue makes a new event, which is delivered,
# and the log names what was discarded.
t_dead_letters_discard() {
    local topic=mock.discard out=$IT_TMP/discard.tsv gone new
    mock create $topic 1
    mock produce-errors 1000 10    # MESSAGE_TOO_LARGE: refused, not retriable
    sql "SELECT outbox.enqueue('T', 'dl-1', jsonb_build_object('seq', 1), topic => '$topic', msg_key => 'K'),
                outbox.enqueue('T', 'dl-gone', jsonb_build_object('seq', 0), topic => '$topic', msg_key => 'G')" >/dev/null
    wait_until 30 "SELECT count(*) = 2 FROM outbox.dead_letters WHERE topic = '$topic'" \
        || { fail "events not dead: $(sql "SELECT string_agg(status || '/' || attempts, ' ') FROM outbox.events WHERE topic = '$topic'")"; return; }
    mock clear
    sql "SELECT outbox.enqueue('T', 'dl-2', jsonb_build_object('seq', 2), topic => '$topic', msg_key => 'K')" >/dev/null
    wait_until 20 "SELECT status = 'sent' FROM outbox.events WHERE biz_key = 'dl-2'" \
        || fail "a later event of a dead event's key was held back"
    sql "BEGIN;
         SELECT outbox.replay(id) FROM outbox.dead_letters WHERE biz_key = 'dl-1';
         SELECT outbox.enqueue('T', 'dl-3', jsonb_build_object('seq', 3), topic => '$topic', msg_key => 'K');
         COMMIT" >/dev/null

    gone=$(sql "SELECT id FROM outbox.dead_letters WHERE biz_key = 'dl-gone'")
    expect "a retried enqueue of the dead event" \
        "$(sql "SELECT outbox.enqueue('T', 'dl-gone', jsonb_build_object('seq', 0), topic => '$topic', msg_key => 'G')")" "$gone"
    LOG_MARK=$(log_mark)
    expect "discarded" "$(sql "SELECT outbox.discard($gone)")" t
    log_shows "LOG:  outbox: dead event $gone of topic \"$topic\" discarded"
    log_shows "DETAIL:  Its biz_type was \"T\", its biz_key \"dl-gone\" and its msg_key \"G\"; it was dead after 3 failed attempts, the last: Broker: Message size too large\.  Role \"[^\"]+\" discarded it\."
    new=$(sql "SELECT outbox.enqueue('T', 'dl-gone', jsonb_build_object('seq', 0), topic => '$topic', msg_key => 'G')")
    [ "${new:-0}" -gt "${gone:-0}" ] || fail "the enqueue after the discard gave id $new, not a new one (the dead one was $gone)"

    wait_until 20 "$(all_sent $topic 4)" \
        || fail "not all sent: $(sql "SELECT string_agg(biz_key || ':' || status, ' ' ORDER BY id) FROM outbox.events WHERE topic = '$topic'")"
    mock_consume $topic 100 20000 3000 >"$out"
    expect "K's arrival order: the replayed event after its key's event sent while it was dead" \
        "$(grep -P '\tK\t' "$out" | cut -f6 | tr '\n' ' ')" '{"seq":2} {"seq":1} {"seq":3} '
    load_consumed got_discard "$out"
    expect "G's events in Kafka" "$(sql "SELECT string_agg(event_id::text, ' ') FROM got_discard WHERE key = 'G'")" "$new"
    expect "dead letters left" "$(sql "SELECT count(*) FROM outbox.dead_letters WHERE topic = '$topic'")" 0
}

# A burst of refusals on a few keys: once the broker accepts again, the
# events queued behind each key's failed one drain in a few rounds, not
# one event per key per outbox.poll_interval.
t_retry_burst() {
    local topic=mock.burst out=$IT_TMP/burst.tsv
    mock create $topic 1
    set_setting outbox.poll_interval 2000
    # The burst goes out in the two requests refused (MESSAGE_TOO_LARGE):
    # a refusal of part of it while later requests of its keys are accepted
    # is the README's order caveat, not this case's subject, so librdkafka
    # lingers long enough to gather the whole batch.
    set_setting outbox.kafka_properties "linger.ms=200"
    mock request-errors 0 2 10
    sql "SELECT count(outbox.enqueue('T', 'burst-' || i, jsonb_build_object('seq', i), topic => '$topic', msg_key => 'k' || (i % 2)))
         FROM generate_series(1, 4000) i" >/dev/null
    wait_until 20 "SELECT count(*) > 0 FROM outbox.event_state s JOIN outbox.event_log l USING (id) WHERE l.topic = '$topic' AND s.attempts > 0" \
        || fail "no refused event"
    local start=$SECONDS
    mock_consume $topic 4000 60000 >"$out" || fail "not all 4000 events arrived ($(wc -l <"$out"))"
    echo "#   4,000 refused events on 2 keys delivered $((SECONDS - start)) s after the refusals ended"
    [ $((SECONDS - start)) -le 15 ] || fail "draining the burst took $((SECONDS - start)) s"
    load_consumed got_burst "$out"
    expect "order violations" "$(sql "SELECT count(*) FROM (SELECT (value::jsonb->>'seq')::int - lag((value::jsonb->>'seq')::int) OVER (PARTITION BY key ORDER BY off) AS step FROM got_burst) s WHERE step <> 2")" 0
    wait_until 20 "$(all_sent $topic 4000)" || fail "events not all marked sent"
    set_setting outbox.poll_interval 200
    reset_properties
}
