/*
 * kafka.c
 *		The Kafka producer: the only file that talks to librdkafka.
 *
 * librdkafka runs threads of its own, and no PostgreSQL function may be
 * called from them.  Log lines and delivery reports are therefore queued
 * inside librdkafka (log.queue) and served by rd_kafka_poll/rd_kafka_flush
 * on the worker's thread; the callbacks only copy what they are given, and
 * the copies are written to the server log after librdkafka has returned.
 * Every text librdkafka gives (log lines, error events, rd_kafka_new's
 * errors) is first scrubbed of the properties' values (kafka_scrub.c):
 * librdkafka quotes them, secrets included, whatever their names.
 *
 * A fault that lasts makes librdkafka say the same thing again and again
 * (every reconnect, every retry, every producer re-created after a fatal
 * error), often twice (a log line and an error event).  A line like one
 * written less than LOG_REPEAT_MS ago is counted instead of written; the
 * next one written says how many were left out.  The latest warning or
 * error is also kept for outbox.relay_status() (outbox_kafka_new_problem):
 * a relay waiting for acknowledgements says what librdkafka is struggling
 * with.
 *
 * A fatal error (the idempotent producer can no longer guarantee order,
 * or the cluster refuses it an id) ends this producer, not the relay: the
 * worker makes a new one after its backoff, and every event the old one
 * failed counts as not delivered, for the producer's sake, not refused.
 *
 * src/kafka.c
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

#include "kafka.h"

/* Log lines kept between two calls of flush_log(). */
#define LOG_SLOTS 32
#define LOG_LINE_LEN 512

/* Lines written lately, remembered to leave out their repeats. */
#define REPEAT_SLOTS 16
#define LOG_REPEAT_MS 60000

/* How long to wait for the cluster's word on a topic that stalls. */
#define METADATA_TIMEOUT_MS 2000

/* The same, when judging a timed-out message: the relay's loop waits. */
#define REFUSAL_CHECK_TIMEOUT_MS 500

/*
 * After a question about a topic the cluster left unanswered, how long no
 * other is asked: a broker that answers late would otherwise block the
 * loop for each topic in turn (20 topics waiting kept it blocked all the
 * time), while events of every other topic wait behind it.
 */
#define METADATA_QUIET_MS 5000

/*
 * Topics this producer has sent to: their handles (librdkafka looks a topic
 * up by name under its global lock on every send by name) and their
 * metadata, asked for before their first send.  Open addressing.
 */
#define KNOWN_TOPICS 256
#define FIRST_METADATA_TIMEOUT_MS 200

/* Topics judged lately, and how long a judgement holds. */
#define REFUSAL_SLOTS 16
#define REFUSAL_KEEP_MS 5000

/*
 * The rule for a topic the cluster refuses.  An authorization failure or
 * an invalid name is the cluster's answer for good (until an operator
 * acts): the events of such a topic fail at once, each failure an attempt,
 * with the cluster's error.  librdkafka may hold them instead until
 * message.timeout.ms (2.0 does when a Metadata answer lists partitions
 * beside the error), so the relay takes them back (take_back_refused) and
 * refuses new ones at once while the judgement holds (REFUSAL_KEEP_MS;
 * then the next send asks again).  An unknown topic
 * is not judged so: it may be created a moment later, so librdkafka's
 * topic.metadata.propagation.max.ms (30 s) passes before it fails, and
 * its events then wait for it (outbox_kafka_topic_missing, event_state.c)
 * rather than count toward death.
 */

/*
 * How long librdkafka keeps trying a message, unless a property says
 * otherwise.  librdkafka's own default (5 minutes) is how long each try of
 * an event of a refused topic would last; 30 s rides out a leader election
 * or a broker restart, and bounds how soon an event of a refused topic is
 * dead: outbox.max_attempts x (30 s + the backoff).
 */
#define DEFAULT_MESSAGE_TIMEOUT_MS "30000"

/*
 * How long librdkafka waits for more messages before sending, unless a
 * property says otherwise.  The relay hands over whole batches, so waiting
 * for more (librdkafka's default is 5 ms) only adds to every event's
 * latency; under load, batches still form while requests are in flight.
 */
#define DEFAULT_LINGER_MS "1"

/*
 * Where a keyed message goes, unless a property says otherwise: murmur2 of
 * the key, as Java's kafka-clients (and so Kafka Streams, Kafka Connect,
 * Debezium) choose, so that a key lands on the partition a Java producer
 * of the same topic, or of a topic joined with it, puts it on.
 * librdkafka's own default (consistent_random, CRC32) puts most keys
 * elsewhere.  A message without a key goes to a random partition, as with
 * librdkafka's default.
 */
#define DEFAULT_PARTITIONER "murmur2_random"

/*
 * How long the coordinator lets a transaction of the relay stay open
 * before it aborts it, unless a property says otherwise: a relay that
 * stopped mid-transaction holds read_committed consumers of its
 * partitions back until then (or until it starts again, at once).  Well
 * above message.timeout.ms: the relay itself aborts a transaction whose
 * messages time out, and one the coordinator aborted first would come back
 * to it as a fenced epoch.
 */
#define DEFAULT_TRANSACTION_TIMEOUT_MS "60000"

/*
 * The first librdkafka whose builtin unsecured OAUTHBEARER token refresher
 * does not crash (rd_kafka_sasl_oauthbearer_init returned before it set the
 * queue the token refresh timer posts to, from 1.9.0 to 2.1.1).
 */
#define UNSECURED_JWT_SAFE_VERSION 0x02020000

/* Set to a property, a text librdkafka takes only where any text goes. */
#define FREE_TEXT_PROBE "outbox: any text"

/* The GSSAPI kinit command, and what makes it print nothing. */
#define KINIT_CMD "sasl.kerberos.kinit.cmd"
#define QUIET_PREFIX "exec >/dev/null 2>&1; "

/* syslog levels librdkafka uses: up to 4 (warning) goes to the log. */
#define SYSLOG_ERR 3
#define SYSLOG_WARNING 4

typedef struct LogLine
{
	int level; /* syslog level, as librdkafka gives it */
	char text[LOG_LINE_LEN];
} LogLine;

/* A line written lately, and how many like it were left out since. */
/* What the cluster reported lately for a topic (outbox_kafka_topic_refused). */
typedef struct TopicReport
{
	uint32 hash; /* of the topic; 0 for a free slot */
	TimestampTz asked_at;
	bool refused;
	bool missing;  /* the cluster reports that the topic does not exist */
	int permanent; /* the cluster's error, if it refuses the topic for good */
	char text[128];
} TopicReport;

typedef struct RepeatedLine
{
	uint32 hash; /* of the line's gist; 0 for a free slot */
	TimestampTz written_at;
	int left_out;
} RepeatedLine;

