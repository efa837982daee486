# test/integration/exactly_once.sh: outbox.delivery = exactly_once against
# the real broker.  Every consumer here reads with
# isolation.level=read_committed (outbox-consume does).

# set_delivery MODE: outbox.delivery set and reloaded; in exactly_once,
# waits until the relay's transactions are ready (it says so in its log,
# or logs nothing and sends: either way its status leaves "starting").
set_delivery() {
    local mark
    mark=$(log_mark)
    set_setting outbox.delivery "$1"
    wait_log "$mark" 20 "parameter \"outbox.delivery\" changed to \"$1\"" \
        || fail "the reload of outbox.delivery = $1 was not logged"
}

# set_exactly_once: exactly_once, once the relay has taken it.  The
# postmaster logs the reload before the relay takes it; the transactional
# producer's start writes a new proof into outbox.relay_cursor (sender.c).
# Without this wait, an event enqueued next could go out through the old
# producer, and the new one start later, while a test holds the cursor.
set_exactly_once() {
    local proof
    proof=$(sql "SELECT coalesce(proof, '') FROM outbox.relay_cursor")
    set_delivery exactly_once
    wait_until 60 "SELECT coalesce(proof, '') <> '$proof' FROM outbox.relay_cursor" && return 0
    fail "exactly_once: no transactional producer started within 60 s: $(relay_state)"
    return 1
}

# eos_ready: exactly_once, and a round trip through it: an event sent and
# recorded, so that init_transactions and the progress topic are behind.
eos_ready() {
    local topic=it.eos.ready
    set_exactly_once
    sql "SELECT outbox.enqueue('T', 'ready-' || clock_timestamp(), '{}', topic => '$topic')" >/dev/null
    wait_until 60 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND status <> 'sent'" \
        || fail "exactly_once: the relay did not send within 60 s: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"
}

# expect_exactly_once NAME TOPIC FILE: the consumer's read (FILE) of TOPIC
# is every event of TOPIC once, and each key's events in id order.
expect_exactly_once() {
    local table=got_$1
    load_consumed "$table" "$3"
    expect_delivered "$1: events delivered" "$table" "SELECT id FROM outbox.event_log WHERE topic = '$2'"
    expect "$1: duplicates" "$(duplicates "$table")" 0
    expect "$1: events after a later one of their key" \
        "$(sql "SELECT count(*) FROM (SELECT event_id < lag(event_id) OVER (PARTITION BY key ORDER BY part, off) AS back FROM $table) x WHERE back")" 0
}

# progress_key: this database's relay's transactional.id, the key of its
# progress records: the system identifier, the database's OID and the
# relay's sender (src/sender.c).
progress_key() {
    sql "SELECT 'outbox-' || system_identifier || '-' || (SELECT oid FROM pg_database WHERE datname = current_database())
                || '-' || (SELECT sender FROM outbox.relay_cursor)
           FROM pg_control_system()"
}

# progress_records: the values of the progress records this database's
# relay has committed, one a line, oldest first.
progress_records() {
    local id
    id=$(progress_key)
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t outbox_progress -T 10000 -i 2000 2>/dev/null \
        | awk -v id="$id" -F'\t' '$4 == id { print $6 }'
}

# progress_of: the latest of them that moved its first sends (has a
# "to").  A round of retries only records no place, and under load one
# may come last.
progress_of() {
    progress_records | grep '; to ' | tail -n 1
}

# progress_count: how many there are, one per Kafka transaction that sent
# anything.
progress_count() {
    progress_records | wc -l
}

# 3,000 events over 30 keys, read 250 at a time: each reaches a
# read_committed consumer once, in key order; the backlog fills each Kafka
# transaction with several batches (2 transactions for the 12 batches, 6
# allowed: one sent at a time would take 12); the progress topic holds the
# relay's record, whose "to" is where outbox.relay_cursor is.  The batch
# size is set before eos_ready, whose wait for the new producer shows the
# relay has taken it too.
t_eos_delivery() {
    local topic=it.eos.delivery out=$IT_TMP/eos_delivery.tsv n=3000 record cursor records
    set_batch_size 250
    topic_ready $topic || return
    eos_ready
    records=$(progress_count)
    sql "SELECT count(outbox.enqueue('T', 'd-' || i, jsonb_build_object('i', i), topic => '$topic', msg_key => 'k' || i % 30))
         FROM generate_series(1, $n) i" >/dev/null
    wait_until 60 "$(all_sent $topic $n)" || fail "not all $n events sent"
    consume $topic $n 30000 3000 >"$out"
    expect_exactly_once delivery $topic "$out"
    records=$(($(progress_count) - records))
    echo "#   12 batches of 250 sent in $records Kafka transactions"
    [ "$records" -ge 1 ] && [ "$records" -le 6 ] \
        || fail "the 12 batches took $records Kafka transactions (progress records), not 1 to 6"
    record=$(progress_of)
    [[ $record == *"outbox progress 1"* ]] || fail "no progress record for this database: '$record'"
    cursor=$(sql "SELECT done_snapshot || '/' || coalesce(window_snapshot::text, '-') || '/' || window_last_tx || '/' || window_last_id
                  FROM outbox.relay_cursor")
    [[ "$record;" == *"; to $cursor;"* ]] || fail "the latest record does not end where outbox.relay_cursor is ($cursor): $record"
    expect "relay state" "$(sql "SELECT state FROM outbox.relay_status()")" idle
    reset_batch_size
    set_delivery at_least_once
}

# commit_unrecorded MODE TOPIC: 200 events sent and committed in Kafka
# while an application holds the row of outbox.relay_cursor (so the relay
# cannot record them), then the relay SIGKILLed (the server restarts).
# The consumer's read after the restart is left in $IT_TMP/TOPIC.tsv.
# The row is taken only once the relay's window is closed: an event counts
# as sent once its place in the window is recorded, but the window's end
# is recorded after it, and in exactly_once nothing more is sent until
# then, so a lock taken in between would hold the 200 events back.
commit_unrecorded() {
    local topic=$2 out=$IT_TMP/$2.tsv n=200 pid locker
    topic_ready "$topic" || return
    wait_until 30 "SELECT window_snapshot IS NULL FROM outbox.relay_cursor" \
        || fail "$1: the relay's window was not closed in 30 s"
    "$PGBIN/psql" -X -q -d "$IT_DB" -c "BEGIN; SELECT 1 FROM outbox.relay_cursor FOR UPDATE; SELECT pg_sleep(120)" \
        >/dev/null 2>&1 &
    locker=$!
    wait_until 10 "SELECT count(*) = 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                   WHERE c.relname = 'relay_cursor' AND l.mode = 'RowShareLock' AND l.granted" \
        || fail "$1: the application did not take the cursor's row"
    sql "SELECT count(outbox.enqueue('T', '$topic-' || i, jsonb_build_object('i', i), topic => '$topic', msg_key => 'k' || i % 7))
         FROM generate_series(1, $n) i" >/dev/null
    consume $topic $n 30000 >"$out" \
        || fail "$1: the $n events did not reach Kafka while the cursor was held ($(wc -l <"$out"); relay: $(relay_state); events: $(sql "SELECT string_agg(status || ' ' || c, ', ') FROM (SELECT status, count(*) c FROM outbox.events WHERE topic = '$topic' GROUP BY 1) x"))"
    expect "$1: events recorded sent while the cursor was held" \
        "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'sent'")" 0
    pid=$(relay_pid)
    kill -KILL "$pid"
    wait "$locker" 2>/dev/null
    wait_until 60 "$(all_sent $topic $n)" || fail "$1: not all $n events recorded sent after the restart"
    consume $topic $((2 * n)) 30000 3000 >"$out"
}

