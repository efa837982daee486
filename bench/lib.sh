# bench/lib.sh: what the benchmarks share (bench/run, bench/enqueue,
# bench/retention): the server's durability, read back from the running
# server rather than echoed from the script, and refused unless it is what a
# user runs; and a transaction holding an xid open through a measure
# (bench_xid_open / bench_xid_held / bench_xid_close).  Source it after
# test/cluster.sh, with the cluster started.

# bench_durability: one line with the running server's durability settings
# (SHOW), the data directory's file system and this disk's fdatasync time;
# fails unless fsync, synchronous_commit and full_page_writes are on and
# wal_sync_method is the platform's default, so that no figure comes from
# a server that would lose commits in a crash.
bench_durability() {
    local fsync sc fpw wsm wsm_source fs us
    fsync=$(bench_show fsync)
    sc=$(bench_show synchronous_commit)
    fpw=$(bench_show full_page_writes)
    wsm=$(bench_show wal_sync_method)
    wsm_source=$("$PG_BINDIR/psql" -X -At -d postgres -c \
        "SELECT source FROM pg_settings WHERE name = 'wal_sync_method'")
    if [ "$fsync" != on ] || [ "$sc" != on ] || [ "$fpw" != on ] || [ "$wsm_source" != default ]; then
        echo "bench: the server is not durable (fsync $fsync, synchronous_commit $sc," \
            "full_page_writes $fpw, wal_sync_method $wsm from $wsm_source):" \
            "benchmarks run with CLUSTER_DURABLE=1" >&2
        return 1
    fi
    fs=$(findmnt -n -o FSTYPE,SOURCE -T "$CLUSTER_DATA" | tr -s ' ' | sed 's/ / on /')
    us=$(bench_fdatasync_us)
    echo "server (SHOW): fsync $fsync, synchronous_commit $sc, full_page_writes $fpw," \
        "wal_sync_method $wsm (the default); data on $fs, fdatasync of 8 kB ${us} us (pg_test_fsync)"
}

# bench_show NAME: the running server's value of setting NAME.
bench_show() {
    "$PG_BINDIR/psql" -X -At -d postgres -c "SHOW $1"
}

# bench_fdatasync_us: microseconds per fdatasync of one 8 kB write on the
# data directory's disk (pg_test_fsync, 1 s per test, about 15 s): what
# each durable commit waits for at least.
bench_fdatasync_us() {
    "$PG_BINDIR/pg_test_fsync" -s 1 -f "$CLUSTER_DIR/fsync.test" 2>/dev/null |
        awk '/one 8kB write/ {one = 1} one && $1 == "fdatasync" {print $(NF - 1); exit}'
    rm -f "$CLUSTER_DIR/fsync.test"
}

# A transaction holding an xid open, idle, for a measure (bench/run's xid
# case): what a forgotten session or a slow batch job does to every reader
# of the outbox.  One at a time; bench_xid_close ends it, and bench/run's
# exit trap calls it, so it never outlives a failed run.
BENCH_XID_N=0

# bench_xid_open DB DIR: open the transaction in DB (BEGIN; SELECT
# pg_current_xact_id(); then idle) in a psql fed through a FIFO in DIR, and
# return once pg_stat_activity shows its backend idle in transaction with
# an xid (BENCH_XID, BENCH_XID_BACKEND); fails within 10 s otherwise.
bench_xid_open() {
    local fifo=$2/xid.fifo row
    BENCH_XID_N=$((BENCH_XID_N + 1))
    BENCH_XID_APP=bench-xid-$$-$BENCH_XID_N
    rm -f "$fifo" && mkfifo "$fifo"
    # Read-write, so that opening it never waits for psql to start.
    exec {BENCH_XID_FD}<>"$fifo"
    "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -d "dbname=$1 application_name=$BENCH_XID_APP" \
        <"$fifo" >"$2/xid.out" 2>&1 &
    BENCH_XID_PID=$!
    printf '%s\n' "BEGIN;" "SELECT pg_current_xact_id();" >&"$BENCH_XID_FD"
    for _ in $(seq 1 100); do
        row=$(bench_xid_row)
        if [ -n "$row" ]; then
            read -r BENCH_XID_BACKEND BENCH_XID <<<"$row"
            return 0
        fi
        sleep 0.1
    done
    echo "bench: no session of $BENCH_XID_APP idle in transaction with an xid within 10 s" >&2
    cat "$2/xid.out" >&2
    return 1
}

# bench_xid_row: "backend_pid xid" of the open transaction's session while
# it is idle in transaction with an xid, nothing otherwise.
bench_xid_row() {
    "$PG_BINDIR/psql" -X -At -F ' ' -d postgres -c \
        "SELECT pid, backend_xid FROM pg_catalog.pg_stat_activity
          WHERE application_name = '$BENCH_XID_APP' AND state = 'idle in transaction'
            AND backend_xid IS NOT NULL"
}

# bench_xid_held: succeeds if the transaction bench_xid_open began still
# holds the same xid in the same backend (checked at the end of a measure:
# the figure is only labelled with an xid held open if it was, throughout).
bench_xid_held() {
    [ -n "${BENCH_XID_PID:-}" ] && [ "$(bench_xid_row)" = "$BENCH_XID_BACKEND $BENCH_XID" ]
}

# bench_xid_close: end the transaction (COMMIT, then end psql), whatever
# state it is in; if its backend is still there after 10 s, terminate it.
# Quiet and always succeeds, for the exit trap; bench_xid_gone checks.
bench_xid_close() {
    [ -n "${BENCH_XID_PID:-}" ] || return 0
    # In a subshell: a psql that died leaves a FIFO whose write must not
    # take this shell down.
    (printf '%s\n' "COMMIT;" '\q' >&"$BENCH_XID_FD") 2>/dev/null || true
    exec {BENCH_XID_FD}>&-
    for _ in $(seq 1 100); do
        kill -0 "$BENCH_XID_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill "$BENCH_XID_PID" 2>/dev/null || true
    wait "$BENCH_XID_PID" 2>/dev/null || true
    BENCH_XID_PID=
    "$PG_BINDIR/psql" -X -At -d postgres -c \
        "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity
          WHERE application_name = '$BENCH_XID_APP'" >/dev/null 2>&1 || true
}

# bench_xid_gone: succeeds once no session of the last open transaction is
# left (10 s at most): the measures after it run without it.
bench_xid_gone() {
    for _ in $(seq 1 100); do
        [ "$("$PG_BINDIR/psql" -X -At -d postgres -c \
            "SELECT count(*) FROM pg_catalog.pg_stat_activity
              WHERE application_name = '$BENCH_XID_APP'")" = 0 ] && return 0
        sleep 0.1
    done
    return 1
}
