# test/integration/debezium_shape.sh: outbox.message_format = debezium,
# side by side with the real Debezium (bench/debezium.sh: Kafka Connect,
# the PostgreSQL connector and its outbox EventRouter, String converters).
# The same events go through both to one topic; each message of the relay
# must equal Debezium's of the same key in topic, partition, key, value
# bytes and headers, and a consumer written for Debezium's shape must apply
# both unchanged.  Real broker.  Debezium needs java, mvn (its jars are
# resolved once into ~/.m2), wal_level = logical and TCP (on a loopback
# address of its own): the case restarts the server for them and back,
# and skips only Debezium's side when it cannot start; the relay's shape
# is checked against the table either way.

. bench/debezium.sh

DBZ_TOPIC=dbzshape.event.order
DBZ_EVENTS=20

# dbzshape_sql_helpers: the events both sides send, and what to read the
# consumer's header text ("name=value,...") with.
dbzshape_sql_helpers() {
    sql "CREATE TABLE dbzshape_events AS
           SELECT i, 'order-' || i AS key, CASE WHEN i % 2 = 0 THEN 'OrderPaid' ELSE 'OrderPlaced' END AS type,
                  jsonb_build_object('order_id', i, 'sku', 'sku-' || i, 'price', (i || '.50')::numeric,
                                     'note', E'caf\\u00e9 \"' || i || '\"', 'lines', jsonb_build_array(i, 'x', NULL),
                                     'empty', '{}'::jsonb) AS payload
             FROM generate_series(1, $DBZ_EVENTS) i;
         CREATE FUNCTION dbzshape_header(h text, name text) RETURNS text LANGUAGE sql IMMUTABLE
           AS \$\$ SELECT substring(h FROM '(?:^|,)' || name || '=([^,]*)') \$\$;
         CREATE FUNCTION dbzshape_names(h text) RETURNS text LANGUAGE sql IMMUTABLE
           AS \$\$ SELECT string_agg(split_part(x, '=', 1), ',' ORDER BY n)
                     FROM unnest(string_to_array(h, ',')) WITH ORDINALITY u(x, n) \$\$;
         CREATE TABLE dbzshape_seen (id text PRIMARY KEY);
         CREATE TABLE dbzshape_applied (id text, key text, type text, value jsonb)"
}

# dbzshape_restart_for_debezium: wal_level = logical and TCP for Debezium's
# JDBC and replication connections, on a loopback address of its own
# (DBZ_ADDR) and the same port: a relay that sees its server's port change
# takes a new Kafka identity.
dbzshape_restart_for_debezium() {
    local i
    for i in 1 2 3 4 5; do
        DBZ_ADDR=127.$((RANDOM % 250 + 2)).$((RANDOM % 250 + 2)).1
        ss -ltn 2>/dev/null | grep -q " $DBZ_ADDR:5432 " || break
    done
    cp "$CLUSTER_DATA/pg_hba.conf" "$IT_TMP/pg_hba.conf.orig"
    printf '%s\n' "host all all $DBZ_ADDR/32 trust" "host replication all $DBZ_ADDR/32 trust" \
        >>"$CLUSTER_DATA/pg_hba.conf"
    sql "ALTER SYSTEM SET wal_level = logical" && sql "ALTER SYSTEM SET listen_addresses = '$DBZ_ADDR'" || return 1
    cluster_ctl -w -t 60 restart >/dev/null
}

# dbzshape_restore: the database's format the default again, Debezium
# stopped, its slot, publication and table gone (a logical slot would keep
# the server from starting at wal_level replica), the server as before;
# the relay restarted, in its own shape.
dbzshape_restore() {
    local pid
    pid=$(relay_pid)
    sql "ALTER DATABASE $IT_DB RESET outbox.message_format"
    debezium_use dbz_shape
    [ -z "${DEBEZIUM_DIR:-}" ] || cp "$DEBEZIUM_DIR/connect.log" "$IT_TMP/debezium-connect.log" 2>/dev/null
    debezium_stop
    if [ -n "$DBZ_ADDR" ]; then
        wait_until 20 "SELECT NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = 'dbz_shape' AND active)" \
            || fail "Debezium's slot still active"
        sql "SELECT pg_drop_replication_slot('dbz_shape') FROM pg_replication_slots WHERE slot_name = 'dbz_shape'" >/dev/null
        sql "ALTER SYSTEM RESET wal_level" && sql "ALTER SYSTEM RESET listen_addresses"
        cp "$IT_TMP/pg_hba.conf.orig" "$CLUSTER_DATA/pg_hba.conf"
        cluster_ctl -w -t 60 restart >/dev/null || fail "the server did not restart as before"
    else
        sql "SELECT pg_reload_conf()" >/dev/null
    fi
    sql "SET client_min_messages = warning; DROP PUBLICATION IF EXISTS dbz_pub; DROP TABLE IF EXISTS dbz_outbox"
    wait_until 20 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> ${pid:-0}" \
        || fail "the relay did not restart after RESET outbox.message_format"
}

