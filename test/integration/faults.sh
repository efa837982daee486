# test/integration/faults.sh: a broker that answers every request type the
# relay's idempotent producer sends with errors, and settings that are
# wrong.  Each case checks that the server log says what is wrong (once,
# not once per retry), that outbox.relay_status() shows it, that the relay
# neither crashes nor restarts, that no event dies of a fault that is not
# the event's own, and that once the fault is gone every event arrives in
# Kafka exactly once and is marked sent.
#
# The producer (enable.idempotence, acks=all) sends ApiVersions (18) on
# every new connection, Metadata (3), InitProducerId (22) once per producer
# and Produce (0); with SASL also SaslHandshake (17) and SaslAuthenticate
# (36).  ApiVersions and InitProducerId are sent when a producer starts,
# so the cases that fault them make the relay build a new one
# (new_producer).  The mock cases run against test/tools/mock_broker.c,
# the settings cases against the real broker.

# The password of the real broker's SASL_PLAINTEXT listener (kafka_add_sasl).
IT_SASL_USER=outbox
# It holds a ';', which outbox.kafka_properties takes escaped (escape_property).
IT_SASL_PASSWORD='Right-Sasl;Pw-4711'
IT_SASL_WRONG=Wrong-Sasl-Pw-0815

# The cases below read the server log since LOG_MARK, which each sets with
# LOG_MARK=$(log_mark) (lib.sh) before what it watches.

# log_count REGEX: lines of the log since LOG_MARK matching REGEX.
log_count() {
    log_since "$LOG_MARK" | grep -c -E -- "$1"
}

# log_shows REGEX: wait (30 s at most) until a line since LOG_MARK matches
# REGEX; fail if none does.
log_shows() {
    wait_log "$LOG_MARK" 30 "$1" || fail "no line in the server log matches '$1'"
}

# log_at_most N REGEX: fail if more than N lines since LOG_MARK match REGEX.
log_at_most() {
    local n
    n=$(log_count "$2")
    [ "$n" -le "$1" ] || fail "$n lines in the server log match '$2', want at most $1"
}

# status_shows TEXT: wait until relay_status().last_error contains TEXT.
status_shows() {
    wait_until 30 "SELECT strpos(last_error, '$1') > 0 FROM outbox.relay_status()" \
        || fail "relay_status does not show '$1': $(relay_state)"
}

# relay_state: the relay's state, broker state and last error, for failures.
relay_state() {
    sql "SELECT state || ' / ' || broker_state || ' / ' || coalesce(last_error, '') FROM outbox.relay_status()"
}

# state_is STATE: wait until relay_status().state is STATE.
state_is() {
    wait_until 30 "SELECT state = '$1' FROM outbox.relay_status()" \
        || fail "relay state is not '$1': $(relay_state)"
}

# relay_steady PID: fail unless the relay is still process PID and no relay
# process ended since LOG_MARK.
relay_steady() {
    expect "relay process" "$(relay_pid)" "$1"
    expect "relay processes that ended" \
        "$(log_count 'background worker "outbox relay" \(PID [0-9]+\) (exited|was terminated)')" 0
}

# relay_cpu_ms PID: CPU time the relay process (all its threads) has used.
relay_cpu_ms() {
    [ -r "/proc/$1/stat" ] || { echo 0; return; }
    awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print int(($12 + $13) * 1000 / hz) }' "/proc/$1/stat"
}

# calm_for PID SECONDS TOPIC: for SECONDS, poll that no event of TOPIC is
# sent or dead or has a failed attempt recorded (the fault is not the
# events' own); fail if one is, or if the relay kept a core busy for more
# than a third of the time (a retry loop without a pause).
calm_for() {
    local before
    before=$(relay_cpu_ms "$1")
    holds "$2" "$(held_sql "$3")" \
        || fail "events of $3 sent/dead/with attempts during the fault: $(held_counts "$3"), want 0/0/0"
    [ $(($(relay_cpu_ms "$1") - before)) -lt $(($2 * 1000 / 3)) ] \
        || fail "the relay used $(($(relay_cpu_ms "$1") - before)) ms of CPU in $2 s"
}

# enqueue TOPIC N PREFIX: N events of TOPIC, all of one key, in order.
enqueue() {
    sql "SELECT count(outbox.enqueue('T', 'fault-$3-' || i, jsonb_build_object('seq', i),
                                     topic => '$1', msg_key => 'k'))
           FROM generate_series(1, $2) i" >/dev/null
}