# timeout_gap_order (real_broker.sh) in exactly_once: a timed-out message
# aborts its Kafka transaction, and the younger messages with it.
t_eos_timeout_gap_order() {
    eos_ready
    timeout_gap it.eos.timeout_gap 4
    set_delivery at_least_once
}

# The proof of exactly_once: a transaction Kafka committed but PostgreSQL
# did not record (the relay killed in between) is not sent again: after
# the restart the relay reads its progress from Kafka and moves
# outbox.relay_cursor.  The same fault in at_least_once sends the 200
# events twice, which shows the check can fail.
t_eos_commit_unrecorded() {
    local mark
    eos_ready
    mark=$(log_mark)
    commit_unrecorded exactly_once it.eos.unrecorded
    expect_exactly_once unrecorded it.eos.unrecorded "$IT_TMP/it.eos.unrecorded.tsv"
    log_since "$mark" | grep -q "DETAIL:  outbox.relay_cursor was moved to the transaction's end" \
        || fail "the relay did not say it moved the cursor to Kafka's progress"
    set_delivery at_least_once
    commit_unrecorded at_least_once it.alo.unrecorded
    load_consumed got_alo_unrecorded "$IT_TMP/it.alo.unrecorded.tsv"
    expect "at_least_once: duplicates after the same fault" "$(duplicates got_alo_unrecorded)" 200
}

# refuse_one TOPIC N BIG: TOPIC made to refuse records over 2,000 bytes,
# then N events enqueued over 4 keys, event BIG of them 5,000 bytes; waits
# until BIG is dead and the others sent.  Kafka refuses the whole batch of
# a partition that holds BIG, so its neighbours are refused with it.
refuse_one() {
    local topic=$1 n=$2 big=$3
    sql "SELECT outbox.enqueue('T', '$topic-0', '{}', topic => '$topic', msg_key => 'other')" >/dev/null
    wait_until 30 "$(all_sent $topic 1)" || fail "the topic's first event was not sent"
    topic_max_message_bytes $topic 2000 || { fail "could not lower max.message.bytes of $topic: $(tail -3 "$IT_TMP/config.log")"; return; }
    sql "SELECT count(outbox.enqueue('T', '$topic-' || i,
                 jsonb_build_object('i', i, 'pad', CASE WHEN i = $big THEN repeat('x', 5000) ELSE '' END),
                 topic => '$topic', msg_key => 'k' || i % 4))
         FROM generate_series(1, $n) i" >/dev/null
    wait_until 60 "SELECT status = 'dead' FROM outbox.events WHERE topic = '$topic' AND biz_key = '$topic-$big'" \
        || fail "the refused event is not dead: $(sql "SELECT status || ' ' || attempts FROM outbox.events WHERE biz_key = '$topic-$big'")"
    wait_until 60 "SELECT count(*) FILTER (WHERE status = 'sent') = $n FROM outbox.events WHERE topic = '$topic'" \
        || fail "the other events were not all sent: $(sql "SELECT string_agg(status || ' ' || c, ', ') FROM (SELECT status, count(*) c FROM outbox.events WHERE topic = '$topic' GROUP BY 1) x")"
}

# at_least_once: the events Kafka refused only for sharing a batch with
# one too large are retried apart from it and delivered; only the large
# one dies (before, all 26 of its neighbours died with it).
t_refused_batch_neighbours() {
    refuse_one it.refused.neighbours 60 30
    expect "dead events" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = 'it.refused.neighbours' AND status = 'dead'")" 1
}

