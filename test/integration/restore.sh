# test/integration/restore.sh: what the relay sends after a database with
# the extension is dumped and restored, or upgraded from 0.1.0, with events
# in every state.  Each case makes databases of its own, points the relay
# at them (outbox.database) and puts it back on $IT_DB at the end.

# relay_serve DB: point the relay at DB and wait until it runs there.
# The launcher counts a relay that ran under 10 s as failing, whatever
# stopped it, and doubles its restart delay (up to a minute): let the
# current relay reach 10 s before switching.
relay_serve() {
    wait_until 15 "SELECT coalesce(bool_and(now() - backend_start > interval '10.5 s'), true)
                     FROM pg_stat_activity WHERE backend_type = 'outbox relay'" || true
    set_setting outbox.database "$1"
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity
                    WHERE backend_type = 'outbox relay' AND datname = '$1'" \
        || fail "no relay started for $1"
}

# events_in_every_state DB TOPIC: with the relay serving DB, events of
# TOPIC that are sent (s-1..s-5, by the relay), then, with the relay
# paused, one waiting for a retry (r-1) and one dead (d-1), recorded as
# the relay records them (the cursor past them, a row in event_state),
# and unsent ones (u-1..u-5).  Leaves the relay paused.
events_in_every_state() {
    local db=$1 topic=$2
    IT_DB=$db sql "SELECT count(outbox.enqueue('T', 's-' || i, '{}', topic => '$topic'))
                     FROM generate_series(1, 5) i" >/dev/null
    IT_DB=$db wait_until 30 "$(all_sent "$topic" 5)" || fail "$db: the first events were not sent"
    IT_DB=$db sql "SELECT outbox.pause()" >/dev/null
    IT_DB=$db wait_until 10 "SELECT state = 'paused' FROM outbox.relay_status()" || fail "$db: relay not paused"
    IT_DB=$db sql "SELECT outbox.enqueue('T', k, '{}', topic => '$topic') FROM unnest(ARRAY['r-1', 'd-1']) k" >/dev/null
    IT_DB=$db sql "UPDATE outbox.relay_cursor SET done_snapshot = pg_current_snapshot(),
                          window_snapshot = NULL, window_last_tx = '0', window_last_id = 0;
                   INSERT INTO outbox.event_state (id, status, attempts, next_attempt_at, last_error)
                   SELECT id, CASE biz_key WHEN 'r-1' THEN 'new' ELSE 'dead' END,
                          CASE biz_key WHEN 'r-1' THEN 1 ELSE 3 END, now(), 'refused in a test'
                     FROM outbox.event_log WHERE topic = '$topic' AND biz_key IN ('r-1', 'd-1')"
    IT_DB=$db sql "SELECT count(outbox.enqueue('T', 'u-' || i, '{}', topic => '$topic'))
                     FROM generate_series(1, 5) i" >/dev/null
    expect "$db: statuses before" "$(IT_DB=$db sql "SELECT string_agg(biz_key || '=' || status, ' ' ORDER BY id)
                                                     FROM outbox.events WHERE topic = '$topic'")" \
        "s-1=sent s-2=sent s-3=sent s-4=sent s-5=sent r-1=new d-1=dead u-1=new u-2=new u-3=new u-4=new u-5=new"
}

# deliveries_are DB TOPIC: once the relay serving DB has sent r-1 and the
# u-* events, what a consumer of TOPIC received, per event of DB, must be:
# each once, except d-1, never.
deliveries_are() {
    local db=$1 topic=$2 out=$IT_TMP/$2.tsv
    IT_DB=$db wait_until 30 "SELECT count(*) = 6 FROM outbox.events
                              WHERE topic = '$topic' AND status = 'sent' AND biz_key ~ '^[ru]-'" \
        || fail "$db: the relay did not send the unsent events"
    consume "$topic" 1000 30000 3000 >"$out"
    IT_DB=$db load_consumed got "$out"
    expect "$db: deliveries per event" "$(IT_DB=$db sql "
        SELECT string_agg(l.biz_key || '=' || (SELECT count(*) FROM got g WHERE g.event_id = l.id), ' ' ORDER BY l.id)
          FROM outbox.event_log l WHERE l.topic = '$topic'")" \
        "s-1=1 s-2=1 s-3=1 s-4=1 s-5=1 r-1=1 d-1=0 u-1=1 u-2=1 u-3=1 u-4=1 u-5=1"
    expect "$db: deliveries of other events" "$(IT_DB=$db sql "SELECT count(*) FROM got g
        WHERE NOT EXISTS (SELECT 1 FROM outbox.event_log l WHERE l.id = g.event_id)")" 0
}

