# test/integration/partitioning.sh: the relay puts each message key on the
# partition Java's kafka-clients producer puts it on, so that a topic the
# relay writes stays co-partitioned with one a Java service (or Debezium)
# writes.  Real broker; Java's side is test/tools/java-partitions, run.

PART_KEYS=10000
PART_PARTITIONS=12

# java_partitions_classes: where the Java tool's class is, one directory
# per broker version (KAFKA_VERSION), whose kafka-clients it runs with.
java_partitions_classes() {
    echo "$TOOLS/java-partitions/classes-$KAFKA_VERSION"
}

# java_partitions_build: compile the Java tool against the broker's
# classpath (kafka-clients included), unless its class is newer than its
# source: once per checkout and broker version, not once per case.
java_partitions_build() {
    local dir=$TOOLS/java-partitions classes
    classes=$(java_partitions_classes)
    [ "$classes/JavaPartitions.class" -nt "$dir/JavaPartitions.java" ] && return 0
    javac --release 17 -d "$classes" -cp "$KAFKA_CP" "$dir/JavaPartitions.java"
}

# java_partitions KEYFILE TOPIC...: create each TOPIC with PART_PARTITIONS
# partitions and send KEYFILE's keys through Java's producer to the first.
java_partitions() {
    java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
        -cp "$KAFKA_CP:$(java_partitions_classes)" JavaPartitions \
        "$IT_BROKERS" "$PART_PARTITIONS" "$@"
}

# Random keys of every length from 12 to 32 bytes (murmur2 hashes four
# bytes at a time, then the one to three left over), a tenth of them with
# multibyte UTF-8 in front, each sent once by the relay and once by Java's
# producer to a topic of as many partitions: each must land on the same
# partition in both.  Then a user's partitioner overrides the relay's.
t_java_partitioning() {
    local relay_topic=it.partitioning.relay java_topic=it.partitioning.java
    local keys=$IT_TMP/partitioning.keys relay_out=$IT_TMP/partitioning.relay.tsv
    local java_out=$IT_TMP/partitioning.java.tsv java_log=$IT_TMP/partitioning.java.log
    local crc_topic=it.partitioning.crc32
    java_partitions_build || { fail "the Java tool did not build"; return; }
    sql "CREATE TABLE partitioning_keys AS
           SELECT i, CASE WHEN i % 10 = 0 THEN 'заказ-' ELSE '' END
                     || left(md5(i || ':' || random()), 12 + i % 21) AS key
             FROM generate_series(1, $PART_KEYS) i"
    expect "distinct keys" "$(sql "SELECT count(DISTINCT key) FROM partitioning_keys")" "$PART_KEYS"
    sql "SELECT key FROM partitioning_keys ORDER BY i" >"$keys"
    java_partitions "$keys" "$java_topic" "$relay_topic" "$crc_topic" 2>"$java_log" \
        || { fail "Java's producer failed: $(tail -3 "$java_log")"; return; }
    sql "SELECT count(outbox.enqueue('KeyPlaced', key, '{}', topic => '$relay_topic', msg_key => key))
           FROM partitioning_keys" >/dev/null
    consume "$relay_topic" "$PART_KEYS" >"$relay_out" || fail "not all events arrived ($(wc -l <"$relay_out"))"
    # To the end: a key Java's tool sent again may be there twice.
    consume "$java_topic" 1000000 30000 3000 >"$java_out"
    load_consumed partitioning_relay "$relay_out"
    load_consumed partitioning_java "$java_out"
    expect "partitions the relay used" "$(sql "SELECT count(DISTINCT part) FROM partitioning_relay")" "$PART_PARTITIONS"
    expect "keys both sent" "$(sql "SELECT count(DISTINCT key) FROM partitioning_relay r
                                     JOIN partitioning_java j USING (key)")" "$PART_KEYS"
    expect "keys on another partition than Java's producer puts them" "$(sql "
        SELECT count(DISTINCT key) FROM partitioning_relay r JOIN partitioning_java j USING (key)
         WHERE r.part <> j.part")" 0
    wait_until 30 "$(all_sent $relay_topic "$PART_KEYS")" || fail "events not all marked sent"
    partitioner_overridden "$crc_topic"
}

# partitioner_overridden TOPIC: with partitioner=consistent_random in
# outbox.kafka_properties, the relay places keys as librdkafka's own
# default does (CRC32 of the key, modulo the partitions): the user's
# property wins over the relay's default.  TOPIC has PART_PARTITIONS.
partitioner_overridden() {
    local n=1000 out=$IT_TMP/partitioning.crc32.tsv mark
    mark=$(log_mark)
    set_setting outbox.kafka_properties "partitioner=consistent_random"
    wait_log "$mark" 20 '  parameter "outbox.kafka_properties" \(value hidden\)' \
        || fail "the properties were not taken"
    sql "SELECT count(outbox.enqueue('KeyPlacedAgain', key, '{}', topic => '$1', msg_key => key))
           FROM partitioning_keys WHERE i <= $n" >/dev/null
    consume "$1" "$n" >"$out" || fail "not all events arrived under consistent_random ($(wc -l <"$out"))"
    expect "keys off their CRC32 partition under partitioner=consistent_random" "$(python3 - "$out" "$PART_PARTITIONS" <<'PY'
import sys, zlib
path, partitions = sys.argv[1], int(sys.argv[2])
with open(path, encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f]
print(sum(int(r[1]) != zlib.crc32(r[3].encode()) % partitions for r in rows))
PY
)" 0
    reset_properties
}
