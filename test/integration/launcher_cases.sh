# test/integration/launcher_cases.sh: the launcher's DROP DATABASE hold
# and the relay's wake-up at commit, against the real broker.  Every case
# leaves the relay serving $IT_DB as it found it.

# relay_in DB: SQL true when one relay runs, connected to DB.
relay_in() {
    echo "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = '$1'"
}

# consumed_ids FILE: the event ids of the messages in FILE (outbox-consume
# output), one a line, sorted.
consumed_ids() {
    cut -f5 "$1" | sed -n 's/^event_id=\([0-9]*\).*/\1/p' | sort -n
}

# has_id FILE ID: whether the message of event ID is in FILE.
has_id() {
    consumed_ids "$1" | grep -qx "$2"
}

# A role with no rights runs DROP DATABASE of the relayed database, again
# and again (refused, 42501); so does a superuser inside a transaction
# block (refused, 25001).  Neither stops the relay, and the events
# enqueued meanwhile arrive.
t_drop_database_no_rights() {
    local topic=it.drop_no_rights out=$IT_TMP/drop_no_rights.tsv pid err id ids=()
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_nobody; CREATE ROLE it_nobody LOGIN"
    wait_until 20 "$(relay_in "$IT_DB")" || fail "no relay for $IT_DB to begin with"
    pid=$(relay_pid)
    for i in 1 2 3 4 5; do
        err=$("$PGBIN/psql" -X -q -U it_nobody -d postgres -v VERBOSITY=verbose -c "DROP DATABASE $IT_DB" 2>&1) \
            && fail "it_nobody dropped $IT_DB"
        [[ "$err" == *"ERROR:  42501:"* ]] || fail "DROP DATABASE by a role with no rights: $err"
        err=$("$PGBIN/psql" -X -q -d postgres -v VERBOSITY=verbose -c "BEGIN" -c "DROP DATABASE $IT_DB" 2>&1)
        [[ "$err" == *"ERROR:  25001:"* ]] || fail "DROP DATABASE in a transaction block: $err"
        expect "relay after DROP DATABASE number $i" "$(relay_pid)" "$pid"
        id=$(sql "SELECT outbox.enqueue('T', 'nr-$i', '{}', topic => '$topic')")
        ids+=("$id")
    done
    consume $topic 5 20000 >"$out" || fail "not all 5 events arrived ($(wc -l <"$out"))"
    expect "events delivered" "$(consumed_ids "$out" | tr '\n' ' ')" "$(printf '%s\n' "${ids[@]}" | sort -n | tr '\n' ' ')"
    sql "DROP ROLE it_nobody"
    wait_until 30 "$(relay_in "$IT_DB")" || fail "the relay did not come back for $IT_DB"
}

# A superuser's DROP DATABASE of the relayed database, waiting for another
# session to leave, is ended by pg_terminate_backend (FATAL: no error
# cleanup runs).  The relay comes back and events flow.  Then the
# database's owner, not a superuser, drops it WITH (FORCE) although the
# relay (a superuser's process) serves it.
t_drop_database_terminated() {
    local topic=it.drop_terminated out=$IT_TMP/drop_terminated.tsv db=outbox_victim_fatal
    local sleeper dropper id
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_owner; CREATE ROLE it_owner LOGIN"
    sql "CREATE DATABASE $db OWNER it_owner"
    "$PGBIN/psql" -X -q -d $db -c "CREATE EXTENSION outbox"
    set_setting outbox.database $db
    wait_until 20 "$(relay_in $db)" || fail "no relay started for $db"

    # A session of the owner stays in $db: DROP DATABASE waits up to 5 s.
    PGAPPNAME=it_sleeper "$PGBIN/psql" -X -q -U it_owner -d $db -c "SELECT pg_sleep(120)" >/dev/null 2>&1 &
    sleeper=$!
    wait_until 10 "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'it_sleeper' AND state = 'active'" \
        || fail "the session in $db did not start"
    PGAPPNAME=it_dropper "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE $db" >"$IT_TMP/dropper.log" 2>&1 &
    dropper=$!
    wait_until 10 "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE backend_type = 'outbox relay')
                      AND EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'it_dropper' AND state = 'active')" \
        || fail "DROP DATABASE did not stop the relay and wait"
    sql "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'it_dropper'" >/dev/null
    wait "$dropper" && fail "DROP DATABASE was not terminated: $(cat "$IT_TMP/dropper.log")"
    expect "$db after the terminated DROP" "$(sql "SELECT count(*) FROM pg_database WHERE datname = '$db'")" 1

    wait_until 20 "$(relay_in $db)" || fail "the relay did not come back after the DROP DATABASE session was terminated"
    id=$("$PGBIN/psql" -X -q -At -d $db -c "SELECT outbox.enqueue('T', 'fatal-1', '{}', topic => '$topic')")
    consume $topic 1 20000 >"$out" || fail "no delivery after the terminated DROP DATABASE"
    has_id "$out" "$id" || fail "event $id did not arrive (got: $(consumed_ids "$out"))"

    timeout 30 "$PGBIN/psql" -X -q -U it_owner -d postgres -c "DROP DATABASE $db WITH (FORCE)" \
        || fail "the owner's DROP DATABASE WITH (FORCE) of the relayed database failed"
    kill "$sleeper" 2>/dev/null
    wait "$sleeper"
    set_setting outbox.database "$IT_DB"
    sql "DROP ROLE it_owner"
    wait_until 30 "$(relay_in "$IT_DB")" || fail "the relay did not come back for $IT_DB"
}

