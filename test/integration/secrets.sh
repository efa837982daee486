# test/integration/secrets.sh: a secret in outbox.kafka_properties reaches
# neither the server log, nor another extension's log hook, nor a client,
# nor pg_stat_activity, whichever way an operator spells, quotes or
# mistypes it.  Each secret is unique and the log is read from a mark.

SPY_LIB=outbox_log_spy

# escape_property VALUE: VALUE with ';' and '\' escaped for a
# key=value;key=value list of outbox.kafka_properties.
escape_property() {
    local v=${1//\\/\\\\}
    printf '%s' "${v//;/\\;}"
}

# restart_with LIBS: restart the server with shared_preload_libraries LIBS
# (a list, unquoted; empty: as postgresql.conf says) and wait for the relay.
restart_with() {
    if [ -n "$1" ]; then
        sql "ALTER SYSTEM SET shared_preload_libraries = $1"
    else
        sql "ALTER SYSTEM RESET shared_preload_libraries"
    fi
    cluster_ctl -m fast restart >/dev/null || { fail "the server did not restart"; return 1; }
    wait_until 30 "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay'" \
        || fail "no relay after the restart"
}

# leaks WHERE FILE: fail for each secret of SECRETS found in FILE.
leaks() {
    local label
    for label in "${!SECRETS[@]}"; do
        ! grep -q -- "${SECRETS[$label]}" "$2" || fail "$label: the secret is in $1"
    done
}

# idle_activity SECRET: what a pg_monitor member reads in pg_stat_activity
# of a superuser session left idle after setting SECRET with ALTER SYSTEM.
idle_activity() {
    (echo "ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=$1';"; sleep 5) |
        PGAPPNAME=secrets-idle "$PGBIN/psql" -X -q -d "$IT_DB" >/dev/null 2>&1 &
    local session=$!
    wait_until 4 "SELECT count(*) = 1 FROM pg_stat_activity WHERE application_name = 'secrets-idle' AND state = 'idle'" \
        || { fail "pg_stat_activity: the session that set the secret was not seen idle"; } >&2
    "$PGBIN/psql" -X -q -At -U secrets_monitor -d "$IT_DB" \
        -c "SELECT query FROM pg_stat_activity WHERE application_name = 'secrets-idle'"
    wait "$session"
}

# Every spelling of the setting's name, a ';' inside a password, a
# configuration file that does not parse, a statement failing inside a
# function, with log_statement = ddl and log_min_error_statement = error,
# and a second emit_log_hook preloaded before outbox's: the secrets are
# nowhere; properties with spaces around '=' and ';' are taken.
t_secrets() {
    local s="Sx${RANDOM}q${RANDOM}z" out all=$IT_TMP/secrets.out spy=$CLUSTER_DATA/log_spy.out
    local libdir
    declare -A SECRETS=([upper case]=${s}up [quoted]=${s}qu [spaces]=${s}sp [set_config]=${s}sc
        [semicolon]=${s}se [semicolon, known name]=${s}kn [escaped semicolon]=${s}es
        [conf syntax error]=${s}cf [function context]=${s}fn [pg_stat_activity]=${s}ac)
    libdir=$("$PG_CONFIG" --pkglibdir)
    cp "$TOOLS/$SPY_LIB.so" "$CLUSTER_INSTALL$libdir/" || { fail "no $SPY_LIB.so"; return; }
    sql "ALTER SYSTEM SET log_statement = 'ddl'"
    sql "ALTER SYSTEM SET log_min_error_statement = 'error'"
    restart_with "$SPY_LIB, outbox" || return
    sql "SET client_min_messages = warning; DROP ROLE IF EXISTS secrets_monitor;
         CREATE ROLE secrets_monitor LOGIN IN ROLE pg_monitor"
    LOG_MARK=$(log_mark)
    : >"$all"

    {
        alter_system "ALTER SYSTEM SET outbox.KAFKA_PROPERTIES = 'linger.ms=1;sasl.password=${SECRETS[upper case]}'"
        alter_system "ALTER SYSTEM SET \"outbox\".\"Kafka_Properties\" = 'linger.ms=1;sasl.password=${SECRETS[quoted]}'"
        alter_system "ALTER SYSTEM SET Outbox . kafka_PROPERTIES = 'linger.ms=1;sasl.password=${SECRETS[spaces]}'"
        alter_system "SELECT set_config('OUTBOX.KAFKA_PROPERTIES', 'sasl.password=${SECRETS[set_config]}', false)"
        alter_system "DO \$\$ BEGIN PERFORM set_config('outbox.kafka_properties', 'sasl.password=${SECRETS[function context]}', false); END \$\$"
    } >>"$all"

    # A ';' in a password: refused, by position, unless escaped.
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=pw;${SECRETS[semicolon]}'")
    echo "$out" >>"$all"
    [[ "$out" == *'ERROR:  22023: invalid value for parameter "outbox.kafka_properties" (value hidden)'* &&
        "$out" == *'DETAIL:  Entry 2 is not key=value.'* ]] || fail "semicolon: not refused by position: $out"
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=pw;${SECRETS[semicolon, known name]}=1'")
    echo "$out" >>"$all"
    [[ "$out" == *'DETAIL:  Entry 2 names no property librdkafka knows.'* ]] \
        || fail "semicolon, known name: not refused by position: $out"
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = '$(escape_property "sasl.password=pw;${SECRETS[escaped semicolon]}")'")
    echo "$out" >>"$all"
    [ -z "$out" ] || fail "escaped semicolon: refused: $out"
    sql "SELECT pg_reload_conf()" >/dev/null
    log_shows 'parameter "outbox.kafka_properties" \(value hidden\)'

    # A configuration file that does not parse, then parses again.
    echo "outbox.kafka_properties = 'linger.ms=1;sasl.password=it'${SECRETS[conf syntax error]}'" >>"$CLUSTER_DATA/postgresql.conf"
    sql "SELECT pg_reload_conf()" >/dev/null
    log_shows 'syntax error in file .* \(token hidden\)'
    sed -i "/${SECRETS[conf syntax error]}/d" "$CLUSTER_DATA/postgresql.conf"
    sql "SELECT pg_reload_conf()" >/dev/null

    idle_activity "${SECRETS[pg_stat_activity]}" >>"$all"

    # White space around keys, values and ';' is not part of them.
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = ' acks = all ; linger.ms = 5 ; '")
    [ -z "$out" ] || fail "properties with spaces refused: $out"

    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    sql "ALTER SYSTEM RESET log_statement"
    sql "ALTER SYSTEM RESET log_min_error_statement"
    restart_with ""
    log_since "$LOG_MARK" >"$IT_TMP/secrets.log"
    leaks "the server log" "$IT_TMP/secrets.log"
    leaks "what the client or pg_stat_activity showed" "$all"
    leaks "what another extension's log hook saw" "$spy"
    grep -q 'invalid value for parameter "outbox.kafka_properties"' "$spy" \
        || fail "the log spy saw no message about outbox.kafka_properties"
}
