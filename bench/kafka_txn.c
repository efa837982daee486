/*
 * kafka_txn.c
 *		bench-kafka-txn: what a Kafka transaction per batch costs, the design
 *		question of exactly-once delivery (one transaction per relay batch,
 *		with the relay's progress written into it).  No database: the
 *		broker, librdkafka and this machine only.
 *
 *		For each batch size, in rounds whose order rotates, three ways of
 *		sending a batch of that many messages (200-byte values, 1,000 keys,
 *		the relay's producer settings: idempotence, acks=all, linger.ms=1):
 *		  idempotent   send the batch, wait until Kafka acknowledged all of
 *		               it (one batch in flight, as 0.2.0's relay);
 *		  pipelined    send PIPELINE batches back to back, wait once (several
 *		               batches in flight, as 0.3.0's relay); per batch;
 *		  transaction  begin, send the batch and one progress record to
 *		               PROGRESS_TOPIC, commit (a transactional producer can
 *		               have one transaction open at a time).
 *		Prints each size's median time per batch and its rate for each way,
 *		the transaction's rate over each of the others (the median of each
 *		round's ratio), and the median of each of the transaction's two
 *		parts: until every message is acknowledged, and the commit.
 *
 * usage: bench-kafka-txn BROKERS TOPIC PROGRESS_TOPIC SIZES ROUNDS
 *		SIZES is a comma-separated list of batch sizes.  Exit status 0 once
 *		every message was acknowledged and every transaction committed.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#define PIPELINE 8
#define MAX_SIZES 8
#define MAX_ROUNDS 64
#define TIMEOUT_MS 30000

enum Way
{
	IDEMPOTENT,
	PIPELINED,
	TRANSACTION,
	WAYS
};

static const char *const way_name[WAYS] = {"idempotent", "pipelined",
										   "transaction"};
static long long failed = 0;
static char value[200];

/*
 * The latest transaction's two parts: from begin until every message was
 * acknowledged (the partitions added to the transaction, AddPartitionsToTxn,
 * then the sends), and the commit that follows (EndTxn), in ms.
 */
static double txn_acked_ms;
static double txn_commit_ms;

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (m->err)
	{
		if (failed++ == 0)
			fprintf(stderr, "bench-kafka-txn: delivery failed: %s\n",
					rd_kafka_err2str(m->err));
	}
}

static void
die(const char *what, const char *why)
{
	fprintf(stderr, "bench-kafka-txn: %s: %s\n", what, why);
	exit(1);
}

/* A producer with the relay's settings; transactional if txn_id is set. */
static rd_kafka_t *
producer(const char *brokers, const char *txn_id)
{
	char err[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	const char *settings[][2] = {
		{"bootstrap.servers", brokers},
		{"enable.idempotence", "true"},
		{"acks", "all"},
		{"linger.ms", "1"},
		{"transactional.id", txn_id},
	};
	int n = txn_id ? 5 : 4;
	rd_kafka_t *rk;

	for (int i = 0; i < n; i++)
		if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], err,
							  sizeof(err)) != RD_KAFKA_CONF_OK)
			die(settings[i][0], err);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
		die("rd_kafka_new", err);
	return rk;
}

static void
check(rd_kafka_error_t *error, const char *what)
{
	if (error != NULL)
		die(what, rd_kafka_error_string(error));
}