# COMMIT PREPARED wakes the relay (outbox.poll_interval at 60 s would
# otherwise hold the event back that long).  PREPARE leaves no wake-up
# behind: the session's next transaction, which writes an event without
# outbox.enqueue, does not wake the relay.
t_commit_prepared_wakes() {
    local topic=it.prepared out=$IT_TMP/prepared.tsv marker e0 e1 e2 ids
    marker=$(log_mark)
    set_setting outbox.poll_interval 60000
    wait_log "$marker" 10 'parameter "outbox.poll_interval" changed to "60000"' || fail "the reload was not logged"
    # A commit wakes the relay, which by then has read the new setting.
    e0=$(sql "SELECT outbox.enqueue('T', 'pr-0', '{}', topic => '$topic')")
    consume $topic 1 10000 >"$out" || fail "the first event did not arrive"

    ids=$("$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$IT_DB" <<SQL
BEGIN;
SELECT outbox.enqueue('T', 'pr-1', '{}', topic => '$topic');
PREPARE TRANSACTION 'it_prepared';
INSERT INTO outbox.event_log (biz_type, biz_key, topic, msg_key, payload)
VALUES ('T', 'pr-2', '$topic', 'pr-2', '{}') RETURNING id;
SQL
    )
    e1=$(sed -n 1p <<<"$ids")
    e2=$(sed -n 2p <<<"$ids")
    [ -n "$e1" ] && [ -n "$e2" ] || fail "could not prepare: $ids"
    consume $topic 2 3000 >"$out"
    has_id "$out" "$e2" && fail "the transaction after PREPARE woke the relay (event $e2 was sent)"

    sql "COMMIT PREPARED 'it_prepared'"
    consume $topic 3 3000 >"$out"
    has_id "$out" "$e1" || fail "COMMIT PREPARED did not wake the relay: event $e1 not there within 3 s (got: $(consumed_ids "$out" | tr '\n' ' '))"

    sql "SELECT gid FROM pg_prepared_xacts WHERE gid = 'it_prepared'" | grep -q . && sql "ROLLBACK PREPARED 'it_prepared'"
    sql "ALTER SYSTEM RESET outbox.poll_interval" && sql "SELECT pg_reload_conf()" >/dev/null
    consume $topic 3 20000 >"$out" || fail "not all events arrived once the poll interval was restored"
}

# A steady stream of commits from four sessions, with a poll interval of a
# minute: every event arrives within seconds of the last commit, so each
# was read on a commit's wake-up.  Rounds woken by Kafka's
# acknowledgements or by the relay's timers read nothing, and must not
# swallow a commit's wake-up.
t_stream_wakes() {
    local topic=it.stream out=$IT_TMP/stream.tsv marker n=250 c i p pids=()
    marker=$(log_mark)
    set_setting outbox.poll_interval 60000
    wait_log "$marker" 10 'parameter "outbox.poll_interval" changed to "60000"' || fail "the reload was not logged"
    for c in 1 2 3 4; do
        for i in $(seq 1 $n); do
            echo "SELECT outbox.enqueue('T', 'st-$c-$i', '{}', topic => '$topic');"
        done | "$PGBIN/psql" -X -q -d "$IT_DB" -v ON_ERROR_STOP=1 >/dev/null &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || fail "a writer failed"
    done
    consume $topic $((4 * n)) 10000 >"$out" \
        || fail "$(wc -l <"$out") of $((4 * n)) events arrived within 10 s of the last commit (poll interval 60 s)"
    load_consumed got_stream "$out"
    expect_delivered "the stream's events" got_stream "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    sql "ALTER SYSTEM RESET outbox.poll_interval" && sql "SELECT pg_reload_conf()" >/dev/null
}

# scripts/demo's EXIT trap, under the demo's set -e, with the mock broker
# already gone: every step still runs, the cluster is destroyed.
t_demo_cleanup() {
    local out
    out=$(bash -c 'set -euo pipefail
        kafka_stop() { echo kafka_stop; return 1; }
        cluster_destroy() { echo cluster_destroy; }
        eval "$(sed -n "/^cleanup() {/,/^}/p" scripts/demo)"
        sleep 0 &
        MOCK_PID=$!
        wait "$MOCK_PID"
        trap cleanup EXIT
        exit 0' 2>&1)
    expect "cleanup steps run" "$(tr '\n' ' ' <<<"$out")" "kafka_stop cluster_destroy "
}
