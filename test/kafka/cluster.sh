# test/kafka/cluster.sh: a real Apache Kafka cluster of several KRaft
# nodes on loopback (each broker and controller at once), for the cases a
# single broker cannot show: a partition leader lost and its partitions
# led by another node, with nothing acknowledged lost (replication factor
# 3, min.insync.replicas 2, no unclean election).
#
# Source test/kafka/broker.sh first (the classpath, free ports), then:
# kcluster_setup DIR N; kcluster_start; ...; kcluster_stop.  KCLUSTER_BROKERS
# is the nodes' addresses; kcluster_kill I and kcluster_start_node I stop
# (SIGKILL) and restart node I on its data; kcluster_leader TOPIC PARTITION
# names the node leading it; kcluster_wait_moved waits for a partition to
# leave a node.  A node is declared gone 3 s after its last heartbeat (9 s
# by default).  Heaps are small: three JVMs share the machine with
# PostgreSQL.
#
# Elsewhere than loopback (test/partitions): set before kcluster_setup
# KCLUSTER_ADDR[I], node I's address, KCLUSTER_RUN[I], the command prefix
# that starts it there (e.g. "ip netns exec NS"), KCLUSTER_KCAT_RUN, the
# prefix of the health checks' kcat, and KCLUSTER_CONF, lines added to
# every node's configuration.

KCLUSTER_JVM_OPTS=${KCLUSTER_JVM_OPTS:--Xms128m -Xmx384m -XX:+UseSerialGC}

# kcluster_setup DIR N: configure and format N nodes under DIR/1 .. DIR/N.
kcluster_setup() {
    local dir=$1 n=$2 voters= id port ctl host
    KCLUSTER_DIR=$dir KCLUSTER_N=$n KCLUSTER_BROKERS= KCLUSTER_PIDS=() KCLUSTER_PORT=() KCLUSTER_CTL=()
    KAFKA_CP=$(kafka_classpath) || return 1
    for id in $(seq 1 "$n"); do
        port=$(kafka_free_port "${KCLUSTER_PORT[@]}" "${KCLUSTER_CTL[@]}")
        ctl=$(kafka_free_port "${KCLUSTER_PORT[@]}" "${KCLUSTER_CTL[@]}" "$port")
        KCLUSTER_PORT[$id]=$port KCLUSTER_CTL[$id]=$ctl
        host=$(kcluster_addr "$id")
        voters+="${voters:+,}$id@$host:$ctl"
        KCLUSTER_BROKERS+="${KCLUSTER_BROKERS:+,}$host:$port"
    done
    local uuid
    uuid=$(java -cp "$KAFKA_CP" kafka.tools.StorageTool random-uuid 2>/dev/null) || return 1
    for id in $(seq 1 "$n"); do
        mkdir -p "$dir/$id"
        host=$(kcluster_addr "$id")
        cat >"$dir/$id/server.properties" <<CONF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://$host:${KCLUSTER_PORT[$id]},CONTROLLER://$host:${KCLUSTER_CTL[$id]}
advertised.listeners=PLAINTEXT://$host:${KCLUSTER_PORT[$id]}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/$id/data
num.partitions=3
default.replication.factor=$n
min.insync.replicas=$((n > 1 ? n - 1 : 1))
unclean.leader.election.enable=false
auto.create.topics.enable=true
offsets.topic.replication.factor=$n
transaction.state.log.replication.factor=$n
transaction.state.log.min.isr=$((n > 1 ? n - 1 : 1))
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=8388608
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
${KCLUSTER_CONF:-}
CONF
        java -cp "$KAFKA_CP" kafka.tools.StorageTool format -t "$uuid" \
            -c "$dir/$id/server.properties" >"$dir/$id/format.log" 2>&1 || return 1
    done
}

# kcluster_addr I: node I's address.
kcluster_addr() {
    echo "${KCLUSTER_ADDR[$1]:-127.0.0.1}"
}

# kcluster_start_node I: start node I (again, on its data).
kcluster_start_node() {
    # shellcheck disable=SC2086
    ${KCLUSTER_RUN[$1]:-} java $KCLUSTER_JVM_OPTS -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
        -cp "$KAFKA_CP" kafka.Kafka "$KCLUSTER_DIR/$1/server.properties" \
        >>"$KCLUSTER_DIR/$1/broker.log" 2>&1 &
    KCLUSTER_PIDS[$1]=$!
}

# kcluster_start: start every node and wait (120 s at most) until the
# cluster's metadata lists them all.
kcluster_start() {
    local id
    for id in $(seq 1 "$KCLUSTER_N"); do kcluster_start_node "$id"; done
    kcluster_wait_nodes "$KCLUSTER_N" 120
}

# kcluster_wait_nodes N SECONDS: wait until the metadata lists N brokers.
kcluster_wait_nodes() {
    local deadline=$((SECONDS + $2))
    while [ $SECONDS -lt $deadline ]; do
        [ "$(${KCLUSTER_KCAT_RUN:-} kcat -b "$KCLUSTER_BROKERS" -L -m 2 2>/dev/null | grep -c '^  *broker [0-9]* at ')" = "$1" ] && return 0
        sleep 0.5
    done
    echo "the Kafka cluster did not list $1 brokers within $2 s; see $KCLUSTER_DIR/*/broker.log" >&2
    return 1
}

# kcluster_kill I: stop node I at once (SIGKILL).
kcluster_kill() {
    local pid=${KCLUSTER_PIDS[$1]:-}
    [ -n "$pid" ] || return 0
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    KCLUSTER_PIDS[$1]=
}

# kcluster_leader TOPIC PARTITION: the node id leading the partition.
kcluster_leader() {
    ${KCLUSTER_KCAT_RUN:-} kcat -b "$KCLUSTER_BROKERS" -L -t "$1" -m 5 2>/dev/null |
        awk -v p="$2" '$1 == "partition" && $2 == p "," { print $4; exit }' | tr -d ,
}

# kcluster_wait_moved TOPIC PARTITION NODE SECONDS: wait until another node
# than NODE leads the partition; false on timeout.
kcluster_wait_moved() {
    local deadline=$((SECONDS + $4)) now
    while [ $SECONDS -lt $deadline ]; do
        now=$(kcluster_leader "$1" "$2")
        [ -n "$now" ] && [ "$now" != "$3" ] && return 0
        sleep 0.1
    done
    return 1
}

# kcluster_stop: stop every node and remove their files.
kcluster_stop() {
    local id
    [ -n "${KCLUSTER_N:-}" ] || return 0
    for id in $(seq 1 "$KCLUSTER_N"); do kcluster_kill "$id"; done
    [ -n "${KCLUSTER_DIR:-}" ] && rm -rf "$KCLUSTER_DIR"
    KCLUSTER_N=
}
