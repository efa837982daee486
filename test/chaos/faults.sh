# test/chaos/faults.sh: the chaos suite's clients, faults and final checks.
# Sourced by test/chaos/run after test/integration/lib.sh; each t_* is one
# step, run by run_case.

SERVER_BIN=${CLUSTER_INSTALL:-}$PG_BINDIR
WRITER_PIDS=()
CONSUMER_PID=

# node_ctl DATA PORT ARGS...: pg_ctl on one node of the pair.
node_ctl() {
    local data=$1 port=$2
    shift 2
    cluster_run "$CLUSTER_INSTALL$PG_BINDIR/pg_ctl" -D "$data" -l "$CLUSTER_DIR/node-$port.log" "$@"
}

# node_stop DATA: stop a node at once if it runs.
node_stop() {
    [ -n "$1" ] && [ -f "$1/postmaster.pid" ] || return 0
    cluster_run "$CLUSTER_INSTALL$PG_BINDIR/pg_ctl" -D "$1" -m immediate stop >/dev/null 2>&1
}

# on_standby SQL: run SQL on the standby.
on_standby() {
    "$PGBIN/psql" -X -q -At -p "$STANDBY_PORT" -d shop -c "$1"
}

# flow: let the writers and the relay run for a while between faults.
flow() {
    sleep "$FLOW"
}

chaos_start_writers() {
    for w in $(seq 1 "$WRITERS"); do
        "$TOOLS/outbox-chaos-writer" -d "$(conninfo shop)" -w "$w" -t "$TOPIC" \
            >"$W/acked.$w" 2>"$W/writer.$w.log" &
        WRITER_PIDS+=($!)
    done
}