static rd_kafka_t *producer = NULL;
static uint64 generation = 0;         /* producers made so far */
static int outstanding = 0;           /* messages sent, not yet reported */
static size_t outstanding_bytes = 0;  /* their values' bytes */
static TimestampTz last_ack_at = 0;   /* latest acknowledged delivery */
static TimestampTz unanswered_at = 0; /* a metadata question timed out */
static uint64 queued_seq = 0;         /* messages queued so far */
static uint64 acked_seq = 0;          /* the latest queued of those acked */
static uint64 failures = 0;           /* messages refused or failed so far */
static int wake_pipe[2] = {-1, -1};   /* readable when librdkafka has news */
static bool fatal_error = false;
static bool transactional = false;           /* a transactional.id was given */
static const char *broker_state = "unknown"; /* "up", "down", "unknown" */
static LogLine log_lines[LOG_SLOTS];
static int log_count = 0;
static int log_dropped = 0;
static RepeatedLine repeated[REPEAT_SLOTS];
static TopicReport reports[REFUSAL_SLOTS];
typedef struct KnownTopic
{
	uint32 hash;           /* 0 for a free slot */
	rd_kafka_topic_t *rkt; /* NULL if librdkafka refused the name */
} KnownTopic;
static KnownTopic known_topics[KNOWN_TOPICS];
static char latest_problem[LOG_LINE_LEN]; /* latest warning, "" after a delivery */
static bool problem_unsaid = false;       /* not yet published */
static char stalled_topic[256]; /* of the latest message not acknowledged */
static char start_problem[512]; /* why the latest producer was not made */

static rd_kafka_conf_t *make_conf(const char *brokers, const char *properties,
								  const char *transactional_id, char *problem,
								  size_t size);
static rd_kafka_conf_t *user_conf(rd_kafka_conf_t *conf, const char *brokers,
								  const char *properties, char *problem,
								  size_t size);
static bool apply_properties(rd_kafka_conf_t *conf, const char *properties,
							 char *problem, size_t size, const char **hint);
static bool crashing_combination(rd_kafka_conf_t *conf, char *problem,
								 size_t size, const char **hint);
static void scrub_values_of(const char *properties);
static bool names_no_secret(const char *key, const char *value);
static bool takes_free_text(const char *key);
static void scrub_template(char *value);
static bool quiet_kinit(rd_kafka_conf_t *conf, char *problem, size_t size);
static bool apply_entry(rd_kafka_conf_t *conf, char *entry, int position,
						char *problem, size_t size);
static char *next_entry(const char **cursor);
static char *trimmed(char *text);
static KafkaSendResult refused_at_once(OutboxMessage *msg,
									   rd_kafka_resp_err_t err);
static void take_back_overdue(void);
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg,
						void *opaque);
static void on_log(const rd_kafka_t *rk, int level, const char *fac,
				   const char *buf);
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque);
static void keep_log_line(int level, const char *text);
static void flush_log(void);
static bool leave_out(const char *text, TimestampTz now, int *left_out);
static void note_problem(const char *line);
static const char *gist(const char *text);
static bool topic_error(const char *topic, char *text, size_t size);
static bool is_transient(rd_kafka_t *rk, rd_kafka_resp_err_t err);
static bool is_unknown_topic(rd_kafka_resp_err_t err);
static rd_kafka_resp_err_t topic_metadata_error(const char *topic);
static rd_kafka_resp_err_t topic_metadata_error_within(const char *topic,
													   int timeout_ms);
static rd_kafka_topic_t *known_topic(const char *topic);
static TopicReport *topic_report(const char *topic);
static void judge(TopicReport *slot, rd_kafka_resp_err_t err, bool held);
static bool refused_for_good(rd_kafka_resp_err_t err);
static rd_kafka_resp_err_t permanent_refusal(const char *topic, bool ask_again);
static bool refusal_confirmed(const char *topic);
static KafkaSendResult refused_unconfirmed(OutboxMessage *msg,
										   rd_kafka_resp_err_t err);
static void take_back_refused(void);
static void forget_topics(void);
static bool open_wake_pipe(void);
static void drain_wake_pipe(void);

/*
 * outbox_kafka_start: create the producer.  False, with the reason in the
 * server log, if the settings are unusable; the caller retries on reload.
 */
bool
outbox_kafka_start(const char *brokers, const char *properties,
				   const char *transactional_id)
{
	char *problem = start_problem;
	size_t size = sizeof(start_problem);
	const char *property;
	rd_kafka_conf_t *conf;

	Assert(producer == NULL);
	outbox_scrub_forget();
	scrub_values_of(properties);
	outbox_kafka_deadline_reset();
	conf = make_conf(brokers, properties, transactional_id, problem, size);
	if (conf == NULL)
	{
		outbox_scrub(problem, problem, size);
		ereport(LOG, (errmsg("outbox relay: unusable Kafka settings"),
					  errdetail("%s", problem),
					  errhint("Fix outbox.kafka_properties and reload.")));
		return false;
	}
	if (outbox_kafka_unreadable_file(conf, problem, size, &property))
	{
		rd_kafka_conf_destroy(conf);
		ereport(LOG, (errmsg("outbox relay: %s", problem),
					  errdetail("librdkafka reads it to connect to Kafka."),
					  errhint("Make the file readable by the operating system user "
							  "the server runs as, or fix property \"%s\" in "
							  "outbox.kafka_properties, and reload.",
							  property)));
		return false;
	}
	/* On success rd_kafka_new owns conf; on failure it is ours to free. */
	producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, problem, size);
	if (producer == NULL)
	{
		rd_kafka_conf_destroy(conf);
		outbox_scrub(problem, problem, size);
		ereport(LOG,
				(errmsg("outbox relay: could not create the Kafka producer"),
				 errdetail("librdkafka: %s", problem),
				 errhint("Check that the security settings in "
						 "outbox.kafka_properties match the brokers' listener "
						 "and that the files they name hold what they should, "
						 "and reload.")));
		return false;
	}
	start_problem[0] = '\0';
	rd_kafka_set_log_queue(producer, NULL);
	generation++;
	transactional = transactional_id != NULL;
	memset(reports, 0, sizeof(reports));
	unanswered_at = 0;
	outstanding = 0;
	outstanding_bytes = 0;
	memset(known_topics, 0, sizeof(known_topics));
	fatal_error = false;
	broker_state = "unknown";
	if (!open_wake_pipe())
	{
		rd_kafka_destroy(producer);
		producer = NULL;
		ereport(LOG, (errmsg("outbox relay: could not create a pipe: %m")));
		return false;
	}
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
	if (fatal_error)
		keep_log_line(
			SYSLOG_ERR,
			"the producer had a fatal error: making a new one; events it did not deliver are sent again");
	rd_kafka_purge(producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_poll(producer, 0);
	forget_topics();
	rd_kafka_destroy(producer);
	producer = NULL;
	outstanding = 0;
	outstanding_bytes = 0;
	outbox_kafka_deadline_reset();
	drain_wake_pipe(); /* what the old producer said is served */
	flush_log();
}