# dbzshape_debezium_start: Debezium reading dbz_outbox of the test
# database; false, with DBZ_WHY set, if it cannot run here.
dbzshape_debezium_start() {
    command -v "$DEBEZIUM_JAVA" >/dev/null && command -v mvn >/dev/null \
        || { DBZ_WHY="no java or mvn to run Debezium"; return 1; }
    # Its jars come from Maven Central on first use, as the broker's do.
    dbzshape_restart_for_debezium || { DBZ_WHY="the server did not restart with wal_level = logical"; return 1; }
    debezium_use dbz_shape
    debezium_schema | "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$IT_DB" >/dev/null \
        || { DBZ_WHY="Debezium's table, publication or slot could not be made"; return 1; }
    debezium_setup "$IT_TMP/debezium" 5432 "$IT_DB" \
        || { DBZ_WHY="Debezium's jars could not be resolved (mvn, ~/.m2)"; return 1; }
    debezium_start "$DEBEZIUM_LATENCY database.hostname=$DBZ_ADDR" >/dev/null 2>"$IT_TMP/debezium.err" \
        || { DBZ_WHY="Debezium did not start: $(grep -E '^(kafka connect|debezium)' "$IT_TMP/debezium.err" | tail -n 1 | cut -c 1-400)"; return 1; }
}

# dbzshape_format_debezium: the database's relay in Debezium's shape
# (ALTER DATABASE ... SET and a reload: the relay restarts to take it).
dbzshape_format_debezium() {
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || { fail "no relay"; return 1; }
    local pid
    pid=$(relay_pid)
    sql "ALTER DATABASE $IT_DB SET outbox.message_format = 'debezium'"
    sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 20 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> $pid" \
        || { fail "the relay did not restart after ALTER DATABASE ... SET outbox.message_format"; return 1; }
}

# dbzshape_check_relay TABLE: the relay's messages in TABLE (consumer
# output, values in hex) against the events it was given.
dbzshape_check_relay() {
    expect "relay messages unlike the events given" "$(sql "
        SELECT count(*) FROM $1 m JOIN dbzshape_events e USING (key)
          JOIN outbox.events o ON o.msg_key = e.key AND o.topic = '$DBZ_TOPIC'
         WHERE m.topic IS DISTINCT FROM '$DBZ_TOPIC'
            OR m.value IS DISTINCT FROM '\\x' || encode(convert_to(e.payload::text, 'UTF8'), 'hex')
            OR dbzshape_names(m.headers) IS DISTINCT FROM 'id,type,biz_key,outbox_source'
            OR dbzshape_header(m.headers, 'id') IS DISTINCT FROM o.id::text
            OR dbzshape_header(m.headers, 'type') IS DISTINCT FROM e.type
            OR dbzshape_header(m.headers, 'biz_key') IS DISTINCT FROM e.key
            OR dbzshape_header(m.headers, 'outbox_source')
               IS DISTINCT FROM (SELECT $(source_of l) FROM outbox.event_log l WHERE l.id = o.id)")" 0
    expect "relay messages matched to events" "$(sql "SELECT count(DISTINCT key) FROM $1 JOIN dbzshape_events USING (key)")" "$DBZ_EVENTS"
}

# dbzshape_compare TABLE: the relay's message of each key against
# Debezium's, field by field; the id header differs by construction (each
# is its own table's id), so each is checked against its own table.
dbzshape_compare() {
    local base="FROM $1 r JOIN $1 d USING (key)
                 WHERE r.headers LIKE '%outbox_source=%' AND d.headers NOT LIKE '%outbox_source=%'"
    expect "pairs of messages of one key" "$(sql "SELECT count(*) $base")" "$DBZ_EVENTS"
    expect "pairs on another topic" "$(sql "SELECT count(*) $base AND r.topic <> d.topic")" 0
    expect "pairs on another partition" "$(sql "SELECT count(*) $base AND r.part <> d.part")" 0
    expect "pairs with other value bytes" "$(sql "SELECT count(*) $base AND r.value <> d.value")" 0
    expect "Debezium's header names" "$(sql "SELECT DISTINCT dbzshape_names(d.headers) $base")" "id,type"
    expect "pairs whose header names do not start with Debezium's" "$(sql "
        SELECT count(*) $base AND dbzshape_names(r.headers) <> dbzshape_names(d.headers) || ',biz_key,outbox_source'")" 0
    expect "pairs with another type header" "$(sql "
        SELECT count(*) $base AND dbzshape_header(r.headers, 'type') <> dbzshape_header(d.headers, 'type')")" 0
    expect "Debezium ids not its table's" "$(sql "
        SELECT count(*) $base AND dbzshape_header(d.headers, 'id')
               IS DISTINCT FROM (SELECT id::text FROM dbz_outbox WHERE aggregateid = key)")" 0
    expect "partitions used" "$(sql "SELECT count(DISTINCT r.part) $base")" 3
}

