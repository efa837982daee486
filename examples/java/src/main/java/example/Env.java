package example;

import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;

/** Settings from the environment: libpq's PG* variables, as the other examples use. */
final class Env {
    private Env() {
    }

    static String get(String name, String def) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? def : v;
    }

    /** A pgjdbc URL from PGHOST, PGPORT, PGDATABASE and PGUSER (TCP: pgjdbc has no Unix sockets). */
    static String jdbcUrl() {
        return String.format("jdbc:postgresql://%s:%s/%s?user=%s",
                get("PGHOST", "localhost"), get("PGPORT", "5432"), get("PGDATABASE", "postgres"),
                URLEncoder.encode(get("PGUSER", System.getProperty("user.name")), StandardCharsets.UTF_8));
    }
}
