# bench/debezium.sh: Debezium, the usual alternative to a relay, for
# bench/run's comparison: Kafka Connect standalone (connect-runtime) with
# the Debezium PostgreSQL connector (logical decoding, pgoutput) and its
# outbox event router (io.debezium.transforms.outbox.EventRouter), reading
# an outbox table of Debezium's documented shape and writing to the same
# Kafka broker as the outbox relay.  The jars come from Maven Central
# through bench/debezium/pom.xml (fetched once into ~/.m2).
#
# With DEBEZIUM_EOS=1 at debezium_setup, the worker is Kafka Connect in
# distributed mode (one worker; its configs, offsets and status in Kafka
# topics) with exactly.once.source.support = enabled, and the connector
# asks for exactly.once.support = required (KIP-618: each batch the task
# polls is one Kafka transaction, with the connector's offsets).  That is
# the only way Debezium writes to Kafka exactly once; standalone mode
# cannot.
#
# Source it (after test/kafka/broker.sh), then:
#   debezium_use NAME                the instance the calls below act on
#                                    (a worker and its connector; one
#                                    named "debezium" until this is called)
#   debezium_schema | psql -d DB     the outbox table, publication and slot
#   debezium_setup DIR PGPORT DB     configure a worker and the connector
#   debezium_start [SETTINGS]        start the worker and create the connector
#   debezium_configure SETTINGS      the connector's settings for the next
#                                    measure (kept stopped if it was)
#   debezium_connector_stop / _pause / _resume
#                                    shut its task down / hold it / run it again
#   debezium_stop                    stop the worker (SIGKILL) and remove DIR
#   debezium_slot                    the slot's restart_lsn and confirmed_flush_lsn
#   debezium_eos_check               with DEBEZIUM_EOS: whether the task's
#                                    producer is transactional
# An instance's slot is named after it (DEBEZIUM_SLOT): each reads its own
# database of the cluster.
#
# Two tunings, one per measure, each what a team tuning Debezium for that
# measure sets (SETTINGS: connector properties NAME=VALUE, space separated,
# on top of the common ones; producer.override.* reach the task's producer,
# which the worker allows):
#   DEBEZIUM_LATENCY, for commit-to-consumer latency: poll.interval.ms =
#     DEBEZIUM_POLL_MS (10; the connector's default 500 adds up to half a
#     second or more to every event), the default max.batch.size (2048) and
#     max.queue.size (8192), and a producer lingering 1 ms, as the relay's
#     librdkafka producer does by default.
#   DEBEZIUM_DRAIN, for the backlog drain: larger batches and queue and a
#     producer that batches longer.  The values are the best of the trials
#     bench/run's DEBEZIUM_TRIALS measures (see bench/run's header for the
#     figures).
# DEBEZIUM_JAVA: the java binary (java 17 or newer).  DEBEZIUM_VERSION
# (3.6.1.Final) and DEBEZIUM_CONNECT_VERSION (4.3.0, the Kafka version that
# Debezium release is built against; see bench/debezium/pom.xml).

DEBEZIUM_POM=${DEBEZIUM_POM:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/debezium/pom.xml}
DEBEZIUM_POLL_MS=${DEBEZIUM_POLL_MS:-10}
DEBEZIUM_LATENCY=${DEBEZIUM_LATENCY:-poll.interval.ms=$DEBEZIUM_POLL_MS producer.override.linger.ms=1}
DEBEZIUM_DRAIN=${DEBEZIUM_DRAIN:-max.batch.size=20000 max.queue.size=80000 poll.interval.ms=100 producer.override.linger.ms=20}
DEBEZIUM_JAVA=${DEBEZIUM_JAVA:-java}
DEBEZIUM_CONNECT_VERSION=${DEBEZIUM_CONNECT_VERSION:-4.3.0}
DEBEZIUM_VERSION=${DEBEZIUM_VERSION:-3.6.1.Final}
DEBEZIUM_NAME=outbox-debezium
DEBEZIUM_SLOT=debezium
# What differs between instances, swapped by debezium_use.
DEBEZIUM_STATE=(DEBEZIUM_SLOT DEBEZIUM_EOS DEBEZIUM_DIR DEBEZIUM_PID DEBEZIUM_REST_PORT DEBEZIUM_SETTINGS)
declare -A DEBEZIUM_SAVED=()
DEBEZIUM_INSTANCE=debezium

