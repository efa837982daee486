/*
 * chaos_inventory.c
 *		outbox-chaos-inventory: the inventory service of the chaos suite, a
 *		Kafka consumer that reserves stock for each order event.
 *
 * Each message is applied by reserve(event_id, biz_type, biz_key, payload)
 * in the inventory database (test/chaos/schema.sql), one transaction that
 * calls outbox.claim and, when the claim is won, writes the reservation
 * ledger: the design article's consumer.  Offsets are stored only after
 * that transaction commits and committed to Kafka once a second, so a
 * crash redelivers what came after the last commit; a lost connection
 * (crash, failover) means the outcome is unknown and the same message is
 * applied again, which the claim turns into a no-op if it had committed.
 * SIGUSR1 stops storing offsets from then on: what is applied afterwards
 * is sure to come again after a crash, so a test that kills the consumer
 * need not hope a kill fell within the last second's offsets.
 *
 * usage: outbox-chaos-inventory -b BROKERS -t TOPIC -d CONNINFO [-g GROUP]
 *		Runs until SIGTERM or SIGINT; prints a summary on stderr.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "chaos_client.h"
#include <librdkafka/rdkafka.h>

/* Set by SIGUSR1: no offset is stored from then on. */
static volatile sig_atomic_t hold_offsets;

static struct
{
	long		messages;
	long		applied;
	long		duplicates;
	long		retries;
	long		skipped;
}			counts;

/* The value of header NAME as a NUL-terminated copy in buf, or NULL. */
static const char *
header(const rd_kafka_message_t *m, const char *name, char *buf, size_t size)
{
	rd_kafka_headers_t *hdrs;
	const void *val;
	size_t		len;

	if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		rd_kafka_header_get_last(hdrs, name, &val, &len) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		len >= size)
		return NULL;
	memcpy(buf, val, len);
	buf[len] = '\0';
	return buf;
}

static void
on_hold_offsets(int sig)
{
	(void) sig;
	hold_offsets = 1;
}

/*
 * Apply one event: 1 applied, 0 a duplicate the claim refused, -1 unknown
 * (the database failed; the caller retries).
 */
static int
apply(PGconn *conn, const char *event_id, const char *biz_type, const char *biz_key,
	  const char *payload)
{
	const char *params[4] = {event_id, biz_type, biz_key, payload};
	PGresult   *res = PQexecParams(conn, "SELECT reserve($1, $2, $3, $4)", 4, NULL,
								   params, NULL, NULL, 0);
	int			result = -1;

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		result = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	else if (PQstatus(conn) == CONNECTION_OK)
		fprintf(stderr, "outbox-chaos-inventory: %s", PQresultErrorMessage(res));
	PQclear(res);
	return result;
}

/* Apply a message until its outcome is known; false once stopped. */
static int
handle(const rd_kafka_message_t *m, PGconn **conn, const char *conninfo)
{
	char		id[32], type[256], key[256], *payload;
	int			r;

	counts.messages++;
	if (!header(m, "event_id", id, sizeof(id)) || !header(m, "biz_type", type, sizeof(type)) ||
		!header(m, "biz_key", key, sizeof(key)))
	{
		counts.skipped++;
		return 1;
	}
	payload = strndup(m->payload ? (const char *) m->payload : "", m->len);
	while ((r = apply(*conn, id, type, key, payload)) < 0)
	{
		counts.retries++;
		if (PQstatus(*conn) != CONNECTION_OK)
		{
			PQfinish(*conn);
			if ((*conn = connect_db(conninfo)) == NULL)
				break;
		}
		sleep_ms(50);
	}
	free(payload);
	if (r < 0)
		return 0;
	if (r)
		counts.applied++;
	else
		counts.duplicates++;
	/* Committed as offset + 1: where a restart resumes. */
	if (!hold_offsets)
		rd_kafka_offset_store(m->rkt, m->partition, m->offset);
	return 1;
}

/* A consumer of TOPIC in GROUP, committing stored offsets once a second. */
static rd_kafka_t *
make_consumer(const char *brokers, const char *topic, const char *group)
{
	char		err[512];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_topic_partition_list_t *topics;

	if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "group.id", group, err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "auto.commit.interval.ms", "1000", err, sizeof(err)) ||
		/* A killed member's partitions move on after this, not 45 s. */
		rd_kafka_conf_set(conf, "session.timeout.ms", "6000", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "heartbeat.interval.ms", "1000", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "allow.auto.create.topics", "true", err, sizeof(err)) ||
		rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err)) ||
		!(rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err))))
	{
		fprintf(stderr, "outbox-chaos-inventory: %s\n", err);
		return NULL;
	}
	rd_kafka_poll_set_consumer(rk);
	topics = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(topics, topic, RD_KAFKA_PARTITION_UA);
	rd_kafka_subscribe(rk, topics);
	rd_kafka_topic_partition_list_destroy(topics);
	return rk;
}

int
main(int argc, char **argv)
{
	const char *brokers = NULL, *topic = NULL, *conninfo = NULL, *group = "inventory";
	rd_kafka_t *rk;
	PGconn	   *conn;
	int			opt;

	while ((opt = getopt(argc, argv, "b:t:d:g:")) != -1)
	{
		switch (opt)
		{
			case 'b': brokers = optarg; break;
			case 't': topic = optarg; break;
			case 'd': conninfo = optarg; break;
			case 'g': group = optarg; break;
			default: brokers = NULL; break;
		}
	}
	if (!brokers || !topic || !conninfo)
	{
		fprintf(stderr, "usage: outbox-chaos-inventory -b BROKERS -t TOPIC -d CONNINFO [-g GROUP]\n");
		return 2;
	}
	stop_on_signals();
	signal(SIGUSR1, on_hold_offsets);
	if ((rk = make_consumer(brokers, topic, group)) == NULL || (conn = connect_db(conninfo)) == NULL)
		return 1;

	while (!stop)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		int			ok = 1;

		if (!m)
			continue;
		if (!m->err)
			ok = handle(m, &conn, conninfo);
		rd_kafka_message_destroy(m);
		if (!ok)
			break;
	}
	fprintf(stderr, "inventory: %ld messages, %ld applied, %ld duplicates refused by the claim, %ld retried after a database failure, %ld without event headers\n",
			counts.messages, counts.applied, counts.duplicates, counts.retries, counts.skipped);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	PQfinish(conn);
	return 0;
}