# dbzshape_consumer TOPIC COUNT: a consumer written for Debezium's shape:
# it reads the key, the value and the "id" and "type" headers, skips an id
# it has seen and applies the rest, in one transaction per message.
dbzshape_consumer() {
    local topic part off key headers value rest id type h
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t "$1" -n "$2" -T 30000 2>/dev/null |
        while IFS=$'\t' read -r topic part off key headers value rest; do
            id= type=
            IFS=, read -ra h <<<"$headers"
            for h in "${h[@]}"; do
                case $h in id=*) id=${h#id=} ;; type=*) type=${h#type=} ;; esac
            done
            printf '%s\n' "WITH seen AS (INSERT INTO dbzshape_seen VALUES (\$q\$$id\$q\$) ON CONFLICT DO NOTHING RETURNING id)
                INSERT INTO dbzshape_applied SELECT id, \$q\$$key\$q\$, \$q\$$type\$q\$, \$q\$$value\$q\$ FROM seen;"
        done | "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$IT_DB" >/dev/null
}

# The same events through Debezium and through the relay with
# outbox.message_format = debezium, to one topic (3 partitions); the
# relay's messages against the table; each pair compared; a Debezium
# consumer run twice over both (a redelivery) and outbox.claim on the
# relay's headers; then the relay back to its own shape.
t_debezium_shape() {
    local out=$IT_TMP/dbzshape.tsv want=$DBZ_EVENTS dbz=1 id after mark
    mark=$(log_mark)
    DBZ_WHY= DBZ_ADDR=
    dbzshape_sql_helpers
    dbzshape_debezium_start || dbz=
    dbzshape_format_debezium || { dbzshape_restore; return; }
    if [ -n "$dbz" ]; then
        sql "INSERT INTO dbz_outbox (aggregatetype, aggregateid, type, payload)
               SELECT '$DBZ_TOPIC', key, type, payload FROM dbzshape_events ORDER BY i"
        # Moving from Debezium (kafka.md): outbox's ids above those sent.
        sql "SELECT setval('outbox.event_id_seq', greatest((SELECT max(id) FROM dbz_outbox),
                                                           (SELECT last_value FROM outbox.event_id_seq)))" >/dev/null
        want=$((2 * DBZ_EVENTS))
    fi
    sql "SELECT count(outbox.enqueue(type, key, payload, topic => '$DBZ_TOPIC', msg_key => key))
           FROM (SELECT * FROM dbzshape_events ORDER BY i) e" >/dev/null
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t "$DBZ_TOPIC" -n "$want" -T 60000 -x >"$out" 2>/dev/null \
        || fail "$(wc -l <"$out") messages arrived of $want"
    load_consumed dbzshape_all "$out"
    sql "CREATE TABLE dbzshape_relay AS SELECT * FROM dbzshape_all WHERE headers LIKE '%outbox_source=%'"
    dbzshape_check_relay dbzshape_relay
    [ -z "$dbz" ] || dbzshape_compare dbzshape_all

    dbzshape_consumer "$DBZ_TOPIC" "$want"
    dbzshape_consumer "$DBZ_TOPIC" "$want"
    expect "messages the consumer applied" "$(sql "SELECT count(*) FROM dbzshape_applied")" "$want"
    expect "relay events the consumer applied as given" "$(sql "
        SELECT count(*) FROM dbzshape_applied a JOIN outbox.events o ON o.id::text = a.id AND o.topic = '$DBZ_TOPIC'
         WHERE a.key = o.msg_key AND a.type = o.biz_type AND a.value = o.payload")" "$DBZ_EVENTS"
    expect "claims on the relay's headers (first, again)" "$(sql "
        SELECT string_agg(outbox.claim('dbzshape', dbzshape_header(headers, 'id')::bigint, dbzshape_header(headers, 'type'),
                                       dbzshape_header(headers, 'biz_key'), dbzshape_header(headers, 'outbox_source'))::text, ',')
          FROM (SELECT headers FROM dbzshape_relay WHERE key = 'order-1' UNION ALL
                SELECT headers FROM dbzshape_relay WHERE key = 'order-1') x")" "true,false"

    dbzshape_restore
    log_since "$mark" | grep -q "takes a new Kafka identity" && fail "the restarts gave the relay a new Kafka identity"
    # Back to the default: the relay's own shape again.
    id=$(sql "SELECT outbox.enqueue('OrderPlaced', 'dbzshape-after', '{\"a\": 1}', topic => '$DBZ_TOPIC.after')")
    after=$("$TOOLS/outbox-consume" -b "$IT_BROKERS" -t "$DBZ_TOPIC.after" -n 1 -T 30000 2>/dev/null | cut -f5,6)
    expect "after RESET, the relay's own shape" "$after" \
        "event_id=$id,biz_type=OrderPlaced,biz_key=dbzshape-after,outbox_source=$(sql "SELECT $(source_of l) FROM outbox.event_log l WHERE id = $id")	{\"a\":1}"
    [ -z "$dbz" ] && skip_case "Debezium's side only: $DBZ_WHY"
    return 0
}