# debezium_use NAME: act on instance NAME from now on (a new one starts
# with nothing set up, its slot named NAME).
debezium_use() {
    local v
    [ "$1" = "$DEBEZIUM_INSTANCE" ] && return 0
    for v in "${DEBEZIUM_STATE[@]}"; do
        DEBEZIUM_SAVED[$DEBEZIUM_INSTANCE.$v]=${!v-}
        unset "$v"
    done
    DEBEZIUM_INSTANCE=$1
    DEBEZIUM_SLOT=$1
    for v in "${DEBEZIUM_STATE[@]}"; do
        [ -n "${DEBEZIUM_SAVED[$1.$v]+set}" ] && printf -v "$v" '%s' "${DEBEZIUM_SAVED[$1.$v]}"
    done
    return 0
}

# debezium_instances: the instances named so far.
debezium_instances() {
    { echo "$DEBEZIUM_INSTANCE"
      for k in "${!DEBEZIUM_SAVED[@]}"; do echo "${k%%.*}"; done; } | sort -u
}

# debezium_classpath: the worker's classpath, resolving it on first use.
debezium_classpath() {
    local cpfile="${DEBEZIUM_POM%/*}/.classpath-$DEBEZIUM_CONNECT_VERSION-$DEBEZIUM_VERSION"
    if [ ! -s "$cpfile" ] || [ "$DEBEZIUM_POM" -nt "$cpfile" ]; then
        mvn -q -B -Dstyle.color=never -f "$DEBEZIUM_POM" dependency:build-classpath \
            -Dconnect.version="$DEBEZIUM_CONNECT_VERSION" -Ddebezium.version="$DEBEZIUM_VERSION" \
            -Dmdep.includeScope=runtime -Dmdep.outputFile="$cpfile" >&2 || return 1
    fi
    cat "$cpfile"
}

# debezium_schema: SQL for the database Debezium reads.  The outbox table
# as Debezium documents it (id, aggregatetype, aggregateid, type, payload),
# here with aggregatetype holding the topic; a publication of that table
# alone; and the replication slot (the instance's), created now so that
# every row inserted from here on is streamed (snapshot.mode=no_data).
debezium_schema() {
    cat <<SQL
CREATE TABLE dbz_outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE PUBLICATION dbz_pub FOR TABLE dbz_outbox;
SELECT 1 FROM pg_create_logical_replication_slot('$DEBEZIUM_SLOT', 'pgoutput');
SQL
}

# debezium_slot: "restart_lsn confirmed_flush_lsn" of Debezium's slot, as
# the server holds them (restart_lsn stays before the oldest running
# transaction that has written WAL: decoding restarts there).
debezium_slot() {
    "$PG_BINDIR/psql" -X -At -F ' ' -d postgres -c \
        "SELECT restart_lsn, confirmed_flush_lsn FROM pg_catalog.pg_replication_slots
          WHERE slot_name = '$DEBEZIUM_SLOT'"
}

# debezium_rest METHOD PATH [BODY]: the worker's REST API.
debezium_rest() {
    curl -sS -f --max-time 30 -X "$1" -H 'Content-Type: application/json' ${3:+--data "$3"} \
        "http://127.0.0.1:$DEBEZIUM_REST_PORT$2"
}

# debezium_setup DIR PGPORT DB: a worker's and the connector's settings in DIR.
debezium_setup() {
    DEBEZIUM_DIR=$1
    mkdir -p "$DEBEZIUM_DIR"
    DEBEZIUM_CP=$(debezium_classpath) || return 1
    DEBEZIUM_REST_PORT=$(kafka_free_port)
    # The worker: String converters, so a message's value is the payload
    # column's text and its key the aggregateid.  The producer set as the
    # relay's librdkafka producer is: acks=all, idempotent, 5 requests in
    # flight (Connect's own default is 1), linger 5 ms and batches up to
    # 1 MB (librdkafka's defaults; Java's are 5 ms and 16 KB).
    cat >"$DEBEZIUM_DIR/worker.properties" <<CONF
bootstrap.servers=$KAFKA_BROKERS
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
$(debezium_worker_mode)
offset.flush.interval.ms=10000
listeners=http://127.0.0.1:$DEBEZIUM_REST_PORT
plugin.discovery=only_scan
producer.acks=all
producer.enable.idempotence=true
producer.max.in.flight.requests.per.connection=5
producer.linger.ms=5
producer.batch.size=1000000
connector.client.config.override.policy=All
${DEBEZIUM_WORKER_EXTRA:-}
CONF
    local eos=
    [ -n "${DEBEZIUM_EOS:-}" ] && eos='  "exactly.once.support": "required", "transaction.boundary": "poll",
'
    # The connector: pgoutput through an existing slot and publication, no
    # snapshot, and the outbox event router: the topic from aggregatetype,
    # the key from aggregateid, the value from payload, the event's id and
    # type as headers.  Its tuning is debezium_configure's.
    cat >"$DEBEZIUM_DIR/connector.json" <<CONF
{
  "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
  "tasks.max": "1",
  "database.hostname": "127.0.0.1",
  "database.port": "$2",
  "database.user": "postgres",
  "database.password": "trust",
  "database.dbname": "$3",
  "topic.prefix": "dbz",
  "plugin.name": "pgoutput",
  "slot.name": "$DEBEZIUM_SLOT",
  "publication.name": "dbz_pub",
  "publication.autocreate.mode": "disabled",
  "table.include.list": "public.dbz_outbox",
  "snapshot.mode": "no_data",
  "extended.headers.enabled": "false",
${eos}${DEBEZIUM_CONNECTOR_EXTRA:-}
  "transforms": "outbox",
  "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
  "transforms.outbox.route.by.field": "aggregatetype",
  "transforms.outbox.route.topic.replacement": "\${routedByValue}",
  "transforms.outbox.table.field.event.id": "id",
  "transforms.outbox.table.field.event.key": "aggregateid",
  "transforms.outbox.table.field.event.payload": "payload",
  "transforms.outbox.table.fields.additional.placement": "type:header:type"
}
CONF
}

