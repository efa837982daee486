/*
 * mock_broker.c
 *		outbox-mock-broker: a Kafka cluster of one broker from librdkafka's
 *		mock API, speaking the real protocol over loopback TCP, for the
 *		faults a real broker cannot make on demand.
 *
 * It prints its bootstrap address on the first line of stdout, then reads
 * commands, one per line, from stdin, and answers "ok" on stdout to each
 * (an unknown or malformed command is reported on stderr instead):
 *
 *		create TOPIC PARTITIONS          create a topic
 *		request-errors APIKEY COUNT CODE answer the next COUNT requests of
 *		                                 type APIKEY with error CODE
 *		produce-errors COUNT CODE        the same for Produce (APIKEY 0)
 *		clear [APIKEY]                   forget pending request errors, of
 *		                                 one type or of every type
 *		replace-errors APIKEY COUNT CODE clear APIKEY and request-errors in
 *		                                 one step: no request of the type
 *		                                 meets neither set of errors
 *		broker-errors APIKEY COUNT CODE  as request-errors, on the broker's
 *		                                 own stack, which can be counted:
 *		broker-errors-left APIKEY        answers "ok N": how many of them
 *		                                 no request has met yet
 *		topic-error TOPIC CODE           Metadata answers CODE for TOPIC
 *		                                 until set again (0: no error)
 *		down | up                        take the broker down or up
 *		rtt MS                           answer every request MS late
 *		quit                             stop (so does end of input)
 *
 * API keys are the protocol's: 0 Produce, 3 Metadata, 18 ApiVersions,
 * 22 InitProducerId, ...  CODE is a Kafka error code (6 NOT_LEADER, 15
 * COORDINATOR_NOT_AVAILABLE, 31 CLUSTER_AUTHORIZATION_FAILED, ...), or
 * -195 (librdkafka's __TRANSPORT) to drop the connection instead.  In
 * librdkafka 2.0.2 the mock's Metadata handler ignores request errors (a
 * Metadata response carries errors per topic): use topic-error for it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define PRODUCE_API_KEY 0
/* Above every API key the protocol defines today (KIP-932's are in the 70s). */
#define API_KEY_LIMIT 128

static void
push_errors(rd_kafka_mock_cluster_t *mc, long apikey, long count, long code)
{
	rd_kafka_resp_err_t *errs = calloc(count, sizeof(*errs));

	for (long i = 0; i < count; i++)
		errs[i] = (rd_kafka_resp_err_t) code;
	rd_kafka_mock_push_request_errors_array(mc, (int16_t) apikey, count, errs);
	free(errs);
}

/* One at a time: the broker's stack is pushed through a variadic call. */
static void
push_broker_errors(rd_kafka_mock_cluster_t *mc, long apikey, long count, long code)
{
	for (long i = 0; i < count; i++)
		rd_kafka_mock_broker_push_request_error_rtts(mc, 1, (int16_t) apikey, 1,
													 (rd_kafka_resp_err_t) code, 0);
}

/* The proof that a fault happened, where librdkafka versions log it apart. */
static void
print_broker_errors_left(rd_kafka_mock_cluster_t *mc, long apikey)
{
	size_t		left = 0;

	rd_kafka_mock_broker_error_stack_cnt(mc, 1, (int16_t) apikey, &left);
	printf("ok %zu\n", left);
	fflush(stdout);
}

static void
apply(rd_kafka_mock_cluster_t *mc, char *line)
{
	char		topic[256];
	long		a, b, c;

	if (sscanf(line, "create %255s %ld", topic, &a) == 2)
		rd_kafka_mock_topic_create(mc, topic, (int) a, 1);
	else if (sscanf(line, "request-errors %ld %ld %ld", &a, &b, &c) == 3 &&
			 a >= 0 && a < API_KEY_LIMIT && b > 0)
		push_errors(mc, a, b, c);
	else if (sscanf(line, "replace-errors %ld %ld %ld", &a, &b, &c) == 3 &&
			 a >= 0 && a < API_KEY_LIMIT && b > 0)
	{
		rd_kafka_mock_clear_request_errors(mc, (int16_t) a);
		push_errors(mc, a, b, c);
	}
	else if (sscanf(line, "broker-errors-left %ld", &a) == 1 &&
			 a >= 0 && a < API_KEY_LIMIT)
	{
		print_broker_errors_left(mc, a);
		return;
	}
	else if (sscanf(line, "broker-errors %ld %ld %ld", &a, &b, &c) == 3 &&
			 a >= 0 && a < API_KEY_LIMIT && b > 0)
		push_broker_errors(mc, a, b, c);
	else if (sscanf(line, "produce-errors %ld %ld", &a, &b) == 2 && a > 0)
		push_errors(mc, PRODUCE_API_KEY, a, b);
	else if (sscanf(line, "clear %ld", &a) == 1 && a >= 0 && a < API_KEY_LIMIT)
		rd_kafka_mock_clear_request_errors(mc, (int16_t) a);
	else if (strncmp(line, "clear", 5) == 0)
	{
		for (int k = 0; k < API_KEY_LIMIT; k++)
			rd_kafka_mock_clear_request_errors(mc, (int16_t) k);
	}
	else if (sscanf(line, "topic-error %255s %ld", topic, &a) == 2)
		rd_kafka_mock_topic_set_error(mc, topic, (rd_kafka_resp_err_t) a);
	else if (strncmp(line, "down", 4) == 0)
		rd_kafka_mock_broker_set_down(mc, 1);
	else if (strncmp(line, "up", 2) == 0)
		rd_kafka_mock_broker_set_up(mc, 1);
	else if (sscanf(line, "rtt %ld", &a) == 1)
		rd_kafka_mock_broker_set_rtt(mc, 1, (int) a);
	else
	{
		fprintf(stderr, "outbox-mock-broker: unknown command: %s", line);
		fflush(stderr);
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
