# test/partitions/faults.sh: the partition suite's faults.  Each f_NAME
# makes one partition and holds it HOLD seconds (its own default when HOLD
# is empty); fault NAME runs it, heals the network and measures the time
# from the heal until the relay has caught up.  Each fault's window (the
# first event id committed after it began) goes to $W/windows.tsv, so the
# checker can give its figures per fault.
#
# The relay runs inside the primary's namespace: "the relay" below is the
# primary's node.

FAULTS=(leader_cut kafka_cut_long leader_isolated quorum_split standby_cut zombie_primary flapping one_way_out one_way_in)

# fault NAME [HOLD]: one fault alone: made, healed, then caught up.
fault() {
    FAULT_FIRST=$(first_id)
    fault_make "$1" "${2:-}"
    caught_up "$1" "$FAULT_FIRST"
}

# first_id: the id the next committed event will have at least.
first_id() {
    sql "SELECT coalesce(max(id), 0) + 1 FROM outbox.event_log"
}

# fault_make NAME HOLD: make the partition f_NAME makes, hold it HOLD
# seconds (f_NAME's own default if empty), heal it.
fault_make() {
    HOLD=$2
    echo "#   $1${HOLD:+ for $HOLD s}"
    "f_$1" || fail "$1: the fault could not be made"
    net_heal
}

# caught_up LABEL FIRST: wait (240 s at most) until the relay has caught
# up: every event committed from FIRST to the heal recorded sent, none
# dead; record the window (LABEL, FIRST, seconds from the heal) for the
# checker.  By ids, as the checker's windows count events.
caught_up() {
    local heal=$SECONDS recovery=never upto
    upto=$(first_id)
    while [ $SECONDS -lt $((heal + 240)) ]; do
        if [ "$(sql "SELECT NOT EXISTS (SELECT 1 FROM outbox.events
                                         WHERE id >= $2 AND id < $upto AND status <> 'sent')")" = t ]; then
            recovery=$((SECONDS - heal))
            break
        fi
        relay_fenced && fenced_alone "$1"
        sleep 0.2
    done
    if [ "$recovery" = never ]; then
        fail "$1: not caught up 240 s after the heal: $(sql "SELECT backlog || ' in backlog, ' || max_delay_sec
            || ' s behind, ' || dead || ' dead, relay ' || coalesce(relay_state, '?') FROM outbox.stats")"
    else
        echo "#   caught up $recovery s after the heal"
    fi
    printf '%s\t%s\t%s\n' "$1" "$2" "$recovery" >>"$W/windows.tsv"
}

# relay_fenced: whether the primary's relay says its producer was fenced.
relay_fenced() {
    [ "$(sql "SELECT count(*) FROM outbox.relay_status() WHERE state = 'fenced'")" != 0 ]
}

# fenced_alone LABEL: the relay says it was fenced, though no other relay
# runs: a failure (found by this suite, fixed since: the relay cut from
# the transaction coordinator past transaction.timeout.ms took the
# coordinator's abort for another relay's fence, and stopped sending until
# a reload).  A reload lets the relay go on, and the run checks the rest.
fenced_alone() {
    fail "$1: the relay stopped as fenced, though no other relay runs; reloading"
    sql "SELECT pg_reload_conf()" >/dev/null
    sleep 1
}

# hold DEFAULT: sleep HOLD seconds, or DEFAULT.
hold() {
    sleep "${HOLD:-$1}"
}

# leader: the node (k1, k2, k3) leading partition 0 of the topic.
leader() {
    local id
    id=$(kcluster_leader "$TOPIC" 0)
    [ -n "$id" ] && echo "k$id"
}

# kafka_nodes_but NODE: the Kafka nodes other than NODE.
kafka_nodes_but() {
    local k
    for k in k1 k2 k3; do [ "$k" = "$1" ] || echo "$k"; done
}

# sent_count: events the relay has recorded as sent.
sent_count() {
    sql "SELECT count(*) FROM outbox.events WHERE status = 'sent'"
}

# The relay cut, both ways and silently, from the leader of one partition:
# that partition's events wait, the others flow.
f_leader_cut() {
    local l
    l=$(leader) || return 1
    echo "#   relay cut from $l, leader of partition 0"
    net_cut "$PRIMARY" "$l" || return 1
    hold 15
}

