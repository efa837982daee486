package example;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * The inventory service: reserves stock once per OrderCreated event.
 *
 * <p>Reads TOPIC with isolation.level=read_committed; for each record, one
 * database transaction claims the event (outbox.claim, arguments from the
 * record's headers) and reserves only when the claim is new; the offset is
 * committed after that transaction, so a crash in between redelivers the
 * record and the claim answers false.  Connects with the PG* variables
 * (PGUSER=inventory_service: EXECUTE on outbox.claim, INSERT on
 * reservations) and stops after MAX_MESSAGES records (a real service loops
 * for ever).
 */
public final class Consumer {
    /** event_id is decimal text in the header: bound as a string, cast in the SQL. */
    static final String CLAIM = "SELECT outbox.claim(?, ?::bigint, ?, ?, ?)";

    /** The JDK has no JSON parser: the database reads the payload (jsonb). */
    static final String RESERVE = "INSERT INTO reservations (order_id, sku, qty, event_id)"
            + " SELECT p->>'order_id', p->>'sku', (p->>'qty')::int, ?::bigint FROM (SELECT ?::jsonb AS p) AS v";

    private Consumer() {
    }

    static String header(ConsumerRecord<String, String> r, String name) {
        Header h = r.headers().lastHeader(name);
        return h == null ? null : new String(h.value(), StandardCharsets.UTF_8);
    }

    /** Claims and applies one record in one transaction; true if applied. */
    static boolean handle(Connection conn, String consumer, ConsumerRecord<String, String> r) throws SQLException {
        String eventId = header(r, "event_id");
        try {
            boolean claimed;
            try (PreparedStatement st = conn.prepareStatement(CLAIM)) {
                st.setString(1, consumer);
                st.setString(2, eventId);
                st.setString(3, header(r, "biz_type"));
                st.setString(4, header(r, "biz_key"));
                st.setString(5, header(r, "outbox_source"));
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    claimed = rs.getBoolean(1);
                }
            }
            if (claimed) {
                try (PreparedStatement st = conn.prepareStatement(RESERVE)) {
                    st.setString(1, eventId);
                    st.setString(2, r.value());
                    st.executeUpdate();
                }
            }
            conn.commit();
            return claimed;
        } catch (SQLException e) {
            conn.rollback();
            throw e;
        }
    }

    public static void main(String[] args) throws SQLException {
        String topic = Env.get("TOPIC", "orders.java");
        String consumer = Env.get("CONSUMER", "inventory-java");
        int max = Integer.parseInt(Env.get("MAX_MESSAGES", "5"));
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, Env.get("KAFKA_BROKERS", "localhost:9092"));
        props.put(ConsumerConfig.GROUP_ID_CONFIG, Env.get("GROUP_ID", "inventory-java"));
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());

        int applied = 0;
        int duplicates = 0;
        try (KafkaConsumer<String, String> kafka = new KafkaConsumer<>(props);
                Connection conn = DriverManager.getConnection(Env.jdbcUrl())) {
            conn.setAutoCommit(false);
            kafka.subscribe(List.of(topic));
            while (applied + duplicates < max && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : kafka.poll(Duration.ofSeconds(1))) {
                    // An exception leaves the offset uncommitted: the record comes again.
                    boolean claimed = handle(conn, consumer, r);
                    if (claimed) {
                        applied++;
                    } else {
                        duplicates++;
                    }
                    // Only now, after the database committed.
                    kafka.commitSync(Map.of(new TopicPartition(r.topic(), r.partition()),
                            new OffsetAndMetadata(r.offset() + 1)));
                    System.out.printf("event %s: %s%n", header(r, "event_id"), claimed ? "applied" : "duplicate, skipped");
                }
            }
        }
        System.out.printf("applied %d, duplicates %d%n", applied, duplicates);
        if (applied + duplicates < max) {
            System.err.printf("only %d of %d records within 60 s%n", applied + duplicates, max);
            System.exit(1);
        }
    }
}
