# test/partitions/check.sh: the partition suite's checker.  It compares
# what a Kafka consumer received (a table load_consumed made) with what is
# committed on the surviving timeline (the final primary's outbox) and what
# the writers saw acknowledged:
#
#   lost: committed, never received;
#   never committed: received, but not committed on the surviving timeline
#     (a rolled-back order, or one a failover lost);
#   duplicates: extra copies of an event (0 with exactly_once and
#     read_committed; within BOUND otherwise);
#   order violations: an event received (first) after a later event of
#     its key (each key is one writer's, its seq growing by one);
#   keys on more than one partition.
#
# check_delivered returns non-zero when a figure is wrong, so the
# self-test (t_checker_selftest in test/partitions/run) can feed it
# doctored results and see it fail.

# p_views DELIVERED: views of DELIVERED: DELIVERED_v, each message with
# its biz key (ref) and its key's seq; DELIVERED_late, the events that
# arrived (first) after a later event of their key.
p_views() {
    sql "CREATE OR REPLACE VIEW $1_v AS
           SELECT *, substring(headers from 'biz_key=([^,]*)') AS ref, (value::jsonb->>'seq')::int AS seq FROM $1"
    sql "CREATE OR REPLACE VIEW $1_late AS
           SELECT event_id FROM (
             SELECT event_id, seq < max(seq) OVER (PARTITION BY key ORDER BY part, off
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS late
               FROM (SELECT DISTINCT ON (ref) * FROM $1_v ORDER BY ref, part, off) f) o
          WHERE late"
}

# check_delivered DELIVERED COMMITTED BOUND: the figures of DELIVERED (a
# consumer's table) against COMMITTED (a table or view of id, ref).  BOUND
# is the most duplicates allowed; "report" only reports them.  False when
# any figure is wrong.
check_delivered() {
    local d=$1 c=$2 bound=$3 bad=0 dups
    p_views "$d"
    must_be_0 "lost (committed, never received)" "SELECT count(*) FROM $c c
        WHERE NOT EXISTS (SELECT 1 FROM ${d}_v d WHERE d.event_id = c.id AND d.ref = c.ref)" || { bad=1; p_lost "$d" "$c"; }
    must_be_0 "received, never committed" "SELECT count(*) FROM ${d}_v d
        WHERE NOT EXISTS (SELECT 1 FROM $c c WHERE c.id = d.event_id AND c.ref = d.ref)" || bad=1
    must_be_0 "rolled back, received" "SELECT count(*) FROM ${d}_v WHERE ref LIKE 'rb-%'" || bad=1
    check_order "$d" || bad=1
    must_be_0 "keys on more than one partition" "SELECT count(*) FROM (
        SELECT key FROM $d GROUP BY key HAVING count(DISTINCT part) > 1) k" || bad=1
    dups=$(sql "SELECT count(*) - count(DISTINCT event_id) FROM $d")
    if [ "$bound" = report ]; then
        report "duplicates (allowed here)" "$dups"
    else
        report "duplicates (at most $bound)" "$dups"
        [ "$dups" -le "$bound" ] || { fail "$d: $dups duplicates, more than $bound"; bad=1; }
    fi
    return $bad
}

# check_windows DELIVERED: one line per fault's window (its events, the
# lost, the duplicates, the order violations, the time to catch up), from
# $W/windows.tsv, for the docs' table.
check_windows() {
    local d=$1
    sql "CREATE TABLE IF NOT EXISTS p_windows (label text, first_id bigint, recovery text)"
    sql "TRUNCATE p_windows"
    "$PGBIN/psql" -X -q -d "$IT_DB" -c "\\copy p_windows FROM '$W/windows.tsv'"
    echo "#   | fault | events | lost | duplicates | order violations | caught up after heal (s) |"
    sql "WITH w AS (SELECT label, first_id, recovery,
                           coalesce(lead(first_id) OVER (ORDER BY first_id), 9223372036854775807) AS next_id
                      FROM p_windows),
              late AS (SELECT event_id FROM ${d}_late)
         SELECT '#   | ' || label || ' | '
                || (SELECT count(*) FROM p_committed c WHERE c.id >= first_id AND c.id < next_id) || ' | '
                || (SELECT count(*) FROM p_committed c WHERE c.id >= first_id AND c.id < next_id
                      AND NOT EXISTS (SELECT 1 FROM ${d}_v d WHERE d.event_id = c.id AND d.ref = c.ref)) || ' | '
                || (SELECT count(*) - count(DISTINCT event_id) FROM $d WHERE event_id >= first_id AND event_id < next_id) || ' | '
                || (SELECT count(*) FROM late WHERE event_id >= first_id AND event_id < next_id) || ' | '
                || recovery || ' |'
           FROM w ORDER BY first_id"
}