# The relay cut from every Kafka node for longer than message.timeout.ms
# and transaction.timeout.ms: its sends time out, its transaction is
# aborted by the coordinator; nothing is sent meanwhile.  The relay may
# still record, during the cut, acknowledgements it had before it (its
# record waits for a synchronous standby catching up after an earlier
# fault, say): an event recorded sent meanwhile must be in Kafka already,
# read by a consumer that can reach it, since nothing can get there.
f_kafka_cut_long() {
    net_cut "$PRIMARY" k1 k2 k3 || return 1
    sleep 2
    sql "SET client_min_messages = warning; DROP TABLE IF EXISTS p_cut_sent;
         CREATE TABLE p_cut_sent AS SELECT id FROM outbox.events WHERE status = 'sent'" || return 1
    hold 16
    recorded_in_kafka
    echo "#   at the cut's end: $(sql "SELECT 'unsent ' || count(*) FILTER (WHERE status <> 'sent') || ', by state '
        || string_agg(DISTINCT status, '/') FILTER (WHERE status <> 'sent') FROM outbox.events WHERE id >= $FAULT_FIRST");" \
        "outbox.stats: $(sql "SELECT 'backlog ' || backlog || ', max_delay_sec ' || max_delay_sec FROM outbox.stats")"
}

# recorded_in_kafka: the events recorded sent since p_cut_sent was taken,
# each found in Kafka (by id and business key, read_committed) while the
# relay is still cut off.
recorded_in_kafka() {
    local late missing
    sql "SET client_min_messages = warning; DROP TABLE IF EXISTS p_cut_late;
         CREATE TABLE p_cut_late AS SELECT e.id, e.biz_key FROM outbox.events e
          WHERE e.status = 'sent' AND NOT EXISTS (SELECT 1 FROM p_cut_sent c WHERE c.id = e.id)"
    late=$(sql "SELECT count(*) FROM p_cut_late")
    [ "$late" = 0 ] && return 0
    consume_all "" "$W/during_cut.tsv"
    load_consumed p_cut_kafka "$W/during_cut.tsv"
    missing=$(sql "SELECT count(*) FROM p_cut_late l WHERE NOT EXISTS (
                     SELECT 1 FROM p_cut_kafka k
                      WHERE k.event_id = l.id AND substring(k.headers from 'biz_key=([^,]*)') = l.biz_key)")
    echo "#   $late events recorded sent during the cut, of $(sql "SELECT count(*) FROM p_cut_kafka") in Kafka: $missing not there"
    [ "$missing" = 0 ] || fail "kafka_cut_long: $missing events recorded as sent while Kafka was unreachable, not in Kafka"
}

# A leader cut from both its followers (and so from the controller
# majority), still reached by the relay: with min.insync.replicas=2 it
# cannot take a write alone, and another node is made leader.
f_leader_isolated() {
    local l
    l=$(leader) || return 1
    echo "#   $l, leader of partition 0, cut from $(kafka_nodes_but "$l" | tr '\n' ' ')"
    # shellcheck disable=SC2046
    net_cut "$l" $(kafka_nodes_but "$l") || return 1
    hold 15
}

# The controller quorum split three ways: no node reaches another, so no
# majority, no ISR change, no new leader; every node still reaches the
# relay.
f_quorum_split() {
    net_cut k1 k2 k3 && net_cut k2 k3 || return 1
    hold 12
}

# The primary cut from its synchronous standby: commits wait for it, so
# the writers see nothing committed while the cut lasts.  A writer may
# still print, during the cut, a commit acknowledged before it (a writer
# slow to be scheduled, say): an order acknowledged meanwhile must be on
# the standby already, where nothing can reach now.
f_standby_cut() {
    net_cut "$PRIMARY" "$STANDBY" || return 1
    sleep 2
    cat "$W"/acked.* | sort >"$W/cut_acked.before"
    hold 8
    acked_on_standby
}

