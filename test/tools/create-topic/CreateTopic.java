// CreateTopic: create a topic with Kafka's Java admin client, as an
// operator would (the broker's classpath carries kafka-clients, not the
// kafka-topics tool).  Run from source: java -cp "$KAFKA_CP" CreateTopic.java.
// usage: CreateTopic BROKERS TOPIC PARTITIONS
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;

public class CreateTopic {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(List.of(new NewTopic(args[1], Integer.parseInt(args[2]), (short) 1)))
                .all().get();
        }
    }
}
