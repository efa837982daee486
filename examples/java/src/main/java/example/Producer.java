package example;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

/**
 * The order service: each order and its OrderCreated event in one transaction.
 *
 * <p>Connects with the PG* variables (PGUSER=order_service: EXECUTE on
 * outbox.enqueue and INSERT on orders, nothing else); TOPIC, ORDER_PREFIX and
 * ORDERS say where and how many.
 */
public final class Producer {
    /**
     * JSON text bound with setString and cast in the SQL: without the casts
     * pgjdbc sends a varchar and the call fails (42883, no such function).
     */
    static final String ENQUEUE = "SELECT outbox.enqueue(biz_type => ?, biz_key => ?, payload => ?::jsonb,"
            + " topic => ?, headers => ?::jsonb)";

    private Producer() {
    }

    /** Adds the order's event in the connection's transaction; returns its id. */
    static long enqueue(Connection conn, String topic, String orderId, String sku, int qty) throws SQLException {
        // A real service would write the JSON with its JSON library.
        String payload = String.format("{\"order_id\": \"%s\", \"sku\": \"%s\", \"qty\": %d}", orderId, sku, qty);
        try (PreparedStatement st = conn.prepareStatement(ENQUEUE)) {
            st.setString(1, "OrderCreated");
            st.setString(2, orderId);
            st.setString(3, payload);
            st.setString(4, topic);
            st.setString(5, "{\"source\": \"java-example\"}");
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    public static void main(String[] args) throws SQLException {
        String topic = Env.get("TOPIC", "orders.java");
        String prefix = Env.get("ORDER_PREFIX", "java");
        int orders = Integer.parseInt(Env.get("ORDERS", "5"));

        try (Connection conn = DriverManager.getConnection(Env.jdbcUrl())) {
            conn.setAutoCommit(false);
            String orderId = null;
            long eventId = 0;
            for (int i = 1; i <= orders; i++) {
                orderId = prefix + "-" + i;
                try (PreparedStatement st = conn.prepareStatement("INSERT INTO orders (id, sku, qty) VALUES (?, ?, ?)")) {
                    st.setString(1, orderId);
                    st.setString(2, "sku-red");
                    st.setInt(3, i);
                    st.executeUpdate();
                    eventId = enqueue(conn, topic, orderId, "sku-red", i);
                    conn.commit();
                } catch (SQLException e) {
                    conn.rollback();
                    throw e;
                }
                System.out.printf("order %s: committed with event %d%n", orderId, eventId);
            }

            // A retry of the same call (say, the COMMIT's answer was lost) finds
            // the event and returns its id: nothing new is enqueued.
            long again = enqueue(conn, topic, orderId, "sku-red", orders);
            conn.commit();
            if (again != eventId) {
                throw new IllegalStateException("retry returned event " + again + ", not " + eventId);
            }
            System.out.printf("order %s: retried enqueue returned event %d again%n", orderId, again);
        }
    }
}
