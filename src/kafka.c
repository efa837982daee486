/*
 * kafka.c
 *		The Kafka producer: the only file that talks to librdkafka.
 *
 * librdkafka runs threads of its own, and no PostgreSQL function may be
 * called from them.  Log lines and delivery reports are therefore queued
 * inside librdkafka (log.queue) and served by rd_kafka_poll/rd_kafka_flush
 * on the worker's thread; the callbacks only copy what they are given, and
 * the copies are written to the server log after librdkafka has returned.
 *
 * src/kafka.c
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "miscadmin.h"

#include "kafka.h"

/* Log lines kept between two calls of flush_log(). */
#define LOG_SLOTS 32
#define LOG_LINE_LEN 512

typedef struct LogLine
{
	int level; /* syslog level, as librdkafka gives it */
	char text[LOG_LINE_LEN];
} LogLine;

static rd_kafka_t *producer = NULL;
static int outstanding = 0; /* messages sent, not yet reported */
static bool fatal_error = false;
static const char *broker_state = "unknown"; /* "up", "down", "unknown" */
static LogLine log_lines[LOG_SLOTS];
static int log_count = 0;
static int log_dropped = 0;

static rd_kafka_conf_t *make_conf(const char *brokers, const char *properties,
								  char *problem, size_t size);
static bool apply_properties(rd_kafka_conf_t *conf, const char *properties,
							 char *problem, size_t size);
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg,
						void *opaque);
static void on_log(const rd_kafka_t *rk, int level, const char *fac,
				   const char *buf);
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque);
static void keep_log_line(int level, const char *text);
static void flush_log(void);
static bool is_transient(rd_kafka_resp_err_t err);

/*
 * outbox_kafka_start: create the producer.  False, with the reason in the
 * server log, if the settings are unusable; the caller retries on reload.
 */
bool
outbox_kafka_start(const char *brokers, const char *properties)
{
	char problem[512];
	rd_kafka_conf_t *conf;

	Assert(producer == NULL);
	conf = make_conf(brokers, properties, problem, sizeof(problem));
	if (conf == NULL)
	{
		ereport(LOG,
				(errmsg("outbox relay: unusable Kafka settings: %s", problem),
				 errhint("Fix outbox.kafka_properties and reload.")));
		return false;
	}
	/* On success rd_kafka_new owns conf; on failure it is ours to free. */
	producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, problem, sizeof(problem));
	if (producer == NULL)
	{
		rd_kafka_conf_destroy(conf);
		ereport(LOG,
				(errmsg("outbox relay: could not create the Kafka producer: %s",
						problem)));
		return false;
	}
	rd_kafka_set_log_queue(producer, NULL);
	outstanding = 0;
	fatal_error = false;
	broker_state = "unknown";
	return true;
}

/*
 * outbox_kafka_stop: destroy the producer.  Messages not yet acknowledged
 * are dropped here; their events are still unsent in the outbox and go out
 * again, so this loses nothing.
 */
