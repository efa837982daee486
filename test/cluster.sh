# test/cluster.sh: a throwaway PostgreSQL cluster for the tests and the demo.
#
# Source it, then call cluster_create, cluster_start and (on exit)
# cluster_destroy.  The cluster runs from a private copy of the server's
# installation with this build of outbox installed into it, so nothing is
# written to the system's PostgreSQL directories.  PostgreSQL refuses to run
# as root: under root the server runs as the unprivileged user "postgres".
# After cluster_start, PGHOST, PGPORT and PGUSER point clients at it.
#
# The tests' server runs with fsync = off: they check behaviour, not speed,
# and none survives an OS crash.  CLUSTER_DURABLE=1 (set before
# cluster_create) is the opt-in for the benchmarks: a server as durable as
# a user's, fsync, synchronous_commit and full_page_writes on and the
# default wal_sync_method.

# The server is PostgreSQL $PG (15 unless set), or PG_CONFIG's.
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/${PG:-15}/bin/pg_config}
PG_BINDIR=$("$PG_CONFIG" --bindir)

# cluster_run CMD...: run a server-side command as the cluster's OS user.
cluster_run() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u "$CLUSTER_OS_USER" -- "$@"
    else
        "$@"
    fi
}

# cluster_os_user: the unprivileged user the server runs as.
cluster_os_user() {
    if [ "$(id -u)" -ne 0 ]; then
        id -un
        return
    fi
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    echo postgres
}

# cluster_create: a temporary installation with outbox, and an empty cluster.
cluster_create() {
    CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/outbox-cluster.XXXXXX")
    CLUSTER_OS_USER=$(cluster_os_user)
    CLUSTER_INSTALL=$CLUSTER_DIR/install
    CLUSTER_DATA=$CLUSTER_DIR/data
    chmod 755 "$CLUSTER_DIR"
    # The server writes its socket and log here.
    chown "$CLUSTER_OS_USER" "$CLUSTER_DIR"

    # The server finds its share and lib directories relative to its binary,
    # so a copy of bin/ and symlink trees of the rest make a full install.
    local libdir sharedir
    libdir=$("$PG_CONFIG" --pkglibdir)
    sharedir=$("$PG_CONFIG" --sharedir)
    mkdir -p "$CLUSTER_INSTALL$PG_BINDIR" "$CLUSTER_INSTALL$libdir" "$CLUSTER_INSTALL$sharedir"
    cp -a "$PG_BINDIR/." "$CLUSTER_INSTALL$PG_BINDIR/"
    cp -rs "$libdir/." "$CLUSTER_INSTALL$libdir/"
    cp -rs "$sharedir/." "$CLUSTER_INSTALL$sharedir/"
    make -s install DESTDIR="$CLUSTER_INSTALL" >/dev/null

    # A durable cluster also has its initial files synced, as initdb does
    # by default.
    local fsync=off nosync=--no-sync
    if [ "${CLUSTER_DURABLE:-0}" = 1 ]; then fsync=on nosync=; fi
    cluster_run mkdir "$CLUSTER_DATA"
    cluster_run "$CLUSTER_INSTALL$PG_BINDIR/initdb" -D "$CLUSTER_DATA" -U postgres \
        --auth=trust --encoding=UTF8 --locale=C $nosync >"$CLUSTER_DIR/initdb.log"
    cat >>"$CLUSTER_DATA/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$CLUSTER_DIR'
port = 5432
fsync = $fsync
max_connections = 40
log_line_prefix = '%m [%p] %q%a '
CONF
}

# cluster_conf LINE...: append settings to postgresql.conf.
cluster_conf() {
    printf '%s\n' "$@" >>"$CLUSTER_DATA/postgresql.conf"
}

# cluster_ctl ARGS...: pg_ctl on the cluster, as its OS user.
cluster_ctl() {
    cluster_run "$CLUSTER_INSTALL$PG_BINDIR/pg_ctl" -D "$CLUSTER_DATA" \
        -l "$CLUSTER_DIR/server.log" "$@"
}

# cluster_start: start the server and point libpq's variables at it.
cluster_start() {
    cluster_ctl -w -t 60 start >/dev/null
    export PGHOST=$CLUSTER_DIR PGPORT=5432 PGUSER=postgres PGDATABASE=postgres
}

# cluster_destroy: stop the server if it runs and remove every file.
cluster_destroy() {
    [ -n "${CLUSTER_DIR:-}" ] && [ -d "$CLUSTER_DIR" ] || return 0
    cluster_ctl -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$CLUSTER_DIR"
}

# cluster_log_tail: the end of the server log, for a failure report.
cluster_log_tail() {
    tail -n "${1:-40}" "$CLUSTER_DIR/server.log" 2>/dev/null || true
}