/*
 * outbox_kafka_producer: the producer, for kafka_txn.c; NULL if none.
 */
struct rd_kafka_s *
outbox_kafka_producer(void)
{
	return producer;
}

/*
 * outbox_kafka_generation: how many producers were made so far: a new
 * number says a new producer, whose transactions start afresh.
 */
uint64
outbox_kafka_generation(void)
{
	return generation;
}

/*
 * outbox_kafka_reader_conf: a configuration for a consumer of the same
 * cluster, with the same properties (TLS, SASL) as the producer, and its
 * log lines kept as the producer's are; NULL, with the problem said, if
 * the settings are unusable.
 */
struct rd_kafka_conf_s *
outbox_kafka_reader_conf(const char *brokers, const char *properties,
						 char *problem, size_t size)
{
	rd_kafka_conf_t *conf;

	scrub_values_of(properties);
	conf = user_conf(rd_kafka_conf_new(), brokers, properties, problem, size);
	if (conf == NULL)
		outbox_scrub(problem, problem, size);
	return conf;
}

/*
 * outbox_kafka_max_message_bytes: the producer's message.max.bytes, the
 * largest message (as librdkafka counts it) it accepts; 0 without one.
 */
int
outbox_kafka_max_message_bytes(void)
{
	char value[32];
	size_t size = sizeof(value);

	if (producer == NULL ||
		rd_kafka_conf_get(rd_kafka_conf(producer), "message.max.bytes", value,
						  &size) != RD_KAFKA_CONF_OK)
		return 0;
	return atoi(value);
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
 * outbox_kafka_send: queue one message (librdkafka copies it).  Never
 * waits: KAFKA_FULL if librdkafka's local queue is full (the caller sends
 * it later), KAFKA_REFUSED if refused at once (msg->error says why).
 */
KafkaSendResult
outbox_kafka_send(OutboxMessage *msg)
{
	rd_kafka_headers_t *headers;
	rd_kafka_topic_t *rkt = known_topic(msg->topic); /* may judge it */
	rd_kafka_resp_err_t err = permanent_refusal(msg->topic, true);

	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		return refused_at_once(msg, err);
	headers = rd_kafka_headers_new(msg->nheaders);
	for (int i = 0; i < msg->nheaders; i++)
		rd_kafka_header_add(headers, msg->header_names[i], -1,
							msg->header_values[i], -1);
	if (rkt != NULL)
		err = rd_kafka_producev(
			producer, RD_KAFKA_V_RKT(rkt),
			RD_KAFKA_V_KEY(msg->key, msg->key_len),
			RD_KAFKA_V_VALUE((void *) msg->value, msg->value_len),
			RD_KAFKA_V_HEADERS(headers),
			RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(msg),
			RD_KAFKA_V_END);
	else
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
		outstanding_bytes += msg->value_len;
		msg->queued = true;
		msg->seq = ++queued_seq;
		outbox_kafka_deadline_queued(msg);
		return KAFKA_QUEUED;
	}
	/* Not queued: the headers are still ours. */
	rd_kafka_headers_destroy(headers);
	if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
		return KAFKA_FULL;
	if (refused_for_good(err) && !refusal_confirmed(msg->topic))
		return refused_unconfirmed(msg, err);
	return refused_at_once(msg, err);
}

/*
 * refusal_confirmed: whether the cluster refuses topic for good by the
 * relay's own judgement, asked now unless it was within REFUSAL_KEEP_MS.
 * librdkafka fails a topic's messages at once while its latest metadata
 * refused the topic, and keeps that until its next answer: when the relay's
 * question went unanswered (as after a replay, the ACL given back, with the
 * broker slow to answer), librdkafka's word is older than the relay's.
 */
static bool
refusal_confirmed(const char *topic)
{
	char text[128];

	return outbox_kafka_topic_refused(topic, text, sizeof(text)) &&
		   topic_report(topic)->permanent != 0;
}

/*
 * refused_unconfirmed: msg was refused at once for err, a refusal for good
 * that librdkafka remembers but the cluster did not confirm: a failure for
 * the broker's sake, tried again after a backoff and never dead for it.
 */
static KafkaSendResult
refused_unconfirmed(OutboxMessage *msg, rd_kafka_resp_err_t err)
{
	/* Static, as librdkafka's texts are: one per error refused_for_good. */
	static char texts[2][160];
	char *text = texts[err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED];

	snprintf(text, sizeof(texts[0]),
			 "%s, as librdkafka last heard; the cluster has not confirmed "
			 "it since",
			 rd_kafka_err2str(err));
	(void) refused_at_once(msg, err);
	msg->transient = true;
	msg->error_text = text;
	return KAFKA_REFUSED;
}

/*
 * refused_at_once: msg was refused when sent, for err.
 */
static KafkaSendResult
refused_at_once(OutboxMessage *msg, rd_kafka_resp_err_t err)
{
	msg->done = true;
	msg->error = err;
	msg->transient = is_transient(producer, err);
	msg->topic_unknown = is_unknown_topic(err);
	msg->error_text = rd_kafka_err2str(err);
	failures++;
	return KAFKA_REFUSED;
}

/*
 * outbox_kafka_refuse: answer for msg without sending it, refused for its
 * own sake (never the broker's): text, a static string, says why.
 */
KafkaSendResult
outbox_kafka_refuse(OutboxMessage *msg, const char *text)
{
	msg->done = true;
	msg->error = RD_KAFKA_RESP_ERR__INVALID_ARG;
	msg->transient = false;
	msg->error_text = text;
	failures++;
	return KAFKA_REFUSED;
}

/*
 * outbox_kafka_push: send what was queued now, without waiting out
 * linger.ms: a batch is whole once the relay has queued it, and lingering
 * would only delay it.  Serves reports already in, never waits.
 */
void
outbox_kafka_push(void)
{
	if (producer == NULL)
		return;
	(void) rd_kafka_flush(producer, 0);
	take_back_overdue();
	flush_log();
}

/*
 * outbox_kafka_in_flight: messages librdkafka holds for us, and the bytes
 * of their values.
 */
void
outbox_kafka_in_flight(int *messages, size_t *bytes)
{
	*messages = outstanding;
	*bytes = outstanding_bytes;
}

/*
 * outbox_kafka_last_ack: when Kafka last acknowledged a message.
 */
TimestampTz
outbox_kafka_last_ack(void)
{
	return last_ack_at;
}

/*
 * outbox_kafka_failures: how many messages failed so far (refused when
 * queued, or reported failed): unchanged, nothing sent since failed.
 */
uint64
outbox_kafka_failures(void)
{
	return failures;
}