# debezium_worker_mode: the worker's settings of its mode: standalone (its
# offsets in a file) or, with DEBEZIUM_EOS, distributed with exactly-once
# source support (its configs, offsets and status in topics of one
# replica: the bench has one broker).
debezium_worker_mode() {
    if [ -z "${DEBEZIUM_EOS:-}" ]; then
        echo "offset.storage.file.filename=$DEBEZIUM_DIR/offsets"
        return
    fi
    local t=outbox-$DEBEZIUM_INSTANCE
    printf '%s\n' "group.id=$t" "config.storage.topic=$t-configs" "offset.storage.topic=$t-offsets" \
        "status.storage.topic=$t-status" "config.storage.replication.factor=1" \
        "offset.storage.replication.factor=1" "status.storage.replication.factor=1" \
        "exactly.once.source.support=enabled"
}

# debezium_eos_check: whether the running task writes in Kafka
# transactions: its producer was configured with the transactional.id
# Connect gives a task with exactly-once support (GROUP-CONNECTOR-TASK);
# DEBEZIUM_EOS_WHY says why not.
debezium_eos_check() {
    local id="outbox-$DEBEZIUM_INSTANCE-$DEBEZIUM_NAME-0"
    for _ in $(seq 1 300); do
        grep -q "transactional.id = $id\$" "$DEBEZIUM_DIR/connect.log" && return 0
        sleep 0.1
    done
    DEBEZIUM_EOS_WHY="no producer with transactional.id $id in $DEBEZIUM_DIR/connect.log after 30 s"
    return 1
}

# debezium_state: the connector's state and its task's, e.g. "RUNNING RUNNING".
debezium_state() {
    debezium_rest GET "/connectors/$DEBEZIUM_NAME/status" 2>/dev/null |
        jq -r '[.connector.state, (.tasks[0].state // "NONE")] | join(" ")'
}

# debezium_wait STATE...: wait until debezium_state is one of STATE.
debezium_wait() {
    local s deadline=$((SECONDS + 120))
    while [ $SECONDS -lt $deadline ]; do
        s=$(debezium_state)
        for want in "$@"; do [ "$s" = "$want" ] && return 0; done
        case $s in *FAILED*)
            echo "debezium connector failed ($s); see $DEBEZIUM_DIR/connect.log" >&2
            debezium_rest GET "/connectors/$DEBEZIUM_NAME/status" >&2 2>/dev/null
            return 1 ;;
        esac
        sleep 0.1
    done
    echo "debezium connector not in state $* after 120 s (it is: $s); see $DEBEZIUM_DIR/connect.log" >&2
    return 1
}

# debezium_start: start the worker, wait for its REST API, create the
# connector and wait until its task runs.  A worker that exits before it
# listens is started once more on another REST port: the free port
# kafka_free_port chose may be taken before the worker binds it (CI runs
# two suites side by side).
debezium_start() {
    local try
    for try in 1 2; do
        debezium_worker && break
        [ "$try" = 2 ] || [ -n "$DEBEZIUM_PID" ] && return 1
        DEBEZIUM_REST_PORT=$(kafka_free_port)
        sed -i "s|^listeners=.*|listeners=http://127.0.0.1:$DEBEZIUM_REST_PORT|" "$DEBEZIUM_DIR/worker.properties"
    done
    debezium_configure "${1:-$DEBEZIUM_LATENCY}" || return 1
    debezium_wait "RUNNING RUNNING"
}

