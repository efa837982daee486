/*
 * consume.c
 *		outbox-consume: a Kafka consumer for the tests, the demo and the
 *		benchmarks.  It reads topics from the beginning (or their tails,
 *		-e), committed messages only (isolation.level=read_committed), and
 *		prints one line per message:
 *
 *		topic <TAB> partition <TAB> offset <TAB> key <TAB> headers <TAB> value <TAB> received_us <TAB> created_ms
 *
 *		headers as name=value pairs joined by ","; received_us is the wall
 *		clock (microseconds since the epoch) when the message arrived here;
 *		created_ms the message's timestamp, set by the producer at send.
 *
 * usage: outbox-consume -b BROKERS -t TOPIC [-t TOPIC ...] [-n COUNT] [-U]
 *                       [-T TIMEOUT_MS] [-i IDLE_MS] [-e TAIL] [-x]
 *		Stops after COUNT messages, after TIMEOUT_MS in all, once no
 *		message came for IDLE_MS after the first, or at SIGTERM, having
 *		written what it received; exit status 0 if COUNT (when given) was
 *		reached, else 1.  -U reads uncommitted messages too (those of
 *		aborted Kafka transactions).  -e reads only the last TAIL messages
 *		of each partition.  -x prints the value in hex, "\x" and two digits
 *		a byte as PostgreSQL writes bytea, for values that are not text.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

#define MAX_TOPICS 32
#define BATCH 1024

static char outbuf[1 << 20];
static volatile sig_atomic_t stopping = 0;

static void
on_term(int sig)
{
	(void) sig;
	stopping = 1;
}

static long long
now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (long long) tv.tv_sec * 1000000 + tv.tv_usec;
}

/* Assign every partition of every topic from offset START, waiting for the
 * topics to exist (they are created on first use). */
static int
assign_all(rd_kafka_t *rk, char **topics, int ntopics, int64_t start,
		   long long deadline)
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
					rd_kafka_topic_partition_list_add(parts, topics[t], md->topics[0].partitions[p].id)->offset = start;
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

/*
 * The output goes through one large buffer with plain copies: at a drain of
 * 100,000+ messages a second, printf's format parsing was a quarter of this
 * consumer's CPU, taken from the 2 cores the relay and the broker share.
 */
static void
put(const void *data, size_t len)
{
	fwrite_unlocked(data, 1, len, stdout);
}

static void
put_str(const char *s)
{
	put(s, strlen(s));
}

static void
put_num(long long v)
{
	char		buf[24];
	char	   *p = buf + sizeof(buf);
	unsigned long long u = v < 0 ? -(unsigned long long) v : (unsigned long long) v;

	do
		*--p = '0' + u % 10;
	while ((u /= 10) != 0);
	if (v < 0)
		*--p = '-';
	put(p, buf + sizeof(buf) - p);
}

static int	hex_values = 0;

static void
put_hex(const unsigned char *data, size_t len)
{
	static const char digits[] = "0123456789abcdef";

	put_str("\\x");
	for (size_t i = 0; i < len; i++)
	{
		putchar_unlocked(digits[data[i] >> 4]);
		putchar_unlocked(digits[data[i] & 15]);
	}
}

static void
print_message(const rd_kafka_message_t *m)
{
	rd_kafka_headers_t *hdrs = NULL;

	put_str(rd_kafka_topic_name(m->rkt));
	putchar_unlocked('\t');
	put_num(m->partition);
	putchar_unlocked('\t');
	put_num(m->offset);
	putchar_unlocked('\t');
	if (m->key)
		put(m->key, m->key_len);
	putchar_unlocked('\t');
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		const char *name;
		const void *val;
		size_t		size;

		for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
		{
			if (i)
				putchar_unlocked(',');
			put_str(name);
			putchar_unlocked('=');
			if (val)
				put(val, size);
		}
	}
	putchar_unlocked('\t');
	if (hex_values)
		put_hex(m->payload, m->payload ? m->len : 0);
	else if (m->payload)
		put(m->payload, m->len);
	putchar_unlocked('\t');
	put_num(now_us());
	putchar_unlocked('\t');
	put_num(rd_kafka_message_timestamp(m, NULL));
	putchar_unlocked('\n');
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
	int64_t		from = RD_KAFKA_OFFSET_BEGINNING;
	const char *isolation = "read_committed";
	char		err[512];
	int			opt;

	while ((opt = getopt(argc, argv, "b:t:n:T:i:Ue:x")) != -1)
	{
		switch (opt)
		{
			case 'b': brokers = optarg; break;
			case 't': if (ntopics < MAX_TOPICS) topics[ntopics++] = optarg; break;
			case 'n': count = atol(optarg); break;
			case 'T': timeout_ms = atol(optarg); break;
			case 'i': idle_ms = atol(optarg); break;
			case 'U': isolation = "read_uncommitted"; break;
			case 'e': from = RD_KAFKA_OFFSET_TAIL(atol(optarg)); break;
			case 'x': hex_values = 1; break;
			default:
				fprintf(stderr, "usage: outbox-consume -b BROKERS -t TOPIC... [-n COUNT] [-T TIMEOUT_MS] [-i IDLE_MS] [-U] [-e TAIL] [-x]\n");
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
		rd_kafka_conf_set(conf, "isolation.level", isolation, err, sizeof(err)) ||
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

	if (!assign_all(rk, topics, ntopics, from, deadline))
		return 1;
	/* Ready: a caller waiting for this line may start producing. */
	fprintf(stderr, "outbox-consume: assigned\n");
	setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
	signal(SIGTERM, on_term);

	long		got = 0;
	long long	last = 0;

	/*
	 * Wait for one message, then take what else is ready without waiting
	 * (a batch call that waited for a full batch would hold back the time
	 * a message is received): one queue lock per batch, not per message;
	 * never more than COUNT in all.
	 */
	rd_kafka_queue_t *queue = rd_kafka_queue_get_consumer(rk);
	rd_kafka_message_t *batch[BATCH];

	while (!stopping && (count < 0 || got < count) && now_us() < deadline &&
		   !(idle_ms >= 0 && last > 0 && now_us() - last > idle_ms * 1000LL))
	{
		size_t		want = count < 0 || count - got > BATCH ? BATCH : (size_t) (count - got);
		ssize_t		n = 0;

		if ((batch[0] = rd_kafka_consumer_poll(rk, 20)) != NULL)
			n = 1 + (want > 1 ? rd_kafka_consume_batch_queue(queue, 0, batch + 1, want - 1) : 0);
		for (ssize_t i = 0; i < n; i++)
		{
			if (!batch[i]->err)
			{
				print_message(batch[i]);
				got++;
				last = now_us();
			}
			rd_kafka_message_destroy(batch[i]);
		}
	}
	rd_kafka_queue_destroy(queue);
	fflush(stdout);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return (count < 0 || got >= count) ? 0 : 1;
}