/*
 * outbox_kafka_acked_seq: the seq of the latest queued event Kafka has
 * acknowledged (0 if none): a message queued before it and still
 * unanswered waits for something other than Kafka's pace.  A progress
 * record is left out: sent with a round's events, it is often answered
 * before an event whose topic is new to the cluster, and such an event
 * would be taken for stuck (flight.c).
 */
uint64
outbox_kafka_acked_seq(void)
{
	return acked_seq;
}

/*
 * outbox_kafka_wake_fd: a descriptor that becomes readable when librdkafka
 * has delivery reports or log lines to serve, for the worker's one wait;
 * -1 without a producer.
 */
int
outbox_kafka_wake_fd(void)
{
	return producer == NULL ? -1 : wake_pipe[0];
}

/*
 * outbox_kafka_serve: serve whatever librdkafka has queued for us (logs,
 * errors, late delivery reports) without waiting.
 */
void
outbox_kafka_serve(void)
{
	if (producer != NULL)
	{
		drain_wake_pipe();
		rd_kafka_poll(producer, 0);
		take_back_overdue();
	}
	flush_log();
}

/*
 * take_back_overdue: once a message has waited message.timeout.ms outside
 * a Kafka transaction, take back every message librdkafka holds, before
 * anything younger of its partition can leave (kafka_deadline.c).  They
 * come back as timed out or purged, and are sent again in order.  What
 * Kafka already holds of a partition's messages is a prefix of them (one
 * epoch's messages are written only in sequence): sent again, a
 * duplicate, not a reordering.  Their reports are served at once (the
 * purge waits until librdkafka has queued them): a batch read before the
 * relay knew of the failures would go out ahead of the events sent again.
 */
static void
take_back_overdue(void)
{
	if (transactional || !outbox_kafka_deadline_passed())
		return;
	(void) rd_kafka_purge(producer,
						  RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_poll(producer, 0);
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
 * outbox_kafka_fence: whether err is the coordinator's word that the
 * producer's epoch is no longer current (another producer of its
 * transactional.id, or its own transaction's timeout, bumped it).
 */
bool
outbox_kafka_fence(int err)
{
	return err == RD_KAFKA_RESP_ERR__FENCED ||
		   err == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
		   err == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH;
}

/*
 * outbox_kafka_stall_reason: why the latest messages were not acknowledged,
 * as a sentence: the error the cluster reports for their topic (asked
 * briefly, unless every broker is down), else librdkafka's latest problem.
 */
char *
outbox_kafka_stall_reason(void)
{
	char text[LOG_LINE_LEN + 300];

	if (producer != NULL && stalled_topic[0] != '\0' &&
		strcmp(broker_state, "down") != 0 &&
		topic_error(stalled_topic, text, sizeof(text)))
		return pstrdup(text);
	if (latest_problem[0] != '\0')
		return psprintf("librdkafka: %s.", latest_problem);
	return pstrdup("No acknowledgement came in time.");
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
 * be a secret), and *hint, if not NULL, says what to set instead.
 */
bool
outbox_kafka_check_properties(const char *properties, char *problem,
							  size_t size, const char **hint)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	bool ok = apply_properties(conf, properties, problem, size, hint);

	rd_kafka_conf_destroy(conf);
	return ok;
}

/*
 * outbox_kafka_files_fingerprint: into *fingerprint, a fingerprint of the
 * files properties name (outbox_kafka_conf_fingerprint), for the worker to
 * tell a renewed certificate or key from the one its producer read.  False
 * if one could not be read, problem saying which and why.  Properties
 * librdkafka refuses name no file: the producer's start says what is
 * wrong with them.  Called on the worker's thread only.
 */
bool
outbox_kafka_files_fingerprint(const char *properties, uint64 *fingerprint,
							   char *problem, size_t size)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	bool ok = true;

	if (apply_properties(conf, properties, problem, size, NULL))
		ok = outbox_kafka_conf_fingerprint(conf, fingerprint, problem, size);
	else
		*fingerprint = 0;
	rd_kafka_conf_destroy(conf);
	return ok;
}

/*
 * make_conf: the producer configuration: safe defaults, then the user's
 * properties, then the callbacks that keep librdkafka off our functions.
 */
static rd_kafka_conf_t *
make_conf(const char *brokers, const char *properties,
		  const char *transactional_id, char *problem, size_t size)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();

	/* exactly_once: the relay's own id, and a bound on a stalled one. */
	if (transactional_id != NULL &&
		(rd_kafka_conf_set(conf, "transactional.id", transactional_id, problem,
						   size) != RD_KAFKA_CONF_OK ||
		 rd_kafka_conf_set(conf, "transaction.timeout.ms",
						   DEFAULT_TRANSACTION_TIMEOUT_MS, problem,
						   size) != RD_KAFKA_CONF_OK))
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}

	/*
	 * Defaults a user may override: at-least-once with no reordering, keys
	 * placed as Java's clients place them.
	 */
	if (rd_kafka_conf_set(conf, "enable.idempotence", "true", problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "acks", "all", problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "client.id", "outbox-relay", problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "message.timeout.ms", DEFAULT_MESSAGE_TIMEOUT_MS,
						  problem, size) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "linger.ms", DEFAULT_LINGER_MS, problem,
						  size) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "partitioner", DEFAULT_PARTITIONER, problem,
						  size) != RD_KAFKA_CONF_OK)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	conf = user_conf(conf, brokers, properties, problem, size);
	if (conf == NULL)
		return NULL;
	/* Outside a transaction, the relay keeps message.timeout.ms itself. */
	if (transactional_id == NULL &&
		!outbox_kafka_deadline_conf(conf, problem, size))
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_error_cb(conf, on_error);
	return conf;
}

/*
 * user_conf: conf with the user's properties and brokers, and log lines
 * queued for flush_log; NULL (conf freed) if they are unusable.
 */
static rd_kafka_conf_t *
user_conf(rd_kafka_conf_t *conf, const char *brokers, const char *properties,
		  char *problem, size_t size)
{
	if (!apply_properties(conf, properties, problem, size, NULL) ||
		!quiet_kinit(conf, problem, size) ||
		rd_kafka_conf_set(conf, "bootstrap.servers", brokers, problem, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "log.queue", "true", problem, size) !=
			RD_KAFKA_CONF_OK)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_log_cb(conf, on_log);
	return conf;
}

/*
 * quiet_kinit: have the Kerberos kinit command (GSSAPI), the property's or
 * librdkafka's default, run with its output thrown away.  librdkafka runs
 * it with system(), so what the shell and kinit print goes to the relay's
 * stdout and stderr, the server log, past outbox_scrub: "kinit: Key table
 * file '<sasl.kerberos.keytab>' not found".  librdkafka's own line on a
 * failed kinit says the exit code, and is scrubbed.  True without such a
 * property (a build without GSSAPI).
 */
