# test/integration/multi_database.sh: one relay per database that has the
# extension (outbox.database unset), against the real broker and a second
# real one.  Every case puts outbox.database back on $IT_DB and drops the
# databases it made.

MD_DBS="outbox_md_a outbox_md_b outbox_md_c"
MD_NONE=outbox_md_none

# sql_in DB SQL: sql in another database.
sql_in() {
    "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$1" -c "$2"
}

# relays_in DB: SQL counting the relays connected to DB.
relays_in() {
    echo "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = '$1')"
}

# md_setup: three databases with the extension, one without, every
# database relayed.
md_setup() {
    local db
    for db in $MD_DBS $MD_NONE; do
        "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    done
    for db in $MD_DBS; do sql_in $db "CREATE EXTENSION outbox"; done
    set_setting outbox.database ''
}

# md_teardown: back to one relayed database.
md_teardown() {
    local db
    set_setting outbox.database "$IT_DB"
    for db in $MD_DBS $MD_NONE; do
        timeout 60 "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE IF EXISTS $db" \
            || fail "DROP DATABASE $db with its relay failed"
    done
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "relays left after the databases were dropped: $(sql "SELECT string_agg(datname, ',') FROM pg_stat_activity WHERE backend_type = 'outbox relay'")"
}

# md_deliver DB TOPIC KEY [BROKERS]: enqueue one event in DB and fail
# unless it arrives in TOPIC (of BROKERS) with its payload.
md_deliver() {
    local id out=$IT_TMP/md_$1_$3.tsv
    id=$(sql_in "$1" "SELECT outbox.enqueue('md', '$3', '{\"db\": \"$1\"}', topic => '$2')")
    "$TOOLS/outbox-consume" -b "${4:-$IT_BROKERS}" -t "$2" -n 1 -T 20000 >"$out" 2>/dev/null
    grep -q "event_id=$id[^0-9]" "$out" && grep -q "\"db\": \"$1\"\|\"db\":\"$1\"" "$out" \
        || fail "event $id of $1 did not arrive in $2 (got: $(cut -f5,6 "$out" | head -3))"
}

