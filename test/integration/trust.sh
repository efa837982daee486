# test/integration/trust.sh: what the exactly_once relay reads back from
# the progress topic is untrusted input, and a copy of the cluster is
# another sender (src/sender.c).  Real broker.

# forge KEY FILE: FILE's bytes written to the progress topic as one record
# under KEY, as any client with write access to the topic could.
forge() {
    kcat -P -b "$IT_BROKERS" -t outbox_progress -k "$1" "$2" 2>>"$IT_TMP/forge.log" \
        || fail "kcat could not write the forged record $(basename "$2")"
}

# restart_relay: a new relay process, whose producer's start reads the
# progress topic.
restart_relay() {
    local pid
    pid=$(relay_pid)
    sql "SELECT pg_terminate_backend(${pid:-0})" >/dev/null
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> ${pid:-0}" \
        || fail "no new relay after the old one was terminated"
}

# crashes_since MARK: how many server processes died of a signal since
# MARK (each such death restarts every backend of the server).
crashes_since() {
    log_since "$1" | grep -c "terminated by signal" || true
}

# Nothing an application, another database's tenant or a damaged record
# puts on the progress topic moves the cursor or marks an event sent.
# With the relay paused and 40 events pending, records under this relay's
# own key: a full forged record whose "to" is far past everything, a
# "sent" list of every pending id, one with a guessed proof, a truncated
# one, binary bytes, 900 kB of ids; after each, a new producer (a new
# relay process, then reloads), whose start reads the topic.  Before, the first two marked every pending event sent and
# the truncated one crashed the relay (the server restarted every
# backend).  enqueue_bytes refuses the progress topic itself.
t_eos_forged_progress() {
    local topic=it.eos.forged n=40 key oid place ids mark pid err f=$IT_TMP/forged
    eos_ready
    mark=$(log_mark)
    err=$(sql "SELECT outbox.enqueue_bytes('T', 'forge', 'x'::bytea, topic => 'outbox_progress')" 2>&1)
    [[ $err == *"is the relay's progress topic"* ]] || fail "enqueue_bytes accepted the progress topic: $err"
    sql "SELECT outbox.pause()" >/dev/null
    sql "SELECT count(outbox.enqueue('T', 'forged-' || i, jsonb_build_object('i', i), topic => '$topic', msg_key => 'k' || i % 5))
         FROM generate_series(1, $n) i" >/dev/null
    key=$(progress_key)
    oid=$(sql "SELECT oid FROM pg_database WHERE datname = current_database()")
    place=$(sql "SELECT done_snapshot || '/' || coalesce(window_snapshot::text, '-') || '/' || window_last_tx || '/' || window_last_id
                 FROM outbox.relay_cursor")
    ids=$(sql "SELECT string_agg(id::text, ' ') FROM outbox.event_log WHERE topic = '$topic'")
    mkdir -p "$f"
    printf 'outbox progress 1; database %s; from %s; to 2000000:2000000:/-/0/0' "$oid" "$place" >"$f/full"
    printf 'outbox progress 1; database %s; sent %s' "$oid" "$ids" >"$f/sent"
    printf 'outbox progress 1; database %s; proof %s; sent %s' "$oid" 00112233445566778899aabbccddeeff "$ids" >"$f/guessed"
    printf 'outbox progress 1; from x' >"$f/truncated"
    head -c 4096 /dev/urandom >"$f/binary"
    { printf 'outbox progress 1; database %s; sent ' "$oid"; seq 1 130000 | tr '\n' ' '; } >"$f/huge"
    local forged=0
    for r in full sent guessed truncated binary huge; do
        mark=$(log_mark)
        forge "$key" "$f/$r"
        forged=$((forged + 1))
        # A new producer (its start reads the progress topic): the first
        # time in a new relay process, then through a reload.
        if [ $forged -eq 1 ]; then restart_relay; else set_setting outbox.kafka_properties "client.id=forged-$forged"; fi
        wait_log "$mark" 30 "ignored $forged records? of progress topic" \
            || fail "$r: the relay did not say it ignored the forged record: $(log_since "$mark" | grep -i 'progress\|signal' | head -3)"
        expect "$r: events marked sent by the forged record" \
            "$(sql "SELECT count(*) FROM outbox.events WHERE topic = '$topic' AND status = 'sent'")" 0
        expect "$r: server processes that crashed" "$(crashes_since "$mark")" 0
    done
    [[ $(sql "SELECT last_error FROM outbox.relay_status()") == *"did not write"* ]] \
        || fail "relay_status() does not show the ignored record: $(sql "SELECT last_error FROM outbox.relay_status()")"
    set_setting outbox.kafka_properties ''
    sql "SELECT outbox.resume()" >/dev/null
    wait_until 60 "$(all_sent $topic $n)" || fail "the pending events were not all sent after the forged records"
    consume $topic $n 30000 3000 >"$IT_TMP/eos_forged.tsv"
    expect_exactly_once forged $topic "$IT_TMP/eos_forged.tsv"
    set_delivery at_least_once
}

# A copy of the cluster (pg_basebackup, started as a server of its own,
# not a standby) beside the original, both exactly_once on the same Kafka,
# both enqueueing to one topic, then each given a new producer in turn:
# the copy takes a new Kafka identity (it never fences the original) and
# keeps the source (the events both have keep their identity; the ones
# each enqueues differ by their incarnation), the original keeps
# delivering, and every event either marks sent is in
# Kafka.  Before, the copy fenced the original, and the original, once
# reloaded, took the copy's progress for its own and marked its own
# pending events sent.
t_eos_copy_beside() {
    local topic=it.eos.copy copy=$CLUSTER_DIR/copy_eos cport=5435 server_bin=$CLUSTER_INSTALL$PG_BINDIR
    local out=$IT_TMP/eos_copy.tsv mark
    copy_sql() { "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -p $cport -d "$IT_DB" -c "$1"; }
    eos_ready
    mark=$(log_mark)
    cluster_run "$server_bin/pg_basebackup" -h "$PGHOST" -p "$PGPORT" -U postgres -D "$copy" -X stream --checkpoint=fast \
        || { fail "pg_basebackup failed"; return; }
    echo "port = $cport" | cluster_run tee -a "$copy/postgresql.conf" >/dev/null
    cluster_run "$server_bin/pg_ctl" -D "$copy" -l "$IT_TMP/copy_eos.log" -w start >/dev/null \
        || { fail "the copy did not start"; return; }
    copy_round() {
        sql "SELECT count(outbox.enqueue('T', 'orig-$1-' || i, jsonb_build_object('who', 'orig-$1-' || i), topic => '$topic', msg_key => 'k' || i % 3))
             FROM generate_series(1, 30) i" >/dev/null
        copy_sql "SELECT count(outbox.enqueue('T', 'copy-$1-' || i, jsonb_build_object('who', 'copy-$1-' || i), topic => '$topic', msg_key => 'k' || i % 3))
                  FROM generate_series(1, 30) i" >/dev/null
    }
    # copy_delivery MODE: outbox.delivery of the copy set and reloaded.
    copy_delivery() {
        copy_sql "ALTER SYSTEM SET outbox.delivery = $1" >/dev/null
        copy_sql "SELECT pg_reload_conf()" >/dev/null
        sleep 1
    }
    copy_round 1
    copy_delivery at_least_once
    copy_delivery exactly_once
    copy_round 2
    set_delivery at_least_once
    set_delivery exactly_once
    copy_round 3
    wait_until 60 "SELECT count(*) = 90 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'" \
        || fail "the original stopped delivering: $(sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()"; sql "SELECT string_agg(status || ' ' || c, ', ') FROM (SELECT status, count(*) c FROM outbox.events WHERE topic = '$topic' GROUP BY 1) x"; sql "SELECT * FROM outbox.relay_cursor"; cp "$IT_TMP/copy_eos.log" /tmp/copy_eos.log)"
    local deadline=$((SECONDS + 60))
    until [ "$(copy_sql "SELECT count(*) = 90 FROM outbox.events WHERE topic = '$topic' AND status = 'sent'")" = t ]; do
        [ $SECONDS -lt $deadline ] || { fail "the copy did not deliver: $(copy_sql "SELECT state || ': ' || coalesce(last_error, '') FROM outbox.relay_status()")"; break; }
        sleep 0.2
    done
    [ "$(sql "SELECT sender FROM outbox.relay_cursor")" != "$(copy_sql "SELECT sender FROM outbox.relay_cursor")" ] \
        || fail "the copy sends under the original's identity"
    [ "$(sql "SELECT source FROM outbox.relay_cursor")" = "$(copy_sql "SELECT source FROM outbox.relay_cursor")" ] \
        || fail "the copy took a source of its own: the events both have would not keep their identity"
    consume $topic 180 30000 3000 >"$out"
    load_consumed got_copy "$out"
    expect "events of either server marked sent and not in Kafka" \
        "$(sql "SELECT count(*) FROM (SELECT 'orig-' || r || '-' || i AS who FROM generate_series(1, 3) r, generate_series(1, 30) i
                                      UNION ALL SELECT 'copy-' || r || '-' || i FROM generate_series(1, 3) r, generate_series(1, 30) i) w
                WHERE NOT EXISTS (SELECT FROM got_copy g WHERE g.value::jsonb ->> 'who' = w.who)")" 0
    expect "identities (outbox_source, event_id) shared by two different events" "$(sql "
        SELECT count(*) FROM (SELECT substring(headers from 'outbox_source=([^,]*)') AS source, event_id FROM got_copy
                               GROUP BY 1, 2 HAVING count(DISTINCT value::jsonb ->> 'who') > 1) d")" 0
    log_since "$mark" | grep -q "fenced" && fail "a relay was fenced: $(log_since "$mark" | grep fenced | head -2)"
    cluster_run "$server_bin/pg_ctl" -D "$copy" -m fast stop >/dev/null
    grep -q "takes a new Kafka identity" "$IT_TMP/copy_eos.log" \
        || fail "the copy did not say it took a new identity"
    set_delivery at_least_once
}