static void
send_one(rd_kafka_t *rk, const char *topic, const char *key, size_t len)
{
	rd_kafka_resp_err_t err;

	while ((err = rd_kafka_producev(
				rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
				RD_KAFKA_V_VALUE(value, len),
				RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
		   RD_KAFKA_RESP_ERR__QUEUE_FULL)
		rd_kafka_poll(rk, 10);
	if (err)
		die("produce", rd_kafka_err2str(err));
}

static void
send_batch(rd_kafka_t *rk, const char *topic, int size)
{
	char key[16];

	for (int i = 0; i < size; i++)
	{
		snprintf(key, sizeof(key), "k%d", i % 1000);
		send_one(rk, topic, key, sizeof(value));
	}
	rd_kafka_poll(rk, 0);
}

static void
wait_acked(rd_kafka_t *rk)
{
	if (rd_kafka_flush(rk, TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR)
		die("flush", "not every message was answered in time");
}

/* One batch (PIPELINE of them when pipelined): milliseconds per batch. */
static double
one_batch(enum Way way, rd_kafka_t *plain, rd_kafka_t *txn, const char *topic,
		  const char *progress, int size)
{
	double start = now_ms();

	switch (way)
	{
		case IDEMPOTENT:
			send_batch(plain, topic, size);
			wait_acked(plain);
			break;
		case PIPELINED:
			for (int b = 0; b < PIPELINE; b++)
				send_batch(plain, topic, size);
			wait_acked(plain);
			return (now_ms() - start) / PIPELINE;
		case TRANSACTION:
			check(rd_kafka_begin_transaction(txn), "begin_transaction");
			send_batch(txn, topic, size);
			send_one(txn, progress, "progress", 40);
			/* commit_transaction would flush first; apart, it is timed. */
			wait_acked(txn);
			txn_acked_ms = now_ms() - start;
			check(rd_kafka_commit_transaction(txn, TIMEOUT_MS),
				  "commit_transaction");
			txn_commit_ms = now_ms() - start - txn_acked_ms;
			break;
		default:
			break;
	}
	return now_ms() - start;
}

static int
by_value(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;

	return (x > y) - (x < y);
}

static double
median(double *values, int n)
{
	qsort(values, n, sizeof(double), by_value);
	return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int
main(int argc, char **argv)
{
	int sizes[MAX_SIZES], nsizes = 0, rounds;
	double ms[MAX_SIZES][WAYS][MAX_ROUNDS];
	double acked[MAX_SIZES][MAX_ROUNDS], commit[MAX_SIZES][MAX_ROUNDS];
	char txn_id[64];
	rd_kafka_t *plain, *txn;

	if (argc != 6)
		die("usage",
			"bench-kafka-txn BROKERS TOPIC PROGRESS_TOPIC SIZES ROUNDS");
	for (char *s = strtok(argv[4], ","); s && nsizes < MAX_SIZES;
		 s = strtok(NULL, ","))
		sizes[nsizes++] = atoi(s);
	rounds = atoi(argv[5]);
	if (nsizes == 0 || rounds < 1 || rounds > MAX_ROUNDS)
		die("usage", "SIZES: n[,n...]; ROUNDS: 1-64");
	memset(value, 'x', sizeof(value));

	snprintf(txn_id, sizeof(txn_id), "bench-kafka-txn-%d", (int) getpid());
	plain = producer(argv[1], NULL);
	txn = producer(argv[1], txn_id);
	check(rd_kafka_init_transactions(txn, TIMEOUT_MS), "init_transactions");
	/* Warm-up: metadata, connections and the coordinator found. */
	for (int w = 0; w < WAYS; w++)
		(void) one_batch(w, plain, txn, argv[2], argv[3], 100);

	for (int r = 0; r < rounds; r++)
		for (int s = 0; s < nsizes; s++)
			for (int k = 0; k < WAYS; k++)
			{
				int w = (k + r) % WAYS;

				ms[s][w][r] =
					one_batch(w, plain, txn, argv[2], argv[3], sizes[s]);
				if (w == TRANSACTION)
				{
					acked[s][r] = txn_acked_ms;
					commit[s][r] = txn_commit_ms;
				}
			}

	printf("batch size\tway\tms per batch (median of %d rounds)\tevents/s\n",
		   rounds);
	for (int s = 0; s < nsizes; s++)
	{
		double over[2][MAX_ROUNDS];

		/* Ratios round by round: neighbours in time share the noise. */
		for (int r = 0; r < rounds; r++)
		{
			over[0][r] = ms[s][IDEMPOTENT][r] / ms[s][TRANSACTION][r];
			over[1][r] = ms[s][PIPELINED][r] / ms[s][TRANSACTION][r];
		}
		for (int w = 0; w < WAYS; w++)
		{
			double m = median(ms[s][w], rounds);

			printf("%d\t%s\t%.2f\t%.0f\n", sizes[s], way_name[w], m,
				   sizes[s] / m * 1000.0);
		}
		printf("%d\ttransaction's rate over idempotent's %.2fx, over "
			   "pipelined's %.2fx (medians of each round's ratio)\n",
			   sizes[s], median(over[0], rounds), median(over[1], rounds));
		printf("%d\ttransaction's parts: begin to every message acknowledged "
			   "(AddPartitionsToTxn, then the sends) %.2f ms, the commit "
			   "(EndTxn) %.2f ms (medians)\n",
			   sizes[s], median(acked[s], rounds), median(commit[s], rounds));
	}
	rd_kafka_destroy(txn);
	rd_kafka_destroy(plain);
	return failed == 0 ? 0 : 1;
}