# Three databases with the extension get a relay each, the one without
# none; each database's events reach its own topic; relay_status() lists
# every relay in every database but shows another database's last error
# only to pg_read_all_stats; DROP EXTENSION stops one relay and leaves the
# others flowing; CREATE EXTENSION starts one within seconds.
t_multi_database() {
    local db started took
    md_setup
    for db in $MD_DBS $IT_DB; do
        wait_until 30 "SELECT $(relays_in $db) = 1" || fail "no relay for $db (got $(sql "SELECT $(relays_in $db)"))"
    done
    holds 2 "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'outbox relay'
               AND datname IN ('$MD_NONE', 'postgres', 'template1')" \
        || fail "a relay runs where the extension is not"
    expect "relay_status() rows seen from outbox_md_a" \
        "$(sql_in outbox_md_a "SELECT string_agg(database::text, ',' ORDER BY database) FROM outbox.relay_status()")" \
        "outbox_it,outbox_md_a,outbox_md_b,outbox_md_c"

    for db in $MD_DBS; do md_deliver $db "it.md.$db" first; done
    # Each topic holds its own database's event only.
    expect "messages in it.md.outbox_md_b" \
        "$("$TOOLS/outbox-consume" -b "$IT_BROKERS" -t it.md.outbox_md_b -n 100 -T 3000 -i 2000 2>/dev/null | wc -l)" 1

    # Another database's last error (a message larger than the producer's
    # message.max.bytes, enqueued past outbox.max_payload_size by a
    # superuser): hidden from a plain role, not from pg_read_all_stats.
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_md_owner; CREATE ROLE it_md_owner LOGIN"
    sql_in outbox_md_a "GRANT USAGE ON SCHEMA outbox TO it_md_owner; GRANT EXECUTE ON FUNCTION outbox.relay_status() TO it_md_owner"
    sql_in outbox_md_c "SET outbox.max_payload_size = '2MB'; SELECT outbox.enqueue('md', 'too-large', jsonb_build_object('x', repeat('x', 1000500)), topic => 'it.md.large')" >/dev/null
    wait_until 30 "SELECT count(*) = 1 FROM outbox.relay_status() WHERE database = 'outbox_md_c' AND last_error IS NOT NULL" \
        || fail "outbox_md_c's relay published no last error"
    expect "another database's last error, seen by a plain role" \
        "$("$PGBIN/psql" -X -q -At -U it_md_owner -d outbox_md_a -c "SELECT count(*) FROM outbox.relay_status() WHERE last_error IS NOT NULL AND database = 'outbox_md_c'")" 0
    sql "GRANT pg_read_all_stats TO it_md_owner"
    expect "another database's last error, seen with pg_read_all_stats" \
        "$("$PGBIN/psql" -X -q -At -U it_md_owner -d outbox_md_a -c "SELECT count(*) FROM outbox.relay_status() WHERE last_error IS NOT NULL AND database = 'outbox_md_c'")" 1
    expect "outbox.stats counts this database's relay only" \
        "$(sql_in outbox_md_a "SELECT sent_last_minute FROM outbox.stats")" 1
    sql_in outbox_md_a "REVOKE ALL ON SCHEMA outbox FROM it_md_owner; REVOKE ALL ON FUNCTION outbox.relay_status() FROM it_md_owner"
    sql "DROP ROLE it_md_owner"

    # DROP EXTENSION: that relay leaves, nothing waits, the others flow.
    timeout 20 "$PGBIN/psql" -X -q -d outbox_md_b -c "DROP EXTENSION outbox" || fail "DROP EXTENSION did not return within 20 s"
    wait_until 20 "SELECT $(relays_in outbox_md_b) = 0" || fail "the relay of outbox_md_b stayed after DROP EXTENSION"
    md_deliver outbox_md_a it.md.outbox_md_a.2 second
    md_deliver outbox_md_c it.md.outbox_md_c.2 second
    holds 6 "SELECT $(relays_in outbox_md_b) = 0" || fail "a relay came back to outbox_md_b without the extension"

    # CREATE EXTENSION: a relay within seconds, where there was none.
    for db in outbox_md_b $MD_NONE; do
        started=${EPOCHREALTIME/./}
        sql_in $db "CREATE EXTENSION outbox"
        wait_until 10 "SELECT $(relays_in $db) = 1" || fail "no relay within 10 s of CREATE EXTENSION in $db"
        took=$(((${EPOCHREALTIME/./} - started) / 1000))
        echo "#   relay of $db started $took ms after CREATE EXTENSION"
        md_deliver $db "it.md.$db.3" third
    done
    md_teardown
}

# A database's own brokers (ALTER DATABASE ... SET by a superuser, then a
# reload): its relay restarts and sends there, the others stay on the
# cluster's.  A database owner who is not a superuser cannot point the
# relay elsewhere, and outbox.kafka_properties (secrets) cannot be set per
# database at all: every role can read pg_db_role_setting.
t_database_brokers() {
    local second pid err
    kcluster_setup "$CLUSTER_DIR/kafka_second" 1 && kcluster_start || { fail "the second broker did not start"; return; }
    second=$KCLUSTER_BROKERS
    md_setup
    wait_until 30 "SELECT $(relays_in outbox_md_c) = 1" || fail "no relay for outbox_md_c"
    pid=$(sql "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = 'outbox_md_c'")
    sql "ALTER DATABASE outbox_md_c SET outbox.kafka_brokers = '$second'"
    sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 20 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'
                     AND datname = 'outbox_md_c' AND pid <> $pid" \
        || fail "the relay of outbox_md_c did not restart after ALTER DATABASE ... SET and a reload"
    md_deliver outbox_md_c it.md.brokers second "$second"
    expect "outbox_md_c's event on the cluster's broker" \
        "$("$TOOLS/outbox-consume" -b "$IT_BROKERS" -t it.md.brokers -n 100 -T 3000 -i 2000 2>/dev/null | wc -l)" 0
    md_deliver outbox_md_a it.md.brokers_a first
    expect "outbox_md_a's event on the second broker" \
        "$("$TOOLS/outbox-consume" -b "$second" -t it.md.brokers_a -n 100 -T 3000 -i 2000 2>/dev/null | wc -l)" 0

    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_md_dbowner; CREATE ROLE it_md_dbowner LOGIN;
         ALTER DATABASE outbox_md_a OWNER TO it_md_dbowner"
    err=$("$PGBIN/psql" -X -q -U it_md_dbowner -d outbox_md_a -v VERBOSITY=verbose \
        -c "ALTER DATABASE outbox_md_a SET outbox.kafka_brokers = '127.0.0.1:1'" 2>&1) \
        && fail "a database owner set the relay's brokers"
    [[ "$err" == *"ERROR:  42501:"* ]] || fail "the owner's ALTER DATABASE SET outbox.kafka_brokers: $err"
    err=$("$PGBIN/psql" -X -q -d outbox_md_a -v VERBOSITY=verbose \
        -c "ALTER DATABASE outbox_md_a SET outbox.kafka_properties = 'sasl.password=secret'" 2>&1) \
        && fail "outbox.kafka_properties was set per database"
    [[ "$err" == *"ERROR:  55P02:"* ]] || fail "ALTER DATABASE SET outbox.kafka_properties: $err"
    [[ "$err" != *secret* ]] || fail "the refusal quotes the value: $err"
    sql "ALTER DATABASE outbox_md_a OWNER TO postgres; DROP ROLE it_md_dbowner"
    md_teardown
    kcluster_stop
}

