/*
 * consume.c
 *		outbox-consume: a Kafka consumer for the tests, the demo and the
 *		benchmarks.  It reads topics from the beginning and prints one line
 *		per message:
 *
 *		topic <TAB> partition <TAB> offset <TAB> key <TAB> headers <TAB> value <TAB> received_us <TAB> created_ms
 *
 *		headers as name=value pairs joined by ","; received_us is the wall
 *		clock (microseconds since the epoch) when the message arrived here;
 *		created_ms the message's timestamp, set by the producer at send.
 *
 * usage: outbox-consume -b BROKERS -t TOPIC [-t TOPIC ...] [-n COUNT]
 *                       [-T TIMEOUT_MS] [-i IDLE_MS]
 *		Stops after COUNT messages, after TIMEOUT_MS in all, or once no
 *		message came for IDLE_MS after the first; exit status 0 if COUNT
 *		(when given) was reached, else 1.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#define MAX_TOPICS 32

static long long
now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (long long) tv.tv_sec * 1000000 + tv.tv_usec;
}

/* Assign every partition of every topic, from the beginning, waiting for
 * the topics to exist (they are created on first use). */
static int
assign_all(rd_kafka_t *rk, char **topics, int ntopics, long long deadline)
{
	rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(16);

	for (int t = 0; t < ntopics; t++)
	{
		for (;;)
		{
			const struct rd_kafka_metadata *md = NULL;
			rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topics[t], NULL);
			rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, 2000);
			int			found = 0;

			if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
				md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
				md->topics[0].partition_cnt > 0)
			{
				for (int p = 0; p < md->topics[0].partition_cnt; p++)
					rd_kafka_topic_partition_list_add(parts, topics[t], md->topics[0].partitions[p].id)->offset =
						RD_KAFKA_OFFSET_BEGINNING;
				found = 1;
			}
			if (md)
				rd_kafka_metadata_destroy(md);
			rd_kafka_topic_destroy(rkt);
			if (found)
				break;
			if (now_us() > deadline)
			{
				fprintf(stderr, "outbox-consume: topic %s not found\n", topics[t]);
				return 0;
			}
			struct timespec ts = {0, 200 * 1000 * 1000};

			nanosleep(&ts, NULL);
		}
	}
	rd_kafka_assign(rk, parts);
	rd_kafka_topic_partition_list_destroy(parts);
	return 1;
}

static void
print_message(const rd_kafka_message_t *m)
{
	rd_kafka_headers_t *hdrs = NULL;

	printf("%s\t%d\t%lld\t%.*s\t", rd_kafka_topic_name(m->rkt), m->partition,
		   (long long) m->offset, (int) m->key_len, m->key ? (const char *) m->key : "");
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		const char *name;
		const void *val;
		size_t		size;

		for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
			printf("%s%s=%.*s", i ? "," : "", name, (int) size, val ? (const char *) val : "");
	}
	printf("\t%.*s\t%lld\t%lld\n", (int) m->len, m->payload ? (const char *) m->payload : "", now_us(),
		   (long long) rd_kafka_message_timestamp(m, NULL));
}

int
main(int argc, char **argv)
{
	char	   *brokers = NULL;
	char	   *topics[MAX_TOPICS];
	int			ntopics = 0;
	long		count = -1;
	long		timeout_ms = 60000;
	long		idle_ms = -1;
	char		err[512];
	int			opt;

	while ((opt = getopt(argc, argv, "b:t:n:T:i:")) != -1)
	{
		switch (opt)
		{
			case 'b': brokers = optarg; break;
			case 't': if (ntopics < MAX_TOPICS) topics[ntopics++] = optarg; break;
			case 'n': count = atol(optarg); break;
			case 'T': timeout_ms = atol(optarg); break;
			case 'i': idle_ms = atol(optarg); break;
			default:
				fprintf(stderr, "usage: outbox-consume -b BROKERS -t TOPIC... [-n COUNT] [-T TIMEOUT_MS] [-i IDLE_MS]\n");
				return 2;
		}
	}
	if (!brokers || ntopics == 0)
	{
		fprintf(stderr, "outbox-consume: -b and -t are required\n");
		return 2;
	}

	rd_kafka_conf_t *conf = rd_kafka_conf_new();

	if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "group.id", "outbox-consume", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "allow.auto.create.topics", "true", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "fetch.wait.max.ms", "10", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err)))
	{
		fprintf(stderr, "outbox-consume: %s\n", err);
		return 2;
	}
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));

	if (!rk)
	{
		fprintf(stderr, "outbox-consume: %s\n", err);
		return 2;
	}
	long long	start = now_us();
	long long	deadline = start + timeout_ms * 1000LL;

	if (!assign_all(rk, topics, ntopics, deadline))
		return 1;
	/* Ready: a caller waiting for this line may start producing. */
	fprintf(stderr, "outbox-consume: assigned\n");

	long		got = 0;
	long long	last = 0;

	while ((count < 0 || got < count) && now_us() < deadline &&
		   !(idle_ms >= 0 && last > 0 && now_us() - last > idle_ms * 1000LL))
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 20);

		if (!m)
			continue;
		if (!m->err)
		{
			print_message(m);
			got++;
			last = now_us();
		}
		rd_kafka_message_destroy(m);
	}
	fflush(stdout);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return (count < 0 || got >= count) ? 0 : 1;
}