# relay_home: the relay back on $IT_DB; then drop the databases named.
relay_home() {
    relay_serve "$IT_DB"
    local db
    for db in "$@"; do
        "$PGBIN/psql" -X -q -d "$IT_DB" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || fail "could not drop $db"
    done
}

# pg_dump of the relayed database restores in one transaction (psql -1,
# ON_ERROR_STOP); served by the relay, the copy is paused as the source
# was, and once resumed sends exactly the events the source had not sent.
t_dump_restore() {
    local topic=it.restore dump=$IT_TMP/restore.sql
    "$PGBIN/psql" -X -q -c "CREATE DATABASE outbox_src" -c "CREATE DATABASE outbox_copy"
    IT_DB=outbox_src sql "CREATE EXTENSION outbox"
    relay_serve outbox_src
    events_in_every_state outbox_src $topic
    "$PGBIN/pg_dump" -d outbox_src -f "$dump" || fail "pg_dump failed"
    if ! "$PGBIN/psql" -X -q -1 -v ON_ERROR_STOP=1 -d outbox_copy -f "$dump" >"$IT_TMP/restore.log" 2>&1; then
        fail "the dump did not restore in one transaction: $(grep -m1 ERROR "$IT_TMP/restore.log")"
        relay_home outbox_src outbox_copy
        return
    fi
    relay_serve outbox_copy
    IT_DB=outbox_copy wait_until 10 "SELECT state = 'paused' FROM outbox.relay_status()" \
        || fail "the copy's relay is not paused: $(IT_DB=outbox_copy sql "SELECT state FROM outbox.relay_status()")"
    IT_DB=outbox_copy sql "SELECT outbox.resume()" >/dev/null
    deliveries_are outbox_copy $topic
    restored_identities outbox_src outbox_copy $topic.after
    relay_home outbox_src outbox_copy
}

# restored_identities ORIGINAL COPY TOPIC: the restored COPY keeps the
# ORIGINAL's source (an event both have keeps its identity, and a
# claiming consumer refuses it sent again); an event each enqueues now
# is named apart (the restored sequence hands out the ids the original
# does, so only the outbox_source header can).
restored_identities() {
    local ids=()
    [ "$(IT_DB=$1 sql "SELECT source FROM outbox.relay_cursor")" = "$(IT_DB=$2 sql "SELECT source FROM outbox.relay_cursor")" ] \
        || fail "the restored database took a source of its own: its events sent again are applied again"
    for db in "$1" "$2"; do
        IT_DB=$db sql "SELECT outbox.enqueue('T', 'after-restore', '{}', topic => '$3')" >/dev/null
        ids+=("$(IT_DB=$db sql "SELECT $(source_of l) FROM outbox.event_log l WHERE biz_key = 'after-restore'")")
    done
    [ "${ids[0]}" != "${ids[1]}" ] || fail "new events of either database name one outbox_source: ${ids[0]}"
}