static bool
quiet_kinit(rd_kafka_conf_t *conf, char *problem, size_t size)
{
	size_t cmd_size = 0;
	char *cmd;
	char *quiet;
	bool ok;

	if (rd_kafka_conf_get(conf, KINIT_CMD, NULL, &cmd_size) != RD_KAFKA_CONF_OK)
		return true;
	cmd = palloc(cmd_size + 1);
	if (rd_kafka_conf_get(conf, KINIT_CMD, cmd, &cmd_size) != RD_KAFKA_CONF_OK)
		cmd[0] = '\0';
	quiet = psprintf("%s%s", QUIET_PREFIX, cmd);
	ok = rd_kafka_conf_set(conf, KINIT_CMD, quiet, problem, size) ==
		 RD_KAFKA_CONF_OK;
	pfree(quiet);
	pfree(cmd);
	return ok;
}

/*
 * apply_properties: set each "key=value" of a ';'-separated list.  A refused
 * entry is named by its property only if librdkafka knows that name, else
 * by its position: an unknown "name" may be the tail of a password that
 * held a ';', and librdkafka's own reason may quote the value.
 */
static bool
apply_properties(rd_kafka_conf_t *conf, const char *properties, char *problem,
				 size_t size, const char **hint)
{
	const char *cursor = properties ? properties : "";
	char *entry;
	int position = 0;
	bool ok = true;

	if (hint != NULL)
		*hint = NULL;
	while (ok && (entry = next_entry(&cursor)) != NULL)
	{
		position++;
		ok = apply_entry(conf, entry, position, problem, size);
		pfree(entry);
	}
	return ok && !crashing_combination(conf, problem, size, hint);
}

/*
 * crashing_combination: whether conf asks for what crashes this librdkafka
 * (and with it the server): its builtin unsecured OAUTHBEARER token, before
 * 2.2.0, crashes the first time it is refreshed (10 s after a token it
 * could not make, or at four fifths of a token's life), whatever
 * sasl.oauthbearer.config holds.  If so, problem and *hint say why.
 */
static bool
crashing_combination(rd_kafka_conf_t *conf, char *problem, size_t size,
					 const char **hint)
{
	char value[16];
	size_t value_size = sizeof(value);

	if (rd_kafka_version() >= UNSECURED_JWT_SAFE_VERSION ||
		rd_kafka_conf_get(conf, "enable.sasl.oauthbearer.unsecure.jwt", value,
						  &value_size) != RD_KAFKA_CONF_OK ||
		strcmp(value, "true") != 0)
		return false;
	snprintf(problem, size,
			 "Property \"enable.sasl.oauthbearer.unsecure.jwt\" makes librdkafka %s "
			 "crash the server when it refreshes the token.",
			 rd_kafka_version_str());
	if (hint != NULL)
		*hint = "Use SASL mechanism PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or "
				"GSSAPI, or librdkafka 2.2.0 or later for unsecured "
				"OAUTHBEARER tokens.";
	return true;
}

/*
 * scrub_values_of: have outbox_scrub look for the value of each entry of
 * properties whose property takes free text (a secret may be any of them),
 * but the names (names_no_secret) and the paths of the files OpenSSL reads
 * (outbox_kafka_is_file_property), which say where a secret is, not what:
 * hidden, every run of four bytes of a path shredded librdkafka's TLS
 * errors ("cert", "tmp/", "ired").
 */
static void
scrub_values_of(const char *properties)
{
	const char *cursor = properties ? properties : "";
	char *entry;

	while ((entry = next_entry(&cursor)) != NULL)
	{
		char *eq = strchr(entry, '=');

		if (eq != NULL)
		{
			*eq = '\0';
			if (!names_no_secret(trimmed(entry), trimmed(eq + 1)) &&
				!outbox_kafka_is_file_property(trimmed(entry)) &&
				takes_free_text(trimmed(entry)))
				scrub_template(trimmed(eq + 1));
		}
		pfree(entry);
	}
}

/*
 * names_no_secret: whether key=value names something the client says in
 * clear: client.id, sent with every request for brokers' logs and quotas,
 * and sasl.username, the principal that brokers log and ACLs name, if the
 * value is a plain name (letters, digits, "._-@"): a typo such as a
 * space for the ";" before sasl.password puts the password in the
 * username's value.  Hidden, either cut librdkafka's own words out of its
 * lines ("ApiVersion" under client.id=relay-apiversions, "outbox"
 * everywhere under sasl.username=outbox).
 */
static bool
names_no_secret(const char *key, const char *value)
{
	if (strcmp(key, "client.id") == 0)
		return true;
	if (strcmp(key, "sasl.username") != 0)
		return false;
	for (const char *c = value; *c != '\0'; c++)
	{
		if (!isalnum((unsigned char) *c) && strchr("._-@", *c) == NULL)
			return false;
	}
	return true;
}

/*
 * scrub_template: have outbox_scrub look for value, or for each part of it
 * between the "%{property}" of a template (sasl.kerberos.kinit.cmd): those
 * name other properties, whose own values are looked for, and hiding them
 * would hide every "kerberos" librdkafka says.
 */
static void
scrub_template(char *value)
{
	char *open;

	while ((open = strstr(value, "%{")) != NULL && strchr(open, '}') != NULL)
	{
		*open = '\0';
		outbox_scrub_add(value);
		value = strchr(open + 2, '}') + 1;
	}
	outbox_scrub_add(value);
}

/*
 * takes_free_text: whether librdkafka takes any text for property key (a
 * string), rather than only a number, a boolean or one of its named
 * choices, which could hold no secret.  An unknown key counts as one: it
 * is refused before its value reaches librdkafka anyway.
 */
static bool
takes_free_text(const char *key)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char why[256];
	rd_kafka_conf_res_t res;

	res = rd_kafka_conf_set(conf, key, FREE_TEXT_PROBE, why, sizeof(why));
	rd_kafka_conf_destroy(conf);
	return res != RD_KAFKA_CONF_INVALID;
}

/*
 * apply_entry: set the property of one "key=value" entry, white space
 * around key and value ignored; an empty entry is no property.
 */
static bool
apply_entry(rd_kafka_conf_t *conf, char *entry, int position, char *problem,
			size_t size)
{
	char *eq = strchr(entry, '=');
	char *key;
	char why[256];
	char range[256];
	rd_kafka_conf_res_t res;

	if (eq == NULL && *trimmed(entry) == '\0')
		return true;
	if (eq == NULL)
	{
		snprintf(problem, size, "Entry %d is not key=value.", position);
		return false;
	}
	*eq = '\0';
	key = trimmed(entry);
	if (*key == '\0')
	{
		snprintf(problem, size, "Entry %d has no property name.", position);
		return false;
	}
	res = rd_kafka_conf_set(conf, key, trimmed(eq + 1), why, sizeof(why));
	if (res == RD_KAFKA_CONF_UNKNOWN)
		snprintf(problem, size, "Entry %d names no property librdkafka knows.",
				 position);
	else if (res != RD_KAFKA_CONF_OK &&
			 outbox_kafka_property_range(key, range, sizeof(range)))
		snprintf(problem, size,
				 "Property \"%.64s\" was refused by librdkafka (entry %d): it "
				 "takes %s.",
				 key, position, range);
	else if (res != RD_KAFKA_CONF_OK)
		snprintf(problem, size,
				 "Property \"%.64s\" was refused by librdkafka (entry %d).",
				 key, position);
	return res == RD_KAFKA_CONF_OK;
}