# held_sql TOPIC: SQL, true while no event of TOPIC is sent or dead or has
# a failed attempt recorded.
held_sql() {
    echo "SELECT count(*) FILTER (WHERE status IN ('sent', 'dead') OR attempts > 0) = 0
            FROM outbox.events WHERE topic = '$1'"
}

# held_counts TOPIC: how many events of TOPIC are sent, dead, with a failed
# attempt, as "sent/dead/attempts".
held_counts() {
    sql "SELECT count(*) FILTER (WHERE status = 'sent') || '/' || count(*) FILTER (WHERE status = 'dead')
                || '/' || count(*) FILTER (WHERE attempts > 0)
           FROM outbox.events WHERE topic = '$1'"
}

# arrive_once TOPIC N [BROKERS]: every one of the N events of TOPIC is
# marked sent and is in Kafka exactly once, in enqueue order (in any order
# with UNORDERED=1: events replayed after dying lose their place).
arrive_once() {
    local topic=$1 n=$2 out=$IT_TMP/$1.tsv
    wait_until 60 "$(all_sent "$topic" "$n")" || {
        fail "events of $topic not all marked sent: $(sql "SELECT string_agg(status || ':' || c, ' ') FROM
              (SELECT status, count(*) c FROM outbox.events WHERE topic = '$topic' GROUP BY 1) s")"
        return
    }
    # All are acknowledged: read until nothing more comes, to see duplicates.
    IT_BROKERS=${3:-$IT_BROKERS} consume "$topic" $((2 * n)) 30000 3000 >"$out"
    expect "messages of $topic in Kafka" "$(wc -l <"$out")" "$n"
    load_consumed got_arrive "$out"
    expect_delivered "events of $topic in Kafka" got_arrive "SELECT id FROM outbox.event_log WHERE topic = '$topic'"
    [ "${UNORDERED:-0}" = 1 ] ||
        expect "order of $topic" "$(cut -f6 "$out" | tr -d '{}"seq:' | tr '\n' ' ')" "$(seq -s ' ' 1 "$n") "
}

# new_producer TAG: make the relay build a new producer (another
# client.id), which connects and asks for a producer id again.
new_producer() {
    set_setting outbox.kafka_properties "client.id=outbox-relay-$1"
}

# replay TOPIC: replay the dead events of TOPIC; prints how many.
replay() {
    sql "SELECT count(*) FILTER (WHERE outbox.replay(id)) FROM outbox.dead_letters WHERE topic = '$1'"
}

# reset_properties: back to no outbox.kafka_properties.
reset_properties() {
    sql "ALTER SYSTEM RESET outbox.kafka_properties" && sql "SELECT pg_reload_conf()" >/dev/null
}

# --- the mock broker: errors for every request type ---------------------

# ApiVersions refused (UNSUPPORTED_VERSION) on every connection: the broker
# is unreachable, said once; then dropped connections (retriable) that
# librdkafka gets past on its own.
t_fault_apiversions() {
    local topic=mock.fault.apiversions pid
    mock create $topic 1
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    mock request-errors 18 100000 35
    # A user name is no secret: were it hidden as one, "Broker" would be
    # cut out of the line this case looks for.
    set_setting outbox.kafka_properties "client.id=outbox-relay-apiversions;sasl.username=Broker"
    enqueue $topic 10 av
    log_shows 'outbox relay: kafka: .*ApiVersionRequest failed: Broker: API version not supported'
    state_is 'broker unreachable'
    status_shows 'ApiVersionRequest failed'
    calm_for "$pid" 4 $topic
    log_at_most 2 'ApiVersionRequest failed'
    mock clear 18
    arrive_once $topic 10 "$MOCK_BROKERS"

    local retried=mock.fault.apiversions.drop
    mock create $retried 1
    mock broker-errors 18 3 -195
    new_producer apiversions-drop
    enqueue $retried 10 avd
    arrive_once $retried 10 "$MOCK_BROKERS"
    # Each dropped connection took one of the three (librdkafka 2.0 logs
    # them, 2.14 does not): the fault happened, and cost no attempt.
    expect "dropped ApiVersions connections met" "$(mock_answer broker-errors-left 18)" 0
    expect "failed attempts recorded" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$retried' AND attempts > 0")" 0
    relay_steady "$pid"
    reset_properties
}