# debezium_worker: start the Connect worker and wait up to 300 s for its
# REST API; on failure DEBEZIUM_PID is empty if the worker exited, and
# stderr says why.
debezium_worker() {
    local main=Standalone
    [ -n "${DEBEZIUM_EOS:-}" ] && main=Distributed
    # The JVM settings Kafka's own connect-standalone.sh uses.
    "$DEBEZIUM_JAVA" -Xms256m -Xmx2g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -Djava.awt.headless=true -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
        -Dorg.slf4j.simpleLogger.showDateTime=true \
        -cp "$DEBEZIUM_CP" "org.apache.kafka.connect.cli.Connect$main" \
        "$DEBEZIUM_DIR/worker.properties" >>"$DEBEZIUM_DIR/connect.log" 2>&1 &
    DEBEZIUM_PID=$!
    local deadline=$((SECONDS + 300))
    while [ $SECONDS -lt $deadline ]; do
        if ! kill -0 "$DEBEZIUM_PID" 2>/dev/null; then
            wait "$DEBEZIUM_PID" 2>/dev/null
            DEBEZIUM_PID=
            echo "kafka connect exited before it listened on port $DEBEZIUM_REST_PORT: $(grep -m1 -E 'ERROR|Exception' "$DEBEZIUM_DIR/connect.log")" >&2
            return 1
        fi
        debezium_rest GET / >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "kafka connect did not listen on port $DEBEZIUM_REST_PORT within 300 s; see $DEBEZIUM_DIR/connect.log" >&2
    tail -n 30 "$DEBEZIUM_DIR/connect.log" >&2
    return 1
}

# debezium_configure SETTINGS: give the connector the common settings plus
# SETTINGS (NAME=VALUE ...), unless it has them already.  Connect restarts a
# running connector on a new configuration; a stopped one stays stopped.
debezium_configure() {
    [ "${DEBEZIUM_SETTINGS-unset}" = "$1" ] && return 0
    local config
    config=$(printf '%s\n' $1 | jq -R -s --slurpfile base "$DEBEZIUM_DIR/connector.json" \
        '[split("\n")[] | select(length > 0) | capture("^(?<key>[^=]+)=(?<value>.*)$")] |
         $base[0] + from_entries') || return 1
    debezium_rest PUT "/connectors/$DEBEZIUM_NAME/config" "$config" >/dev/null || return 1
    # Read back: a figure is only labelled with a tuning Connect holds.
    local kv
    for kv in $1; do
        [ "$(debezium_config_now "${kv%%=*}")" = "${kv#*=}" ] || {
            echo "debezium: Connect does not hold ${kv%%=*}=${kv#*=}" >&2
            return 1
        }
    done
    DEBEZIUM_SETTINGS=$1
}

# debezium_config_now KEY: the connector's current value of KEY, as Connect
# holds it (empty if unset: the connector's default).
debezium_config_now() {
    debezium_rest GET "/connectors/$DEBEZIUM_NAME/config" | jq -r --arg k "$1" '.[$k] // empty'
}

# debezium_connector_stop: shut the connector's task down (it keeps its
# offsets and the slot keeps its place), like a connector that is down.
debezium_connector_stop() {
    debezium_rest PUT "/connectors/$DEBEZIUM_NAME/stop" >/dev/null && debezium_wait "STOPPED NONE"
}

# debezium_connector_pause: hold the task's output (Connect's pause: the task
# stays connected and reads ahead into its queue, up to max.queue.size).
debezium_connector_pause() {
    debezium_rest PUT "/connectors/$DEBEZIUM_NAME/pause" >/dev/null && debezium_wait "PAUSED PAUSED"
}

# debezium_connector_resume: run the connector again, from stopped or paused.
debezium_connector_resume() {
    debezium_rest PUT "/connectors/$DEBEZIUM_NAME/resume" >/dev/null && debezium_wait "RUNNING RUNNING"
}

# debezium_kill: stop the worker at once (SIGKILL), keeping its files.
debezium_kill() {
    if [ -n "${DEBEZIUM_PID:-}" ]; then
        kill -KILL "$DEBEZIUM_PID" 2>/dev/null || true
        wait "$DEBEZIUM_PID" 2>/dev/null || true
    fi
    DEBEZIUM_PID=
}

# debezium_stop: stop the worker and remove its files.
debezium_stop() {
    debezium_kill
    if [ -n "${DEBEZIUM_DIR:-}" ]; then rm -rf "$DEBEZIUM_DIR"; fi
}