/*
 * next_entry: the entry of a ';'-separated list at *cursor, palloc'd, with
 * "\;" read as ';' and "\\" as '\' (so a password may hold either);
 * NULL at the end of the list.
 */
static char *
next_entry(const char **cursor)
{
	const char *p = *cursor;
	StringInfoData entry;

	if (*p == '\0')
		return NULL;
	initStringInfo(&entry);
	for (; *p != '\0' && *p != ';'; p++)
	{
		if (p[0] == '\\' && (p[1] == ';' || p[1] == '\\'))
			p++;
		appendStringInfoChar(&entry, *p);
	}
	*cursor = *p == ';' ? p + 1 : p;
	return entry.data;
}

/*
 * trimmed: text without the white space around it, cut in place.
 */
static char *
trimmed(char *text)
{
	char *end;

	while (isspace((unsigned char) *text))
		text++;
	end = text + strlen(text);
	while (end > text && isspace((unsigned char) end[-1]))
		end--;
	*end = '\0';
	return text;
}

/*
 * on_delivery: librdkafka's delivery report, called from rd_kafka_poll or
 * rd_kafka_flush on the worker's thread.  Records the outcome only.
 */
static void
on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *rkmessage, void *opaque)
{
	OutboxMessage *msg = (OutboxMessage *) rkmessage->_private;
	rd_kafka_resp_err_t err = rkmessage->err;

	outstanding--;
	if (msg == NULL)
		return;
	outstanding_bytes -= msg->value_len;
	err = outbox_kafka_deadline_answered(msg, err);
	/* Taken back by take_back_refused: the cluster's refusal is the answer. */
	if (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE &&
		permanent_refusal(msg->topic, false) != RD_KAFKA_RESP_ERR_NO_ERROR)
		err = permanent_refusal(msg->topic, false);
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		broker_state = "up";
		latest_problem[0] = '\0';
		last_ack_at = GetCurrentTimestamp();
		if (!msg->progress)
			acked_seq = Max(acked_seq, msg->seq);
	}
	msg->done = true;
	msg->error = err;
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		failures++;
	/* Only failures need classifying: not on every acknowledged message. */
	msg->transient = err != RD_KAFKA_RESP_ERR_NO_ERROR && is_transient(rk, err);
	if (msg->transient)
		strlcpy(stalled_topic, msg->topic, sizeof(stalled_topic));
	msg->error_text = err ? rd_kafka_err2str(err) : NULL;
	msg->timed_out = err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
	msg->topic_unknown = is_unknown_topic(err);
	msg->purged = err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
				  err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT;
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
	outbox_scrub(line, line, sizeof(line));
	keep_log_line(level, line);
	if (level <= SYSLOG_WARNING)
		note_problem(line);
}

/*
 * note_problem: keep a warning or error line as the latest problem; only
 * a different one is published again.
 */