# Metadata says the topic has no leader (retriable): the events wait, the
# relay says once that Kafka does not acknowledge and why, and once when it
# does again.
t_fault_metadata() {
    local topic=mock.fault.metadata pid
    skip_case "$(mock_topic_errors_crash)" && return
    mock create $topic 1
    pid=$(relay_pid)
    mock topic-error $topic 5
    # Deliveries time out in 2 s instead of 5 min, so the stall shows.
    set_setting outbox.kafka_properties "message.timeout.ms=2000"
    LOG_MARK=$(log_mark)
    enqueue $topic 10 md
    log_shows 'outbox relay: Kafka did not acknowledge the events sent'
    log_shows "The cluster reports for topic \"$topic\": Broker: Leader not available"
    status_shows 'Leader not available'
    calm_for "$pid" 5 $topic
    log_at_most 1 'Kafka did not acknowledge the events sent'
    mock topic-error $topic 0
    arrive_once $topic 10 "$MOCK_BROKERS"
    log_shows 'outbox relay: Kafka acknowledges the events sent again'
    relay_steady "$pid"
    reset_properties
}

# Metadata says the topic does not exist (not retriable), and
# outbox.missing_topic_dead is on (0.2.0's rule; off, they wait:
# topic_created_late): the events die after outbox.max_attempts, each said
# in the log; once the topic exists, replayed, they arrive.
t_fault_metadata_unknown_topic() {
    local topic=mock.fault.notopic pid
    mock create $topic 1
    pid=$(relay_pid)
    mock topic-error $topic 3
    set_setting outbox.kafka_properties "topic.metadata.propagation.max.ms=500"
    set_setting outbox.missing_topic_dead on
    LOG_MARK=$(log_mark)
    enqueue $topic 5 nt
    wait_until 30 "SELECT count(*) = 5 FROM outbox.dead_letters WHERE topic = '$topic' AND attempts = 3" \
        || fail "events not dead after 3 refusals: $(sql "SELECT string_agg(status || '/' || attempts, ' ') FROM outbox.events WHERE topic = '$topic'")"
    log_shows "outbox relay: event [0-9]+ is dead after 3 failed attempts: topic \"$topic\" does not exist"
    status_shows "topic \"$topic\" does not exist"
    mock topic-error $topic 0
    # librdkafka keeps "no such topic" for a moment after the topic is
    # back, and may refuse a replayed event again: replay until all went.
    expect "replayed" "$(replay $topic)" 5
    for _ in 1 2 3 4 5; do
        wait_until 20 "SELECT count(*) FILTER (WHERE status = 'sent') = 5 OR count(*) FILTER (WHERE status = 'dead') > 0
                         FROM outbox.events WHERE topic = '$topic'"
        [ "$(sql "SELECT count(*) FROM outbox.dead_letters WHERE topic = '$topic'")" = 0 ] && break
        replay $topic >/dev/null
    done
    UNORDERED=1 arrive_once $topic 5 "$MOCK_BROKERS"
    relay_steady "$pid"
    reset_properties
    sql "ALTER SYSTEM RESET outbox.missing_topic_dead" && sql "SELECT pg_reload_conf()" >/dev/null
}

# InitProducerId answered "coordinator loading" and then "coordinator not
# available" (retriable): librdkafka retries every half second; the log
# says each once, relay_status shows it, and the events wait.
t_fault_init_producer_id() {
    local topic=mock.fault.pid pid
    mock create $topic 1
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    mock request-errors 22 2 14
    mock request-errors 22 100000 15
    new_producer pid
    enqueue $topic 10 pid
    log_shows 'Failed to acquire idempotence PID from broker .*: Broker: Coordinator load in progress: retrying'
    log_shows 'Failed to acquire idempotence PID from broker .*: Broker: Coordinator not available: retrying'
    status_shows 'Coordinator not available'
    calm_for "$pid" 5 $topic
    log_at_most 1 'Coordinator not available'
    mock clear 22
    arrive_once $topic 10 "$MOCK_BROKERS"
    relay_steady "$pid"
    reset_properties
}

