# test/integration/lib.sh: helpers for the integration suites.
#
# Each case is a shell function named t_*; it prints nothing on success and
# calls fail with a reason otherwise.  run_case turns that into TAP lines.

IT_DB=outbox_it
TOOLS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tools" && pwd)
PGBIN=${PG_BINDIR:-$("${PG_CONFIG:-/usr/lib/postgresql/${PG:-15}/bin/pg_config}" --bindir)}
IT_PASSED=0
IT_FAILED=0
IT_N=0
IT_SKIPPED=0
IT_TODO=0

# sql SQL: run SQL in the test database, unaligned, tuples only.
sql() {
    "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$IT_DB" -c "$1"
}

# fail REASON: mark the current case failed.
fail() {
    IT_CASE_FAILED=1
    echo "#   $*"
}

# expect NAME GOT WANT: fail unless GOT equals WANT.
expect() {
    [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
}

# wait_until SECONDS SQL: poll until SQL returns t; false on timeout.
wait_until() {
    local deadline=$((SECONDS + $1))
    while [ $SECONDS -lt $deadline ]; do
        [ "$(sql "$2" 2>/dev/null)" = t ] && return 0
        sleep 0.1
    done
    return 1
}

# consume TOPIC COUNT [TIMEOUT_MS] [IDLE_MS]: messages of TOPIC on stdout.
consume() {
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t "$1" -n "$2" -T "${3:-30000}" \
        ${4:+-i "$4"} 2>/dev/null
}

# source_of ALIAS: SQL for the outbox_source header of the event_log row
# ALIAS: the database's source, then the incarnation it was enqueued in
# (src/incarnation.c), none for a row from before 0.3.0.
source_of() {
    echo "((SELECT source FROM outbox.relay_cursor)
           || CASE WHEN $1.incarnation = 0 THEN '' ELSE '/' || lpad(to_hex($1.incarnation), 16, '0') END)"
}

# load_consumed TABLE FILE: consumer output into a table of the test database.
load_consumed() {
    sql "SET client_min_messages = warning; DROP TABLE IF EXISTS $1; CREATE TABLE $1 (topic text, part int, off bigint,
         key text, headers text, value text, received_us bigint, created_ms bigint,
         event_id bigint GENERATED ALWAYS AS (substring(headers from 'event_id=([0-9]+)')::bigint) STORED)"
    "$PGBIN/psql" -X -q -d "$IT_DB" -v ON_ERROR_STOP=1 \
        -c "\\copy $1 (topic, part, off, key, headers, value, received_us, created_ms) FROM '$2' WITH (FORMAT csv, DELIMITER E'\\t', QUOTE E'\\x01')"
}

