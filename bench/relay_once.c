/*
 * relay_once.c
 *		bench-relay-once: the design article's relayOnce (section 4.2), the
 *		row-at-a-time relay teams write by hand, as the benchmark's baseline.
 *
 *		Every poll_ms it locks up to 100 new rows with FOR UPDATE SKIP
 *		LOCKED; for each it marks SENDING, sends to Kafka and waits for the
 *		ack, marks SENT; then commits.  Payload and key as the extension
 *		sends them.
 *
 * usage: bench-relay-once CONNINFO BROKERS TOPIC POLL_MS COUNT
 *		exits once COUNT rows are sent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

static int	delivered_err = -1;

static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	delivered_err = m->err;
}

static void
exec_ok(PGconn *db, const char *sql)
{
	PGresult   *r = PQexec(db, sql);

	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "bench-relay-once: %s: %s", sql, PQerrorMessage(db));
		exit(1);
	}
	PQclear(r);
}

/* Send one message and wait for its acknowledgement, as relayOnce does. */
static int
send_sync(rd_kafka_t *rk, const char *topic, const char *key, const char *value)
{
	delivered_err = -1;
	if (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
						  RD_KAFKA_V_VALUE((void *) value, strlen(value)),
						  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END))
		return -1;
	while (delivered_err == -1)
		rd_kafka_poll(rk, 1);
	return delivered_err;
}

int
main(int argc, char **argv)
{
	char		err[512];
	long		sent = 0;

	if (argc != 6)
	{
		fprintf(stderr, "usage: bench-relay-once CONNINFO BROKERS TOPIC POLL_MS COUNT\n");
		return 2;
	}
	const char *topic = argv[3];
	int			poll_ms = atoi(argv[4]);
	long		count = atol(argv[5]);
	PGconn	   *db = PQconnectdb(argv[1]);

	if (PQstatus(db) != CONNECTION_OK)
	{
		fprintf(stderr, "bench-relay-once: %s", PQerrorMessage(db));
		return 1;
	}
	rd_kafka_conf_t *conf = rd_kafka_conf_new();

	rd_kafka_conf_set(conf, "bootstrap.servers", argv[2], err, sizeof(err));
	rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err));
	rd_kafka_conf_set(conf, "linger.ms", "0", err, sizeof(err));
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));

	while (sent < count)
	{
		exec_ok(db, "BEGIN");
		PGresult   *rows = PQexec(db,
								  "SELECT id, biz_key, payload::text FROM tx_outbox"
								  " WHERE status = 0 AND next_retry_at <= now()"
								  " ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED");

		if (PQresultStatus(rows) != PGRES_TUPLES_OK)
		{
			fprintf(stderr, "bench-relay-once: %s", PQerrorMessage(db));
			return 1;
		}
		for (int i = 0; i < PQntuples(rows); i++)
		{
			char		sql[256];
			const char *id = PQgetvalue(rows, i, 0);

			snprintf(sql, sizeof(sql), "UPDATE tx_outbox SET status = 1, updated_at = now() WHERE id = %s", id);
			exec_ok(db, sql);
			if (send_sync(rk, topic, PQgetvalue(rows, i, 1), PQgetvalue(rows, i, 2)) == 0)
				snprintf(sql, sizeof(sql), "UPDATE tx_outbox SET status = 2, updated_at = now() WHERE id = %s", id);
			else
				snprintf(sql, sizeof(sql),
						 "UPDATE tx_outbox SET status = 0, retry_count = retry_count + 1,"
						 " next_retry_at = now() + interval '1 second' WHERE id = %s", id);
			exec_ok(db, sql);
			sent++;
		}
		int			n = PQntuples(rows);

		PQclear(rows);
		exec_ok(db, "COMMIT");
		if (n == 0)
			usleep(poll_ms * 1000);
	}
	rd_kafka_flush(rk, 5000);
	rd_kafka_destroy(rk);
	PQfinish(db);
	return 0;
}
