# test/integration/tls.sh: the relay over TLS, against the real broker's
# SSL listener (a client certificate required) and SASL_SSL listener
# (kafka_add_tls), with certificates made when the suite starts: events
# delivered with SCRAM-SHA-512 and hostname verification, and with mutual
# TLS; and the usual mistakes (a CA file the server cannot read, the wrong
# CA, the wrong password, an expired client certificate) each shown by
# state and message in relay_status() and the log, no event lost, no
# secret shown, and delivery back once fixed; and a client certificate
# and key renewed in place, taken at a reload (cert_renewed).  Events are
# read back on the PLAINTEXT listener: the relay's side is the one under
# test.

# The SASL_SSL listener's one account (kafka_add_tls).
IT_TLS_USER=outbox-tls
IT_TLS_PASSWORD=Tls$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 20)
IT_TLS_WRONG=Wrong$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 20)

# tls_dir: where kafka_add_tls made the certificates.
tls_dir() {
    echo "$IT_TMP/tls"
}

# scram_broken: why the relay's librdkafka cannot authenticate by SCRAM
# to this broker, or nothing.  Before 2.6.1 its client-final-message
# repeats the client's nonce, which Kafka 4 checks strictly (RFC 5802):
# the right password is refused as invalid credentials (librdkafka #4895).
# Kafka 3.x accepts it (KAFKA_VERSION, test/kafka/broker.sh).
scram_broken() {
    local v
    kafka_version_at_least 4.0 || return 0
    v=$(grep -o 'outbox relay started for database .* (librdkafka [0-9.]*' "$CLUSTER_DIR/server.log" |
        tail -n 1 | sed 's/.*librdkafka //')
    case $v in
        0.* | 1.* | 2.[0-5].* | 2.6.0)
            echo "librdkafka $v cannot authenticate by SCRAM to Kafka 4 (librdkafka #4895, fixed in 2.6.1): delivered by PLAIN over the same TLS" ;;
    esac
}

# tls_use BROKERS PROPERTIES: point the relay at BROKERS with
# outbox.kafka_properties PROPERTIES (no ';' inside a value), reloaded.
tls_use() {
    sql "ALTER SYSTEM SET outbox.kafka_properties = '$2'"
    set_setting outbox.kafka_brokers "$1"
}

# tls_reset: back to the PLAINTEXT listener and no properties.
tls_reset() {
    sql "ALTER SYSTEM RESET outbox.kafka_properties"
    set_setting outbox.kafka_brokers "$IT_BROKERS"
}

# sasl_ssl MECHANISM PASSWORD: properties for the SASL_SSL listener with
# the CA and hostname verification.
sasl_ssl() {
    echo "security.protocol=SASL_SSL;sasl.mechanism=$1;sasl.username=$IT_TLS_USER;sasl.password=$2;ssl.ca.location=$(tls_dir)/ca.pem;ssl.endpoint.identification.algorithm=https;broker.address.family=v4"
}

# mtls CA CERTIFICATE: properties for the SSL listener with the client's
# key, encrypted with TLS_KEY_PASSWORD (tls_encrypted_key).
mtls() {
    echo "security.protocol=SSL;ssl.ca.location=$1;ssl.certificate.location=$2;ssl.key.location=$(tls_dir)/client-encrypted.key;ssl.key.password=$TLS_KEY_PASSWORD;ssl.endpoint.identification.algorithm=https;broker.address.family=v4"
}

# tls_encrypted_key: the client's key encrypted with a new password,
# TLS_KEY_PASSWORD, readable by the server only.
tls_encrypted_key() {
    local key=$(tls_dir)/client-encrypted.key
    TLS_KEY_PASSWORD=Key$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 20)
    openssl pkey -in "$(tls_dir)/client.key" -aes256 -passout "pass:$TLS_KEY_PASSWORD" -out "$key" &&
        chown "$CLUSTER_OS_USER" "$key" && chmod 600 "$key"
}

# tls_no_secret ALL SECRET...: fail if any part of a SECRET (or of the
# client's key) is in ALL, the server log since LOG_MARK, or what
# relay_status() shows now.
tls_no_secret() {
    local all=$1 key
    shift
    relay_said "$all"
    log_since "$LOG_MARK" >>"$all"
    for key in "$(tls_dir)"/client*.key; do
        set -- "$@" "$(sed -n 2p "$key")"
    done
    leaks_part "the server log or relay_status()" "$all" "$@"
}

