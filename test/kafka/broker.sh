# test/kafka/broker.sh: a real Apache Kafka broker (KRaft, one node) on
# loopback for the tests, the demo and the benchmarks.
#
# Source it, then: kafka_start; ...; kafka_stop.  KAFKA_BROKERS is set to
# its address.  The broker's jars come from Maven Central through
# test/kafka/pom.xml (fetched once into ~/.m2).  Faults are real:
# kafka_pause/kafka_resume (SIGSTOP/SIGCONT), kafka_kill and kafka_start
# again on the same data.  kafka_add_sasl adds a SASL_PLAINTEXT listener,
# kafka_add_tls an SSL (mutual TLS) and a SASL_SSL (SCRAM-SHA-512) one.
# KAFKA_JVM_OPTS, if set, replaces the JVM's heap and collector options (a
# small heap by default; bench/run sets its own).  The log cleaner's buffer
# is 16 MB, not 128 MB: the heap would otherwise hold it for life.
#
# KAFKA_VERSION, if set, is the broker's version (e.g. 3.6.2 or 3.9.1; any
# kafka_2.13 release on Maven Central from 3.5 on, the first whose
# StorageTool writes SCRAM credentials); unset, the pom's kafka.version.
# Each version's classpath is cached apart, in test/kafka/.classpath-VERSION.

KAFKA_POM=${KAFKA_POM:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pom.xml}
KAFKA_VERSION=${KAFKA_VERSION:-$(sed -n 's|.*<kafka.version>\(.*\)</kafka.version>.*|\1|p' "$KAFKA_POM")}

# kafka_classpath: the broker's classpath (KAFKA_VERSION's), resolving it
# on first use.
kafka_classpath() {
    local cpfile="${KAFKA_POM%/*}/.classpath-$KAFKA_VERSION"
    if [ ! -s "$cpfile" ] || [ "$KAFKA_POM" -nt "$cpfile" ]; then
        mvn -q -B -f "$KAFKA_POM" dependency:build-classpath -Dkafka.version="$KAFKA_VERSION" \
            -Dmdep.includeScope=runtime -Dmdep.outputFile="$cpfile" >&2 || return 1
    fi
    cat "$cpfile"
}

# kafka_version_at_least VERSION: whether the broker (KAFKA_VERSION) is
# VERSION or later, e.g. kafka_version_at_least 4.0.
kafka_version_at_least() {
    [ "$(printf '%s\n%s\n' "$1" "$KAFKA_VERSION" | sort -V | head -n 1)" = "$1" ]
}

# kafka_free_port [TAKEN...]: a TCP port on loopback nobody listens on,
# none of TAKEN.  Below the kernel's ephemeral range (32768 up, here and
# on Debian's default): a port from it may become the local end of any
# outgoing connection, a broker's own among them, between this choice and
# the bind, and a node of a three-node cluster once failed to start so.
kafka_free_port() {
    local port low=20000 high
    high=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$high" -gt $((low + 1000)) ] || high=$((low + 10000))
    while :; do
        port=$((low + RANDOM % (high - low)))
        [[ " $* " == *" $port "* ]] && continue
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
    done
}

# kafka_setup DIR: configure and format a broker in DIR.
kafka_setup() {
    KAFKA_DIR=$1
    mkdir -p "$KAFKA_DIR"
    KAFKA_CP=$(kafka_classpath) || return 1
    local port ctl
    port=$(kafka_free_port)
    ctl=$(kafka_free_port "$port")
    KAFKA_BROKERS=127.0.0.1:$port
    cat >"$KAFKA_DIR/server.properties" <<CONF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctl
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_DIR/data
num.partitions=3
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=16777216
CONF
    kafka_format
}

# kafka_format [ARG...]: format the broker's storage (again: what was in it
# is gone), with StorageTool's ARGs.
kafka_format() {
    rm -rf "$KAFKA_DIR/data"
    java -cp "$KAFKA_CP" kafka.tools.StorageTool format -t "$(java -cp "$KAFKA_CP" kafka.tools.StorageTool random-uuid 2>/dev/null)" \
        -c "$KAFKA_DIR/server.properties" "$@" >"$KAFKA_DIR/format.log" 2>&1
}

# kafka_add_sasl USER PASSWORD: also listen for SASL_PLAINTEXT clients
# (mechanism PLAIN) with USER, the listener's one account; KAFKA_SASL_BROKERS
# is its address.  Opt-in: call it between kafka_setup and kafka_start.  The
# PLAINTEXT listener stays as it was.
kafka_add_sasl() {
    local port
    port=$(kafka_free_port)
    KAFKA_SASL_BROKERS=127.0.0.1:$port
    sed -i -e "s|^\(listeners=.*\)|\1,SASL_PLAINTEXT://$KAFKA_SASL_BROKERS|" \
        -e "s|^\(advertised.listeners=.*\)|\1,SASL_PLAINTEXT://$KAFKA_SASL_BROKERS|" \
        -e "s|^\(listener.security.protocol.map=.*\)|\1,SASL_PLAINTEXT:SASL_PLAINTEXT|" \
        "$KAFKA_DIR/server.properties"
    cat >>"$KAFKA_DIR/server.properties" <<CONF
sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$1="$2";
CONF
}

