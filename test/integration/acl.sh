# test/integration/acl.sh: least privilege, tested.  A broker of its own
# (test/kafka/cluster.sh, one KRaft node) with Kafka's StandardAuthorizer
# and allow.everyone.if.no.acl.found=false; the relay connects as its own
# principal over SASL_PLAINTEXT (PLAIN), the test's admin and consumer as
# the super user over PLAINTEXT.  The relay's principal gets the ACLs
# docs/kafka.md lists for the delivery mode, by running that section's
# own "acl" lines through Kafka's AclCommand (the class behind
# kafka-acls.sh), and nothing else: its events are delivered.  Then each
# listed ACL is removed in turn: relay_status() and the log name what is
# missing, no event is lost or charged beyond what the docs' table of
# mistakes says, and once the ACL is back every event is delivered as the
# mode promises (checked by event id against a read_committed consumer).

# The relay's principal, the SASL_PLAINTEXT listener's one account.  Its
# name shares no four bytes with the topics' names: the relay hides any
# such run of a property's value in what librdkafka says (kafka_scrub.c).
IT_ACL_USER=relayacl
IT_ACL_PASSWORD=Pw$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 20)
ACL_TOPIC_PREFIX=it.acl.
ACL_N=0

# acl_broker: set up and start the broker; ACL_RELAY_BROKERS is the
# relay's listener, KCLUSTER_BROKERS the super user's.  Topics are not
# created on first use: the relay's principal has no Create.
acl_broker() {
    local dir=$IT_TMP/kacl f port
    kcluster_setup "$dir" 1 || return 1
    f=$dir/1/server.properties
    port=$(kafka_free_port "${KCLUSTER_PORT[1]}" "${KCLUSTER_CTL[1]}")
    ACL_RELAY_BROKERS=127.0.0.1:$port
    sed -i -e "s|^\(listeners=.*\)|\1,SASL_PLAINTEXT://$ACL_RELAY_BROKERS|" \
        -e "s|^\(advertised.listeners=.*\)|\1,SASL_PLAINTEXT://$ACL_RELAY_BROKERS|" \
        -e "s|^\(listener.security.protocol.map=.*\)|\1,SASL_PLAINTEXT:SASL_PLAINTEXT|" \
        -e "s|^auto.create.topics.enable=.*|auto.create.topics.enable=false|" "$f"
    cat >>"$f" <<CONF
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:ANONYMOUS
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$IT_ACL_USER="$IT_ACL_PASSWORD";
CONF
    kcluster_start
}

# kafka_tool CLASS ARG...: Kafka's command-line tool CLASS (kafka-tools),
# as the super user; its output goes to acl_tools.log.
kafka_tool() {
    local class=$1
    shift
    java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$KAFKA_CP" "org.apache.kafka.tools.$class" \
        --bootstrap-server "$KCLUSTER_BROKERS" "$@" >>"$IT_TMP/acl_tools.log" 2>&1 ||
        { fail "$class $*: failed; see $IT_TMP/acl_tools.log"; return 1; }
}

# acl add|remove ARG...: AclCommand for the relay's principal, as
# docs/kafka.md's acl function calls kafka-acls.sh.
acl() {
    local what=$1
    shift
    if [ "$what" = add ]; then
        kafka_tool AclCommand --add --allow-principal "User:$IT_ACL_USER" "$@"
    else
        kafka_tool AclCommand --remove --force --allow-principal "User:$IT_ACL_USER" "$@"
    fi
}

# acl_docs MODE: docs/kafka.md's acl lines (the arguments after "acl")
# for MODE, the topic prefix "orders." made ACL_TOPIC_PREFIX: every line
# for exactly_once, those naming neither a transactional id nor the
# progress topic for at_least_once.
acl_docs() {
    sed -n '/^## ACLs/,/^## /p' docs/kafka.md | sed -n 's/^acl //p' |
        sed "s/ orders\. / $ACL_TOPIC_PREFIX /" |
        if [ "$1" = exactly_once ]; then cat; else grep -v -e '--transactional-id' -e 'outbox_progress'; fi
}

# acl_setup MODE TOPIC: the broker, TOPIC and (exactly_once, unless
# ACL_NO_PROGRESS is set) the progress topic made by the admin, and the
# docs' ACLs for MODE granted, all at once.
acl_setup() {
    local pids=() line args p
    acl_broker || { fail "the broker did not start"; return 1; }
    kafka_tool TopicCommand --create --topic "$2" --partitions 3 --replication-factor 1 &
    pids+=($!)
    kafka_tool TopicCommand --create --topic "${ACL_TOPIC_PREFIX}probe" --partitions 1 --replication-factor 1 &
    pids+=($!)
    [ "$1" = at_least_once ] || [ -n "${ACL_NO_PROGRESS:-}" ] ||
        kafka_tool TopicCommand --create --topic outbox_progress --partitions 1 --replication-factor 1 \
            --config cleanup.policy=compact &
    pids+=($!)
    while read -r line; do
        read -ra args <<<"$line"
        acl add "${args[@]}" &
        pids+=($!)
    done < <(acl_docs "$1")
    for p in "${pids[@]}"; do
        wait "$p" || fail "a topic or an ACL could not be made"
    done
    [ "$(acl_docs "$1" | wc -l)" -gt 0 ] || fail "no acl lines in docs/kafka.md's ACLs section"
}