# SASL_SSL with SCRAM-SHA-512, the CA, hostname verification on: events
# delivered in order, exactly once, the relay steady.  A bootstrap
# address the broker's certificate does not name (127.0.0.1) is refused
# first: verification is on.  No part of the password reaches the log.
t_tls_sasl_scram() {
    local topic=it.tls.scram pid all=$IT_TMP/tls_scram.out port reason mech=SCRAM-SHA-512
    [ -n "${KAFKA_SASL_SSL_BROKERS:-}" ] || { fail "the test broker has no SASL_SSL listener (kafka_add_tls)"; return; }
    pid=$(relay_pid)
    reason=$(scram_broken)
    port=${KAFKA_SASL_SSL_BROKERS##*:}
    LOG_MARK=$(log_mark)
    : >"$all"
    tls_use "127.0.0.1:$port" "$(sasl_ssl $mech "$IT_TLS_PASSWORD")"
    enqueue $topic 5 scram
    log_shows "outbox relay: kafka: .*127.0.0.1:$port/bootstrap: SSL handshake failed: .*certificate verify failed"
    state_is 'broker unreachable'
    calm_for "$pid" 2 $topic
    if [ -n "$reason" ]; then
        tls_use "$KAFKA_SASL_SSL_BROKERS" "$(sasl_ssl $mech "$IT_TLS_PASSWORD")"
        log_shows 'SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512'
        log_shows 'HINT:  Check sasl.username and sasl.password.  Kafka 4.0 and later also refuse the right password from librdkafka before 2.6.1'
        mech=PLAIN
    fi
    tls_use "$KAFKA_SASL_SSL_BROKERS" "$(sasl_ssl $mech "$IT_TLS_PASSWORD")"
    arrive_once $topic 5
    relay_steady "$pid"
    tls_reset
    tls_no_secret "$all" "$IT_TLS_PASSWORD"
    skip_case "$reason"
}

# SSL with a client certificate, the broker requiring one, the client's
# key encrypted (ssl.key.password): events delivered in order, exactly
# once, the relay steady; neither the key nor its password in the log.
t_tls_mtls() {
    local topic=it.tls.mtls pid all=$IT_TMP/tls_mtls.out dir
    [ -n "${KAFKA_SSL_BROKERS:-}" ] || { fail "the test broker has no SSL listener (kafka_add_tls)"; return; }
    dir=$(tls_dir)
    tls_encrypted_key || { fail "could not encrypt the client's key"; return; }
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    : >"$all"
    tls_use "$KAFKA_SSL_BROKERS" "$(mtls "$dir/ca.pem" "$dir/client.pem")"
    enqueue $topic 5 mtls
    arrive_once $topic 5
    relay_steady "$pid"
    tls_reset
    tls_no_secret "$all" "$TLS_KEY_PASSWORD"
}

# tls_mistake NAME STATE LOG STATUS BROKERS BAD GOOD: with properties BAD
# and five events waiting, the log matches LOG (an extended regular
# expression), relay_status() is in STATE and its last_error holds
# STATUS, no event is sent, dies or spends an attempt; with GOOD all five
# arrive once, in order.  What relay_status() showed goes to $ALL.
tls_mistake() {
    local topic=it.tls.mistake.$1
    tls_use "$5" "$6"
    enqueue "$topic" 5 "$1"
    log_shows "$3"
    state_is "$2"
    status_shows "$4"
    relay_said "$ALL"
    calm_for "$PID" 2 "$topic"
    tls_use "$5" "$7"
    arrive_once "$topic" 5
}

# Each mistake shows a state and a message that say what is wrong, loses
# nothing, and delivery resumes once it is fixed: a CA file the server
# cannot read (named, with the property and the reason), a CA that did
# not sign the broker's certificate, a wrong password, an expired client
# certificate.  No part of a password or key reaches the log or
# relay_status().
t_tls_mistakes() {
    local ALL=$IT_TMP/tls_mistakes.out PID dir ca mech=SCRAM-SHA-512
    local refused='Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512'
    [ -n "${KAFKA_SSL_BROKERS:-}" ] || { fail "the test broker has no SSL listener (kafka_add_tls)"; return; }
    dir=$(tls_dir)
    ca=$dir/ca-unreadable.pem
    # Where SCRAM cannot work, the wrong password is PLAIN's (tls_sasl_scram).
    [ -z "$(scram_broken)" ] || mech=PLAIN refused='Authentication failed: Invalid username or password'
    tls_encrypted_key || { fail "could not encrypt the client's key"; return; }
    cp "$dir/ca.pem" "$ca" && chmod 600 "$ca"
    PID=$(relay_pid)
    LOG_MARK=$(log_mark)
    : >"$ALL"

    # A file the server cannot read: fixed by making it readable.
    tls_use "$KAFKA_SSL_BROKERS" "$(mtls "$ca" "$dir/client.pem")"
    enqueue it.tls.mistake.unreadable 5 unreadable
    log_shows "outbox relay: could not read file \"$ca\" of property \"ssl.ca.location\": Permission denied"
    state_is 'not configured'
    status_shows "unusable Kafka settings: could not read file \"$ca\" of property \"ssl.ca.location\": Permission denied"
    relay_said "$ALL"
    calm_for "$PID" 2 it.tls.mistake.unreadable
    chown "$CLUSTER_OS_USER" "$ca"
    sql "SELECT pg_reload_conf()" >/dev/null
    arrive_once it.tls.mistake.unreadable 5

    tls_mistake wrong_ca 'broker unreachable' \
        'outbox relay: kafka: .*SSL handshake failed: .*certificate verify failed: broker certificate could not be verified' \
        'certificate verify failed: broker certificate could not be verified' \
        "$KAFKA_SSL_BROKERS" "$(mtls "$dir/other-ca.pem" "$dir/client.pem")" "$(mtls "$dir/ca.pem" "$dir/client.pem")"
    tls_mistake wrong_password 'broker unreachable' \
        "outbox relay: kafka: .*SASL authentication error: $refused" \
        "SASL authentication error: $refused" \
        "$KAFKA_SASL_SSL_BROKERS" "$(sasl_ssl $mech "$IT_TLS_WRONG")" "$(sasl_ssl $mech "$IT_TLS_PASSWORD")"
    tls_mistake expired_certificate 'broker unreachable' \
        'outbox relay: kafka: .*Receive failed: error:0A000416:SSL routines::.*alert certificate unknown: SSL alert number 46' \
        'alert certificate unknown: SSL alert number 46' \
        "$KAFKA_SSL_BROKERS" "$(mtls "$dir/ca.pem" "$dir/client-expired.pem")" "$(mtls "$dir/ca.pem" "$dir/client.pem")"
    log_shows 'HINT:  The broker refused the client certificate, or got none: check that ssl.certificate.location'
    relay_steady "$PID"
    tls_reset
    tls_no_secret "$ALL" "$IT_TLS_PASSWORD" "$IT_TLS_WRONG" "$TLS_KEY_PASSWORD"
}

# renewed_certs DIR: in DIR, a second CA (ca-b.pem), a client certificate
# it signed and its key (client-b.pem, client-b.key, CN=outbox as the
# first), and a broker truststore that holds only that CA
# (truststore-b.p12, password KAFKA_TLS_STORE_PASSWORD).
renewed_certs() {
    local dir=$1
    mkdir -p "$dir"
    (
        cd "$dir" || exit 1
        set -e
        rm -f truststore-b.p12
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-b.key -out ca-b.pem -days 30 \
            -subj /CN=outbox-renewal-ca -addext basicConstraints=critical,CA:true
        openssl req -newkey rsa:2048 -nodes -keyout client-b.key -out client-b.csr -subj /CN=outbox
        openssl x509 -req -in client-b.csr -CA ca-b.pem -CAkey ca-b.key -CAcreateserial -days 30 \
            -out client-b.pem
        keytool -importcert -noprompt -alias ca-b -file ca-b.pem -keystore truststore-b.p12 \
            -storetype PKCS12 -storepass "$KAFKA_TLS_STORE_PASSWORD"
    ) >"$dir/make.log" 2>&1
}

# renewed_trust TRUSTSTORE: restart the broker trusting only the CAs of
# TRUSTSTORE for client certificates: a broker reads its truststore when
# it starts, and a restart also ends every connection made before.
renewed_trust() {
    cp "$1" "$(tls_dir)/truststore.p12" && kafka_kill && kafka_start
}

# renewed_enqueue TOPIC FROM TO: events FROM to TO of TOPIC, all of one
# key, their "seq" counting on across calls (arrive_once checks order).
renewed_enqueue() {
    sql "SELECT count(outbox.enqueue('T', '$1-' || i, jsonb_build_object('seq', i),
                                     topic => '$1', msg_key => 'k'))
           FROM generate_series($2, $3) i" >/dev/null
}