# outbox.max_relays and max_worker_processes, when reached, are said in
# the log, and the relays that fit run; a dropped extension frees a slot
# for a database that waited.  So is an outbox.database that names no
# database.
t_relay_limits() {
    local marker db
    marker=$(log_mark)
    set_setting outbox.database outbox_md_no_such
    wait_log "$marker" 20 'database "outbox_md_no_such" does not exist or takes no connections' \
        || fail "no log line for an outbox.database that does not exist"
    md_setup
    sql "ALTER SYSTEM SET outbox.max_relays = 2"
    marker=$(log_mark)
    cluster_ctl -m fast restart >/dev/null || fail "the server did not restart"
    # The first line may name max_worker_processes instead: the launcher's
    # probes of the other databases hold slots for a moment after a start.
    wait_log "$marker" 30 'database "[a-z_]+" is waiting for a relay slot' \
        || fail "no log line for outbox.max_relays reached"
    wait_log "$marker" 30 'outbox.max_relays \(2\) relays run' \
        || fail "no log line names outbox.max_relays: $(log_since "$marker" | grep -A1 'waiting for a relay slot' | head -4)"
    wait_until 20 "SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "not 2 relays with outbox.max_relays = 2"
    holds 3 "SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "more than outbox.max_relays relays"
    # Dropping the extension where a relay runs lets a waiting database in.
    db=$(sql "SELECT datname FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname <> '$IT_DB' LIMIT 1")
    sql_in "$db" "DROP EXTENSION outbox"
    wait_until 30 "SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname <> '$db'" \
        || fail "no waiting database got the slot $db left"

    sql "ALTER SYSTEM SET outbox.max_relays = 8" && sql "ALTER SYSTEM SET max_worker_processes = 3"
    marker=$(log_mark)
    cluster_ctl -m fast restart >/dev/null || fail "the server did not restart"
    wait_log "$marker" 30 'No background worker slot is free \(max_worker_processes = 3\)' \
        || fail "no log line for max_worker_processes reached"
    sql "ALTER SYSTEM RESET outbox.max_relays" && sql "ALTER SYSTEM RESET max_worker_processes"
    cluster_ctl -m fast restart >/dev/null || fail "the server did not restart"
    md_teardown
}

# md_exclusive STATEMENT DB: STATEMENT, which needs a relayed database to
# itself, succeeds; then DB has its relay again, which delivers.
md_exclusive() {
    timeout 20 "$PGBIN/psql" -X -q -d postgres -c "$1" || fail "$1: failed"
    wait_until 20 "SELECT $(relays_in "$2") = 1" || fail "$1: no relay in $2 after it"
    md_deliver "$2" "it.md.exclusive.$2" "after-${1%% *}-$RANDOM"
}