# The same dump restored into another cluster, whose transaction ids have
# nothing to do with the source's: the same events are sent, no others.
t_restore_other_cluster() {
    local topic=it.restore_other dump=$IT_TMP/restore_other.sql other=$CLUSTER_DIR/other port=5434
    local server_bin=$CLUSTER_INSTALL$PG_BINDIR
    "$PGBIN/psql" -X -q -c "CREATE DATABASE outbox_src"
    IT_DB=outbox_src sql "CREATE EXTENSION outbox"
    relay_serve outbox_src
    events_in_every_state outbox_src $topic
    "$PGBIN/pg_dump" -d outbox_src -f "$dump" || fail "pg_dump failed"
    relay_home outbox_src

    cluster_run "$server_bin/initdb" -D "$other" -U postgres --auth=trust --no-sync >/dev/null \
        || { fail "initdb of the other cluster failed"; return; }
    printf '%s\n' "listen_addresses = ''" "unix_socket_directories = '$CLUSTER_DIR'" "port = $port" \
        "shared_preload_libraries = 'outbox'" "outbox.database = 'outbox_copy'" \
        "outbox.kafka_brokers = '$IT_BROKERS'" "outbox.poll_interval = 200" \
        | cluster_run tee -a "$other/postgresql.conf" >/dev/null
    cluster_run "$server_bin/pg_ctl" -D "$other" -l "$IT_TMP/other.log" -w start >/dev/null \
        || { fail "the other cluster did not start"; return; }
    (
        export PGPORT=$port
        "$PGBIN/psql" -X -q -d postgres -c "CREATE DATABASE outbox_copy"
        "$PGBIN/psql" -X -q -1 -v ON_ERROR_STOP=1 -d outbox_copy -f "$dump" >"$IT_TMP/restore_other.log" 2>&1 \
            || fail "the dump did not restore in one transaction: $(grep -m1 ERROR "$IT_TMP/restore_other.log")"
        IT_DB=outbox_copy wait_until 20 "SELECT state = 'paused' FROM outbox.relay_status()" \
            || fail "the other cluster's relay is not paused"
        IT_DB=outbox_copy sql "SELECT outbox.resume()" >/dev/null
        deliveries_are outbox_copy $topic
        exit "$IT_CASE_FAILED"
    ) || IT_CASE_FAILED=1
    cluster_run "$server_bin/pg_ctl" -D "$other" -m fast stop >/dev/null
    rm -rf "$other"
}

# old_events_in_every_state DB TOPIC: in DB, at the old version, events in
# every state the old schema knows, made by SQL (a relay of this library
# does not serve an old version): s-* relayed (by the cursor), r-1
# retrying, d-1 dead, w-1..w-4 in an open window relayed up to w-2 (0.2.0's
# "every id <= window_last_id"), u-* unsent.
old_events_in_every_state() {
    local db=$1 topic=$2
    IT_DB=$db sql "SELECT count(outbox.enqueue('T', 's-' || i, '{}', topic => '$topic')) FROM generate_series(1, 5) i" >/dev/null
    IT_DB=$db sql "UPDATE outbox.relay_cursor SET done_snapshot = pg_current_snapshot(),
                          window_snapshot = NULL, window_last_id = 0, window_max_id = 0"
    IT_DB=$db sql "SELECT outbox.enqueue('T', k, '{}', topic => '$topic') FROM unnest(ARRAY['r-1', 'd-1']) k" >/dev/null
    IT_DB=$db sql "INSERT INTO outbox.event_state (id, status, attempts, next_attempt_at, last_error)
                   SELECT id, CASE biz_key WHEN 'r-1' THEN 'new' ELSE 'dead' END,
                          CASE biz_key WHEN 'r-1' THEN 1 ELSE 3 END, now(), 'refused in a test'
                     FROM outbox.event_log WHERE topic = '$topic' AND biz_key IN ('r-1', 'd-1')"
    IT_DB=$db sql "SELECT count(outbox.enqueue('T', 'w-' || i, '{}', topic => '$topic')) FROM generate_series(1, 4) i" >/dev/null
    IT_DB=$db sql "UPDATE outbox.relay_cursor SET window_snapshot = pg_current_snapshot(),
                          window_last_id = (SELECT id FROM outbox.event_log WHERE biz_key = 'w-2'),
                          window_max_id = (SELECT id FROM outbox.event_log WHERE biz_key = 'w-4')"
    IT_DB=$db sql "SELECT count(outbox.enqueue('T', 'u-' || i, '{}', topic => '$topic')) FROM generate_series(1, 5) i" >/dev/null
    expect "$db: statuses before" "$(IT_DB=$db sql "SELECT string_agg(biz_key || '=' || status, ' ' ORDER BY id)
                                                     FROM outbox.events WHERE topic = '$topic'")" \
        "s-1=sent s-2=sent s-3=sent s-4=sent s-5=sent r-1=new d-1=dead w-1=sent w-2=sent w-3=sending w-4=sending u-1=new u-2=new u-3=new u-4=new u-5=new"
}

# An extension at 0.1.0 or 0.2.0 holding live events, served by this
# library's relay: the relay sends nothing and says once why; ALTER
# EXTENSION UPDATE keeps every state, including the open window's progress,
# and outbox.stats reads the same; the relay then sends exactly what was
# unsent: each once, none of what the old cursor called relayed, the dead
# one never.
t_upgrade_live() {
    local from
    for from in 0.1.0 0.2.0; do
        upgrade_live_from $from
    done
}