static void
note_problem(const char *line)
{
	if (strcmp(latest_problem, gist(line)) == 0)
		return;
	strlcpy(latest_problem, gist(line), sizeof(latest_problem));
	problem_unsaid = true;
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
	outbox_scrub(line, line, sizeof(line));
	keep_log_line(err == RD_KAFKA_RESP_ERR__FATAL ? SYSLOG_ERR : SYSLOG_WARNING,
				  line);
	/* "All brokers are down" says less than the error that led to it. */
	if (err != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || latest_problem[0] == '\0')
		note_problem(line);
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
 * has returned and an ereport cannot unwind through it; leave out repeats
 * of lines written lately.
 */
static void
flush_log(void)
{
	TimestampTz now = GetCurrentTimestamp();

	for (int i = 0; i < log_count; i++)
	{
		const char *text = log_lines[i].text;
		const char *hint;
		int left_out = 0;

		if (log_lines[i].level > SYSLOG_WARNING)
		{
			/* Debug output (the "debug" property) is never left out. */
			ereport(DEBUG1, (errmsg("outbox relay: kafka: %s", text)));
			continue;
		}
		if (leave_out(text, now, &left_out))
			continue;
		hint = outbox_kafka_line_hint(text);
		ereport(LOG, (errmsg("outbox relay: kafka: %s", text),
					  left_out > 0 ? errdetail("Repeated %d times since it was "
											   "last written.",
											   left_out)
								   : 0,
					  hint != NULL ? errhint("%s", hint) : 0));
	}
	if (log_dropped > 0)
		ereport(LOG, (errmsg("outbox relay: kafka: %d more log lines dropped",
							 log_dropped)));
	log_count = 0;
	log_dropped = 0;
}

/*
 * outbox_kafka_new_problem: librdkafka's latest warning or error if it was
 * not asked for yet, for relay_status(); NULL if none is new.
 */
const char *
outbox_kafka_new_problem(void)
{
	if (!problem_unsaid || latest_problem[0] == '\0')
		return NULL;
	problem_unsaid = false;
	return latest_problem;
}

/*
 * outbox_kafka_start_problem: why the latest outbox_kafka_start failed,
 * with nothing of a secret in it; "" if it did not.
 */
const char *
outbox_kafka_start_problem(void)
{
	return start_problem;
}

/*
 * outbox_kafka_forget_problem: drop librdkafka's latest problem, which the
 * settings it came from no longer cause.
 */
void
outbox_kafka_forget_problem(void)
{
	latest_problem[0] = '\0';
	problem_unsaid = false;
}

/*
 * leave_out: whether a line like text was written less than LOG_REPEAT_MS
 * ago (it is then counted); if not, it is remembered as written now, and
 * left_out says how many like it were left out before.
 */
static bool
leave_out(const char *text, TimestampTz now, int *left_out)
{
	const char *g = gist(text);
	const char *end = strstr(g, " (after ");
	size_t len = end ? (size_t) (end - g) : strlen(g);
	uint32 hash = hash_bytes((const unsigned char *) g, (int) len) | 1;
	RepeatedLine *slot = &repeated[0];

	for (int i = 0; i < REPEAT_SLOTS; i++)
	{
		if (repeated[i].hash == hash)
		{
			slot = &repeated[i];
			break;
		}
		if (repeated[i].written_at < slot->written_at)
			slot = &repeated[i];
	}
	if (slot->hash == hash &&
		!TimestampDifferenceExceeds(slot->written_at, now, LOG_REPEAT_MS))
	{
		slot->left_out++;
		return true;
	}
	*left_out = slot->hash == hash ? slot->left_out : 0;
	slot->hash = hash;
	slot->written_at = now;
	slot->left_out = 0;
	return false;
}

/*
 * gist: a librdkafka line without its facility and thread names, so that
 * a log line and the error event that repeats it look alike.
 */
static const char *
gist(const char *text)
{
	const char *thread = strstr(text, "[thrd:");
	const char *colon = strchr(text, ':');

	if (thread != NULL && strstr(thread, "]: ") != NULL)
		return strstr(thread, "]: ") + 3;
	if (colon != NULL && colon[1] == ' ')
		return colon + 2;
	return text;
}

/*
 * topic_error: whether the cluster reports an error for topic or one of
 * its partitions; if so, text says which.
 */
static bool
topic_error(const char *topic, char *text, size_t size)
{
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(producer, topic, NULL);
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;

	if (rkt == NULL)
		return false;
	if (rd_kafka_metadata(producer, 0, rkt, &md, METADATA_TIMEOUT_MS) ==
			RD_KAFKA_RESP_ERR_NO_ERROR &&
		md->topic_cnt == 1)
	{
		err = md->topics[0].err;
		for (int i = 0; err == 0 && i < md->topics[0].partition_cnt; i++)
			err = md->topics[0].partitions[i].err;
	}
	if (md != NULL)
		rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		return false;
	snprintf(text, size, "The cluster reports for topic \"%s\": %s.", topic,
			 rd_kafka_err2str(err));
	return true;
}

/*
 * is_transient: whether a delivery failure says the broker could not be
 * reached in time, or the producer itself failed, rather than that this
 * message cannot be written.
 */
static bool
is_transient(rd_kafka_t *rk, rd_kafka_resp_err_t err)
{
	/* A fatal producer fails what it holds with whatever error it had. */
	if (rd_kafka_fatal_error(rk, NULL, 0) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return true;
	/*
	 * With every broker down, librdkafka cannot learn that a topic exists
	 * and, after topic.metadata.propagation.max.ms, calls it unknown: that
	 * says nothing about the topic.
	 */
	if ((err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
		 err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION) &&
		strcmp(broker_state, "down") == 0)
		return true;
	switch (err)
	{
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__RESOLVE:
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
		case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
		case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
		case RD_KAFKA_RESP_ERR__FATAL:
		case RD_KAFKA_RESP_ERR__STATE:
		case RD_KAFKA_RESP_ERR__FENCED:
		case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
		case RD_KAFKA_RESP_ERR_INVALID_TXN_STATE:
		case RD_KAFKA_RESP_ERR_PRODUCER_FENCED:
			return true;
		default:
			return false;
	}
}

/*
 * is_unknown_topic: whether err says the topic does not exist: librdkafka's
 * own word, or the broker's, which librdkafka 2.0 passes on once
 * topic.metadata.propagation.max.ms is over.
 */
static bool
is_unknown_topic(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
		   err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
}

/*
 * outbox_kafka_topic_refused: whether the cluster, asked briefly, reports
 * an error for topic (unknown, not authorized...) while it acknowledges
 * other messages: a message of that topic that timed out was then refused
 * for the topic's sake, not lost to an outage.  Bounded by
 * REFUSAL_CHECK_TIMEOUT_MS, and asked at most once per REFUSAL_KEEP_MS
 * per topic, however many of its messages time out; text says what the
 * cluster reported.
 */
bool
outbox_kafka_topic_refused(const char *topic, char *text, size_t size)
{
	TopicReport *slot;

	if (producer == NULL || strcmp(broker_state, "down") == 0)
		return false;
	slot = topic_report(topic);
	if (TimestampDifferenceExceeds(slot->asked_at, GetCurrentTimestamp(),
								   REFUSAL_KEEP_MS))
		judge(slot, topic_metadata_error(topic), true);
	if (slot->refused)
		strlcpy(text, slot->text, size);
	return slot->refused;
}

/*
 * outbox_kafka_topic_missing: whether the cluster, asked as
 * outbox_kafka_topic_refused asks, reports that topic does not exist
 * (UNKNOWN_TOPIC_OR_PART: not created yet, and the cluster does not
 * create topics on first use).  Not an authorization failure, which Kafka
 * reports as such for a topic the client may not describe, nor an invalid
 * name (TOPIC_EXCEPTION): those are refusals (refused_for_good).
 */
bool
outbox_kafka_topic_missing(const char *topic)
{
	char text[128];

	return outbox_kafka_topic_refused(topic, text, sizeof(text)) &&
		   topic_report(topic)->missing;
}

/*
 * outbox_kafka_judge_again: an operator acted (replayed the events of a
 * topic the cluster refused, once the ACL is granted): each topic judged
 * refused is asked about again at its next send, rather than its events
 * refused at once, each an attempt, for what is left of REFUSAL_KEEP_MS.
 */
void
outbox_kafka_judge_again(void)
{
	for (int i = 0; i < REFUSAL_SLOTS; i++)
		reports[i].asked_at = 0;
}

/*
 * judge: record what the cluster reported for a topic (err) in its slot.
 * A new refusal for good takes back what librdkafka holds, if it may hold
 * messages of the topic (held); one that lasts does not: while it is
 * believed, and when it is asked again, no message of the topic is sent.
 */
static void
judge(TopicReport *slot, rd_kafka_resp_err_t err, bool held)
{
	held = held && slot->permanent == 0;
	slot->asked_at = GetCurrentTimestamp();
	slot->refused = err != RD_KAFKA_RESP_ERR_NO_ERROR &&
					err != RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
	slot->missing = err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
	slot->permanent = refused_for_good(err) ? err : 0;
	strlcpy(slot->text, rd_kafka_err2str(err), sizeof(slot->text));
	if (slot->permanent && held)
		take_back_refused();
}

/*
 * topic_report: the slot of topic's latest judgement; a slot never asked
 * for (asked_at 0), the oldest one's, if topic has none.
 */
static TopicReport *
topic_report(const char *topic)
{
	uint32 hash = hash_bytes((const unsigned char *) topic, strlen(topic)) | 1;
	TopicReport *slot = &reports[0];

	for (int i = 0; i < REFUSAL_SLOTS; i++)
	{
		if (reports[i].hash == hash)
			return &reports[i];
		if (reports[i].asked_at < slot->asked_at)
			slot = &reports[i];
	}
	memset(slot, 0, sizeof(*slot));
	slot->hash = hash;
	return slot;
}

/*
 * outbox_kafka_unauthorized: whether err, a message's error, says the
 * relay's principal may not write to the message's topic.
 */
bool
outbox_kafka_unauthorized(int err)
{
	return err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
}

/*
 * refused_for_good: whether the cluster's err for a topic stays until an
 * operator acts (see the rule at the top of this file).
 */
static bool
refused_for_good(rd_kafka_resp_err_t err)
{
	return err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
		   err == RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION;
}

/*
 * permanent_refusal: the cluster's error if it refused topic for good
 * within the last REFUSAL_KEEP_MS, else none.  An older such judgement is,
 * with ask_again, asked again (a send: the topic's next event must not
 * wait for message.timeout.ms either, nor be refused once allowed);
 * without, as in a delivery report, it is none.
 */
static rd_kafka_resp_err_t
permanent_refusal(const char *topic, bool ask_again)
{
	uint32 hash = 0;
	char text[128];

	for (int i = 0; i < REFUSAL_SLOTS; i++)
	{
		/* Called on every send: hash only when some topic is refused. */
		if (reports[i].permanent != 0 && hash == 0)
			hash = hash_bytes((const unsigned char *) topic, strlen(topic)) | 1;
		if (reports[i].permanent == 0 || reports[i].hash != hash)
			continue;
		if (!TimestampDifferenceExceeds(reports[i].asked_at,
										GetCurrentTimestamp(), REFUSAL_KEEP_MS))
			return (rd_kafka_resp_err_t) reports[i].permanent;
		if (!ask_again)
			return RD_KAFKA_RESP_ERR_NO_ERROR;
		(void) outbox_kafka_topic_refused(topic, text, sizeof(text));
		return (rd_kafka_resp_err_t) reports[i].permanent;
	}
	return RD_KAFKA_RESP_ERR_NO_ERROR;
}

/*
 * take_back_refused: fail the messages librdkafka holds for a topic the
 * cluster refuses for good, now rather than at message.timeout.ms.
 * librdkafka purges only a whole producer's queues: the messages of other
 * topics not yet sent come back too, as purged (no attempt: they are sent
 * again at once); those in requests on the wire are left alone.  Not in a
 * Kafka transaction: there the relay aborts the transaction of a stuck
 * event, which takes its messages back.
 */
static void
take_back_refused(void)
{
	if (transactional)
		return;
	(void) rd_kafka_purge(producer, RD_KAFKA_PURGE_F_QUEUE);
}

/*
 * topic_metadata_error: the error the cluster reports for topic itself,
 * asked for at most REFUSAL_CHECK_TIMEOUT_MS.
 */
static rd_kafka_resp_err_t
topic_metadata_error(const char *topic)
{
	return topic_metadata_error_within(topic, REFUSAL_CHECK_TIMEOUT_MS);
}

/*
 * topic_metadata_error_within: the same, asked for at most timeout_ms;
 * not asked (no error) within METADATA_QUIET_MS of a question the cluster
 * left unanswered.
 */
static rd_kafka_resp_err_t
topic_metadata_error_within(const char *topic, int timeout_ms)
{
	rd_kafka_topic_t *rkt;
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
	rd_kafka_resp_err_t asked;

	if (unanswered_at != 0 &&
		!TimestampDifferenceExceeds(unanswered_at, GetCurrentTimestamp(),
									METADATA_QUIET_MS))
		return err;
	rkt = rd_kafka_topic_new(producer, topic, NULL);
	if (rkt == NULL)
		return err;
	asked = rd_kafka_metadata(producer, 0, rkt, &md, timeout_ms);
	unanswered_at =
		asked == RD_KAFKA_RESP_ERR__TIMED_OUT ? GetCurrentTimestamp() : 0;
	if (asked == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1)
		err = md->topics[0].err;
	if (md != NULL)
		rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);
	return err;
}

/*
 * known_topic: the producer's handle for topic, NULL if it has none (no
 * room left, or a name librdkafka refuses: then the send names the topic
 * and gets librdkafka's answer).  Before the first message of a topic, its
 * metadata is asked for (at most FIRST_METADATA_TIMEOUT_MS, once per topic
 * and producer): librdkafka would otherwise hold the message until its
 * periodic topic scan, up to a second later, asks for it.  An answer that
 * refuses the topic for good is kept as a judgement (judge).
 */
static rd_kafka_topic_t *
known_topic(const char *topic)
{
	uint32 hash = hash_bytes((const unsigned char *) topic, strlen(topic)) | 1;

	for (int n = 0; n < KNOWN_TOPICS; n++)
	{
		KnownTopic *known = &known_topics[(hash + n) % KNOWN_TOPICS];

		if (known->hash == hash &&
			(known->rkt == NULL ||
			 strcmp(rd_kafka_topic_name(known->rkt), topic) == 0))
			return known->rkt;
		if (known->hash == 0)
		{
			rd_kafka_resp_err_t err;

			known->hash = hash;
			known->rkt = rd_kafka_topic_new(producer, topic, NULL);
			err = topic_metadata_error_within(topic, FIRST_METADATA_TIMEOUT_MS);
			/* Its first event must not wait for a later one to show it stuck. */
			if (refused_for_good(err))
				judge(topic_report(topic), err, false);
			return known->rkt;
		}
	}
	return NULL; /* so many topics: librdkafka's scan finds them */
}

/*
 * forget_topics: let go of the producer's topic handles, before the
 * producer itself.
 */
static void
forget_topics(void)
{
	for (int i = 0; i < KNOWN_TOPICS; i++)
	{
		if (known_topics[i].rkt != NULL)
			rd_kafka_topic_destroy(known_topics[i].rkt);
	}
	memset(known_topics, 0, sizeof(known_topics));
}

/*
 * open_wake_pipe: a non-blocking pipe librdkafka writes to when its queue
 * of reports and log lines goes from empty to not empty.  One pipe serves
 * every producer of the process, so that the worker's wait can keep
 * watching the same descriptor.
 */
static bool
open_wake_pipe(void)
{
	rd_kafka_queue_t *main_queue;

	if (wake_pipe[0] < 0)
	{
		if (pipe(wake_pipe) != 0)
			return false;
		for (int i = 0; i < 2; i++)
		{
			(void) fcntl(wake_pipe[i], F_SETFL,
						 fcntl(wake_pipe[i], F_GETFL) | O_NONBLOCK);
			(void) fcntl(wake_pipe[i], F_SETFD, FD_CLOEXEC);
		}
	}
	main_queue = rd_kafka_queue_get_main(producer);
	rd_kafka_queue_io_event_enable(main_queue, wake_pipe[1], "1", 1);
	rd_kafka_queue_destroy(main_queue);
	return true;
}

/*
 * drain_wake_pipe: empty the pipe before serving the queue, so that news
 * arriving after the serve makes it readable again.
 */
static void
drain_wake_pipe(void)
{
	char buf[64];

	while (read(wake_pipe[0], buf, sizeof(buf)) > 0)
		;
}