# Statements that need a database to themselves do not fail on its relay:
# ALTER DATABASE ... RENAME (the relay comes back under the new name),
# SET TABLESPACE, and CREATE DATABASE ... TEMPLATE of a relayed database.
t_database_exclusive_statements() {
    local ts=$IT_TMP/tablespace
    md_setup
    for db in $MD_DBS; do
        wait_until 30 "SELECT $(relays_in $db) = 1" || fail "no relay for $db"
    done
    md_exclusive "ALTER DATABASE outbox_md_a RENAME TO outbox_md_renamed" outbox_md_renamed
    timeout 20 "$PGBIN/psql" -X -q -d postgres -c "ALTER DATABASE outbox_md_renamed RENAME TO outbox_md_a" \
        || fail "renaming it back failed"
    mkdir -p "$ts" && chown "$CLUSTER_OS_USER" "$ts"
    sql "CREATE TABLESPACE it_md_ts LOCATION '$ts'"
    md_exclusive "ALTER DATABASE outbox_md_b SET TABLESPACE it_md_ts" outbox_md_b
    timeout 20 "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE outbox_md_copy TEMPLATE outbox_md_c" \
        || fail "CREATE DATABASE ... TEMPLATE of a relayed database failed"
    timeout 60 "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE outbox_md_copy" || fail "dropping the copy failed"
    md_teardown
    sql "DROP TABLESPACE it_md_ts"
}

# relay_starts MARK: how many relay processes the postmaster started since
# MARK (its DEBUG1 line; log_min_messages must be debug1 meanwhile).
relay_starts() {
    log_since "$1" | grep -c 'starting background worker process "outbox relay"'
}

# md_loop SECONDS ROLE DB STATEMENT...: run the statements again and again
# for SECONDS, as ROLE in DB, one session, errors ignored; say how many
# ran and how many relays started meanwhile (log_min_messages must be
# debug1) in NOOP_STARTS.
md_loop() {
    local seconds=$1 role=$2 db=$3 marker t0 ran
    shift 3
    marker=$(log_mark)
    t0=${EPOCHREALTIME/./}
    ran=$(for i in $(seq 1 100000); do printf '%s;\n' "$@"; done \
        | timeout "$seconds" "$PGBIN/psql" -X -q -U "$role" -d "$db" -v VERBOSITY=terse 2>&1 | wc -l)
    t0=$(((${EPOCHREALTIME/./} - t0) / 1000))
    sleep 1
    NOOP_STARTS=$(relay_starts "$marker")
    echo "#   $role, $seconds s of: $*: $ran messages in $t0 ms, $NOOP_STARTS relay starts"
    return 0
}

# Statements that change nothing the launcher must know wake nothing: a
# role with CONNECT only, looping CREATE EXTENSION IF NOT EXISTS outbox
# (which succeeds where it exists) or DROP EXTENSION IF EXISTS of an
# extension that is not there; a database's owner without CREATEDB
# looping statements on its database that are refused or do nothing
# (RENAME, SET TABLESPACE to its own, CREATE DATABASE ... TEMPLATE), then
# with CREATEDB, to names that exist.  No relay starts meanwhile, and the
# relays keep their processes.
t_noop_wakes() {
    local pids starts=0
    md_setup
    for db in $MD_DBS; do
        wait_until 30 "SELECT $(relays_in $db) = 1" || fail "no relay for $db"
    done
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_nobody; CREATE ROLE it_nobody LOGIN;
         DROP ROLE IF EXISTS it_md_owner; CREATE ROLE it_md_owner LOGIN;
         ALTER DATABASE outbox_md_a OWNER TO it_md_owner"
    pids=$(sql "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'outbox relay'")
    set_setting log_min_messages debug1
    md_loop 3 it_nobody outbox_md_b "CREATE EXTENSION IF NOT EXISTS outbox"
    starts=$((starts + NOOP_STARTS))
    md_loop 2 it_nobody outbox_md_b "DROP EXTENSION IF EXISTS outbox_no_such"
    starts=$((starts + NOOP_STARTS))
    md_loop 2 it_md_owner postgres "ALTER DATABASE outbox_md_a RENAME TO outbox_md_z" \
        "ALTER DATABASE outbox_md_a SET TABLESPACE pg_default" "CREATE DATABASE outbox_md_z TEMPLATE outbox_md_a"
    starts=$((starts + NOOP_STARTS))
    sql "ALTER ROLE it_md_owner CREATEDB"
    md_loop 2 it_md_owner postgres "ALTER DATABASE outbox_md_a RENAME TO outbox_md_b" \
        "CREATE DATABASE outbox_md_b TEMPLATE outbox_md_a"
    starts=$((starts + NOOP_STARTS))
    sql "ALTER SYSTEM RESET log_min_messages" && sql "SELECT pg_reload_conf()" >/dev/null
    expect "relay starts during no-op statements" "$starts" 0
    expect "relay processes after no-op statements" \
        "$(sql "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'outbox relay'")" "$pids"
    md_deliver outbox_md_a it.md.noop after
    sql "ALTER DATABASE outbox_md_a OWNER TO postgres; DROP ROLE it_nobody; DROP ROLE it_md_owner"
    md_teardown
}

