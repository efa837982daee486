# bench/lib.sh: what the benchmarks share (bench/run, bench/enqueue,
# bench/retention): the server's durability, read back from the running
# server rather than echoed from the script, and refused unless it is what a
# user runs.  Source it after test/cluster.sh, with the cluster started.

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