# kafka_make_certs DIR OWNER: certificates made now, in DIR: a CA
# (ca.pem), the broker's certificate for localhost (subjectAltName
# DNS:localhost; in broker.p12 with its key, and the CA in truststore.p12,
# both with password KAFKA_TLS_STORE_PASSWORD), a client's certificate
# and key (client.pem, client.key, CN=outbox), the same client's
# certificate expired in 2020 (client-expired.pem), and a CA that signed
# nothing here (other-ca.pem).  The client's files and the CAs go to OS
# user OWNER, keys mode 0600: the server's user reads them, nobody else.
kafka_make_certs() {
    local dir=$1 owner=$2 pw=$KAFKA_TLS_STORE_PASSWORD
    mkdir -p "$dir"
    (
        cd "$dir" || exit 1
        set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 \
            -subj /CN=outbox-test-ca -addext basicConstraints=critical,CA:true
        openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days 30 \
            -subj /CN=outbox-other-ca -addext basicConstraints=critical,CA:true
        openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj /CN=localhost
        printf 'subjectAltName=DNS:localhost\n' >broker.ext
        openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile broker.ext -out broker.pem
        openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
            -out broker.p12 -passout "pass:$pw"
        keytool -importcert -noprompt -alias ca -file ca.pem -keystore truststore.p12 \
            -storetype PKCS12 -storepass "$pw"
        openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=outbox
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 -out client.pem
        # openssl x509 cannot date a certificate in the past; keytool can.
        openssl pkcs12 -export -in ca.pem -inkey ca.key -name ca -out ca.p12 -passout "pass:$pw"
        keytool -gencert -rfc -alias ca -keystore ca.p12 -storetype PKCS12 -storepass "$pw" \
            -infile client.csr -outfile client-expired.pem -startdate '2020/01/01 00:00:00' -validity 2
        chown "$owner" ca.pem other-ca.pem client.pem client.key client-expired.pem
        chmod 600 client.key
    ) >"$dir/make.log" 2>&1 || { echo "making certificates failed; see $dir/make.log" >&2; return 1; }
}

# kafka_add_tls DIR OWNER USER PASSWORD: also listen for TLS clients, with
# certificates made in DIR (kafka_make_certs DIR OWNER): an SSL listener
# that requires a client certificate signed by the CA
# (KAFKA_SSL_BROKERS) and a SASL_SSL listener whose one account is USER
# with PASSWORD (KAFKA_SASL_SSL_BROKERS), by SCRAM-SHA-512 or PLAIN
# (librdkafka before 2.6.1 fails SCRAM with Kafka 4: librdkafka #4895).
# Both are advertised as localhost, the name in the broker's certificate.
# Opt-in: call it between kafka_setup and kafka_start; it formats the
# storage again, as SCRAM credentials are written there.
KAFKA_TLS_STORE_PASSWORD=outbox-test-store
kafka_add_tls() {
    local dir=$1 ssl sasl
    kafka_make_certs "$dir" "$2" || return 1
    ssl=$(kafka_free_port)
    sasl=$(kafka_free_port "$ssl")
    KAFKA_SSL_BROKERS=localhost:$ssl
    KAFKA_SASL_SSL_BROKERS=localhost:$sasl
    sed -i -e "s|^\(listeners=.*\)|\1,SSL://127.0.0.1:$ssl,SASL_SSL://127.0.0.1:$sasl|" \
        -e "s|^\(advertised.listeners=.*\)|\1,SSL://$KAFKA_SSL_BROKERS,SASL_SSL://$KAFKA_SASL_SSL_BROKERS|" \
        -e "s|^\(listener.security.protocol.map=.*\)|\1,SSL:SSL,SASL_SSL:SASL_SSL|" \
        "$KAFKA_DIR/server.properties"
    cat >>"$KAFKA_DIR/server.properties" <<CONF
ssl.keystore.type=PKCS12
ssl.keystore.location=$dir/broker.p12
ssl.keystore.password=$KAFKA_TLS_STORE_PASSWORD
ssl.truststore.type=PKCS12
ssl.truststore.location=$dir/truststore.p12
ssl.truststore.password=$KAFKA_TLS_STORE_PASSWORD
listener.name.ssl.ssl.client.auth=required
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$3="$4";
CONF
    kafka_format --add-scram "SCRAM-SHA-512=[name=$3,password=$4]"
}

# kafka_start: start (or restart) the broker and wait until it answers.
kafka_start() {
    java ${KAFKA_JVM_OPTS:--Xms256m -Xmx512m -XX:+UseSerialGC} -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
        -cp "$KAFKA_CP" kafka.Kafka "$KAFKA_DIR/server.properties" >>"$KAFKA_DIR/broker.log" 2>&1 &
    KAFKA_PID=$!
    for _ in $(seq 1 120); do
        if kcat -b "$KAFKA_BROKERS" -L -m 1 >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.5
    done
    echo "kafka broker did not start; see $KAFKA_DIR/broker.log" >&2
    return 1
}

# kafka_kill: stop the broker at once (SIGKILL).
kafka_kill() {
    if [ -n "${KAFKA_PID:-}" ]; then
        kill -KILL "$KAFKA_PID" 2>/dev/null || true
        wait "$KAFKA_PID" 2>/dev/null || true
    fi
    KAFKA_PID=
}

# kafka_pause / kafka_resume: freeze the broker and let it go on.
kafka_pause() { kill -STOP "$KAFKA_PID"; }
kafka_resume() { kill -CONT "$KAFKA_PID"; }

# kafka_stop: stop the broker and remove its files.
kafka_stop() {
    kafka_kill
    if [ -n "${KAFKA_DIR:-}" ]; then rm -rf "$KAFKA_DIR"; fi
}