# acl_relay MODE: the relay as its principal, in delivery MODE, with a new
# producer (its properties changed): the next start of a producer meets
# the ACLs as they are now.
acl_relay() {
    ACL_N=$((ACL_N + 1))
    sql "ALTER SYSTEM SET outbox.kafka_properties = 'security.protocol=SASL_PLAINTEXT;sasl.mechanism=PLAIN;sasl.username=$IT_ACL_USER;sasl.password=$IT_ACL_PASSWORD;socket.timeout.ms=$((60000 + ACL_N))'"
    sql "ALTER SYSTEM SET outbox.kafka_brokers = '$ACL_RELAY_BROKERS'"
    if [ "$(sql "SHOW outbox.delivery")" = "$1" ]; then
        sql "SELECT pg_reload_conf()" >/dev/null
    else
        set_delivery "$1"
    fi
}

# acl_end ALL: no part of the password in ALL, the log since LOG_MARK or
# relay_status(); back to the suite's broker in at_least_once.
acl_end() {
    relay_said "$1"
    log_since "$LOG_MARK" >>"$1"
    leaks_part "the server log or relay_status()" "$1" "$IT_ACL_PASSWORD"
    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    sql "ALTER SYSTEM SET outbox.kafka_brokers = '$IT_BROKERS'"
    [ "$(sql "SHOW outbox.delivery")" = at_least_once ] || set_delivery at_least_once
    sql "SELECT pg_reload_conf()" >/dev/null
    kcluster_stop
}

# acl_held PREFIX SECONDS: for SECONDS, no event enqueued with PREFIX
# (enqueue) is sent or dead or has a failed attempt recorded.
acl_held() {
    holds "$2" "SELECT count(*) FILTER (WHERE status IN ('sent', 'dead') OR attempts > 0) = 0
                  FROM outbox.events WHERE biz_key LIKE 'fault-$1-%'" ||
        fail "events $1 sent/dead/with attempts while an ACL was missing: $(sql "SELECT count(*) FILTER (WHERE status = 'sent')
              || '/' || count(*) FILTER (WHERE status = 'dead') || '/' || count(*) FILTER (WHERE attempts > 0)
              FROM outbox.events WHERE biz_key LIKE 'fault-$1-%'"), want 0/0/0"
}

# acl_all_sent TOPIC: wait until every event of TOPIC is sent.
acl_all_sent() {
    wait_until 30 "SELECT count(*) FILTER (WHERE status <> 'sent') = 0 FROM outbox.events WHERE topic = '$1'" ||
        fail "events of $1 not all sent once the ACL was back: $(held_counts "$1") sent/dead/attempts; $(relay_state)"
}

# acl_topic_refused TOPIC PREFIX: Write on the topics removed: three
# events of TOPIC (PREFIX, see enqueue) are refused, the log and
# relay_status() name the topic and the ACL, and each dies at the first
# refusal the cluster confirms from its outbox.max_attempts-th (3)
# attempt on; with Write back, replayed, all are sent (with
# ACL_REPLAY_FROZEN, replayed while the broker is frozen for that many
# seconds).
acl_topic_refused() {
    local topic=$1 prefix=$2
    acl remove --operation Write --topic "$ACL_TOPIC_PREFIX" --resource-pattern-type prefixed
    enqueue "$topic" 3 "$prefix"
    log_shows "outbox relay: Kafka refused event [0-9]+: Broker: Topic authorization failed"
    log_shows "HINT:  The relay's Kafka principal may not write to topic \"$topic\": grant it Write there"
    status_shows 'Topic authorization failed'
    wait_until 30 "SELECT count(*) FILTER (WHERE status = 'dead') = 3 FROM outbox.events
                   WHERE topic = '$topic' AND biz_key LIKE 'fault-$prefix-%'" ||
        fail "the refused events are not dead: $(held_counts "$topic") sent/dead/attempts"
    # Dead at the first refusal the cluster confirms from the third attempt
    # on: one it did not confirm (its metadata answer later than 500 ms,
    # as under CI's load) is an attempt that is not charged.
    expect "refused events with fewer than 3 attempts" \
        "$(sql "SELECT count(*) FROM outbox.events WHERE biz_key LIKE 'fault-$prefix-%' AND attempts < 3")" 0
    echo "#   attempts of the refused events: $(sql "SELECT string_agg(attempts::text, ' ' ORDER BY id) FROM outbox.events WHERE biz_key LIKE 'fault-$prefix-%'")"
    log_shows "event [0-9]+ is dead after [0-9]+ failed attempts: .*Topic authorization failed"
    acl add --operation Write --topic "$ACL_TOPIC_PREFIX" --resource-pattern-type prefixed
    acl_write_effective
    # At once: the replay has the relay ask the cluster again, rather than
    # refuse the topic's events for what is left of the 5 s it trusts a
    # refusal (each refusal an attempt, three and they are dead again).
    if [ -n "${ACL_REPLAY_FROZEN:-}" ]; then
        kill -STOP "${KCLUSTER_PIDS[1]}"
        expect "events replayed" "$(replay "$topic")" 3
        sleep "$ACL_REPLAY_FROZEN"
        kill -CONT "${KCLUSTER_PIDS[1]}"
    else
        expect "events replayed" "$(replay "$topic")" 3
    fi
    acl_all_sent "$topic"
}

