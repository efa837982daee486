/*
 * JavaPartitions: where Java's kafka-clients producer, with its default
 * partitioner, puts each key, for test/integration/partitioning.sh.
 *
 * It creates each topic named with PARTITIONS partitions, then sends every
 * line of KEYFILE (UTF-8) as a record's key, and value, to the first of
 * them; a consumer reads back which partition each key landed on.  Built
 * with javac against the test broker's classpath (test/kafka/pom.xml), so
 * kafka-clients is the broker's own version.
 *
 * usage: java -cp KAFKA_CLASSPATH:DIR JavaPartitions BROKERS PARTITIONS KEYFILE TOPIC [TOPIC...]
 */
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.StringSerializer;

public final class JavaPartitions {
    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: JavaPartitions BROKERS PARTITIONS KEYFILE TOPIC [TOPIC...]");
            System.exit(2);
        }
        List<String> topics = List.of(args).subList(3, args.length);
        createTopics(args[0], Integer.parseInt(args[1]), topics);
        send(args[0], topics.get(0),
             Files.readAllLines(Paths.get(args[2]), StandardCharsets.UTF_8));
    }

    /* Create every topic with the same partition count, one replica. */
    private static void createTopics(String brokers, int partitions, List<String> topics)
            throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        List<NewTopic> wanted = new ArrayList<>();
        for (String topic : topics)
            wanted.add(new NewTopic(topic, partitions, (short) 1));
        try (Admin admin = Admin.create(props)) {
            admin.createTopics(wanted).all().get();
            awaitLeaders(admin, topics);
        }
    }

    /*
     * Wait, up to a minute, until every partition of topics has a leader:
     * a producer that starts sooner may wait out delivery.timeout.ms for a
     * partition whose leader it learnt too late (seen on a loaded machine).
     */
    private static void awaitLeaders(Admin admin, List<String> topics) throws Exception {
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (true) {
            int leaderless = 0;
            for (TopicDescription topic : admin.describeTopics(topics).allTopicNames().get().values())
                for (TopicPartitionInfo partition : topic.partitions())
                    if (partition.leader() == null || partition.leader().isEmpty())
                        leaderless++;
            if (leaderless == 0)
                return;
            if (System.nanoTime() > deadline)
                throw new IllegalStateException(leaderless + " partitions still have no leader after 60 s");
            Thread.sleep(100);
        }
    }

    /*
     * Send each key to topic with the default partitioner and wait for every
     * ack; keys whose send failed (a batch expired on a loaded machine, seen
     * once in CI) go again, in a new producer, up to three rounds in all.
     * Only where a key lands matters here, not that it lands once.
     */
    private static void send(String brokers, String topic, List<String> keys) throws Exception {
        List<String> left = keys;
        for (int round = 1; !left.isEmpty(); round++) {
            List<String> failed = sendOnce(brokers, topic, left);
            if (!failed.isEmpty() && round == 3)
                throw new IllegalStateException(failed.size() + " keys not acknowledged after 3 rounds");
            if (!failed.isEmpty())
                System.err.println(failed.size() + " keys not acknowledged; sending them again");
            left = failed;
        }
    }

    /* One producer's sends of keys: the keys whose send failed. */
    private static List<String> sendOnce(String brokers, String topic, List<String> keys) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        List<String> failed = new ArrayList<>();
        try (KafkaProducer<String, String> producer =
                 new KafkaProducer<>(props, new StringSerializer(), new StringSerializer())) {
            for (String key : keys)
                sent.add(producer.send(new ProducerRecord<>(topic, key, key)));
            for (int i = 0; i < sent.size(); i++) {
                try {
                    sent.get(i).get();
                } catch (ExecutionException e) {
                    failed.add(keys.get(i));
                }
            }
        }
        return failed;
    }
}
