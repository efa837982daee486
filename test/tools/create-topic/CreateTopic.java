// CreateTopic: create topics with Kafka's Java admin client, as an
// operator would (the broker's classpath carries kafka-clients, not the
// kafka-topics tool).
// usage: CreateTopic BROKERS PARTITIONS TOPIC...
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;

public class CreateTopic {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        List<NewTopic> topics = new ArrayList<>();
        for (int i = 2; i < args.length; i++)
            topics.add(new NewTopic(args[i], Integer.parseInt(args[1]), (short) 1));
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(topics).all().get();
        }
    }
}