# acl_write_effective: wait until the broker lets the relay's principal
# write to the topics again.  AclCommand returns once the controller took
# the ACL; the broker's authorizer applies it a moment later, and under
# load a replay within that moment could be refused its three attempts
# (100 ms apart here) and die again, as in CI.  A probe topic under the same prefix takes
# the probes, so that the topic checked holds only events.
acl_write_effective() {
    local _ out
    for _ in $(seq 1 60); do
        # kcat's exit status and its word: a refused message is said.
        out=$(echo probe | kcat -P -b "$ACL_RELAY_BROKERS" -t "${ACL_TOPIC_PREFIX}probe" \
            -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN \
            -X sasl.username="$IT_ACL_USER" -X sasl.password="$IT_ACL_PASSWORD" \
            -X message.timeout.ms=2000 2>&1) && ! grep -qi "fail\|error" <<<"$out" && return 0
        sleep 0.5
    done
    fail "the relay's principal still may not write to ${ACL_TOPIC_PREFIX}probe 30 s after the ACL was given back"
}

# acl_delivered TOPIC: a read_committed consumer (the super user) got
# every event of TOPIC once, whatever its order (replayed events lose
# their place).
acl_delivered() {
    local out=$IT_TMP/$1.tsv n
    n=$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$1'")
    IT_BROKERS=$KCLUSTER_BROKERS consume "$1" $((2 * n)) 30000 3000 >"$out"
    expect "messages of $1 in Kafka" "$(wc -l <"$out")" "$n"
    load_consumed got_acl "$out"
    expect_delivered "events of $1 in Kafka" got_acl "SELECT id FROM outbox.event_log WHERE topic = '$1'"
}

# acl_at_least_once_case NAME [FROZEN]: at_least_once with Write on the
# topics (prefixed) and nothing else: delivered.  Without it: refused,
# named, dead after its attempts, delivered once replayed (with FROZEN,
# replayed while the broker is frozen for FROZEN s: acl_topic_refused).
acl_at_least_once_case() {
    local topic=$ACL_TOPIC_PREFIX$1 all=$IT_TMP/acl_$1.out pid
    LOG_MARK=$(log_mark)
    : >"$all"
    acl_setup at_least_once "$topic" || { kcluster_stop; return; }
    pid=$(relay_pid)
    acl_relay at_least_once
    enqueue "$topic" 5 "$1-granted"
    acl_all_sent "$topic"
    ACL_REPLAY_FROZEN=${2:-} acl_topic_refused "$topic" "$1-write"
    acl_delivered "$topic"
    relay_steady "$pid"
    acl_end "$all"
}

t_acl_at_least_once() { acl_at_least_once_case alo; }

# The replay answered late: Write given back, the three dead events
# replayed while the broker is frozen (SIGSTOP) for 2 s, so that the
# relay's question about the topic goes unanswered.  librdkafka still
# holds the topic as refused until an answer comes: that is not the
# cluster's word, and must not make the replayed events dead (before, each
# was refused at once, three times in 300 ms, and died again).
t_acl_replay_answered_late() { acl_at_least_once_case late 2; }