# A key's later events are held while an earlier one waits for a retry,
# and sent by the retry step.  First sends must not go on holding a busy
# key's new events behind the retry step's own, batch after batch (held,
# recorded, sent again, while the next batch holds more): once nothing
# waits for a backoff, keys go back to first sends at once.  Under 800
# events/s over 20 keys, Kafka refuses every record of the topic for a
# moment (max.message.bytes 128); the relay is paused while the limit is
# lifted, and resumed on a backlog of 3 batches with the refused events
# due.  Of the events enqueued from the pause to 4 s after the resume,
# none goes through the retry step.  Before, every batch of the backlog
# was held whole (1,800 and 2,900 of 6,000 events here), and under load
# the chain went on while the writers did: in a chaos run, 70,806 of
# 93,978 events went through outbox.event_state, 206 of them refused.
#
# The chain still forms when the machine is loaded so heavily that a
# batch of retries is not answered within the 200 ms first sends wait
# for it (3,799 and 4,725 of 6,600-6,900 events beside a chaos run's
# start, and beside the other half of CI): first sends read meanwhile,
# and each batch in flight holding a key makes the next one hold it too.
# It ends with the load (every event is sent, checked).  So a try that
# chained is made again on a new topic, three tries at most: the
# defects the check is for (mutations 70 and 71) chain every time.
t_held_chain_ends() {
    local try
    for try in 1 2 3; do
        held_chain_try it.held.chain$try && break
        [ "$IT_CASE_FAILED" = 1 ] && return
        echo "#   try $try: the chain formed; again on a new topic"
        [ "$try" = 3 ] && fail "events of the backlog and after went through the retry step in 3 tries"
    done
}

# held_chain_try TOPIC: one try of held_chain_ends on TOPIC; false if an
# event of the backlog or after went through the retry step (or the try
# failed, with IT_CASE_FAILED set).
held_chain_try() {
    local topic=$1 script=$IT_TMP/chain.pgbench writer from to held total
    sql "SELECT outbox.enqueue('T', 'chain-0', '{}', topic => '$topic')" >/dev/null
    wait_until 30 "$(all_sent $topic 1)" || { fail "the topic's first event was not sent"; return 1; }
    # Refused for as long as the limit takes to lift, never dead.
    set_setting outbox.max_attempts 1000
    set_setting outbox.batch_size 1000
    # The retry step's pace (the least of the two) as long as the paused
    # relay's rounds: resume() comes before the retry step is due again,
    # unless a paused relay asks for retries every round.
    set_setting outbox.backoff_min 200
    cat >"$script" <<SQL
\set k random(0, 19)
SELECT outbox.enqueue('T', 'chain-' || gen_random_uuid(), '{"n": 1}', topic => '$topic', msg_key => 'k' || :k);
SQL
    "$PGBIN/pgbench" -n -c 2 -j 2 -R 800 -T 30 -f "$script" "$IT_DB" >"$IT_TMP/chain.log" 2>&1 &
    writer=$!
    sleep 1
    topic_max_message_bytes $topic 128 || fail "could not lower max.message.bytes of $topic"
    wait_until 30 "SELECT count(*) > 0 FROM outbox.event_state s JOIN outbox.event_log l USING (id)
                    WHERE l.topic = '$topic' AND s.attempts > 0" \
        || fail "Kafka refused no event of $topic"
    sql "SELECT outbox.pause()" >/dev/null
    from=$(sql "SELECT max(id) FROM outbox.event_log")
    topic_default_max_message_bytes $topic || fail "could not reset max.message.bytes of $topic"
    wait_until 30 "SELECT backlog >= 3000 FROM outbox.stats" || fail "no backlog of 3,000 events in 30 s"
    sql "SELECT outbox.resume()" >/dev/null
    sleep 4
    to=$(sql "SELECT max(id) FROM outbox.event_log")
    kill "$writer"
    wait "$writer" 2>/dev/null
    total=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$topic'")
    wait_until 60 "$(all_sent $topic "$total")" || fail "not all $total events were sent in 60 s"
    held=$(sql "SELECT count(*) FROM outbox.event_state WHERE id > $from AND id <= $to")
    echo "#   events $from-$to: $held of $((to - from)) sent by the retry step" \
         "($(sql "SELECT count(*) FROM outbox.event_state s JOIN outbox.event_log l USING (id) WHERE l.topic = '$topic'") of $total in all)"
    reset_setting outbox.backoff_min
    reset_setting outbox.batch_size
    reset_setting outbox.max_attempts
    [ "$IT_CASE_FAILED" != 1 ] && [ "$held" = 0 ]
}

# How much later than before the refusal a healthy topic's events may
# leave (the relay's send, from their enqueue; the 99th percentile) while
# another topic is refused: this many ms more than twice the p99 measured
# just before, under the same load.
REFUSED_STREAM_P99_SLACK_MS=300

