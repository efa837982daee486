/*
 * kafka_floor.c
 *		bench-kafka-floor: Kafka alone at a steady rate, the floor under every
 *		system's commit-to-consumer latency.  It sends RATE messages a second
 *		for SECS seconds, evenly spaced, each valued {"t": <send time, us>}
 *		as the latency measure's events are, with the relay's producer
 *		settings (idempotence, acks=all, linger.ms=1, each message pushed at
 *		once), after a second of warm-up messages (valued {"warm": 1}), so
 *		that a new producer's start stays out of the measure.  No database:
 *		what a consumer then measures is what the broker, the client
 *		libraries and this machine cost by themselves.
 *
 * usage: bench-kafka-floor BROKERS TOPIC RATE SECS
 *		Exit status 0 once every message is acknowledged.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>

static long long
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static long long failed = 0;

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (m->err)
		failed++;
}

static rd_kafka_t *
make_producer(const char *brokers)
{
	char err[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;

	if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "acks", "all", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "linger.ms", "1", err, sizeof(err)))
	{
		fprintf(stderr, "bench-kafka-floor: %s\n", err);
		exit(2);
	}
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "bench-kafka-floor: %s\n", err);
		exit(2);
	}
	return rk;
}

int
main(int argc, char **argv)
{
	rd_kafka_t *rk;
	long long rate, n, start;

	if (argc != 5 || (rate = atoll(argv[3])) <= 0 || atoll(argv[4]) <= 0)
	{
		fprintf(stderr, "usage: bench-kafka-floor BROKERS TOPIC RATE SECS\n");
		return 2;
	}
	n = rate * (atoll(argv[4]) + 1);
	rk = make_producer(argv[1]);
	start = now_us();
	for (long long i = 0; i < n; i++)
	{
		long long due = start + i * 1000000 / rate;
		char key[32], value[64];
		struct timespec ts;

		ts.tv_sec = due / 1000000;
		ts.tv_nsec = (due % 1000000) * 1000;
		clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL);
		snprintf(key, sizeof(key), "floor-%lld", i);
		if (i < rate)
			snprintf(value, sizeof(value), "{\"warm\": 1}");
		else
			snprintf(value, sizeof(value), "{\"t\": %lld}", now_us());
		while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(argv[2]),
								 RD_KAFKA_V_KEY(key, strlen(key)),
								 RD_KAFKA_V_VALUE(value, strlen(value)),
								 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								 RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
			rd_kafka_poll(rk, 10);
		rd_kafka_flush(rk, 0);
	}
	rd_kafka_flush(rk, 60000);
	if (rd_kafka_outq_len(rk) > 0 || failed > 0)
	{
		fprintf(stderr, "bench-kafka-floor: %lld failed, %d unanswered\n",
				failed, rd_kafka_outq_len(rk));
		return 1;
	}
	rd_kafka_destroy(rk);
	return 0;
}