# upgrade_live_from VERSION: t_upgrade_live from VERSION, in its own
# database and topic.
upgrade_live_from() {
    local from=$1 db=outbox_up_${1//./} topic=it.upgrade.${1//./} out id mark current figures
    out=$IT_TMP/$db.tsv
    current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" outbox.control)
    # u-1..u-5, w-3 and w-4 unsent, r-1 waiting for its retry, d-1 dead.
    figures="SELECT concat_ws(' ', backlog, dead, retrying) FROM outbox.stats"
    "$PGBIN/psql" -X -q -c "CREATE DATABASE $db"
    IT_DB=$db sql "CREATE EXTENSION outbox VERSION '$from'"
    mark=$(log_mark)
    relay_serve $db
    old_events_in_every_state $db $topic
    wait_log "$mark" 20 "outbox relay: the extension here is version $from, the server's library is $current" \
        || fail "$from: the relay did not say it waits for the update"
    holds 3 "SELECT last_error LIKE '%ALTER EXTENSION outbox UPDATE%' FROM outbox.relay_status()" \
        || fail "$from: relay_status does not say the relay waits for the update"
    expect "$from: backlog, dead, retrying before" "$(IT_DB=$db sql "$figures")" "8 1 1"
    # Claims made before the update are still recognised after it.
    expect "$from: claims before the update" "$(IT_DB=$db sql "SELECT string_agg(outbox.claim('it-upgrade-old', id)::text, ' ' ORDER BY id)
                                                   FROM outbox.event_log WHERE topic = '$topic' AND biz_key IN ('s-1', 'd-1')")" "true true"
    IT_DB=$db sql "ALTER EXTENSION outbox UPDATE" || { fail "$from: ALTER EXTENSION outbox UPDATE failed"; relay_home $db; return; }
    expect "$from: version" "$(IT_DB=$db sql "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")" "$current"
    expect "$from: statuses after the update" "$(IT_DB=$db sql "SELECT string_agg(biz_key || '=' || status, ' ' ORDER BY id)
                                                     FROM outbox.events WHERE topic = '$topic' AND biz_key ~ '^[srd]-|^w-[12]$'")" \
        "s-1=sent s-2=sent s-3=sent s-4=sent s-5=sent r-1=new d-1=dead w-1=sent w-2=sent"
    IT_DB=$db wait_until 30 "SELECT count(*) = 15 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "$from: the relay did not send the unsent events after the update"
    consume $topic 1000 30000 3000 >"$out"
    IT_DB=$db load_consumed got "$out"
    expect "$from: deliveries per event" "$(IT_DB=$db sql "
        SELECT string_agg(l.biz_key || '=' || (SELECT count(*) FROM got g WHERE g.event_id = l.id), ' ' ORDER BY l.id)
          FROM outbox.event_log l WHERE l.topic = '$topic'")" \
        "s-1=0 s-2=0 s-3=0 s-4=0 s-5=0 r-1=1 d-1=0 w-1=0 w-2=0 w-3=1 w-4=1 u-1=1 u-2=1 u-3=1 u-4=1 u-5=1"
    id=$(IT_DB=$db sql "SELECT outbox.enqueue('T', 'after-update', '{}', topic => '$topic')")
    consume $topic 9 20000 >"$out" || fail "$from: the event enqueued after the update did not arrive"
    grep -q "event_id=$id," "$out" || fail "$from: event $id, enqueued after the update, not received"
    expect "$from: claims of before, claimed again after the update" "$(IT_DB=$db sql "SELECT string_agg(outbox.claim('it-upgrade-old', id)::text, ' ' ORDER BY id)
                                                   FROM outbox.event_log WHERE topic = '$topic' AND biz_key IN ('s-1', 'd-1', 's-2')")" "false true false"
    expect "$from: first claim after the update" "$(IT_DB=$db sql "SELECT outbox.claim('it-upgrade', $id)")" t
    expect "$from: second claim after the update" "$(IT_DB=$db sql "SELECT outbox.claim('it-upgrade', $id)")" f
    relay_home $db
}