# os_teardown: drop the owner_slots databases and roles.
os_teardown() {
    local db
    for db in $(sql "SELECT datname FROM pg_database WHERE datname LIKE 'outbox_os_%'"); do
        timeout 60 "$PGBIN/psql" -X -q -d postgres -c "DROP DATABASE $db WITH (FORCE)" || fail "DROP DATABASE $db failed"
    done
    sql "DROP ROLE IF EXISTS it_tenant; DROP ROLE IF EXISTS it_other"
    set_setting outbox.database "$IT_DB"
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "relays left after the databases were dropped"
}

# A tenant with CREATEDB copies its outbox database until the relays run
# out (max_worker_processes: 8, so about 6 relays).  Another owner's new
# outbox database still gets a relay within seconds and delivers; the
# copies left without one are named in the log and shown waiting in
# relay_status() (of any database) and in their outbox.stats.
t_owner_slots() {
    local marker n=0 last=-1 count started took waiting
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_tenant; CREATE ROLE it_tenant LOGIN CREATEDB;
         DROP ROLE IF EXISTS it_other; CREATE ROLE it_other LOGIN"
    "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE outbox_os_t0 OWNER it_tenant"
    sql_in outbox_os_t0 "CREATE EXTENSION outbox"
    set_setting outbox.database ''
    marker=$(log_mark)
    # Copies until the relay count stops growing, then two more.
    while [ $n -lt 12 ]; do
        n=$((n + 1))
        timeout 30 "$PGBIN/psql" -X -q -U it_tenant -d postgres -c "CREATE DATABASE outbox_os_t$n TEMPLATE outbox_os_t0" \
            || fail "copy $n failed"
        sleep 1.5
        count=$(sql "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'")
        [ "$count" = "$last" ] && [ $n -ge 8 ] && break
        last=$count
    done
    echo "#   $n copies, $count relays"
    "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE outbox_os_other OWNER it_other"
    started=${EPOCHREALTIME/./}
    sql_in outbox_os_other "CREATE EXTENSION outbox"
    if wait_until 30 "SELECT $(relays_in outbox_os_other) = 1"; then
        took=$(((${EPOCHREALTIME/./} - started) / 1000))
        echo "#   relay of outbox_os_other started $took ms after CREATE EXTENSION"
        md_deliver outbox_os_other it.os.other first
    else
        fail "no relay for another owner's database once a tenant's copies took the slots"
    fi
    wait_log "$marker" 10 'database "outbox_os_t[0-9]+" is waiting for a relay slot' \
        || fail "the log names no copy left without a relay"
    waiting=$(sql "SELECT string_agg(database::text, ',' ORDER BY database) FROM outbox.relay_status()
                    WHERE state = 'waiting for a relay slot' AND pid IS NULL")
    [ -n "$waiting" ] || fail "relay_status() shows no database waiting for a relay slot"
    echo "#   waiting: $waiting"
    expect "outbox.stats.relay_state of ${waiting%%,*}" \
        "$(sql_in "${waiting%%,*}" "SELECT relay_state FROM outbox.stats")" "waiting for a relay slot"
    expect "outbox.stats.relay_state of outbox_os_other" "$(sql_in outbox_os_other "SELECT relay_state FROM outbox.stats")" idle
    os_teardown
}

# A database's owner (CREATEDB) renames it in a transaction left open:
# the database stays locked, and no relay waits on that lock holding a
# slot meanwhile; relay_status() says it waits for the lock.  Once the
# transaction ends the relay comes back and delivers.
t_rename_lock() {
    local oid renamer started took
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS it_tenant; CREATE ROLE it_tenant LOGIN CREATEDB"
    "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE outbox_os_r OWNER it_tenant"
    sql_in outbox_os_r "CREATE EXTENSION outbox"
    set_setting outbox.database ''
    wait_until 30 "SELECT $(relays_in outbox_os_r) = 1" || fail "no relay for outbox_os_r"
    oid=$(sql "SELECT oid FROM pg_database WHERE datname = 'outbox_os_r'")
    PGAPPNAME=it_renamer "$PGBIN/psql" -X -q -U it_tenant -d postgres -c "BEGIN" \
        -c "ALTER DATABASE outbox_os_r RENAME TO outbox_os_r2" -c "SELECT pg_sleep(8)" -c "ROLLBACK" >/dev/null 2>&1 &
    renamer=$!
    wait_until 10 "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'it_renamer' AND query LIKE '%pg_sleep%'" \
        || fail "the renaming transaction did not start"
    holds 5 "SELECT count(*) = 0 FROM pg_locks WHERE locktype = 'object' AND classid = 'pg_database'::regclass
               AND objid = $oid AND NOT granted" \
        || fail "a relay waits for the lock of the database being renamed: $(sql "SELECT count(*) FROM pg_locks WHERE NOT granted")"
    expect "relay_status() of the locked database" \
        "$(sql "SELECT state FROM outbox.relay_status() WHERE database = 'outbox_os_r'")" "waiting for lock"
    wait "$renamer"
    started=${EPOCHREALTIME/./}
    wait_until 70 "SELECT $(relays_in outbox_os_r) = 1" || fail "no relay for outbox_os_r after the rename rolled back"
    took=$(((${EPOCHREALTIME/./} - started) / 1000))
    echo "#   relay of outbox_os_r back $took ms after the transaction ended"
    md_deliver outbox_os_r it.os.rename after
    os_teardown
}

# Two databases on one topic, each with events 1 to 20 and the same
# business keys (shards of one service, or a tenant sending another's
# future keys first): a consumer that claims as the README says, with
# each message's outbox_source header, applies all 40 once, and none again
# on redelivery.  Claimed without the source, 20 of them were refused as
# duplicates of the other database's events.
t_two_sources() {
    local topic=it.sources out=$IT_TMP/sources.tsv db
    md_setup
    for db in outbox_md_a outbox_md_b; do
        wait_until 30 "SELECT $(relays_in $db) = 1" || fail "no relay for $db"
        sql_in $db "SELECT count(outbox.enqueue('Order', 'o-' || i, jsonb_build_object('db', '$db', 'i', i), topic => '$topic'))
                    FROM generate_series(1, 20) i" >/dev/null
    done
    "$TOOLS/outbox-consume" -b "$IT_BROKERS" -t $topic -n 40 -T 30000 >"$out" 2>/dev/null
    load_consumed got_sources "$out"
    expect "messages" "$(sql "SELECT count(*) FROM got_sources")" 40
    expect "sources named" "$(sql "SELECT count(DISTINCT substring(headers from 'outbox_source=([0-9a-f-]{36})')) FROM got_sources")" 2
    expect "event ids shared by the two databases" "$(sql "SELECT count(DISTINCT event_id) FROM got_sources")" 20
    sources_claimed() {
        sql "SELECT count(*) FILTER (WHERE outbox.claim('it-sources', event_id,
                            substring(headers from 'biz_type=([^,]*)'), substring(headers from 'biz_key=([^,]*)'),
                            substring(headers from 'outbox_source=([^,]*)')))
               FROM (SELECT * FROM got_sources ORDER BY part, off) g"
    }
    expect "events applied" "$(sources_claimed)" 40
    expect "events applied again on redelivery" "$(sources_claimed)" 0
    # What a claim without the source makes of the same messages.
    expect "events applied when claimed without their source" \
        "$(sql "SELECT count(*) FILTER (WHERE outbox.claim('it-sources-legacy', event_id,
                    substring(headers from 'biz_type=([^,]*)'), substring(headers from 'biz_key=([^,]*)')))
                  FROM (SELECT * FROM got_sources ORDER BY part, off) g")" 20
    sql "DELETE FROM outbox.consumer_dedup WHERE consumer IN ('it-sources', 'it-sources-legacy'); DROP TABLE got_sources"
    md_teardown
}
