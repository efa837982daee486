# test/chaos/faults.sh: the chaos suite's clients, faults and final checks.
# Sourced by test/chaos/run after test/integration/lib.sh; each t_* is one
# step, run by run_case.

SERVER_BIN=${CLUSTER_INSTALL:-}$PG_BINDIR
CONSUMER_PID=
LOCKER_PID=
# Relay crashes the run made (SIGKILL, immediate stop, failover): each may
# leave one acknowledged but unrecorded batch to be sent again, so the
# README's bound on duplicates is CRASHES x outbox.max_in_flight_events.
CRASHES=0
# The number K of each relay killed between Kafka's acknowledgement and
# its record: chaos_recorded holds, under K, the window's events recorded
# before the kill, and chaos_unrecorded those past the cursor's place.  Some
# of the latter were in Kafka and must arrive again; the recorded must not.
UNRECORDED=()

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

# The broker killed, down for seconds, started again on its data; the
# relay goes on sending: an event committed after the restart (its id
# above every id committed before it) is recorded sent.  Not a count of
# sent events sampled during the outage: acknowledgements Kafka gave
# before the kill may be recorded after the sample (the relay's commit
# waits for the synchronous standby), and would pass for sends after
# the restart.
t_broker_down() {
    local after
    kafka_kill
    sleep 3
    kafka_start || { fail "broker did not restart"; return; }
    after=$(sql "SELECT coalesce(max(id), 0) FROM outbox.event_log")
    wait_until 60 "SELECT EXISTS (SELECT 1 FROM outbox.events WHERE id > $after AND status = 'sent')" \
        || fail "no event committed after the broker's restart was sent in 60 s: $(sql "SELECT count(*)
                 FROM outbox.event_log WHERE id > $after") committed since"
}

# Produce errors: with max.message.bytes below any event's size the broker
# refuses every produce request (MESSAGE_TOO_LARGE); the relay records the
# failed attempts and retries with backoff until the limit is lifted.  128
# bytes: above the batch of a transaction marker (about 80), which the
# broker must still write to abort a transaction: at 64, Kafka could not,
# and the coordinator kept the relay's transactional.id busy for good.
#
# The fault is seen to land: the relay names the broker's refusal (failed
# attempts and retries alone may be the broker outage's, just before).
# 60 s: the broker takes the topic's new configuration in its own time,
# which the relay does not bound.
t_produce_errors() {
    local since
    since=$(sql "SELECT clock_timestamp()")
    topic_config --add-config max.message.bytes=128 || { fail "could not set max.message.bytes"; return; }
    wait_until 60 "SELECT (SELECT last_error_at > '$since' AND last_error ~* 'too large' FROM outbox.relay_status())
                       OR EXISTS (SELECT 1 FROM outbox.event_state WHERE updated_at > '$since' AND last_error ~* 'too large')" \
        || fail "the relay never said the broker refused a message as too large in 60 s: $(sql "SELECT coalesce(last_error, '(no error)') FROM outbox.relay_status()")"
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
    kill -KILL "$pid" && CRASHES=$((CRASHES + 1))
    wait_until 60 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> $pid" \
        || fail "the relay did not come back"
}