# renewed_not_sent TOPIC FROM: SQL, true while no event of TOPIC from
# seq FROM on is sent.
renewed_not_sent() {
    echo "SELECT count(*) = 0 FROM outbox.events WHERE topic = '$1' AND status = 'sent'
                                              AND (payload->>'seq')::int >= $2"
}

# cert_renewed MODE TOPIC: mutual TLS in delivery MODE; events flow with
# the client certificate of the suite's CA (A); the certificate is renewed
# in place by one of a second CA (B; the certificate file rewritten, the
# key replaced by a rename: the paths stay); the broker restarts trusting
# only B, and the relay's producer, which read A, is refused; events
# enqueued meanwhile wait.  A reload, the settings' text unchanged, makes
# a new producer that reads B: those events and later ones arrive, each
# exactly once, in order.  Then the key made unreadable and reloaded: a
# WARNING names the file and the reason, once, and the producer it has
# goes on delivering.  No part of either key reaches the log or
# relay_status().  The broker trusts the suite's CA again at the end.
cert_renewed() {
    local mode=$1 topic=$2 dir=$IT_TMP/renewed-$1 tls pid all=$IT_TMP/$2.out
    [ -n "${KAFKA_SSL_BROKERS:-}" ] || { fail "the test broker has no SSL listener (kafka_add_tls)"; return; }
    tls=$(tls_dir)
    renewed_certs "$dir" || { fail "could not make the second CA's certificates; see $dir/make.log"; return; }
    cp "$tls/truststore.p12" "$dir/truststore-a.p12"
    install -o "$CLUSTER_OS_USER" -m 644 "$tls/client.pem" "$dir/client.pem"
    install -o "$CLUSTER_OS_USER" -m 600 "$tls/client.key" "$dir/client.key"
    topic_ready "$topic" || return
    pid=$(relay_pid)
    LOG_MARK=$(log_mark)
    : >"$all"
    cert_renewed_steps "$mode" "$topic" "$dir" && arrive_once "$topic" 20
    relay_steady "$pid"
    relay_said "$all"
    chown "$CLUSTER_OS_USER" "$dir/client.key"
    tls_reset
    [ "$mode" = at_least_once ] || set_delivery at_least_once
    renewed_trust "$dir/truststore-a.p12" || fail "the broker did not restart trusting the suite's CA again"
    log_since "$LOG_MARK" >>"$all"
    leaks_part "the server log or relay_status()" "$all" \
        "$(sed -n 2p "$tls/client.key")" "$(sed -n 2p "$dir/client-b.key")"
}

