/*
 * mock_broker.c
 *		outbox-mock-broker: a Kafka cluster of one broker from librdkafka's
 *		mock API, speaking the real protocol over loopback TCP, for the
 *		faults a real broker cannot make on demand.
 *
 * It prints its bootstrap address on the first line of stdout, then reads
 * commands, one per line, from stdin:
 *
 *		create TOPIC PARTITIONS      create a topic
 *		produce-errors COUNT CODE    fail the next COUNT produce requests
 *		clear                        forget pending produce errors
 *		down | up                    take the broker down or up
 *		rtt MS                       answer every request MS late
 *		quit                         stop (so does end of input)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define PRODUCE_API_KEY 0

static void
apply(rd_kafka_mock_cluster_t *mc, char *line)
{
	char		topic[256];
	long		a, b;

	if (sscanf(line, "create %255s %ld", topic, &a) == 2)
		rd_kafka_mock_topic_create(mc, topic, (int) a, 1);
	else if (sscanf(line, "produce-errors %ld %ld", &a, &b) == 2)
	{
		rd_kafka_resp_err_t *errs = calloc(a, sizeof(*errs));

		for (long i = 0; i < a; i++)
			errs[i] = (rd_kafka_resp_err_t) b;
		rd_kafka_mock_push_request_errors_array(mc, PRODUCE_API_KEY, a, errs);
		free(errs);
	}
	else if (strncmp(line, "clear", 5) == 0)
		rd_kafka_mock_clear_request_errors(mc, PRODUCE_API_KEY);
	else if (strncmp(line, "down", 4) == 0)
		rd_kafka_mock_broker_set_down(mc, 1);
	else if (strncmp(line, "up", 2) == 0)
		rd_kafka_mock_broker_set_up(mc, 1);
	else if (sscanf(line, "rtt %ld", &a) == 1)
		rd_kafka_mock_broker_set_rtt(mc, 1, (int) a);
	else
	{
		fprintf(stderr, "outbox-mock-broker: unknown command: %s", line);
		return;
	}
	printf("ok\n");
	fflush(stdout);
}

int
main(void)
{
	char		err[512];
	char		line[1024];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;

	rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (!rk)
	{
		fprintf(stderr, "outbox-mock-broker: %s\n", err);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, 1);
	if (!mc)
	{
		fprintf(stderr, "outbox-mock-broker: could not create the mock cluster\n");
		return 1;
	}
	printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);

	while (fgets(line, sizeof(line), stdin) != NULL)
	{
		if (strncmp(line, "quit", 4) == 0)
			break;
		apply(mc, line);
	}
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}