# The relay SIGKILLed in the window the README names, after Kafka
# acknowledged a batch and before the relay recorded it, in the middle of
# a window of several batches: a pause first piles up a backlog of 2.5
# batches, so after the resume a batch of the window is recorded when the
# next is in flight.  A session holds the cursor row, so the relay's
# record waits (up to its 5 s lock_timeout) while the batch is in Kafka.
# This crash certainly makes duplicates (so the dedupe checks cannot pass
# for want of any), and t_outcome checks which: the batch in flight comes
# again, the batches recorded before it do not.
t_relay_killed_unrecorded() {
    local try pid batch recorded unrecorded stuck pending waited=$SECONDS kill=$((${#UNRECORDED[@]} + 1))
    batch=$(sql "SHOW outbox.batch_size")
    # Events of a key with a retry pending are held, not sent: after the
    # produce-error fault a window can be made of them alone for minutes
    # (see README, "A refused event's neighbours"), and no try could find
    # any of it in Kafka.  Wait for the retries, within bounds.
    pending=$(sql "SELECT count(*) FROM outbox.event_state WHERE status IN ('new', 'sending')")
    if wait_until 180 "SELECT count(*) = 0 FROM outbox.event_state WHERE status IN ('new', 'sending')"; then
        [ "$pending" = 0 ] || echo "#   $pending events waited for a retry; none after $((SECONDS - waited)) s"
    else
        echo "#   $pending events waited for a retry; still $(sql "SELECT count(*) FROM outbox.event_state
                WHERE status IN ('new', 'sending')") after 180 s"
    fi
    for try in 1 2 3 4 5; do
        stuck=$(stuck_said)
        pid=$(relay_pid)
        [ -n "$pid" ] || { fail "no relay running"; return; }
        sql "SELECT outbox.pause()" >/dev/null
        wait_until 120 "SELECT backlog >= $batch * 5 / 2 FROM outbox.stats" \
            || { sql "SELECT outbox.resume()" >/dev/null; fail "no backlog of 2.5 batches in 120 s"; return; }
        sql "SELECT outbox.resume()" >/dev/null
        if cursor_locker_start "$pid" && wait_relay_blocked "$pid" "recording deliveries%" 35 \
            && [ "$(sql "SELECT count(*) FILTER (WHERE relayed) > 0 AND count(*) FILTER (WHERE NOT relayed) > 0
                          FROM ($WINDOW_SQL) w")" = t ] && unrecorded_in_kafka; then
            # Recorded as sent: past the cursor's place and not held back
            # for a retry (those are sent later, and may come twice then).
            sql "INSERT INTO chaos_recorded SELECT $kill, id FROM ($WINDOW_SQL) w
                  WHERE relayed AND NOT EXISTS (SELECT 1 FROM outbox.event_state s
                                                 WHERE s.id = w.id AND s.status IN ('new', 'sending'))"
            sql "INSERT INTO chaos_unrecorded SELECT $kill, id, id IN (SELECT event_id FROM chaos_tail)
                   FROM ($WINDOW_SQL) w WHERE NOT relayed"
            recorded=$(sql "SELECT count(*) FROM chaos_recorded WHERE kill = $kill")
            unrecorded=$(sql "SELECT count(*) FILTER (WHERE in_kafka) || ' of ' || count(*)
                                FROM chaos_unrecorded WHERE kill = $kill")
            sql "INSERT INTO chaos_kills VALUES ($kill, (extract(epoch FROM clock_timestamp()) * 1000)::bigint)"
            kill -KILL "$pid" && CRASHES=$((CRASHES + 1))
            UNRECORDED+=("$kill")
            cursor_locker_stop
            echo "#   killed before recording a batch, $recorded events of its window recorded," \
                 "$unrecorded past the cursor already in Kafka (try $try)"
            # Events of a topic said stuck are held, never sent: none of
            # them can arrive twice.
            [ "$(stuck_said)" = "$stuck" ] || echo "#   the relay said the topic was stuck during the try"
            wait_until 60 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> $pid" \
                || fail "the relay did not come back"
            return
        fi
        cursor_locker_stop
    done
    fail "the relay was never caught between Kafka's acknowledgement and its record mid-window in 5 tries"
}

# unrecorded_in_kafka: whether, while the relay waits to record, Kafka
# already holds some of the open window's events past the cursor's place
# (read from the tail of each partition into chaos_tail).  If not, the
# batches waiting to be recorded were not acknowledged (refused, or handed
# over as stuck), and a kill now would prove nothing about the window.
unrecorded_in_kafka() {
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t "$TOPIC" -e 20000 -T 3000 -i 300 >"$W/tail.tsv" 2>/dev/null
    load_consumed chaos_tail "$W/tail.tsv"
    [ "$(sql "SELECT EXISTS (SELECT 1 FROM ($WINDOW_SQL) w JOIN chaos_tail t ON t.event_id = w.id
                             WHERE NOT relayed)")" = t ] && return 0
    echo "#   none of the window's events past the cursor was in Kafka yet: $(sql "SELECT count(*) || ' past it, ids '
            || min(id) || '-' || max(id) FROM ($WINDOW_SQL) w WHERE NOT relayed"); the tail read:" \
         "$(sql "SELECT count(*) || ' messages, ids ' || min(event_id) || '-' || max(event_id) FROM chaos_tail")"
    return 1
}

# stuck_said: how often the relay has said a topic was stuck.
stuck_said() {
    cat "$CLUSTER_DIR"/node-*.log | grep -c 'are stuck' || true
}

# The open window's events, each with whether the cursor's place is past it.
WINDOW_SQL="SELECT l.id, ROW(l.tx, l.id) <= ROW(c.window_last_tx, c.window_last_id) AS relayed
              FROM outbox.event_log l, outbox.relay_cursor c
             WHERE c.window_snapshot IS NOT NULL
               AND l.tx >= pg_snapshot_xmin(c.done_snapshot)
               AND pg_visible_in_snapshot(l.tx, c.window_snapshot)
               AND NOT pg_visible_in_snapshot(l.tx, c.done_snapshot)"

# cursor_locker_start PID: a session that waits (up to 30 s) until relay
# PID sends a batch of a window of which a batch is already recorded, then
# locks outbox.relay_cursor's row, so that the relay waits to record it.
# It polls in the server, every few milliseconds: a client would often
# come too late.
cursor_locker_start() {
    PGAPPNAME=chaos-lock "$PGBIN/psql" -X -q -d shop -v ON_ERROR_STOP=1 >>"$W/locker.log" 2>&1 <<SQL &
DO \$\$
DECLARE
    deadline timestamptz := clock_timestamp() + interval '30 s';
BEGIN
    LOOP
        PERFORM pg_stat_clear_snapshot();
        -- Mid-window: part of it recorded, the rest being sent.
        EXIT WHEN EXISTS (SELECT 1 FROM ($WINDOW_SQL) w WHERE relayed)
              AND EXISTS (SELECT 1 FROM ($WINDOW_SQL) w WHERE NOT relayed);
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'the relay sent no batch mid-window in 30 s';
        END IF;
        PERFORM pg_sleep(0.002);
    END LOOP;
    PERFORM 1 FROM outbox.relay_cursor FOR UPDATE;
    PERFORM pg_sleep(20);
END
\$\$;
SQL
    LOCKER_PID=$!
}

# cursor_locker_stop: end the locking session (if the crash has not).
cursor_locker_stop() {
    [ -n "${LOCKER_PID:-}" ] || return 0
    sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'chaos-lock'" \
        >/dev/null 2>&1
    kill -TERM "$LOCKER_PID" 2>/dev/null
    wait "$LOCKER_PID" 2>/dev/null
    LOCKER_PID=
}

# wait_relay_blocked PID ACTIVITY SECONDS: whether relay PID waits for a
# lock within SECONDS in a step whose activity is LIKE ACTIVITY (false at
# once if it waits in another step).
wait_relay_blocked() {
    local deadline=$((SECONDS + $3)) blocked
    while [ $SECONDS -lt $deadline ]; do
        blocked=$(sql "SELECT CASE WHEN wait_event_type = 'Lock' THEN query LIKE '$2' END
                         FROM pg_stat_activity WHERE pid = $1")
        case $blocked in
            t) return 0 ;;
            f) echo "#   the relay waited for a lock in another step"; return 1 ;;
        esac
        sleep 0.05
    done
    echo "#   the relay was not seen waiting for the cursor lock in $3 s"
    return 1
}

# The consumer SIGKILLed with events applied past its committed offsets,
# and started again: it must go on applying new events, and get the
# messages it had applied but not committed again, which the claim
# refuses.  A kill alone leaves such events only if one was applied in
# the last second before it; SIGUSR1 stops the consumer storing offsets,
# and the kill waits for an event applied after that.
t_consumer_killed() {
    local held_at killed_at
    kill -USR1 "$CONSUMER_PID"
    held_at=$(inventory "SELECT clock_timestamp()")
    inventory_wait 120 "SELECT EXISTS (SELECT 1 FROM reservations WHERE applied_at > '$held_at')" \
        || fail "the consumer applied no event in 120 s before the kill"
    killed_at=$(inventory "SELECT clock_timestamp()")
    kill -KILL "$CONSUMER_PID"
    wait "$CONSUMER_PID" 2>/dev/null
    echo "inventory: SIGKILLed" >>"$W/inventory.log"
    chaos_start_consumer
    inventory_wait 120 "SELECT EXISTS (SELECT 1 FROM reservations WHERE applied_at > '$killed_at')" \
        || fail "the restarted consumer applied no event in 120 s"
    inventory_wait 120 "SELECT EXISTS (SELECT 1 FROM refusals f JOIN reservations r USING (event_id)
                                       WHERE f.refused_at > '$killed_at' AND r.applied_at > '$held_at'
                                         AND r.applied_at < '$killed_at')" \
        || fail "no redelivery of an event applied past the committed offsets was refused by the claim in 120 s"
}

inventory_wait() {
    local deadline=$((SECONDS + $1))
    while [ $SECONDS -lt $deadline ]; do
        [ "$(inventory "$2" 2>/dev/null)" = t ] && return 0
        sleep 0.2
    done
    return 1
}

# pg_ctl stop -m immediate on the primary, then start.
t_immediate_stop() {
    node_ctl "$PRIMARY_DATA" "$PRIMARY_PORT" -m immediate stop >/dev/null || fail "immediate stop failed"
    CRASHES=$((CRASHES + 1))
    node_ctl "$PRIMARY_DATA" "$PRIMARY_PORT" -w -t 60 start >/dev/null || fail "primary did not start again"
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "no relay after the restart"
}

# The primary killed; the standby promoted; clients follow it (their
# conninfo lists both nodes) and its relay sends what was left.
t_failover() {
    node_ctl "$PRIMARY_DATA" "$PRIMARY_PORT" -m immediate stop >/dev/null || fail "could not kill the primary"
    CRASHES=$((CRASHES + 1))
    node_ctl "$STANDBY_DATA" "$STANDBY_PORT" -w promote >/dev/null || { fail "promotion failed"; return; }
    local data=$PRIMARY_DATA port=$PRIMARY_PORT
    PRIMARY_DATA=$STANDBY_DATA PRIMARY_PORT=$STANDBY_PORT
    STANDBY_DATA=$data STANDBY_PORT=$port
    export PGPORT=$PRIMARY_PORT
    # The new primary has no standby yet: it must not wait for one.
    sql "ALTER SYSTEM RESET synchronous_standby_names" && sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "no relay on the promoted standby"
    local n deadline=$((SECONDS + 30))
    n=$(acked)
    until [ "$(acked)" -gt "$n" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
    [ "$(acked)" -gt "$n" ] || fail "writers made no progress on the new primary in 30 s"
}

# After the writers stop: the relay sends everything, no event is dead,
# and the consumer has applied every committed event.  It goes on running
# until t_outcome has seen it refuse every duplicate in Kafka.
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
    # Refused, held behind a refused one, or handed over as stuck: each
    # written twice more, a cost the faults make, not the flow between.
    report "sent by the retry step or handed over" "$(sql "SELECT count(*) FROM outbox.event_state")"
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
    # By id too: an event a failover lost, sent before the standby had
    # it, leaves its copy in Kafka while the writer's retry commits anew.
    must_be_0 "delivered, never committed" "SELECT count(*) FROM chaos_delivered d
        WHERE NOT EXISTS (SELECT 1 FROM chaos_committed c WHERE c.ref = d.ref AND c.id = d.event_id)"
    check_duplicates
    check_refusals
    must_be_0 "duplicates applied" "SELECT count(*) - count(DISTINCT event_id) FROM chaos_applied"
    must_be_0 "committed, not applied" "SELECT count(*) FROM chaos_committed c
        WHERE NOT EXISTS (SELECT 1 FROM chaos_applied a WHERE a.event_id = c.id)"
    # An order violation is an event that arrives (first) or is applied
    # after a later event of its key; a missing event is counted as lost.
    must_be_0 "per-key order violations in Kafka" "SELECT count(*) FROM (
        SELECT seq < max(seq) OVER (PARTITION BY key ORDER BY first ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS late
          FROM (SELECT DISTINCT ON (ref) key, (value::jsonb->>'seq')::int AS seq, (part, off) AS first
                  FROM chaos_delivered ORDER BY ref, part, off) f) o WHERE late"
    # The first late arrivals, with where they landed and what the
    # database says of them, to tell which fault made them.
    sql "SELECT '#     late: ' || ref || ' key ' || key || ' seq ' || seq || ' at ' || part || '/' || off
                || ' after seq ' || before || '; state ' || coalesce((SELECT s.status || ' attempts ' || s.attempts
                     || coalesce(' (' || left(s.last_error, 80) || ')', '') FROM outbox.event_state s WHERE s.id = o.event_id), 'first send')
           FROM (SELECT *, max(seq) OVER (PARTITION BY key ORDER BY first ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
                   FROM (SELECT DISTINCT ON (ref) ref, key, event_id, (value::jsonb->>'seq')::int AS seq, part, off, (part, off) AS first
                           FROM chaos_delivered ORDER BY ref, part, off) f) o
          WHERE seq < before ORDER BY part, off LIMIT 10"
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

# check_duplicates: duplicates in Kafka occurred (a run without them
# proves nothing of the dedupe), and stay within the README's bound, at
# most one batch per crash; every batch the relay was killed before
# recording arrived again.
check_duplicates() {
    local dups batch starts kill
    dups=$(sql "SELECT count(*) - count(DISTINCT ref) FROM chaos_delivered")
    batch=$(sql "SHOW outbox.max_in_flight_events")
    starts=$(cat "$CLUSTER_DIR"/node-*.log | grep -c 'outbox relay started' || true)
    report "relay crashes made (relay starts seen)" "$CRASHES ($starts)"
    if [ "$DELIVERY" = exactly_once ]; then
        check_exactly_once "$dups"
        return
    fi
    report "duplicates delivered (bound: crashes x outbox.max_in_flight_events, $batch)" "$dups ($((CRASHES * batch)))"
    [ "$dups" -gt 0 ] || fail "no duplicate delivered: the dedupe checks proved nothing"
    [ "$dups" -le $((CRASHES * batch)) ] \
        || fail "duplicates delivered: $dups, more than the $batch that may be in flight per crash ($CRASHES crashes)"
    for kill in "${UNRECORDED[@]}"; do
        [ "$(sql "SELECT count(*) FROM (SELECT event_id FROM chaos_delivered d JOIN chaos_unrecorded u
                   ON u.id = d.event_id AND u.kill = $kill GROUP BY 1 HAVING count(*) > 1) d")" -gt 0 ] \
            || fail "no event past the cursor at kill $kill, acknowledged but not recorded, arrived twice"
        # Sent again: a copy the relay produced after the kill.  A copy of
        # an event the window sent again for an earlier crash is older.
        must_be_0 "in Kafka before crash $kill but not recorded, not sent again" "SELECT count(*)
            FROM chaos_unrecorded u JOIN chaos_kills k USING (kill)
            WHERE u.kill = $kill AND u.in_kafka AND NOT EXISTS (SELECT 1 FROM chaos_delivered d
                                                                WHERE d.event_id = u.id AND d.created_ms >= k.at_ms)"
        must_be_0 "recorded before crash $kill, sent again" "SELECT count(*)
            FROM chaos_recorded r JOIN chaos_kills k USING (kill)
            WHERE r.kill = $kill AND EXISTS (SELECT 1 FROM chaos_delivered d
                                             WHERE d.event_id = r.id AND d.created_ms >= k.at_ms)"
    done
}

# check_exactly_once DUPS: with outbox.delivery = exactly_once the
# read_committed consumers got no duplicate, though the relay was killed
# after Kafka committed a batch it had not recorded; the relay said, after
# each such kill, that it moved its cursor to Kafka's progress.
check_exactly_once() {
    local moved
    moved=$(cat "$CLUSTER_DIR"/node-*.log | grep -c "DETAIL:  outbox.relay_cursor was moved to the transaction's end" || true)
    report "cursor moved to Kafka's progress at a start" "$moved (relay kills before a record: ${#UNRECORDED[@]})"
    report "duplicates delivered (exactly_once: must be 0)" "$1"
    [ "$1" = 0 ] || fail "duplicates delivered with exactly_once: $1"
    [ "$moved" -ge "${#UNRECORDED[@]}" ] \
        || fail "the relay moved its cursor to Kafka's progress $moved times, after ${#UNRECORDED[@]} kills before a record"
}

# check_refusals: the consumer refused redeliveries, each of an event it
# had applied, and refused every extra copy in Kafka; it may take a while
# to read the last ones.  A loaded machine's consumer, one transaction a
# message, can be minutes behind: it is waited for as long as it makes
# progress, and given up on after 60 s without any (20 minutes at most).
check_refusals() {
    sql "CREATE TABLE chaos_refused (event_id bigint, refused_at timestamptz)"
    local committed done last=-1 moved=$SECONDS deadline=$((SECONDS + 1200))
    committed=$(sql "SELECT count(*) FROM chaos_committed")
    until load_refusals && [ "$(sql "SELECT count(*) FROM chaos_unrefused")" = 0 ] \
        && [ "$(inventory "SELECT count(DISTINCT event_id) FROM reservations")" -ge "$committed" ]; do
        done=$(inventory "SELECT (SELECT count(*) FROM reservations) + (SELECT count(*) FROM refusals)")
        [ "$done" != "$last" ] && { last=$done; moved=$SECONDS; }
        [ $((SECONDS - moved)) -lt 60 ] && [ $SECONDS -lt $deadline ] || break
        sleep 1
    done
    chaos_stop_consumer
    load_refusals
    sql "TRUNCATE chaos_applied"
    inventory "\\copy reservations TO STDOUT" | "$PGBIN/psql" -X -q -d shop -c "\\copy chaos_applied FROM STDIN"
    report "redeliveries refused by the claim" "$(sql "SELECT count(*) FROM chaos_refused")"
    [ "$(sql "SELECT count(*) FROM chaos_refused")" -gt 0 ] \
        || fail "the claim refused no redelivery: the dedupe checks proved nothing"
    must_be_0 "duplicates in Kafka the claim did not refuse" "SELECT count(*) FROM chaos_unrefused"
    must_be_0 "refused, never applied" "SELECT count(*) FROM chaos_refused f
        WHERE NOT EXISTS (SELECT 1 FROM chaos_applied a WHERE a.event_id = f.event_id)"
}

# load_refusals: the consumer's refusals so far into chaos_refused, and
# chaos_unrefused, the events with more extra copies in Kafka than
# refusals.
load_refusals() {
    sql "TRUNCATE chaos_refused"
    inventory "\\copy refusals TO STDOUT" | "$PGBIN/psql" -X -q -d shop -c "\\copy chaos_refused FROM STDIN"
    sql "CREATE OR REPLACE VIEW chaos_unrefused AS
           SELECT event_id FROM (SELECT event_id, count(*) AS copies FROM chaos_delivered GROUP BY 1) k
             LEFT JOIN (SELECT event_id, count(*) AS refused FROM chaos_refused GROUP BY 1) f USING (event_id)
            WHERE k.copies - 1 > coalesce(f.refused, 0)"
}

# keep_evidence: with CHAOS_EVIDENCE set, copy the logs and dump the shop
# database (the outbox, the figures' tables) into that directory.
keep_evidence() {
    [ -n "${CHAOS_EVIDENCE:-}" ] || return 0
    local dir=$CHAOS_EVIDENCE/$DELIVERY
    mkdir -p "$dir" || return 0
    cp "$CLUSTER_DIR"/*.log "$W"/*.log "$dir/" 2>/dev/null
    "$PGBIN/pg_dump" -d shop -f "$dir/shop.sql" 2>/dev/null
    echo "# evidence kept in $dir"
}
