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

# letters N: N random ASCII letters: a secret no log line holds by chance,
# whichever part of it is looked for.
letters() {
    tr -dc 'A-Za-z' </dev/urandom | head -c "$1"
}

# leaks_part WHERE FILE SECRET...: fail for each SECRET of which any six
# bytes in a row are in FILE (librdkafka quotes values whole, in part, or
# token by token).
leaks_part() {
    local where=$1 file=$2 s i
    shift 2
    for s in "$@"; do
        for ((i = 0; i + 6 <= ${#s}; i++)); do
            if grep -q -F -- "${s:i:6}" "$file"; then
                fail "part of a secret (${s:i:6} of $s) is in $where"
                break
            fi
        done
    done
}

# postmaster_kept START: fail if the postmaster restarted since it started
# at START (pg_postmaster_start_time()) or a process died of a signal
# since LOG_MARK.
postmaster_kept() {
    expect "postmaster start time" "$(sql "SELECT pg_postmaster_start_time()")" "$1"
    ! log_since "$LOG_MARK" | grep -q 'terminated by signal' \
        || fail "a process was terminated by a signal: $(log_since "$LOG_MARK" | grep 'terminated by signal' | head -1)"
}

# relay_said FILE: append what relay_status() shows to FILE.
relay_said() {
    sql "SELECT * FROM outbox.relay_status()" >>"$1" 2>&1
}

# Malformed GSSAPI settings: librdkafka quotes the keytab and the
# principal in its "Kerberos ticket refresh failed" line, and the kinit
# command it runs (here ls, which complains about both as kinit would)
# writes to the relay's stderr, the server log; neither, nor any part of
# them, reaches the server log or relay_status(), and once the settings
# are reset the relay delivers again, its last error gone.
t_librdkafka_quotes_secret() {
    local topic=it.scrub all=$IT_TMP/scrub.out start s1 s2 s3
    [ -n "${KAFKA_SASL_BROKERS:-}" ] || { fail "the test broker has no SASL listener (kafka_add_sasl)"; return; }
    s1=$(letters 16) s2=$(letters 16) s3=$(letters 3)
    start=$(sql "SELECT pg_postmaster_start_time()")
    LOG_MARK=$(log_mark)
    : >"$all"
    alter_system "ALTER SYSTEM SET outbox.kafka_properties = 'security.protocol=SASL_PLAINTEXT;sasl.mechanism=GSSAPI;sasl.kerberos.keytab=/nonexistent/$s1;sasl.kerberos.principal=$s2 $s3;sasl.kerberos.kinit.cmd=ls %{sasl.kerberos.keytab} %{sasl.kerberos.principal}'" >>"$all"
    set_setting outbox.kafka_brokers "$KAFKA_SASL_BROKERS"
    sql "SELECT outbox.enqueue('T', 'scrub-1', '{}', topic => '$topic')" >/dev/null
    log_shows 'Kerberos ticket refresh failed'
    status_shows 'Kerberos ticket refresh failed'
    relay_said "$all"
    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    wait_until 15 "$(all_sent $topic 1)" || fail "not delivered within 15 s of the reset: $(relay_state)"
    expect "last_error after the reset" "$(sql "SELECT coalesce(last_error, 'NULL') FROM outbox.relay_status()")" NULL
    relay_said "$all"
    log_since "$LOG_MARK" >>"$all"
    leaks_part "the server log or relay_status()" "$all" "$s1" "$s2"
    grep -q -E "(^|[^A-Za-z])$s3([^A-Za-z]|$)" "$all" && fail "a short token of a secret ($s3) is in the server log or relay_status()"
    postmaster_kept "$start"
}

# sasl_round MODE NAME PROPERTIES HOLD: PROPERTIES (malformed settings of
# one SASL mechanism) against the SASL listener for HOLD seconds with an
# event waiting, then reset: refused at once with a hint, or taken without
# a crash; either way the event is delivered within 15 s of the reset.
# What the client, the log and relay_status() said goes to $ALL.
sasl_round() {
    local mode=$1 name=$2 topic=it.sasl.$1.$2 out t0
    out=$(alter_system "ALTER SYSTEM SET outbox.kafka_properties = '$3'")
    echo "$out" >>"$ALL"
    if [[ "$out" == *ERROR* ]]; then
        [[ "$out" == *'ERROR:  22023: invalid value for parameter "outbox.kafka_properties"'* && "$out" == *HINT:* ]] \
            || fail "$mode $name: refused without 22023 and a hint: $out"
    else
        set_setting outbox.kafka_brokers "$KAFKA_SASL_BROKERS"
    fi
    sql "SELECT outbox.enqueue('T', 'sasl-$mode-$name', '{}', topic => '$topic')" >/dev/null
    sleep "$4"
    relay_said "$ALL"
    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    t0=$SECONDS
    set_setting outbox.kafka_brokers "$IT_BROKERS"
    wait_until 15 "$(all_sent "$topic" 1)" \
        || fail "$mode $name: not delivered within 15 s of the reset: $(relay_state)"
    echo "# $mode $name: delivered $((SECONDS - t0)) s after the reset"
    relay_said "$ALL"
}

# Every SASL mechanism with malformed settings, in both delivery modes:
# the server never restarts, no part of a value reaches the log or
# relay_status(), and the relay delivers within seconds of the reset.
# librdkafka before 2.2.0 crashes when it refreshes an unsecured
# OAUTHBEARER token (10 s after a malformed sasl.oauthbearer.config):
# there enable.sasl.oauthbearer.unsecure.jwt is refused when set.
t_sasl_malformed() {
    local ALL=$IT_TMP/sasl_malformed.out start mode p=security.protocol=SASL_PLAINTEXT
    local u1 u2 p1 p2 o1 o2 k1
    [ -n "${KAFKA_SASL_BROKERS:-}" ] || { fail "the test broker has no SASL listener (kafka_add_sasl)"; return; }
    u1=$(letters 12) u2=$(letters 12) p1=$(letters 12) p2=$(letters 12) o1=$(letters 12) o2=$(letters 12) k1=$(letters 12)
    start=$(sql "SELECT pg_postmaster_start_time()")
    LOG_MARK=$(log_mark)
    : >"$ALL"
    for mode in at_least_once exactly_once; do
        [ "$(sql "SHOW outbox.delivery")" = $mode ] || set_delivery $mode
        sasl_round $mode plain "$p;sasl.mechanism=PLAIN;sasl.username=$u1 ,=$u2;sasl.password=$p1 $p2" 3
        sasl_round $mode plain_no_password "$p;sasl.mechanism=PLAIN;sasl.username=$u1" 2
        sasl_round $mode scram256 "$p;sasl.mechanism=SCRAM-SHA-256;sasl.username=$u1=,$u2;sasl.password=$p1,=$p2" 3
        sasl_round $mode scram512 "$p;sasl.mechanism=SCRAM-SHA-512;sasl.username=$u1=,$u2;sasl.password=$p1,=$p2" 3
        sasl_round $mode oauthbearer_unsecured "$p;sasl.mechanism=OAUTHBEARER;enable.sasl.oauthbearer.unsecure.jwt=true;sasl.oauthbearer.config=principal=admin extension_token=$o1 lifeSeconds=3600 bogus $o2" 12
        sasl_round $mode oauthbearer "$p;sasl.mechanism=OAUTHBEARER;sasl.oauthbearer.config=principal=$o1 bogus $o2" 3
        sasl_round $mode gssapi "$p;sasl.mechanism=GSSAPI;sasl.kerberos.service.name=$u2 x;sasl.kerberos.keytab=/nonexistent/$k1;sasl.kerberos.principal=$u1 =" 3
    done
    set_delivery at_least_once
    log_since "$LOG_MARK" >>"$ALL"
    leaks_part "what the client, the server log or relay_status() showed" "$ALL" "$u1" "$u2" "$p1" "$p2" "$o1" "$o2" "$k1"
    postmaster_kept "$start"
}