# expect_delivered NAME TABLE SQL: fail unless the distinct event ids in
# TABLE (consumer output, see load_consumed) are exactly the ids SQL
# returns: names how many are missing and how many arrived unasked.
expect_delivered() {
    local got
    got=$(sql "WITH want AS ($3), got AS (SELECT DISTINCT event_id AS id FROM $2)
               SELECT (SELECT count(*) FROM want WHERE id NOT IN (SELECT id FROM got WHERE id IS NOT NULL))
                      || ' missing, ' ||
                      (SELECT count(*) FROM got WHERE id IS NULL OR id NOT IN (SELECT id FROM want))
                      || ' unexpected'")
    expect "$1" "$got" "0 missing, 0 unexpected"
}

# duplicates TABLE: how many messages in TABLE repeat an event id.
duplicates() {
    sql "SELECT count(*) - count(DISTINCT event_id) FROM $1"
}

# log_mark: the server log's current size, to read only what comes after.
log_mark() {
    stat -c %s "$CLUSTER_DIR/server.log"
}

# log_since MARK: the server log written since MARK (see log_mark).
log_since() {
    tail -c +"$(($1 + 1))" "$CLUSTER_DIR/server.log"
}

# wait_log MARK SECONDS PATTERN: poll until the log since MARK matches the
# extended regular expression PATTERN; false on timeout.
wait_log() {
    local deadline=$((SECONDS + $2))
    while [ $SECONDS -lt $deadline ]; do
        log_since "$1" | grep -q -E -- "$3" && return 0
        sleep 0.1
    done
    return 1
}

# relay_pid: the relay process, or nothing.
relay_pid() {
    sql "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay'" 2>/dev/null
}

# topic_ready TOPIC: ask for TOPIC's metadata (the broker creates a topic
# on first use) until every partition of it has a leader, up to 30 s.  A
# case about something else then does not race the topic's creation: the
# first answer is "unknown topic", and a creation that takes longer than
# the relay's second (flight.c, HANDOVER_MS), as under CI's load, has the
# first round to the topic taken for stuck (in exactly_once, aborted).
topic_ready() {
    local deadline=$((SECONDS + 30)) out
    while [ $SECONDS -lt $deadline ]; do
        out=$(kcat -b "$IT_BROKERS" -L -t "$1" -m 5 2>/dev/null)
        grep -q "with [1-9][0-9]* partitions" <<<"$out" && ! grep -q "leader -1" <<<"$out" && return 0
        sleep 0.2
    done
    fail "topic $1: a partition without a leader after 30 s"
    return 1
}

# set_setting NAME VALUE: ALTER SYSTEM and reload.
set_setting() {
    sql "ALTER SYSTEM SET $1 = '$2'" && sql "SELECT pg_reload_conf()" >/dev/null
}

# all_sent TOPIC COUNT: whether COUNT events of TOPIC are all marked sent.
all_sent() {
    echo "SELECT count(*) FILTER (WHERE status = 'sent') = $2 FROM outbox.events WHERE topic = '$1'"
}

# skip_case REASON: mark the running case skipped, with REASON, and
# succeed; with no REASON, fail (the case goes on).  A case that cannot
# run here says why in its TAP line and counts neither way.
skip_case() {
    [ -n "$1" ] || return 1
    IT_CASE_SKIP=$1
}

# todo_case REASON: mark the running case a known failure, with REASON:
# its TAP line is "not ok N - NAME # TODO REASON", counted neither way
# (the failure is known and described; the case goes on).
todo_case() {
    IT_CASE_TODO=$1
}

# run_case NAME: run t_NAME and print its TAP line.
run_case() {
    IT_CASE_FAILED=0
    IT_CASE_SKIP=
    IT_CASE_TODO=
    IT_N=$((IT_N + 1))
    local start=$SECONDS
    if declare -F "t_$1" >/dev/null; then
        "t_$1"
    else
        fail "no function t_$1"
    fi
    if [ -n "$IT_CASE_TODO" ] && [ "$IT_CASE_FAILED" -eq 0 ]; then
        IT_TODO=$((IT_TODO + 1))
        echo "not ok $IT_N - $1 # TODO $IT_CASE_TODO ($((SECONDS - start)) s)"
    elif [ -n "$IT_CASE_SKIP" ] && [ "$IT_CASE_FAILED" -eq 0 ]; then
        IT_SKIPPED=$((IT_SKIPPED + 1))
        echo "ok $IT_N - $1 # SKIP $IT_CASE_SKIP"
    elif [ "$IT_CASE_FAILED" -eq 0 ]; then
        IT_PASSED=$((IT_PASSED + 1))
        echo "ok $IT_N - $1 ($((SECONDS - start)) s)"
    else
        IT_FAILED=$((IT_FAILED + 1))
        echo "not ok $IT_N - $1"
    fi
}

# holds SECONDS SQL [RUNNER]: poll SQL (with RUNNER, default sql) for at
# least SECONDS (whole seconds); false as soon as it does not return t (a
# "nothing happens" check that holds over an interval, not at one instant).
holds() {
    local end=$((${EPOCHREALTIME/./} / 1000 + $1 * 1000)) runner=${3:-sql}
    while [ $((${EPOCHREALTIME/./} / 1000)) -lt $end ]; do
        [ "$("$runner" "$2" 2>/dev/null)" = t ] || return 1
        sleep 0.1
    done
    [ "$("$runner" "$2" 2>/dev/null)" = t ]
}

# report NAME VALUE: one line of a suite's figures.
report() {
    printf '#   %-42s %s\n' "$1" "$2"
}

# must_be_0 NAME SQL: a figure that must be zero; false when it is not.
must_be_0() {
    local n
    n=$(sql "$2") || { fail "$1: query failed"; return 1; }
    report "$1" "$n"
    [ "$n" = 0 ] || { fail "$1: $n, want 0"; return 1; }
}