# InitProducerId refused with CLUSTER_AUTHORIZATION_FAILED, a fatal error
# for an idempotent producer: the relay makes a new producer after its
# backoff (the process stays), says so once, and no event dies of it.
# Each new producer uses up one of the 40 errors: with the backoff (at
# most 1 s here) fewer than 10 go in the 5 s watched, without it all.
t_fault_init_producer_id_fatal() {
    local topic=mock.fault.pid.fatal pid
    mock create $topic 1
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    mock request-errors 22 40 31
    new_producer pid-fatal
    enqueue $topic 10 pf
    log_shows 'outbox relay: kafka: .*Fatal error: Broker: Cluster authorization failed: Failed to acquire idempotence PID'
    log_shows 'outbox relay: kafka: the producer had a fatal error: making a new one'
    state_is 'broker unreachable'
    status_shows 'Cluster authorization failed'
    calm_for "$pid" 5 $topic
    log_at_most 2 'Cluster authorization failed'
    log_at_most 1 'the producer had a fatal error'
    mock clear 22
    arrive_once $topic 10 "$MOCK_BROKERS"
    relay_steady "$pid"
    reset_properties
}

# Produce answered with retriable errors: short bursts librdkafka retries
# in order (nothing recorded, nothing duplicated); then one that lasts past
# the delivery timeout, which the relay reports and sends again.
t_fault_produce_retriable() {
    local topic=mock.fault.produce pid
    mock create $topic 1
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    mock request-errors 0 2 19     # NOT_ENOUGH_REPLICAS
    mock request-errors 0 2 7      # REQUEST_TIMED_OUT
    mock request-errors 0 2 56     # KAFKA_STORAGE_ERROR
    mock request-errors 0 2 5      # LEADER_NOT_AVAILABLE
    mock request-errors 0 2 -195   # connection dropped
    enqueue $topic 30 pr
    arrive_once $topic 30 "$MOCK_BROKERS"
    expect "failed attempts recorded" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND attempts > 0")" 0

    local lasting=mock.fault.produce.lasting
    mock create $lasting 1
    set_setting outbox.kafka_properties "message.timeout.ms=2000"
    mock request-errors 0 100000 19
    local since
    since=$(sql "SELECT now()")
    enqueue $lasting 10 prl
    log_shows 'outbox relay: Kafka did not acknowledge the events sent'
    wait_until 30 "SELECT last_error_at > '$since' AND last_error IS NOT NULL FROM outbox.relay_status()" \
        || fail "relay_status shows no new error: $(relay_state)"
    calm_for "$pid" 4 $lasting
    log_at_most 1 'Kafka did not acknowledge the events sent'
    mock clear 0
    arrive_once $lasting 10 "$MOCK_BROKERS"
    log_shows 'outbox relay: Kafka acknowledges the events sent again'
    relay_steady "$pid"
    reset_properties
}

# Produce refused (not retriable): each refusal counts; fewer than
# outbox.max_attempts and the events arrive; as many and they are dead,
# said in the log, and arrive once replayed.  Sequence errors (fatal for
# the idempotent producer) make a new producer and cost no attempt.
t_fault_produce_refused() {
    local topic=mock.fault.refused pid
    mock create $topic 1
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    mock request-errors 0 1 87   # INVALID_RECORD
    mock request-errors 0 1 18   # RECORD_LIST_TOO_LARGE
    enqueue $topic 10 rf
    arrive_once $topic 10 "$MOCK_BROKERS"
    # Each event was refused once or twice (retries of one key go one by one).
    expect "fewest and most attempts" "$(sql "SELECT min(attempts) || '-' || (max(attempts) <= 2) FROM outbox.events WHERE topic = '$topic'")" 1-true
    expect "refusals in last_error" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic'
        AND last_error IN ('Broker: Broker failed to validate record', 'Broker: Message batch larger than configured server segment size')")" 10

    local dying=mock.fault.refused.dead
    mock create $dying 1
    mock request-errors 0 100000 87
    enqueue $dying 5 rfd
    wait_until 30 "SELECT count(*) = 5 FROM outbox.dead_letters WHERE topic = '$dying' AND attempts = 3" \
        || fail "events not dead after 3 refusals: $(sql "SELECT string_agg(status || '/' || attempts, ' ') FROM outbox.events WHERE topic = '$dying'")"
    log_shows "outbox relay: event [0-9]+ is dead after 3 failed attempts: Broker: Broker failed to validate record"
    status_shows 'Broker failed to validate record'
    mock clear 0
    expect "replayed" "$(replay $dying)" 5
    arrive_once $dying 5 "$MOCK_BROKERS"

    local fatal=mock.fault.refused.sequence
    mock create $fatal 1
    mock request-errors 0 1 45   # OUT_OF_ORDER_SEQUENCE_NUMBER
    enqueue $fatal 10 rfs
    log_shows 'outbox relay: kafka: .*Fatal error: Broker: Broker received an out of order sequence number'
    arrive_once $fatal 10 "$MOCK_BROKERS"
    expect "failed attempts recorded" "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$fatal' AND attempts > 0")" 0
    relay_steady "$pid"
}

