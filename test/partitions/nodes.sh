# test/partitions/nodes.sh: the partition suite's PostgreSQL pair and
# clients, each in its network namespace (test/partitions/net.sh).
#
# Two nodes, pg1 and pg2, each with its data directory and port; PRIMARY
# and STANDBY name which is which (a failover swaps them).  Clients reach
# them only over TCP at their namespace addresses: a Unix socket crosses
# namespaces, so it would pass under any partition.  The harness's own
# queries (sql, from test/integration/lib.sh) do use the socket: the
# harness watches, it is never partitioned.

declare -A PG_DATA PG_PORT

# pg_ctl_on NODE ARGS...: pg_ctl on NODE's data, in NODE's namespace, as
# the cluster's OS user.
pg_ctl_on() {
    local node=$1
    shift
    net_exec "$node" runuser -u "$CLUSTER_OS_USER" -- "$CLUSTER_INSTALL$PG_BINDIR/pg_ctl" \
        -D "${PG_DATA[$node]}" -l "$CLUSTER_DIR/$node.log" "$@"
}

# pg_stop NODE: stop NODE at once if it runs.
pg_stop() {
    [ -n "${PG_DATA[$1]:-}" ] && [ -f "${PG_DATA[$1]}/postmaster.pid" ] || return 0
    pg_ctl_on "$1" -m immediate stop >/dev/null 2>&1
}

# pg_on NODE SQL: run SQL in the shop database on NODE (by its socket).
pg_on() {
    "$PGBIN/psql" -X -q -At -p "${PG_PORT[$1]}" -d shop -c "$2"
}

# pg_use_primary NODE: point the harness's queries at NODE.
pg_use_primary() {
    PRIMARY=$1
    export PGPORT=${PG_PORT[$1]}
}

# pg_conf_network: listen on the namespace's address, let the bridge's
# subnet in (clients and replication), and notice a dead peer within
# seconds instead of a minute.
pg_conf_network() {
    cluster_conf "listen_addresses = '*'" \
        "wal_sender_timeout = '5s'" \
        "wal_receiver_timeout = '5s'" \
        "tcp_keepalives_idle = 2" \
        "tcp_keepalives_interval = 1" \
        "tcp_keepalives_count = 3"
    printf 'host all all %s.0/24 trust\nhost replication all %s.0/24 trust\n' "$NET_PREFIX" "$NET_PREFIX" \
        >>"$CLUSTER_DATA/pg_hba.conf"
}

# pg_make_standby NODE: NODE made anew from the primary by pg_basebackup
# over the bridge, streaming, and made the synchronous standby.
pg_make_standby() {
    local node=$1 pri=$PRIMARY
    pg_stop "$node"
    rm -rf "${PG_DATA[$node]}"
    net_exec "$node" runuser -u "$CLUSTER_OS_USER" -- "$CLUSTER_INSTALL$PG_BINDIR/pg_basebackup" \
        -h "$(net_addr "$pri")" -p "${PG_PORT[$pri]}" -U postgres -D "${PG_DATA[$node]}" \
        -R -X stream --checkpoint=fast >>"$CLUSTER_DIR/basebackup.log" 2>&1 || return 1
    echo "port = ${PG_PORT[$node]}" >>"${PG_DATA[$node]}/postgresql.conf"
    pg_ctl_on "$node" -w -t 60 start >/dev/null || return 1
    STANDBY=$node
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_replication WHERE state = 'streaming'" || return 1
    sql "ALTER SYSTEM SET synchronous_standby_names = '*'" && sql "SELECT pg_reload_conf()" >/dev/null
    wait_until 30 "SELECT sync_state = 'sync' FROM pg_stat_replication"
}

# conninfo DB: both nodes by address; the clients follow the primary.
# Keepalives and tcp_user_timeout end a connection a partition left
# hanging within seconds, as a careful application's pool does.
conninfo() {
    echo "host=$(net_addr pg1),$(net_addr pg2) port=${PG_PORT[pg1]},${PG_PORT[pg2]} dbname=$1" \
        "target_session_attrs=read-write connect_timeout=2 keepalives_idle=1" \
        "keepalives_interval=1 keepalives_count=2 tcp_user_timeout=3000"
}

# consume_all ISOLATION FILE: every message of the topic, read from the
# clients' namespace (-U: read_uncommitted), into FILE.
consume_all() {
    net_exec cl "$TOOLS/outbox-consume" -b "$KCLUSTER_BROKERS" -t "$TOPIC" -n 100000000 \
        -T 180000 -i 8000 $1 >"$2" 2>>"$W/consume.log"
}