# While a topic Kafka refuses (every record over its max.message.bytes)
# keeps the retry step busy, a stream of 300 events/s over 50 keys, each
# tried up to outbox.max_attempts (10) times, a healthy topic's events,
# 300/s, leave within REFUSED_STREAM_P99_SLACK_MS of twice their p99 with
# both topics healthy, measured first: first sends wait for batches of
# retries in flight (held_chain_ends) only briefly, and not for those
# that send an event refused twice.  The bound is relative because the
# machine's load moves both alike: beside the other half of CI the p99
# was 529 ms once (unloaded: 21-48 ms before the refusal and after).
t_refused_stream_isolated() {
    local bad=it.refused.stream healthy=it.refused.stream.healthy script=$IT_TMP/refused_stream.pgbench
    local writer from to base p99 bound
    sql "SELECT outbox.enqueue('T', 'rs-0', '{}', topic => '$bad'), outbox.enqueue('T', 'rs-1', '{}', topic => '$healthy')" >/dev/null
    wait_until 30 "$(all_sent $bad 1)" || { fail "the topics' first events were not sent"; return; }
    cat >"$script" <<SQL
\set k random(0, 49)
SELECT outbox.enqueue('T', 'rs-' || gen_random_uuid(), '{"n": 1}', topic => '$bad', msg_key => 'k' || :k);
SELECT outbox.enqueue('T', 'rs-' || gen_random_uuid(), '{"n": 1}', topic => '$healthy', msg_key => 'k' || :k);
SQL
    from=$(sql "SELECT max(id) FROM outbox.event_log")
    "$PGBIN/pgbench" -n -c 2 -j 2 -R 300 -T 6 -f "$script" "$IT_DB" >"$IT_TMP/refused_stream.log" 2>&1
    to=$(sql "SELECT max(id) FROM outbox.event_log")
    healthy_p99 base "$healthy" "$from" "$to" || return
    base=$P99
    topic_max_message_bytes $bad 128 || { fail "could not lower max.message.bytes of $bad"; return; }
    set_setting outbox.max_attempts 10
    "$PGBIN/pgbench" -n -c 2 -j 2 -R 300 -T 12 -f "$script" "$IT_DB" >"$IT_TMP/refused_stream.log" 2>&1 &
    writer=$!
    # Refused twice: at most one event per key at a time (a key's later
    # events wait behind its refused one), so fewer than its 50 keys.
    wait_until 10 "SELECT count(*) > 25 FROM outbox.event_state s JOIN outbox.event_log l USING (id)
                    WHERE l.topic = '$bad' AND s.attempts > 1" || fail "Kafka refused no event of $bad twice"
    from=$(sql "SELECT max(id) FROM outbox.event_log")
    kill -0 "$writer" 2>/dev/null || fail "the writer ended before $bad was refused twice: nothing measured"
    wait "$writer"
    to=$(sql "SELECT max(id) FROM outbox.event_log")
    echo "#   $bad: $(sql "SELECT count(*) FROM outbox.event_state s JOIN outbox.event_log l USING (id)
            WHERE l.topic = '$bad' AND s.attempts > 0") of its events failed"
    healthy_p99 refused "$healthy" "$from" "$to" || return
    p99=$P99
    bound=$((REFUSED_STREAM_P99_SLACK_MS + 2 * base))
    [ "$p99" -le "$bound" ] \
        || fail "p99 of $healthy while $bad was refused: $p99 ms, before: $base ms (bound $bound ms)"
    topic_default_max_message_bytes $bad || fail "could not reset max.message.bytes of $bad"
    reset_setting outbox.max_attempts
}

# healthy_p99 NAME TOPIC FROM TO: P99 set to the 99th percentile, in ms,
# of how long after its enqueue the relay sent each event of TOPIC with an
# id in (FROM, TO], as a consumer found; says the median and the worst
# too.  False, with a failure, unless every one of them arrived.
healthy_p99() {
    local name=$1 topic=$2 from=$3 to=$4 out=$IT_TMP/refused_stream.$1.tsv n
    n=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$topic' AND id > $from AND id <= $to")
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t "$topic" -T 20000 -i 3000 >"$out" 2>/dev/null
    load_consumed "got_rs_$name" "$out"
    sql "CREATE TABLE rs_ms_$name AS
         SELECT min(g.created_ms) - extract(epoch FROM l.created_at) * 1000 AS ms
           FROM outbox.event_log l JOIN got_rs_$name g ON g.event_id = l.id
          WHERE l.topic = '$topic' AND l.id > $from AND l.id <= $to GROUP BY l.id, l.created_at" >/dev/null
    echo "#   $topic, $name: $n events, sent $(sql "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)) FROM rs_ms_$name") ms" \
         "after their enqueue at the median, $(sql "SELECT round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)) FROM rs_ms_$name") ms at p99," \
         "$(sql "SELECT round(max(ms)) FROM rs_ms_$name") ms at most"
    expect "events of $topic ($name) that arrived" "$(sql "SELECT count(*) FROM rs_ms_$name")" "$n"
    [ "$(sql "SELECT count(*) FROM rs_ms_$name")" = "$n" ] || return 1
    P99=$(sql "SELECT round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)) FROM rs_ms_$name")
}

# exactly_once: one event in the middle of a transaction refused: the
# transaction is aborted, so a read_committed consumer sees each other
# event once, although a read_uncommitted one saw the aborted copies; the
# refused event is tried again, then dead (outbox.max_attempts = 3), and
# the later events of its key reach Kafka only after it died.  Whether the
# neighbours reach the log before the abort is a race (the refusal may
# come back before their batches left, and the abort purges them): a try
# that left no aborted copies cannot show duplicates, so it is made again
# on a new topic, at most three times.
t_eos_refused_mid_batch() {
    local try
    eos_ready
    for try in 1 2 3; do
        eos_refused_try it.eos.refused$try && break
        echo "#   try $try: no aborted copy reached the log (the abort came before the neighbours' batches left)"
        [ "$try" = 3 ] && fail "a read_uncommitted consumer saw no aborted copies in 3 tries: no transaction was aborted"
    done
    set_delivery at_least_once
}