chaos_stop_writers() {
    [ ${#WRITER_PIDS[@]} -gt 0 ] || return 0
    kill -TERM "${WRITER_PIDS[@]}" 2>/dev/null
    wait "${WRITER_PIDS[@]}" 2>/dev/null
    WRITER_PIDS=()
}

chaos_start_consumer() {
    "$TOOLS/outbox-chaos-inventory" -b "$KAFKA_BROKERS" -t "$TOPIC" -d "$(conninfo inventory)" \
        2>>"$W/inventory.log" &
    CONSUMER_PID=$!
}

chaos_stop_consumer() {
    [ -n "$CONSUMER_PID" ] || return 0
    kill -TERM "$CONSUMER_PID" 2>/dev/null
    wait "$CONSUMER_PID" 2>/dev/null
    CONSUMER_PID=
}

chaos_stop_clients() {
    chaos_stop_writers
    chaos_stop_consumer
}

# acked: orders the writers have seen committed so far.
acked() {
    cat "$W"/acked.* | wc -l
}

# A fresh standby of the primary, streaming and synchronous: a commit is
# acknowledged only once the standby has it, so a failover loses no
# acknowledged order.
t_standby_in_sync() {
    node_stop "$STANDBY_DATA"
    cluster_run rm -rf "$STANDBY_DATA"
    cluster_run "$SERVER_BIN/pg_basebackup" -p "$PRIMARY_PORT" -D "$STANDBY_DATA" -R -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; return; }
    echo "port = $STANDBY_PORT" | cluster_run tee -a "$STANDBY_DATA/postgresql.conf" >/dev/null
    node_ctl "$STANDBY_DATA" "$STANDBY_PORT" -w start >/dev/null || { fail "standby did not start"; return; }
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_replication WHERE state = 'streaming'" \
        || fail "standby not streaming"
    sql "ALTER SYSTEM SET synchronous_standby_names = '*'" && sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 30 "SELECT sync_state = 'sync' FROM pg_stat_replication" || fail "standby not synchronous"
    expect "outbox workers on the standby" "$(on_standby "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'outbox%'")" 0
}

# The broker killed, down for seconds, started again on its data.
t_broker_down() {
    kafka_kill
    sleep 3
    kafka_start || fail "broker did not restart"
}

# Produce errors: with max.message.bytes below any event's size the broker
# refuses every produce request (MESSAGE_TOO_LARGE); the relay records the
# failed attempts and retries with backoff until the limit is lifted.
t_produce_errors() {
    topic_config --add-config max.message.bytes=64 || { fail "could not set max.message.bytes"; return; }
    wait_until 20 "SELECT failed_last_minute > 0 AND retrying > 0 FROM outbox.stats" \
        || fail "no failed attempts while the broker refused produce requests"
    sleep 1
    topic_config --delete-config max.message.bytes || fail "could not reset max.message.bytes"
}

# topic_config ARGS...: alter the chaos topic's configuration.
topic_config() {
    java -cp "$KAFKA_CP" kafka.admin.ConfigCommand --bootstrap-server "$KAFKA_BROKERS" \
        --entity-type topics --entity-name "$TOPIC" --alter "$@" >>"$W/config.log" 2>&1
}

# The relay SIGKILLed mid-flow; the server restarts its processes.
t_relay_killed() {
    local pid
    pid=$(relay_pid)
    [ -n "$pid" ] || { fail "no relay running"; return; }
    kill -KILL "$pid"
    wait_until 60 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> $pid" \
        || fail "the relay did not come back"
}

# The consumer SIGKILLed (offsets of the last second not committed) and
# started again: it gets those messages again.
t_consumer_killed() {
    kill -KILL "$CONSUMER_PID"
    wait "$CONSUMER_PID" 2>/dev/null
    echo "inventory: SIGKILLed" >>"$W/inventory.log"
    chaos_start_consumer
}

# pg_ctl stop -m immediate on the primary, then start.
t_immediate_stop() {
    node_ctl "$PRIMARY_DATA" "$PRIMARY_PORT" -m immediate stop >/dev/null || fail "immediate stop failed"
    node_ctl "$PRIMARY_DATA" "$PRIMARY_PORT" -w -t 60 start >/dev/null || fail "primary did not start again"
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "no relay after the restart"
}

# The primary killed; the standby promoted; clients follow it (their
# conninfo lists both nodes) and its relay sends what was left.
t_failover() {
    node_ctl "$PRIMARY_DATA" "$PRIMARY_PORT" -m immediate stop >/dev/null || fail "could not kill the primary"
    node_ctl "$STANDBY_DATA" "$STANDBY_PORT" -w promote >/dev/null || { fail "promotion failed"; return; }
    local data=$PRIMARY_DATA port=$PRIMARY_PORT
    PRIMARY_DATA=$STANDBY_DATA PRIMARY_PORT=$STANDBY_PORT
    STANDBY_DATA=$data STANDBY_PORT=$port
    export PGPORT=$PRIMARY_PORT
    # The new primary has no standby yet: it must not wait for one.
    sql "ALTER SYSTEM RESET synchronous_standby_names" && sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "no relay on the promoted standby"
    local n
    n=$(acked)
    sleep 2
    [ "$(acked)" -gt "$n" ] || fail "writers made no progress on the new primary"
}

# After the writers stop: the relay sends everything, no event is dead,
# and the consumer has applied every committed event.
t_drained() {
    local start=$SECONDS
    wait_until 120 "SELECT backlog = 0 AND dead = 0 FROM outbox.stats" \
        || fail "not drained: $(sql "SELECT backlog || ' in backlog, ' || dead || ' dead, ' || retrying || ' retrying' FROM outbox.stats")"
    echo "#   drained $((SECONDS - start)) s after the writers stopped"
    local committed
    committed=$(sql "SELECT count(*) FROM outbox.event_log WHERE topic = '$TOPIC'")
    local deadline=$((SECONDS + 120))
    until [ "$(inventory "SELECT count(DISTINCT event_id) FROM reservations")" -ge "$committed" ] \
        || [ $SECONDS -ge $deadline ]; do sleep 0.5; done
    chaos_stop_consumer
}

# inventory SQL: run SQL in the consumer's database.
inventory() {
    "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d inventory -c "$1"
}

# The figures, from what the writers saw acknowledged, what the shop
# database holds, what a real consumer read from Kafka and what the
# inventory service applied.
t_outcome() {
    cat "$W"/acked.* >"$W/acked.tsv"
    sql "CREATE TABLE chaos_acked (ref text, event_id bigint)"
    sql "\\copy chaos_acked FROM '$W/acked.tsv'"
    consume "$TOPIC" 100000000 120000 5000 >"$W/kafka.tsv"
    load_consumed chaos_kafka "$W/kafka.tsv"
    sql "CREATE TABLE chaos_applied (n bigint, event_id bigint, order_ref text, sku text, qty int, seq int, applied_at timestamptz)"
    inventory "\\copy reservations TO STDOUT" | "$PGBIN/psql" -X -q -d shop -c "\\copy chaos_applied FROM STDIN"
    sql "CREATE VIEW chaos_delivered AS
           SELECT *, substring(headers from 'biz_key=([^,]*)') AS ref FROM chaos_kafka"
    sql "CREATE VIEW chaos_committed AS SELECT id, biz_key AS ref FROM outbox.event_log WHERE topic = '$TOPIC'"

    local committed acked
    committed=$(sql "SELECT count(*) FROM chaos_committed")
    acked=$(sql "SELECT count(*) FROM chaos_acked")
    [ "$committed" -gt 1000 ] || fail "only $committed events committed: the writers hardly ran"
    report "committed events" "$committed"
    report "acknowledged to the writers" "$acked"
    report "delivered (distinct)" "$(sql "SELECT count(DISTINCT ref) FROM chaos_delivered")"
    must_be_0 "acknowledged but not in the database" "SELECT count(*) FROM chaos_acked a
        WHERE NOT EXISTS (SELECT 1 FROM chaos_committed c WHERE c.id = a.event_id AND c.ref = a.ref)"
    sql "SELECT '#     ' || a.ref || ' acked as event ' || a.event_id || '; in the database as event '
                || coalesce((SELECT c.id::text FROM chaos_committed c WHERE c.ref = a.ref), 'none')
                || '; order row ' || CASE WHEN EXISTS (SELECT 1 FROM orders o WHERE o.ref = a.ref) THEN 'present' ELSE 'absent' END
           FROM chaos_acked a
          WHERE NOT EXISTS (SELECT 1 FROM chaos_committed c WHERE c.id = a.event_id AND c.ref = a.ref)"
    must_be_0 "lost (committed, never delivered)" "SELECT count(*) FROM chaos_committed c
        WHERE NOT EXISTS (SELECT 1 FROM chaos_delivered d WHERE d.ref = c.ref AND d.event_id = c.id)"
    must_be_0 "rolled back, delivered" "SELECT count(*) FROM chaos_delivered WHERE ref LIKE 'rb-%'"
    must_be_0 "rolled back, in the database" "SELECT count(*) FROM outbox.event_log WHERE biz_key LIKE 'rb-%'"
    must_be_0 "delivered, never committed" "SELECT count(*) FROM chaos_delivered d
        WHERE NOT EXISTS (SELECT 1 FROM chaos_committed c WHERE c.ref = d.ref)"
    report "duplicates delivered" "$(sql "SELECT count(*) - count(DISTINCT ref) FROM chaos_delivered")"
    must_be_0 "duplicates applied" "SELECT count(*) - count(DISTINCT event_id) FROM chaos_applied"
    must_be_0 "committed, not applied" "SELECT count(*) FROM chaos_committed c
        WHERE NOT EXISTS (SELECT 1 FROM chaos_applied a WHERE a.event_id = c.id)"
    # An order violation is an event that arrives (first) or is applied
    # after a later event of its key; a missing event is counted as lost.
    must_be_0 "per-key order violations in Kafka" "SELECT count(*) FROM (
        SELECT seq < max(seq) OVER (PARTITION BY key ORDER BY first ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS late
          FROM (SELECT DISTINCT ON (ref) key, (value::jsonb->>'seq')::int AS seq, (part, off) AS first
                  FROM chaos_delivered ORDER BY ref, part, off) f) o WHERE late"
    must_be_0 "per-key order violations applied" "SELECT count(*) FROM (
        SELECT seq < max(seq) OVER (PARTITION BY sku ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS late
          FROM chaos_applied) a WHERE late"
    must_be_0 "keys on more than one partition" "SELECT count(*) FROM (
        SELECT key FROM chaos_delivered GROUP BY key HAVING count(DISTINCT part) > 1) k"
    cat "$W"/writer.*.log | awk '/^writer [0-9]+:/ {for (i = 3; i < NF; i += 2) sum[$i] += $(i + 1)}
        END {printf "#   writers: %d committed, %d rolled back, %d retried with the same biz key (%d got another id), %d unknown outcomes retried, %d reconnects\n",
             sum["committed"], sum["rolled_back"], sum["retried"], sum["retry_mismatches"], sum["unknown_outcomes"], sum["reconnects"]}'
    grep '^inventory' "$W/inventory.log" | sed 's/^/#   /'
    ! grep -q 'got event' "$W"/writer.*.log || fail "a retry with the same biz key got another event id"
}

# report NAME VALUE: one line of the figures.
report() {
    printf '#   %-42s %s\n' "$1" "$2"
}

# must_be_0 NAME SQL: a figure that must be zero.
must_be_0() {
    local n
    n=$(sql "$2") || { fail "$1: query failed"; return; }
    report "$1" "$n"
    [ "$n" = 0 ] || fail "$1: $n, want 0"
}