# --- the real broker: wrong settings ------------------------------------

# A broker address nobody listens on, then a host name that does not
# resolve: the broker is unreachable, said at a sane rate, nothing dies;
# the right address delivers everything.
t_bad_broker_address() {
    local topic=it.badaddr pid port
    pid=$(relay_pid)
    port=$(kafka_free_port)
    LOG_MARK=$(log_mark)
    set_setting outbox.kafka_brokers "127.0.0.1:$port"
    enqueue $topic 10 ba
    log_shows "Connect to ipv4#127.0.0.1:$port failed: Connection refused"
    state_is 'broker unreachable'
    expect "broker state" "$(sql "SELECT broker_state FROM outbox.relay_status()")" down
    status_shows 'Connection refused'
    calm_for "$pid" 5 $topic
    log_at_most 2 'Connection refused'

    set_setting outbox.kafka_brokers "no-such-host.invalid:9092"
    log_shows "Failed to resolve 'no-such-host.invalid:9092'"
    status_shows 'Failed to resolve'
    calm_for "$pid" 5 $topic
    log_at_most 2 'Failed to resolve'

    set_setting outbox.kafka_brokers "$IT_BROKERS"
    arrive_once $topic 10
    relay_steady "$pid"
}

# alter_system SQL: run ALTER SYSTEM (or any statement) and print psql's
# output with SQLSTATEs.
alter_system() {
    "$PGBIN/psql" -X -q -d "$IT_DB" -v VERBOSITY=verbose -c "$1" 2>&1
}

# set_conf_properties VALUE: outbox.kafka_properties written by hand into
# postgresql.conf (no value: the line removed).
set_conf_properties() {
    sed -i '/^outbox.kafka_properties/d' "$CLUSTER_DATA/postgresql.conf"
    [ -z "$1" ] || echo "outbox.kafka_properties = '$1'" >>"$CLUSTER_DATA/postgresql.conf"
}