# p_lost DELIVERED COMMITTED: the first lost events, with their keys and
# what the outbox says of them, to tell which fault lost them.
p_lost() {
    sql "SELECT '#     lost: event ' || c.id || ' (' || c.ref || ')' || coalesce(', key ' || e.msg_key || ', '
                || e.status || ', created ' || e.created_at::time(3) || ', updated ' || e.updated_at::time(3), '')
           FROM $2 c LEFT JOIN outbox.events e ON e.id = c.id
          WHERE NOT EXISTS (SELECT 1 FROM $1_v d WHERE d.event_id = c.id AND d.ref = c.ref)
          ORDER BY c.id LIMIT 8" 2>/dev/null
}

# check_order DELIVERED: no per-key order violation; false if there is.
check_order() {
    local n
    n=$(sql "SELECT count(*) FROM $1_late")
    report "per-key order violations" "$n"
    [ "$n" = 0 ] && return 0
    p_late "$1"
    fail "per-key order violations: $n, want 0"
    return 1
}

# p_late DELIVERED: the first events received after a later one of their
# key: where each landed, the seq it followed, and what the outbox says.
p_late() {
    sql "SELECT '#     late: event ' || l.event_id || ' key ' || d.key || ' seq ' || d.seq || ' at ' || d.part || '/' || d.off
                || ' after seq ' || (SELECT max(e.seq) FROM $1_v e WHERE e.key = d.key AND e.part = d.part AND e.off < d.off)
                || coalesce(', ' || s.status || ' attempts ' || s.attempts || coalesce(' (' || left(s.last_error, 80) || ')', ''), '')
           FROM $1_late l
           JOIN LATERAL (SELECT * FROM $1_v v WHERE v.event_id = l.event_id ORDER BY part, off LIMIT 1) d ON true
           LEFT JOIN outbox.event_state s ON s.id = l.event_id
          ORDER BY d.part, d.off LIMIT 8" 2>/dev/null
}

# checker_selftest: the checker fed results made up here, with figures
# known: a true one must pass; one event dropped, two of a key swapped, or
# one received twice (with no duplicate allowed) must each fail, for the
# reason they were made.
checker_selftest() {
    local dir=$W/selftest
    mkdir -p "$dir"
    sql "CREATE TABLE st_committed AS SELECT id, 'w1-' || id AS ref FROM generate_series(1, 12) id"
    st_messages >"$dir/true.tsv"
    sed '6d' "$dir/true.tsv" >"$dir/dropped.tsv"
    # Key 0's second and third events, each at the other's offset.
    awk -F'\t' -v OFS='\t' '$2 == 0 && $3 == 1 {$3 = 2; print; next} $2 == 0 && $3 == 2 {$3 = 1} 1' \
        "$dir/true.tsv" >"$dir/reordered.tsv"
    { cat "$dir/true.tsv"; sed -n '3p' "$dir/true.tsv" | awk -F'\t' -v OFS='\t' '{$3 = 99; print}'; } \
        >"$dir/duplicated.tsv"
    st_expect true 0 pass ""
    st_expect dropped 0 fail "lost (committed, never received)"
    st_expect reordered 0 fail "per-key order violations"
    st_expect duplicated 0 fail "duplicates"
    st_expect duplicated 1 pass ""
}

# st_messages: what a consumer would have read of st_committed: 3 keys (a
# partition each), 4 events each, in order, as outbox-consume prints them.
st_messages() {
    local k s id
    for k in 0 1 2; do
        for s in 1 2 3 4; do
            id=$((k * 4 + s))
            printf '%s\t%d\t%d\tw1-k%d\tevent_id=%d,biz_type=OrderPlaced,biz_key=w1-%d\t{"seq": %d}\t0\t0\n' \
                "$TOPIC" "$k" $((s - 1)) "$k" "$id" "$id" "$s"
        done
    done
}

# st_expect NAME BOUND pass|fail FIGURE: check_delivered on the made-up
# result NAME must pass, or fail with FIGURE among its complaints.
st_expect() {
    local out rc table=st_$1_$2
    load_consumed "$table" "$W/selftest/$1.tsv"
    out=$(check_delivered "$table" st_committed "$2")
    rc=$?
    if [ "$3" = pass ]; then
        [ "$rc" = 0 ] || fail "self-test: the $1 result (duplicates allowed: $2) failed: $(grep -v ' 0$' <<<"$out" | tr -s ' ')"
    elif [ "$rc" = 0 ]; then
        fail "self-test: the $1 result passed the checker"
    elif ! grep -q "^#   $4" <<<"$out"; then
        fail "self-test: the $1 result failed, but not for its $4: $out"
    else
        echo "#   $1: fails as it must ($(grep "^#   $4" <<<"$out" | grep -v ' 0$' | head -n 1 | sed 's/^#   //' | tr -s ' '))"
    fi
}
