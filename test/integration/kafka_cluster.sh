# test/integration/kafka_cluster.sh: the relay against a real cluster of
# three Kafka nodes (test/kafka/cluster.sh), for what one broker cannot
# show: partition leaders lost mid-flow.

# A stream of events while the leader of one partition is killed
# (SIGKILL), then, once it is back, the leader of another: the relay's
# producer follows the new leaders; every committed event arrives, none
# goes dead, and the events of each key arrive in enqueue order.
t_cluster_leaders_killed() {
    local topic=it.cluster out=$IT_TMP/cluster.tsv pids=() leader
    kcluster_setup "$IT_TMP/kcluster" 3 && kcluster_start || { fail "the Kafka cluster did not start"; kcluster_stop; return; }
    set_setting outbox.kafka_brokers "$KCLUSTER_BROKERS"
    sql "SELECT outbox.enqueue('T', 'cluster-first', '{}', topic => '$topic', msg_key => 'first')" >/dev/null
    wait_until 90 "$(all_sent $topic 1)" || { fail "nothing reached the cluster"; cluster_case_end; return; }
    cluster_writers $topic cluster 400
    pids=("${WRITERS[@]}")
    sleep 1
    leader=$(kcluster_leader $topic 0)
    [ -n "$leader" ] || fail "no leader found for partition 0"
    kcluster_kill "$leader"
    # The flow goes on while another node takes the partition over.
    kcluster_wait_moved $topic 0 "$leader" 30 || fail "partition 0 got no new leader within 30 s of killing node $leader"
    kill -0 "${pids[@]}" 2>/dev/null || fail "the writers ended before the leader was lost: no flow to test"
    sleep 1
    kcluster_start_node "$leader"
    kcluster_wait_nodes 3 90 || fail "node $leader did not come back"
    leader=$(kcluster_leader $topic 1)
    [ -n "$leader" ] && kcluster_kill "$leader"
    kcluster_wait_moved $topic 1 "$leader" 30 || fail "partition 1 got no new leader within 30 s of killing node $leader"
    wait "${pids[@]}"
    wait_until 120 "$(all_sent $topic 1601)" || fail "not every event was recorded as sent: $(sql "TABLE outbox.stats")"
    expect "events dead" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'dead'")" 0
    "$TOOLS/outbox-consume" -b "$KCLUSTER_BROKERS" -t "$topic" -n 1000000 -T 60000 -i 5000 >"$out" 2>/dev/null
    load_consumed got_cluster "$out"
    expect_delivered "events delivered" got_cluster "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    # Each event at its first arrival: a copy sent again after a fault may
    # come later, the order of first arrivals is what a consumer sees.
    expect "order violations" "$(sql "WITH f AS (SELECT key, (value::jsonb->>'seq')::int AS seq, min(off) AS off
                                                 FROM got_cluster WHERE key <> 'first' GROUP BY 1, 2)
        SELECT count(*) FROM (SELECT seq - lag(seq) OVER (PARTITION BY key ORDER BY off) AS step FROM f) s
         WHERE step <= 0")" 0
    cluster_case_end
}

# cluster_writers TOPIC PREFIX N: four sessions in the background, each
# committing N events of TOPIC, one per transaction every 25 ms, over 8 keys
# of its own (business keys PREFIX-S-I); WRITERS holds their pids.
cluster_writers() {
    WRITERS=()
    for s in 1 2 3 4; do
        sql "DO \$\$ BEGIN FOR i IN 1..$3 LOOP
               PERFORM outbox.enqueue('T', '$2-$s-' || i, jsonb_build_object('seq', i),
                                      topic => '$1', msg_key => 'k$s-' || i % 8);
               COMMIT; PERFORM pg_sleep(0.025); END LOOP; END \$\$" &
        WRITERS+=($!)
    done
}

# cluster_case_end: the relay back on the suite's broker, the cluster gone.
cluster_case_end() {
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    kcluster_stop
}