# outbox.kafka_properties that librdkafka refuses: ALTER SYSTEM fails with
# 22023 naming the property, never the value; in postgresql.conf at reload
# the old value stays and the relay keeps delivering; at server start the
# server starts and says so; a combination refused only when the producer
# is made leaves the relay "not configured" until fixed.  No value reaches
# the log.
t_bad_kafka_property() {
    local topic=it.badprop out pid start
    start=$(log_mark)
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=5;no.such.property=Hidden-Value-1'")
    [[ "$out" == *'ERROR:  22023: invalid value for parameter "outbox.kafka_properties"'* ]] \
        || fail "unknown property: no 22023 error: $out"
    [[ "$out" == *'Entry 2 names no property librdkafka knows.'* ]] \
        || fail "unknown property: the error does not give its position: $out"
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=Hidden-Value-2'")
    [[ "$out" == *'ERROR:  22023: invalid value for parameter "outbox.kafka_properties"'* && "$out" == *'Property "linger.ms" was refused'* ]] \
        || fail "bad value: no 22023 error naming linger.ms: $out"
    [[ "$out" == *'Property "linger.ms" was refused by librdkafka (entry 1): it takes 0 .. '* ]] \
        || fail "bad value: the error does not say what linger.ms takes: $out"
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = 'security.protocol=Hidden-Value-4'")
    [[ "$out" == *'it takes plaintext, ssl, sasl_plaintext, sasl_ssl.'* ]] \
        || fail "bad choice: the error does not name security.protocol's choices: $out"
    [[ "$out" != *Hidden-Value* ]] || fail "a refused value was shown to the client: $out"

    # By hand, reloaded: refused, the previous value stays.
    pid=$(relay_pid)
    set_conf_properties "linger.ms=3"
    sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 10 "SELECT current_setting('outbox.kafka_properties') = 'linger.ms=3'" || fail "the good value was not taken"
    LOG_MARK=$(log_mark)
    set_conf_properties "linger.ms=3;no.such.property=Hidden-Value-3"
    sql "SELECT pg_reload_conf()" >/dev/null
    log_shows 'invalid value for parameter "outbox.kafka_properties" \(value hidden\)'
    log_shows 'Entry 2 names no property librdkafka knows'
    expect "value after the refused reload" "$(sql "SHOW outbox.kafka_properties")" "linger.ms=3"
    enqueue $topic 5 bp
    arrive_once $topic 5
    relay_steady "$pid"

    # At server start: the server starts, says so, and relays.
    LOG_MARK=$(log_mark)
    cluster_ctl -m fast restart >/dev/null || fail "the server did not restart"
    log_shows 'invalid value for parameter "outbox.kafka_properties" \(value hidden\)'
    wait_until 30 "SELECT count(*) = 1 FROM outbox.relay_status()" || fail "no relay after the restart"
    sql "SELECT outbox.enqueue('T', 'fault-bp-6', '{\"seq\": 6}', topic => '$topic', msg_key => 'k')" >/dev/null
    arrive_once $topic 6
    set_conf_properties ""
    sql "SELECT pg_reload_conf()" >/dev/null

    # Each property fine, the combination refused when the producer is made.
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    set_setting outbox.kafka_properties "max.in.flight=10"
    log_shows 'outbox relay: could not create the Kafka producer'
    log_shows 'DETAIL:  librdkafka: `max.in.flight` must be set <= 5 when `enable.idempotence` is true'
    log_shows 'HINT:  Check that the security settings in outbox.kafka_properties'
    state_is 'not configured'
    status_shows 'unusable Kafka settings: `max.in.flight` must be set <= 5'
    sql "SELECT outbox.enqueue('T', 'fault-bp-7', '{\"seq\": 7}', topic => '$topic', msg_key => 'k')" >/dev/null
    holds 3 "SELECT status = 'new' FROM outbox.events WHERE biz_key = 'fault-bp-7'" \
        || fail "sent while not configured: $(sql "SELECT status FROM outbox.events WHERE biz_key = 'fault-bp-7'")"
    log_at_most 1 'could not create the Kafka producer'
    reset_properties
    arrive_once $topic 7
    relay_steady "$pid"

    # A file the server cannot read: named, with the property and why.
    local ca=$IT_TMP/unreadable-ca.pem
    echo "not a certificate" >"$ca"
    chmod 600 "$ca"
    LOG_MARK=$(log_mark)
    set_setting outbox.kafka_properties "security.protocol=ssl;ssl.ca.location=$ca"
    log_shows "outbox relay: could not read file \"$ca\" of property \"ssl.ca.location\": Permission denied"
    log_shows 'HINT:  Make the file readable by the operating system user the server runs as'
    state_is 'not configured'
    status_shows "unusable Kafka settings: could not read file \"$ca\""
    reset_properties
    sql "SELECT outbox.enqueue('T', 'fault-bp-8', '{\"seq\": 8}', topic => '$topic', msg_key => 'k')" >/dev/null
    arrive_once $topic 8
    relay_steady "$pid"
    ! log_since "$start" | grep -q 'Hidden-Value' || fail "a value of outbox.kafka_properties is in the server log"
}

# SASL/PLAIN with a wrong password: authentication failed, said once,
# shown, nothing dies, the relay stays; the right password delivers all.
# Neither password ever reaches the server log.
t_sasl_bad_password() {
    local topic=it.sasl pid sasl="security.protocol=SASL_PLAINTEXT;sasl.mechanism=PLAIN;sasl.username=$IT_SASL_USER"
    [ -n "${KAFKA_SASL_BROKERS:-}" ] || { fail "the test broker has no SASL listener (kafka_add_sasl)"; return; }
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    sql "ALTER SYSTEM SET outbox.kafka_properties = '$sasl;sasl.password=$IT_SASL_WRONG'"
    set_setting outbox.kafka_brokers "$KAFKA_SASL_BROKERS"
    enqueue $topic 10 sa
    log_shows 'outbox relay: kafka: .*SASL authentication error: Authentication failed: Invalid username or password'
    state_is 'broker unreachable'
    status_shows 'Authentication failed'
    calm_for "$pid" 5 $topic
    log_at_most 1 'Authentication failed'
    set_setting outbox.kafka_properties "$sasl;sasl.password=$(escape_property "$IT_SASL_PASSWORD")"
    arrive_once $topic 10
    relay_steady "$pid"
    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    ! log_since "$LOG_MARK" | grep -q -e "${IT_SASL_PASSWORD##*;}" -e "$IT_SASL_WRONG" \
        || fail "a SASL password is in the server log"
}