# acked_on_standby: the orders acknowledged since cut_acked.before was
# taken (not named acked.*, which acked reads), each found on the standby (by event id and reference).
acked_on_standby() {
    local late ids missing
    late=$(cat "$W"/acked.* | sort | comm -13 "$W/cut_acked.before" -)
    [ -n "$late" ] || return 0
    # The standby confirmed a commit once it had flushed it, and shows it
    # once it has replayed what it flushed.
    for _ in $(seq 1 150); do
        [ "$(pg_on "$STANDBY" "SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()")" = t ] && break
        sleep 0.2
    done
    ids=$(printf '%s\n' "$late" | awk -F'\t' -v q="'" '{printf "%s(%s, %s%s%s)", NR > 1 ? ", " : "", $2, q, $1, q}')
    missing=$(pg_on "$STANDBY" "SELECT count(*) FROM (VALUES $ids) a(id, ref)
                                 WHERE NOT EXISTS (SELECT 1 FROM outbox.event_log l
                                                    WHERE l.id = a.id AND l.biz_key = a.ref)")
    echo "#   $(printf '%s\n' "$late" | wc -l) orders acknowledged during the cut: ${missing:-?} not on the standby"
    [ "$missing" = 0 ] || fail "standby_cut: orders acknowledged while the synchronous standby was cut off"
}

# The zombie primary: the primary cut from its standby and the clients,
# not from Kafka; the standby promoted, the clients following it, while
# the old primary's relay still reaches every Kafka node.  Then the old
# primary is stopped and made the new standby.
f_zombie_primary() {
    local zombie=$PRIMARY n
    net_cut "$zombie" "$STANDBY" cl || return 1
    sleep 1
    pg_ctl_on "$STANDBY" -w promote >/dev/null || return 1
    pg_use_primary "$STANDBY"
    sql "ALTER SYSTEM RESET synchronous_standby_names" && sql "SELECT pg_reload_conf()" >/dev/null
    n=$(acked)
    hold 10
    # The writers find the promoted standby in their own time (keepalives
    # and tcp_user_timeout end the hung connection in about 3 s, then a
    # 2 s connect_timeout per host): a sequence's hold of 3 s, or a loaded
    # machine, may end before.  So wait on, up to 60 s after the hold, the
    # zombie still cut off: progress is what is checked, not its speed.
    local deadline=$((SECONDS + 60))
    until [ "$(acked)" -gt "$n" ] || [ $SECONDS -ge $deadline ]; do sleep 0.2; done
    [ "$(acked)" -gt "$n" ] || fail "zombie_primary: writers made no progress on the promoted standby in 60 s"
    [ "$(pg_on "$zombie" "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'")" = 1 ] \
        || echo "#   the zombie had no relay running at its end"
    pg_stop "$zombie"
    net_heal
    pg_make_standby "$zombie" || fail "zombie_primary: the old primary could not be made the standby"
}

# A flapping link: the relay's node's port down and up every 300 ms.
f_flapping() {
    local end=$((SECONDS + ${HOLD:-10}))
    while [ $SECONDS -lt $end ]; do
        net_link "$PRIMARY" down
        sleep 0.3
        net_link "$PRIMARY" up
        sleep 0.3
    done
}

# One way: what the relay sends Kafka is dropped; Kafka's packets reach it.
f_one_way_out() {
    local k
    for k in k1 k2 k3; do net_block "$PRIMARY" "$k" || return 1; done
    hold 12
}

# One way: what Kafka sends the relay is dropped; the relay's packets
# reach Kafka (requests arrive, answers never do).
f_one_way_in() {
    local k
    for k in k1 k2 k3; do net_block "$k" "$PRIMARY" || return 1; done
    hold 12
}

# sequence N [SPEC]: three faults drawn from the run's seed, each held 3
# to 10 s, 1 to 3 s apart, the next made before the relay caught up from
# the last; then the time to catch up after the third.  SPEC, "NAME:HOLD
# ...", gives the faults instead (PARTITION_SEQUENCE: a sequence seen
# failing, run again).
sequence() {
    local i spec=${2:-} names=() f
    if [ -z "$spec" ]; then
        for i in 1 2 3; do spec+="${FAULTS[RANDOM % ${#FAULTS[@]}]}:$((3 + RANDOM % 8)) "; done
    fi
    echo "#   PARTITION_SEQUENCE=\"${spec% }\""
    FAULT_FIRST=$(first_id)
    for f in $spec; do
        names+=("${f%%:*}")
        fault_make "${f%%:*}" "${f#*:}"
        sleep $((1 + RANDOM % 3))
    done
    caught_up "seq$1:$(IFS=+; echo "${names[*]}")" "$FAULT_FIRST"
}