# cert_renewed_steps MODE TOPIC DIR: cert_renewed's steps, with the files
# in DIR; false at the first that fails.
cert_renewed_steps() {
    local mode=$1 topic=$2 dir=$3 unreadable
    tls_use "$KAFKA_SSL_BROKERS" "security.protocol=SSL;ssl.ca.location=$(tls_dir)/ca.pem;ssl.certificate.location=$dir/client.pem;ssl.key.location=$dir/client.key;ssl.endpoint.identification.algorithm=https;broker.address.family=v4"
    [ "$mode" = at_least_once ] || eos_ready
    renewed_enqueue "$topic" 1 5
    wait_until 60 "$(all_sent "$topic" 5)" || { fail "certificate A: the first 5 events not sent: $(relay_state)"; return 1; }

    # Renewed in place, then the broker trusts B only.
    cat "$dir/client-b.pem" >"$dir/client.pem"
    install -o "$CLUSTER_OS_USER" -m 600 "$dir/client-b.key" "$dir/client.key.new" &&
        mv -f "$dir/client.key.new" "$dir/client.key"
    renewed_trust "$dir/truststore-b.p12" || { fail "the broker did not restart trusting CA B"; return 1; }
    renewed_enqueue "$topic" 6 10
    state_is 'broker unreachable'
    holds 3 "$(renewed_not_sent "$topic" 6)" ||
        { fail "an event was sent with certificate A, which the broker no longer trusts"; return 1; }

    # The reload: the same text, new files.
    sql "SELECT pg_reload_conf()" >/dev/null
    log_shows 'LOG:  outbox relay: making a new Kafka producer'
    log_shows 'DETAIL:  A file that the Kafka properties name changed since the producer read it'
    renewed_enqueue "$topic" 11 15
    wait_until 60 "$(all_sent "$topic" 15)" ||
        { fail "after the reload: events not all sent with certificate B: $(relay_state)"; return 1; }

    # A file unreadable at a reload: said once, the producer kept.
    unreadable="WARNING:  outbox relay: could not read file \"$dir/client.key\" of property \"ssl.key.location\": Permission denied"
    chown root "$dir/client.key"
    sql "SELECT pg_reload_conf()" >/dev/null
    log_shows "$unreadable"
    renewed_enqueue "$topic" 16 20
    wait_until 60 "$(all_sent "$topic" 20)" || { fail "the unreadable key stopped the producer: $(relay_state)"; return 1; }
    expect "warnings of the unreadable key" "$(log_count "$unreadable")" 1
    chown "$CLUSTER_OS_USER" "$dir/client.key"
}

t_tls_cert_renewed() { cert_renewed at_least_once it.tls.renewed; }
t_eos_tls_cert_renewed() { cert_renewed exactly_once it.eos.tls.renewed; }