void
outbox_kafka_stop(void)
{
	if (producer == NULL)
		return;
	rd_kafka_purge(producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_poll(producer, 0);
	rd_kafka_destroy(producer);
	producer = NULL;
	outstanding = 0;
	flush_log();
}

/*
 * outbox_kafka_running: whether there is a producer to send with.
 */
bool
outbox_kafka_running(void)
{
	return producer != NULL;
}

/*
 * outbox_kafka_send: queue one message.  False if librdkafka refused it at
 * once (msg->error says why); a full local queue is waited out instead.
 */
bool
outbox_kafka_send(OutboxMessage *msg)
{
	for (;;)
	{
		rd_kafka_headers_t *headers = rd_kafka_headers_new(msg->nheaders);
		rd_kafka_resp_err_t err;

		for (int i = 0; i < msg->nheaders; i++)
			rd_kafka_header_add(headers, msg->header_names[i], -1,
								msg->header_values[i], -1);
		err = rd_kafka_producev(
			producer, RD_KAFKA_V_TOPIC(msg->topic),
			RD_KAFKA_V_KEY(msg->key, msg->key_len),
			RD_KAFKA_V_VALUE((void *) msg->value, msg->value_len),
			RD_KAFKA_V_HEADERS(headers),
			RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(msg),
			RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			outstanding++;
			return true;
		}
		/* Not queued: the headers are still ours. */
		rd_kafka_headers_destroy(headers);
		if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
		{
			msg->done = true;
			msg->error = err;
			msg->transient = false;
			msg->error_text = rd_kafka_err2str(err);
			return false;
		}
		/* Local queue full: let deliveries drain it, then try again. */
		rd_kafka_poll(producer, 100);
		flush_log();
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * outbox_kafka_wait: serve delivery reports for up to timeout_ms; true when
 * every message sent has been reported.
 */
bool
outbox_kafka_wait(int timeout_ms)
{
	if (outstanding > 0)
		rd_kafka_flush(producer, timeout_ms);
	else
		rd_kafka_poll(producer, 0);
	flush_log();
	return outstanding == 0;
}

/*
 * outbox_kafka_serve: serve whatever librdkafka has queued for us (logs,
 * errors, late delivery reports) without waiting.
 */
void
outbox_kafka_serve(void)
{
	if (producer != NULL)
		rd_kafka_poll(producer, 0);
	flush_log();
}

/*
 * outbox_kafka_fatal: whether the producer hit a fatal error and must be
 * re-created.
 */
bool
outbox_kafka_fatal(void)
{
	return fatal_error;
}

/*
 * outbox_kafka_broker_state: "up" once a delivery succeeded, "down" once
 * librdkafka found every broker down, "unknown" before either.
 */
const char *
outbox_kafka_broker_state(void)
{
	return producer == NULL ? "unknown" : broker_state;
}

/*
 * outbox_kafka_version: librdkafka's version string.
 */
const char *
outbox_kafka_version(void)
{
	return rd_kafka_version_str();
}

/*
 * outbox_kafka_check_properties: whether librdkafka accepts properties;
 * if not, problem names the offending entry (never its value, which may
 * be a secret).
 */
bool
outbox_kafka_check_properties(const char *properties, char *problem, size_t size)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	bool ok = apply_properties(conf, properties, problem, size);

	rd_kafka_conf_destroy(conf);
	return ok;
}

/*
 * make_conf: the producer configuration: safe defaults, then the user's
 * properties, then the callbacks that keep librdkafka off our functions.
 */
static rd_kafka_conf_t *
make_conf(const char *brokers, const char *properties, char *problem, size_t size)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();

	/* Defaults a user may override: at-least-once with no reordering. */
	if (rd_kafka_conf_set(conf, "enable.idempotence", "true", problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "acks", "all", problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "client.id", "outbox-relay", problem, size) !=
			RD_KAFKA_CONF_OK ||
		!apply_properties(conf, properties, problem, size) ||
		rd_kafka_conf_set(conf, "bootstrap.servers", brokers, problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "log.queue", "true", problem, size) !=
			RD_KAFKA_CONF_OK)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_log_cb(conf, on_log);
	rd_kafka_conf_set_error_cb(conf, on_error);
	return conf;
}

/*
 * apply_properties: set each "key=value" of a ';'-separated list.
 */
static bool
apply_properties(rd_kafka_conf_t *conf, const char *properties, char *problem,
				 size_t size)
{
	char *copy = pstrdup(properties ? properties : "");
	char *save = NULL;
	bool ok = true;

	for (char *item = strtok_r(copy, ";", &save); item != NULL && ok;
		 item = strtok_r(NULL, ";", &save))
	{
		char *eq = strchr(item, '=');
		char *key = item;
		char why[256];

		while (*key == ' ' || *key == '\t' || *key == '\n')
			key++;
		if (*key == '\0')
			continue;
		if (eq == NULL)
		{
			snprintf(problem, size, "Entry \"%.64s\" is not key=value.", key);
			ok = false;
			break;
		}
		*eq = '\0';
		for (char *end = eq - 1; end >= key && (*end == ' ' || *end == '\t');
			 end--)
			*end = '\0';
		if (rd_kafka_conf_set(conf, key, eq + 1, why, sizeof(why)) !=
			RD_KAFKA_CONF_OK)
		{
			/* librdkafka's reason may quote the value: name the key only. */
			snprintf(problem, size,
					 "Property \"%.64s\" was refused by librdkafka.", key);
			ok = false;
		}
	}
	pfree(copy);
	return ok;
}

/*
 * on_delivery: librdkafka's delivery report, called from rd_kafka_poll or
 * rd_kafka_flush on the worker's thread.  Records the outcome only.
 */
static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *rkmessage, void *opaque)
{
	OutboxMessage *msg = (OutboxMessage *) rkmessage->_private;

	outstanding--;
	if (msg == NULL)
		return;
	if (rkmessage->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		broker_state = "up";
	msg->done = true;
	msg->error = rkmessage->err;
	msg->transient = is_transient(rkmessage->err);
	msg->error_text = rkmessage->err ? rd_kafka_err2str(rkmessage->err) : NULL;
}

/*
 * on_log: librdkafka's log line, served from the log queue on the worker's
 * thread; kept for flush_log().
 */
static void
on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	char line[LOG_LINE_LEN];

	snprintf(line, sizeof(line), "%s: %s", fac, buf);
	keep_log_line(level, line);
}

/*
 * on_error: librdkafka's error event, served on the worker's thread.
 */
static void
on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	char line[LOG_LINE_LEN];

	if (err == RD_KAFKA_RESP_ERR__FATAL)
		fatal_error = true;
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
		broker_state = "down";
	snprintf(line, sizeof(line), "%s: %s", rd_kafka_err2name(err), reason);
	keep_log_line(err == RD_KAFKA_RESP_ERR__FATAL ? 3 : 4, line);
}

/*
 * keep_log_line: store a line for flush_log, counting what does not fit.
 */
static void
keep_log_line(int level, const char *text)
{
	if (log_count >= LOG_SLOTS)
	{
		log_dropped++;
		return;
	}
	log_lines[log_count].level = level;
	strlcpy(log_lines[log_count].text, text, LOG_LINE_LEN);
	log_count++;
}

/*
 * flush_log: write the kept lines to the server log, now that librdkafka
 * has returned and an ereport cannot unwind through it.
 */
static void
flush_log(void)
{
	for (int i = 0; i < log_count; i++)
	{
		/* syslog levels: 0-3 errors, 4 warning, 5-6 notice/info, 7 debug */
		int elevel = log_lines[i].level <= 4 ? LOG : DEBUG1;

		ereport(elevel, (errmsg("outbox relay: kafka: %s", log_lines[i].text)));
	}
	if (log_dropped > 0)
		ereport(LOG, (errmsg("outbox relay: kafka: %d more log lines dropped",
							 log_dropped)));
	log_count = 0;
	log_dropped = 0;
}

/*
 * is_transient: whether a delivery failure says the broker could not be
 * reached in time, rather than that this message cannot be written.
 */
static bool
is_transient(rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
		case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
		case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
			return true;
		default:
			return false;
	}
}