# eos_refused_try TOPIC: one try of eos_refused_mid_batch on TOPIC; false
# if a read_uncommitted consumer saw no more messages than a read_committed one.
eos_refused_try() {
    local topic=$1 out=$IT_TMP/$1.tsv all=$IT_TMP/$1.all.tsv n=60 big=30 dead_ms
    refuse_one $topic $n $big
    consume $topic $n 30000 3000 >"$out"
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t $topic -U -T 30000 -i 3000 >"$all" 2>/dev/null
    load_consumed got_eos_refused "$out"
    expect_delivered "refused mid-batch: events delivered" got_eos_refused \
        "SELECT id FROM outbox.events WHERE topic = '$topic' AND status = 'sent'"
    expect "refused mid-batch: duplicates" "$(duplicates got_eos_refused)" 0
    dead_ms=$(sql "SELECT (extract(epoch FROM updated_at) * 1000)::bigint FROM outbox.event_state s JOIN outbox.event_log l USING (id)
                   WHERE l.biz_key = '$topic-$big'")
    expect "later events of the refused one's key sent before it died" \
        "$(sql "SELECT count(*) FROM got_eos_refused g JOIN outbox.event_log l ON l.id = g.event_id
                WHERE g.key = 'k' || $big % 4 AND l.biz_key <> '$topic-0'
                  AND substr(l.biz_key, length('$topic-') + 1)::int > $big AND g.created_ms < $dead_ms")" 0
    [ "$(wc -l <"$all")" -gt "$(wc -l <"$out")" ]
}

# A cluster whose transaction coordinator cannot exist (one broker, the
# transaction log asked to have 3 replicas): exactly_once sends nothing,
# says so in relay_status() and, after 15 s, in the log with the fix;
# at_least_once then delivers through the same broker.
t_eos_no_coordinator() {
    local topic=it.eos.nocoord mark
    kcluster_setup "$IT_TMP/knocoord" 1 || { fail "the broker could not be set up"; return; }
    sed -i 's/^transaction.state.log.replication.factor=.*/transaction.state.log.replication.factor=3/' \
        "$IT_TMP/knocoord/1/server.properties"
    kcluster_start || { fail "the broker did not start"; kcluster_stop; return; }
    set_setting outbox.kafka_brokers "$KCLUSTER_BROKERS"
    mark=$(log_mark)
    set_delivery exactly_once
    # The postmaster logs the reload before the relay takes it: enqueue
    # once the relay waits in exactly_once, or the event may go out before.
    wait_until 40 "SELECT state = 'waiting for Kafka transactions' FROM outbox.relay_status()" \
        || fail "relay_status() does not say it waits for transactions: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"
    sql "SELECT outbox.enqueue('T', '$topic-1', '{}', topic => '$topic')" >/dev/null
    wait_log "$mark" 20 "Kafka transactions could not start within 15 s" \
        || fail "the log does not say why nothing is sent"
    log_since "$mark" | grep -q "HINT:.*transaction.state.log.replication.factor.*outbox.delivery = at_least_once" \
        || fail "the log does not name the fixes"
    holds 3 "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "events sent without transactions: $(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'sent'")"
    set_delivery at_least_once
    wait_until 60 "$(all_sent $topic 1)" || fail "at_least_once did not deliver through the same broker"
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    kcluster_stop
}

# java_hash_mod TEXT N: Kafka's partition for TEXT among N (the abs of
# Java's String.hashCode, modulo N): which partition of
# __transaction_state, so which broker, coordinates a transactional.id.
java_hash_mod() {
    local s=$1 h=0 i c
    for ((i = 0; i < ${#s}; i++)); do
        printf -v c '%d' "'${s:i:1}"
        h=$(((31 * h + c) & 0xffffffff))
    done
    ((h >= 2147483648)) && h=$((h - 4294967296))
    ((h < 0)) && h=$((h == -2147483648 ? 0 : -h))
    echo $((h % $2))
}

# relay_transactional_id: this database's relay's transactional.id.
relay_transactional_id() {
    sql "SELECT 'outbox-' || system_identifier || '-' || (SELECT oid FROM pg_database WHERE datname = current_database())
         FROM pg_control_system()"
}

# exactly_once on a real three-node cluster: while four sessions commit
# 2,400 events, the broker coordinating the relay's transactions is
# SIGKILLed, then (once it is back) the leader of partition 0: a
# read_committed consumer sees every event once, in key order.
t_eos_cluster_killed() {
    local topic=it.eos.cluster out=$IT_TMP/eos_cluster.tsv pids=() leader part coordinator
    kcluster_setup "$IT_TMP/keos" 3 && kcluster_start || { fail "the Kafka cluster did not start"; kcluster_stop; return; }
    set_setting outbox.kafka_brokers "$KCLUSTER_BROKERS"
    set_exactly_once
    sql "SELECT outbox.enqueue('T', 'eos-cluster-first', '{}', topic => '$topic', msg_key => 'first')" >/dev/null
    wait_until 90 "$(all_sent $topic 1)" || { fail "nothing reached the cluster: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"; eos_cluster_end; return; }
    cluster_writers $topic eos-cluster 600
    pids=("${WRITERS[@]}")
    sleep 1
    part=$(java_hash_mod "$(relay_transactional_id)" 50)
    coordinator=$(kcluster_leader __transaction_state "$part")
    [ -n "$coordinator" ] || fail "no coordinator found (partition $part of __transaction_state)"
    kcluster_kill "$coordinator"
    kcluster_wait_moved __transaction_state "$part" "$coordinator" 30 \
        || fail "the transaction coordinator did not move within 30 s of killing node $coordinator"
    kill -0 "${pids[@]}" 2>/dev/null || fail "the writers ended before the coordinator moved: no flow to test"
    kcluster_start_node "$coordinator"
    kcluster_wait_nodes 3 90 || fail "node $coordinator did not come back"
    leader=$(kcluster_leader $topic 0)
    [ -n "$leader" ] || fail "no leader found for partition 0"
    kcluster_kill "$leader"
    kcluster_wait_moved $topic 0 "$leader" 30 || fail "partition 0 got no new leader within 30 s of killing node $leader"
    kcluster_start_node "$leader"
    wait "${pids[@]}"
    wait_until 120 "$(all_sent $topic 2401)" || fail "not every event was recorded as sent: $(sql "TABLE outbox.stats")"
    expect "events dead" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'dead'")" 0
    # Until the 2401 arrive, for longer than transaction.timeout.ms (60 s):
    # a transaction a killed node left open holds a read_committed consumer
    # back until its coordinator aborts it, as docs/kafka.md says; a 5 s
    # pause in the read was once taken for the end (10 "missing").
    "$TOOLS/outbox-consume" -b "$KCLUSTER_BROKERS" -t "$topic" -n 2401 -T 90000 -i 70000 >"$out" 2>/dev/null
    [ "$(wc -l <"$out")" -ge 2401 ] || eos_cluster_short "$topic" "$out"
    expect_exactly_once eos_cluster $topic "$out"
    eos_cluster_end
}

# eos_cluster_short TOPIC OUT: a read_committed read that came short (seen
# twice in CI under load, 5 and 7 events missing, all recorded as sent):
# say whether the events are in the log at all (read_uncommitted) and
# whether a second read_committed read, 120 s on, finds them, so that a
# transaction held open is told from a loss.
eos_cluster_short() {
    local u=$2.uncommitted again=$2.again
    "$TOOLS/outbox-consume" -b "$KCLUSTER_BROKERS" -t "$1" -U -T 20000 -i 10000 >"$u" 2>/dev/null
    "$TOOLS/outbox-consume" -b "$KCLUSTER_BROKERS" -t "$1" -n 2401 -T 120000 -i 100000 >"$again" 2>/dev/null
    echo "#   read_committed got $(wc -l <"$2") of 2401; read_uncommitted then saw" \
        "$(cut -f5 "$u" | sed 's/,.*//' | sort -u | wc -l) distinct events; read_committed again: $(wc -l <"$again")"
}

# eos_cluster_end: the relay back on the suite's broker in at_least_once,
# the cluster gone.
eos_cluster_end() {
    set_delivery at_least_once
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    kcluster_stop
}

# Fencing: the old primary's relay frozen (SIGSTOP) mid-flow, a standby
# promoted (the old primary left running: a zombie), its relay started
# with the same transactional.id; then the zombie resumed.  It cannot
# commit: it says "fenced" and stops; a read_committed consumer sees every
# event once, in key order.
t_eos_fencing() {
    local topic=it.eos.fence out=$IT_TMP/eos_fence.tsv standby=$CLUSTER_DIR/standby_eos sport=5434 n=3000
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR zombie lsn
    standby_sql() { "$PGBIN/psql" -X -q -At -p $sport -d "$IT_DB" -c "$1"; }
    eos_ready
    set_batch_size 20
    cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$standby" -R -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; return; }
    echo "port = $sport" | cluster_run tee -a "$standby/postgresql.conf" >/dev/null
    cluster_run "$server_bin/pg_ctl" -D "$standby" -l "$IT_TMP/standby_eos.log" -w start >/dev/null \
        || { fail "standby did not start"; return; }
    sql "SELECT count(outbox.enqueue('T', '$topic-' || i, jsonb_build_object('i', i), topic => '$topic', msg_key => 'k' || i % 10))
         FROM generate_series(1, $n) i" >/dev/null
    mid_flow $topic $n 300
    zombie=$(relay_pid)
    kill -STOP "$zombie"
    lsn=$(sql "SELECT pg_current_wal_lsn()")
    wait_until_standby "$lsn" || { fail "the standby did not replay up to $lsn"; kill -CONT "$zombie"; eos_fencing_end; return; }
    cluster_run "$server_bin/pg_ctl" -D "$standby" -w promote >/dev/null || fail "promotion failed"
    local deadline=$((SECONDS + 90))
    until [ "$(standby_sql "SELECT count(*) FILTER (WHERE status = 'sent') = $n FROM outbox.events WHERE topic = '$topic'")" = t ]; do
        [ $SECONDS -lt $deadline ] || { fail "the promoted standby did not send the rest: $(standby_sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"; break; }
        sleep 0.2
    done
    kill -CONT "$zombie"
    wait_until 60 "SELECT state = 'fenced' FROM outbox.relay_status()" \
        || fail "the resumed relay does not say it is fenced: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"
    consume $topic $((2 * n)) 30000 3000 >"$out"
    expect_exactly_once fencing $topic "$out"
    eos_fencing_end
}

# wait_until_standby LSN: until the standby of t_eos_fencing replayed LSN.
wait_until_standby() {
    local deadline=$((SECONDS + 60))
    until [ "$(standby_sql "SELECT pg_last_wal_replay_lsn() >= '$1'")" = t ]; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
}

# eos_fencing_end: the standby gone, the old primary's relay back in
# at_least_once (a reload ends its fenced wait).
eos_fencing_end() {
    cluster_run "$CLUSTER_INSTALL$PG_BINDIR/pg_ctl" -D "$CLUSTER_DIR/standby_eos" -m fast stop >/dev/null
    reset_batch_size
    set_delivery at_least_once
}

# mock_eos_ready TOPIC: exactly_once on the mock broker, and the first
# event of TOPIC (seq 1) sent through it; false, and at_least_once again,
# if it was not.
mock_eos_ready() {
    mock create "$1" 1
    mock create outbox_progress 1
    set_exactly_once
    enqueue "$1" 1 "$1"
    wait_until 30 "$(all_sent "$1" 1)" && return 0
    fail "exactly_once on the mock broker sent nothing: $(relay_state)"
    set_delivery at_least_once
    return 1
}

# mock_eos_commits_answered TOPIC COUNT CODE: the next COUNT commits
# (EndTxn) answered with error CODE, then events 2-10 of TOPIC enqueued;
# LOG_MARK is set before.
mock_eos_commits_answered() {
    LOG_MARK=$(log_mark)
    mock request-errors 26 "$2" "$3"
    sql "SELECT count(outbox.enqueue('T', '$1-' || i, jsonb_build_object('seq', i),
                                     topic => '$1', msg_key => 'k'))
           FROM generate_series(2, 10) i" >/dev/null
}

# exactly_once, mock broker: Kafka answers a commit (EndTxn) with
# INVALID_TXN_STATE, which librdkafka makes fatal to the producer.  The
# relay makes a new producer after a backoff, with no reload (before, it
# stopped sending until one); the new producer's init_transactions ends
# what was open, and each event reaches read_committed consumers once.
t_eos_commit_fatal() {
    local topic=mock.eos.fatal pid
    mock_eos_ready $topic || return
    pid=$(relay_pid)
    mock_eos_commits_answered $topic 1 48 # INVALID_TXN_STATE
    log_shows 'outbox relay: making a new Kafka producer'
    log_shows 'DETAIL:  The producer failed: could not commit a Kafka transaction: '
    arrive_once $topic 10 "$MOCK_BROKERS"
    relay_steady "$pid"
    set_delivery at_least_once
}

# exactly_once, mock broker: a transaction kept open past
# transaction.timeout.ms (1 s here: its commit answered "concurrent
# transactions" for 3 s), whose commit is then answered
# INVALID_PRODUCER_EPOCH, as a coordinator answers once it aborted the
# transaction for its timeout and bumped the epoch; librdkafka reports it
# as a fence.  No other relay fenced this one: it says why, makes a new
# producer and delivers every event once, rather than stop until a
# reload.  (A relay cut from Kafka that long meets it: the partition
# suite.)  Then the same fence on the next transaction, once the outlived
# one was committed after all: the coordinator's abort for the timeout
# may come after the relay's own end, and fence the transaction after.
# A fence of a transaction that no outlived one came shortly before still
# halts: eos_fencing.
t_eos_fence_outlived() {
    local topic=mock.eos.outlived next=mock.eos.outlived.next pid
    properties_applied "transaction.timeout.ms=1000;message.timeout.ms=1000"
    mock_eos_ready $topic || return
    pid=$(relay_pid)
    mock_eos_commits_answered $topic 100000 51 # CONCURRENT_TRANSACTIONS
    sleep 3
    # In one step: a commit retried between a clear and the next error
    # would go through, and nothing would fence.
    mock replace-errors 26 1 47 # INVALID_PRODUCER_EPOCH
    fence_outlived_said
    arrive_once $topic 10 "$MOCK_BROKERS"

    mock create $next 1
    mock_eos_commits_answered $next 100000 51
    sleep 3
    mock clear 26
    wait_until 20 "$(all_sent $next 9)" || fail "the outlived transaction was not committed once answered"
    LOG_MARK=$(log_mark)
    mock request-errors 26 1 47
    enqueue $next 1 next-after
    fence_outlived_said
    UNORDERED=1 arrive_once $next 10 "$MOCK_BROKERS"
    relay_steady "$pid"
    set_delivery at_least_once
    reset_properties
}

# fence_outlived_said: since LOG_MARK the relay made a new producer for a
# transaction that outlived its timeout, and did not halt.
fence_outlived_said() {
    log_shows 'outbox relay: making a new Kafka producer'
    log_shows 'DETAIL:  The producer failed: .*the transaction outlived transaction.timeout.ms'
    ! log_since "$LOG_MARK" | grep -q "stopped sending until a reload" \
        || fail "the relay took its own timed-out transaction for another relay's fence"
}

# exactly_once, mock broker: the coordinator answers commits with
# CONCURRENT_TRANSACTIONS (retriable) for longer than 15 s: librdkafka
# goes on trying, and the relay says once what it waits for, in its log
# and relay_status(); once Kafka commits, the events arrive once.
t_eos_commit_slow() {
    local topic=mock.eos.slow pid
    mock_eos_ready $topic || return
    pid=$(relay_pid)
    mock_eos_commits_answered $topic 100000 51 # CONCURRENT_TRANSACTIONS
    log_shows 'outbox relay: Kafka has not finished committing a transaction in 15 s'
    log_shows 'DETAIL:  The cause Kafka gave: .*The relay goes on trying'
    status_shows 'Kafka has not finished committing a transaction'
    mock clear 26
    log_shows 'outbox relay: Kafka finished committing the transaction'
    arrive_once $topic 10 "$MOCK_BROKERS"
    relay_steady "$pid"
    set_delivery at_least_once
}

# exactly_once, mock broker: two stuck topics and a healthy one get events
# for 6 s: the healthy one every 0.1 s, each stuck one every second, in
# turn.  The first, known to the relay's producer before, the broker
# refuses (TOPIC_AUTHORIZATION_FAILED): the coordinator refuses to add its
# partition, which fails the whole transaction at once, and the relay must
# blame the topic, not the broker.  The second the broker does not know
# (UNKNOWN_TOPIC_OR_PART, which may pass: a refusal for good would make its
# events dead at once and hold nothing): its events wait for metadata, and
# the transaction carrying one is aborted after a second.  Either way the
# topic is then held until its event is due again (backoff 2-8 s here), so
# most transactions carry the healthy topic alone: two thirds of its
# events reach a read_committed consumer within 500 ms of their enqueue
# (51 to 60 here; about half when the topic is not held, a handful when
# the broker is blamed).  Before, every transaction carrying a stuck
# event waited a second for it, or the whole relay backed off as if the
# broker were down.  The mock broker shows read_committed consumers
# the copies of aborted transactions too: each event's latest copy counts.
# Once the broker allows the topics, their events arrive.
t_eos_stuck_topic_isolated() {
    local known=mock.eos.refused unknown=mock.eos.stuck healthy=mock.eos.stuck.healthy
    local out=$IT_TMP/eos_stuck.tsv pid cpid fast topic
    skip_case "$(mock_topic_errors_crash)" && return
    mock_eos_ready $healthy || return
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    set_setting outbox.max_attempts 100
    set_setting outbox.backoff_min 2000
    set_setting outbox.backoff_max 8000
    properties_applied "message.timeout.ms=30000"
    mock create $known 1
    sql "SELECT outbox.enqueue('T', '$known-1', '{}', topic => '$known', msg_key => 'r1')" >/dev/null
    wait_until 30 "$(all_sent $known 1)" || fail "the first event of $known was not sent"
    mock topic-error $known 29
    mock create $unknown 1
    mock topic-error $unknown 3
    mock_consume $healthy 1000 20000 3000 >"$out" &
    cpid=$!
    for i in $(seq 2 61); do
        sql "SELECT outbox.enqueue('T', '$healthy-$i', '{}', topic => '$healthy', msg_key => 'h$i')" >/dev/null
        if [ $((i % 5)) = 0 ]; then
            topic=$known && [ $((i % 10)) = 0 ] && topic=$unknown
            sql "SELECT outbox.enqueue('T', '$topic-$i', '{}', topic => '$topic', msg_key => 's$i')" >/dev/null
        fi
        sleep 0.1
    done
    wait "$cpid"
    load_consumed got_stuck_healthy "$out"
    expect_delivered "events of $healthy" got_stuck_healthy "SELECT id FROM outbox.event_log WHERE topic = '$healthy'"
    fast=$(sql "SELECT count(*) FILTER (WHERE g.received_us - extract(epoch FROM l.created_at) * 1e6 < 500000)
                  FROM (SELECT event_id, max(received_us) AS received_us FROM got_stuck_healthy GROUP BY 1) g
                  JOIN outbox.event_log l ON l.id = g.event_id
                 WHERE l.biz_key LIKE '$healthy-%'")
    echo "#   $fast of 60 healthy events reached the consumer within 500 ms of their enqueue"
    echo "#   the coordinator refused to add a refused topic's partition $(log_count 'Failed to add partition') times"
    [ "$fast" -ge 40 ] || fail "only $fast of 60 healthy events within 500 ms: the stuck topics stalled the others"
    for topic in $known $unknown; do
        mock topic-error $topic 0
        got_every_event $topic "SELECT id FROM outbox.event_log WHERE topic = '$topic'" 60 "$MOCK_BROKERS"
    done
    relay_steady "$pid"
    reset_properties
    for s in max_attempts backoff_min backoff_max; do reset_setting outbox.$s; done
    set_delivery at_least_once
}

# A setting changed and changed back (here outbox.delivery) while a batch
# is in flight: the producer is kept, and the relay goes on sending.
# Before, the second reload left it waiting for a drain that had no end:
# idle for good, with events pending.
t_reload_undone() {
    local topic=it.reload.undone
    eos_ready
    sql "SELECT count(outbox.enqueue('T', 'a-' || i, '{}', topic => '$topic', msg_key => 'k' || i % 3)) FROM generate_series(1, 30) i" >/dev/null
    set_delivery at_least_once
    set_delivery exactly_once
    sql "SELECT count(outbox.enqueue('T', 'b-' || i, '{}', topic => '$topic', msg_key => 'k' || i % 3)) FROM generate_series(1, 30) i" >/dev/null
    wait_until 30 "$(all_sent $topic 60)" \
        || fail "the relay stopped sending after the reload was undone: $(sql "SELECT status || ' ' || count(*) FROM outbox.events WHERE topic = '$topic' GROUP BY status")"
    set_delivery at_least_once
}

# A topic whose leader is not there yet (Metadata answers
# LEADER_NOT_AVAILABLE, as while the cluster creates a topic on first use)
# in a Kafka transaction of its own: the progress record, sent with the
# events and answered at once, is no sign that they are stuck.  The
# transaction waits for the topic instead of being aborted, and its events
# go once, none with a failed attempt.
t_eos_leaderless_topic_waits() {
    local topic=mock.eos.leaderless
    skip_case "$(mock_topic_errors_crash)" && return
    mock_eos_ready mock.eos.leaderless.ready || return
    mock create $topic 1
    mock topic-error $topic 5
    LOG_MARK=$(log_mark)
    enqueue $topic 10 lt
    # The relay must have the events in flight to the leaderless topic
    # (else a loaded relay that had not read them yet would pass the
    # checks below on luck); then 3 s, well past the second after which a
    # batch not acknowledged is taken for stuck (flight.c, HANDOVER_MS).
    wait_until 20 "SELECT count(*) = 1 FROM pg_stat_activity
                    WHERE backend_type = 'outbox relay' AND query = 'waiting for Kafka acknowledgements'" \
        || fail "leaderless topic: the relay never waited for Kafka's acknowledgement of its events"
    sleep 3
    expect "leaderless topic: sent while it had no leader" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'sent'")" 0
    mock topic-error $topic 0
    arrive_once $topic 10 "$MOCK_BROKERS"
    expect "leaderless topic: events with a failed attempt" \
        "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND attempts > 0")" 0
    expect "leaderless topic: said stuck" "$(log_since "$LOG_MARK" | grep -c "topic \"$topic\" are stuck")" 0
    set_delivery at_least_once
}

# An asynchronous standby promoted behind the primary, in exactly_once:
# the promoted relay finds the lost primary's progress ahead of its own
# cursor, and no event it enqueues takes an identity a lost one had
# (t_async_promotion, real_broker.sh).
t_eos_async_promotion() {
    eos_ready
    async_promotion it.eos.async_failover
    set_delivery at_least_once
}

# A server restored beside production (t_pitr_beside, t_backup_beside,
# real_broker.sh), in exactly_once: it takes a Kafka identity of its own,
# so production's relay is never fenced.
t_eos_pitr_beside() {
    eos_ready
    restored_beside it.eos.pitr pitr
    set_delivery at_least_once
}

t_eos_backup_beside() {
    eos_ready
    restored_beside it.eos.backup backup
    set_delivery at_least_once
}