# The docs' Create row: exactly_once with the progress topic not made by
# the admin.  Without Create the relay starts no transaction, says what to
# do, and sends nothing; with Create on the progress topic (and nothing
# else more) it makes the topic, one partition and compacted, and every
# event is delivered exactly once to a read_committed consumer.
t_acl_progress_created() {
    local topic=${ACL_TOPIC_PREFIX}made all=$IT_TMP/acl_made.out pid described
    LOG_MARK=$(log_mark)
    : >"$all"
    ACL_NO_PROGRESS=1 acl_setup exactly_once "$topic" || { kcluster_stop; return; }
    pid=$(relay_pid)
    acl_relay exactly_once
    enqueue "$topic" 3 made-none
    log_shows 'outbox relay: the relay.s principal may not create the progress topic "outbox_progress"'
    log_shows 'HINT:  Create topic "outbox_progress" with one partition and cleanup.policy=compact, or grant the relay.s principal Create on it'
    state_is 'waiting for Kafka transactions'
    status_shows 'could not create the progress topic "outbox_progress"'
    acl_held made-none 2
    expect "lines saying the progress topic cannot be created" \
        "$(log_count "may not create the progress topic")" 1
    # The DETAIL gives Kafka's cause; what to do is the HINT's alone.
    expect "DETAILs that give the cause and no advice" \
        "$(log_count 'DETAIL:  The cause Kafka gave: could not create the progress topic "outbox_progress": [^;]*[^.]\. In exactly_once')" 1
    expect "lines saying the relay makes a new producer" "$(log_count "making a new Kafka producer")" 0
    acl add --operation Create --topic outbox_progress
    acl_all_sent "$topic"
    kafka_tool TopicCommand --describe --topic outbox_progress
    described=$(grep -A1 "Topic: outbox_progress" "$IT_TMP/acl_tools.log" | tail -2)
    grep -q "PartitionCount: 1" <<<"$described" && grep -q "cleanup.policy=compact" <<<"$described" ||
        fail "the progress topic the relay made is not one compacted partition: $described"
    acl_delivered "$topic"
    expect "duplicates seen by a read_committed consumer" "$(duplicates got_acl)" 0
    relay_steady "$pid"
    acl_end "$all"
}

# exactly_once with the docs' ACLs: the topics, the transactional id
# (prefixed "outbox-"), the progress topic, both topics made by the admin.
# Each ACL removed in turn, and given back.
t_acl_exactly_once() {
    local topic=${ACL_TOPIC_PREFIX}eos all=$IT_TMP/acl_eos.out pid
    LOG_MARK=$(log_mark)
    : >"$all"
    acl_setup exactly_once "$topic" || { kcluster_stop; return; }
    pid=$(relay_pid)
    acl_relay exactly_once
    enqueue "$topic" 5 eos-granted
    acl_all_sent "$topic"

    # No Write on the transactional id: a new producer cannot start.
    acl remove --operation Write --transactional-id outbox- --resource-pattern-type prefixed
    acl_relay exactly_once
    log_shows "outbox relay: the relay's principal may not use transactional.id \"outbox-[0-9]+-[0-9]+-[0-9]+\""
    log_shows "HINT:  Grant the relay's principal Write on the transactional id \"outbox-"
    state_is 'waiting for Kafka transactions'
    status_shows 'Transactional Id authorization failed'
    enqueue "$topic" 3 eos-txn-id
    acl_held eos-txn-id 2
    expect "lines saying the transactional.id is refused" \
        "$(log_count "may not use transactional.id")" 1
    acl add --operation Write --transactional-id outbox- --resource-pattern-type prefixed
    acl_all_sent "$topic"

    # No Write on the progress topic: every commit fails.
    acl remove --operation Write --topic outbox_progress
    enqueue "$topic" 3 eos-progress-write
    log_shows "outbox relay: the relay's principal may not write to the progress topic \"outbox_progress\""
    log_shows "HINT:  Grant the relay's principal Write and Read on topic \"outbox_progress\""
    state_is 'waiting for Kafka transactions'
    status_shows 'the progress topic "outbox_progress" refused the record'
    acl_held eos-progress-write 2
    acl add --operation Write --topic outbox_progress
    acl_all_sent "$topic"

    # No Read on the progress topic: a new producer cannot read it.
    acl remove --operation Read --topic outbox_progress
    acl_relay exactly_once
    log_shows "outbox relay: the relay's principal may not read the progress topic \"outbox_progress\""
    log_shows "HINT:  Grant the relay's principal Read and Write on topic \"outbox_progress\""
    state_is 'waiting for Kafka transactions'
    status_shows 'the progress topic cannot be read: could not read topic "outbox_progress": Broker: Topic authorization failed'
    enqueue "$topic" 3 eos-progress-read
    acl_held eos-progress-read 2
    acl add --operation Read --topic outbox_progress
    acl_all_sent "$topic"

    # No Write on the topics: as in at_least_once.
    acl_topic_refused "$topic" eos-write
    acl_delivered "$topic"
    expect "duplicates seen by a read_committed consumer" "$(duplicates got_acl)" 0
    relay_steady "$pid"
    acl_end "$all"
}
