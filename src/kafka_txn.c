/*
 * kafka_txn.c
 *		librdkafka's transactions, and the progress topic the relay keeps
 *		its exactly-once progress in.
 *
 * Each call here may wait, and each waits at most the time its caller
 * gives: a transactional step librdkafka did not finish in time is called
 * again (KAFKA_TXN_AGAIN), and librdkafka resumes where it was.  Nothing
 * here decides what to do about an outcome; exactly_once.c does.
 *
 * The progress topic is compacted, one partition, one record per relayed
 * database (keyed by its transactional.id), so reading it from the start
 * reads little.  It is read with isolation.level=read_committed up to the
 * high watermark asked first: a record of ours committed before the read
 * began is below it, and a transaction another relay still holds open
 * makes the read wait (up to the time given) rather than stop short.
 *
 * src/kafka_txn.c
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "utils/timestamp.h"

#include "kafka.h"

/* How long a record of the progress topic is kept before compaction. */
#define PROGRESS_SEGMENT_MS "600000"

static uint64 initialized = 0;    /* the producer generation initialized */
static uint64 open_in = 0;        /* the generation with a transaction open */
static TimestampTz opened_at = 0; /* when that transaction began */
/* Until when a fence may still be an outlived transaction's (see below). */
static TimestampTz outlived_until = 0;
static KafkaTxnRefusal refusal = KAFKA_TXN_ALLOWED; /* of the latest step */

static KafkaTxnResult end_txn(bool commit, int timeout_ms, char *why,
							  size_t size);
static KafkaTxnResult outcome(rd_kafka_error_t *error, char *why, size_t size);
static int transaction_timeout_ms(void);
static KafkaTxnResult progress_read(const char *brokers,
									const char *properties, const char *topic,
									const char *key, const char *const *marks,
									int timeout_ms, char **value, int *others,
									char *why, size_t size);
static KafkaTxnResult ensure_topic(const char *topic, int timeout_ms,
								   char *why, size_t size);
static KafkaTxnResult create_topic(const char *topic, int timeout_ms,
								   char *why, size_t size);
static KafkaTxnResult read_last(rd_kafka_t *consumer, const char *topic,
								const char *key, const char *const *marks,
								TimestampTz deadline, char **value,
								int *others, char *why, size_t size);
static void keep_if_marked(const rd_kafka_message_t *msg,
						   const char *const *marks, char **value, int *others);
static int remaining_ms(TimestampTz deadline);
static KafkaFence fence_of(int cause);
static KafkaTxnRefusal refusal_of(rd_kafka_resp_err_t err);
static void create_failure(const char *topic, rd_kafka_resp_err_t err,
						   const char *text, char *why, size_t size);

/*
 * outbox_kafka_txn_init: init_transactions for the current producer: asks
 * the coordinator for the transactional.id's epoch, which fences any other
 * producer with that id and aborts what it left open.
 */
KafkaTxnResult
outbox_kafka_txn_init(int timeout_ms, char *why, size_t size)
{
	rd_kafka_t *producer = outbox_kafka_producer();
	KafkaTxnResult result;

	if (producer == NULL)
		return KAFKA_TXN_AGAIN;
	if (initialized == outbox_kafka_generation())
		return KAFKA_TXN_DONE;
	result =
		outcome(rd_kafka_init_transactions(producer, timeout_ms), why, size);
	if (result == KAFKA_TXN_DONE)
		initialized = outbox_kafka_generation();
	return result;
}

/*
 * outbox_kafka_txn_begin: open a transaction (no round trip: librdkafka
 * registers partitions as messages are sent to them).
 */
KafkaTxnResult
outbox_kafka_txn_begin(char *why, size_t size)
{
	KafkaTxnResult result;

	if (initialized != outbox_kafka_generation())
		return KAFKA_TXN_AGAIN;
	result =
		outcome(rd_kafka_begin_transaction(outbox_kafka_producer()), why, size);
	if (result == KAFKA_TXN_DONE)
	{
		open_in = outbox_kafka_generation();
		opened_at = GetCurrentTimestamp();
	}
	return result;
}

/*
 * outbox_kafka_txn_open: whether the current producer has a transaction
 * open.
 */
bool
outbox_kafka_txn_open(void)
{
	return outbox_kafka_producer() != NULL &&
		   open_in == outbox_kafka_generation();
}

/*
 * The coordinator looks for transactions past their timeout every
 * transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s by
 * default); a fence that follows one outlived transaction by up to this
 * much more may still be its coordinator's abort.
 */
#define OUTLIVED_SLACK_MS 30000

/*
 * outbox_kafka_txn_fenced: whether the producer's fatal error is a fence,
 * and whose (fence_of).
 */
KafkaFence
outbox_kafka_txn_fenced(void)
{
	rd_kafka_t *producer = outbox_kafka_producer();

	if (producer == NULL || !outbox_kafka_fatal())
		return KAFKA_NOT_FENCED;
	return fence_of(rd_kafka_fatal_error(producer, NULL, 0));
}

/*
 * fence_of: whether the fatal error cause is a fence and, if
 * so, whether it may come from this producer's own transaction outliving
 * transaction.timeout.ms rather than from another producer of its
 * transactional.id: the open transaction is older than that, or one that
 * was ended within the last timeout plus OUTLIVED_SLACK_MS.  Its coordinator may then have aborted it and bumped
 * the producer's epoch, which librdkafka reports as a fence, even to a
 * transaction begun after the relay's own abort (the two aborts race once
 * Kafka is reachable again).  Another relay of the same id fences one
 * whose transactions kept within their timeout: told apart so, a relay
 * fenced by another never starts again on its own, and the other is
 * fenced at most once in turn.
 */
static KafkaFence
fence_of(int cause)
{
	TimestampTz now = GetCurrentTimestamp();
	int timeout_ms = transaction_timeout_ms();

	if (!outbox_kafka_fence(cause))
		return KAFKA_NOT_FENCED;
	if (timeout_ms > 0 &&
		(now < outlived_until ||
		 (outbox_kafka_txn_open() &&
		  TimestampDifferenceExceeds(opened_at, now, timeout_ms))))
		return KAFKA_FENCE_OUTLIVED;
	return KAFKA_FENCED_BY_OTHER;
}

/*
 * transaction_timeout_ms: the producer's transaction.timeout.ms, or 0;
 * read once per producer, not on every commit.
 */
static int
transaction_timeout_ms(void)
{
	static uint64 read_for = 0; /* the producer's generation, once read */
	static int timeout_ms = 0;
	rd_kafka_t *producer = outbox_kafka_producer();
	char value[32];
	size_t size = sizeof(value);

	if (producer == NULL)
		return 0;
	if (read_for == outbox_kafka_generation())
		return timeout_ms;
	timeout_ms = 0;
	if (rd_kafka_conf_get(rd_kafka_conf(producer), "transaction.timeout.ms",
						  value, &size) == RD_KAFKA_CONF_OK)
		timeout_ms = atoi(value);
	read_for = outbox_kafka_generation();
	return timeout_ms;
}

/*
 * outbox_kafka_txn_commit: commit the open transaction: flush what was
 * sent in it, then end it at the coordinator.
 */
KafkaTxnResult
outbox_kafka_txn_commit(int timeout_ms, char *why, size_t size)
{
	if (!outbox_kafka_txn_open())
		return KAFKA_TXN_FAILED;
	return end_txn(true, timeout_ms, why, size);
}

/*
 * outbox_kafka_txn_abort: abort the open transaction: what was sent in it
 * is purged (its delivery reports say so) and never seen by read_committed
 * consumers.
 */
KafkaTxnResult
outbox_kafka_txn_abort(int timeout_ms, char *why, size_t size)
{
	if (!outbox_kafka_txn_open())
		return KAFKA_TXN_DONE;
	return end_txn(false, timeout_ms, why, size);
}

/*
 * end_txn: commit or abort the open transaction.
 */
static KafkaTxnResult
end_txn(bool commit, int timeout_ms, char *why, size_t size)
{
	rd_kafka_t *producer = outbox_kafka_producer();
	KafkaTxnResult result =
		outcome(commit ? rd_kafka_commit_transaction(producer, timeout_ms)
					   : rd_kafka_abort_transaction(producer, timeout_ms),
				why, size);

	if (result == KAFKA_TXN_DONE)
	{
		int limit_ms = transaction_timeout_ms();

		if (limit_ms > 0 && TimestampDifferenceExceeds(
								opened_at, GetCurrentTimestamp(), limit_ms))
			outlived_until = TimestampTzPlusMilliseconds(
				GetCurrentTimestamp(), limit_ms + OUTLIVED_SLACK_MS);
		open_in = 0;
	}
	return result;
}

/*
 * outbox_kafka_progress_read: the value of the latest committed record of
 * key on the progress topic that contains one of marks (a NULL-terminated
 * list; *value NULL if none), creating the topic if it is missing; *others
 * counts the records of key after it that do not.  Uses a consumer of its
 * own, made and destroyed here.
 */
KafkaTxnResult
outbox_kafka_progress_read(const char *brokers, const char *properties,
						   const char *topic, const char *key,
						   const char *const *marks, int timeout_ms,
						   char **value, int *others, char *why, size_t size)
{
	KafkaTxnResult result =
		progress_read(brokers, properties, topic, key, marks, timeout_ms,
					  value, others, why, size);

	/* librdkafka's words, from any step, as outbox_scrub leaves them. */
	if (result != KAFKA_TXN_DONE)
		outbox_scrub(why, why, size);
	return result;
}

/*
 * progress_read: outbox_kafka_progress_read, why as librdkafka said it.
 */
static KafkaTxnResult
progress_read(const char *brokers, const char *properties, const char *topic,
			  const char *key, const char *const *marks, int timeout_ms,
			  char **value, int *others, char *why, size_t size)
{
	TimestampTz deadline =
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);
	rd_kafka_conf_t *conf;
	rd_kafka_t *consumer;
	KafkaTxnResult result;

	*value = NULL;
	*others = 0;
	refusal = KAFKA_TXN_ALLOWED;
	result = ensure_topic(topic, timeout_ms, why, size);
	if (result != KAFKA_TXN_DONE)
		return result;
	conf = outbox_kafka_reader_conf(brokers, properties, why, size);
	if (conf == NULL)
		return KAFKA_TXN_FAILED;
	if (rd_kafka_conf_set(conf, "isolation.level", "read_committed", why,
						  size) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "enable.auto.commit", "false", why, size) !=
			RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "client.id", "outbox-relay-progress", why,
						  size) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "group.id", "outbox-relay-progress", why,
						  size) != RD_KAFKA_CONF_OK)
	{
		rd_kafka_conf_destroy(conf);
		return KAFKA_TXN_FAILED;
	}
	/* assign() wants a group; it is never joined, nothing is committed. */
	consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, size);
	if (consumer == NULL)
	{
		rd_kafka_conf_destroy(conf);
		return KAFKA_TXN_FAILED;
	}
	rd_kafka_set_log_queue(consumer, NULL);
	rd_kafka_poll_set_consumer(consumer);
	result = read_last(consumer, topic, key, marks, deadline, value, others,
					   why, size);
	rd_kafka_consumer_close(consumer);
	rd_kafka_destroy(consumer);
	return result;
}

/*
 * read_last: read partition 0 of topic from its start up to its high
 * watermark, keeping the last value of key that contains one of marks, and
 * counting in *others the records of key after it that do not.
 */
static KafkaTxnResult
read_last(rd_kafka_t *consumer, const char *topic, const char *key,
		  const char *const *marks, TimestampTz deadline, char **value,
		  int *others, char *why, size_t size)
{
	rd_kafka_topic_partition_list_t *parts;
	rd_kafka_resp_err_t err;
	int64_t low;
	int64_t high;
	size_t key_len = strlen(key);
	KafkaTxnResult result = KAFKA_TXN_AGAIN;

	err = rd_kafka_query_watermark_offsets(consumer, topic, 0, &low, &high,
										   Max(1, remaining_ms(deadline)));
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(why, size, "could not ask for the end of topic \"%s\": %s",
				 topic, rd_kafka_err2str(err));
		refusal = refusal_of(err);
		return KAFKA_TXN_AGAIN;
	}
	if (high <= low)
		return KAFKA_TXN_DONE;
	parts = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(parts, topic, 0)->offset =
		RD_KAFKA_OFFSET_BEGINNING;
	err = rd_kafka_assign(consumer, parts);
	while (err == RD_KAFKA_RESP_ERR_NO_ERROR && remaining_ms(deadline) > 0)
	{
		rd_kafka_message_t *msg =
			rd_kafka_consumer_poll(consumer, Min(100, remaining_ms(deadline)));

		if (msg != NULL && msg->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
			msg->key_len == key_len && memcmp(msg->key, key, key_len) == 0)
			keep_if_marked(msg, marks, value, others);
		/* A refused fetch is the ACLs' answer, not a slow broker's. */
		if (msg != NULL && refusal_of(msg->err) != KAFKA_TXN_ALLOWED)
		{
			refusal = refusal_of(msg->err);
			err = msg->err;
			rd_kafka_message_destroy(msg);
			break;
		}
		if (msg != NULL)
			rd_kafka_message_destroy(msg);
		err = rd_kafka_position(consumer, parts);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && parts->elems[0].offset >= high)
		{
			result = KAFKA_TXN_DONE;
			break;
		}
	}
	if (result != KAFKA_TXN_DONE && refusal != KAFKA_TXN_ALLOWED)
		snprintf(why, size, "could not read topic \"%s\": %s", topic,
				 rd_kafka_err2str(err));
	else if (result != KAFKA_TXN_DONE)
		snprintf(why, size,
				 "could not read topic \"%s\" up to offset %lld in time%s%s",
				 topic, (long long) high, err ? ": " : "",
				 err ? rd_kafka_err2str(err) : "");
	rd_kafka_topic_partition_list_destroy(parts);
	return result;
}

/*
 * keep_if_marked: msg, a record of the relay's key, becomes *value if it
 * contains one of marks (it may hold any bytes, NUL included: only its text
 * up to the first NUL is kept); otherwise it is counted in *others.
 */
static void
keep_if_marked(const rd_kafka_message_t *msg, const char *const *marks,
			   char **value, int *others)
{
	bool marked = false;

	char *text = msg->payload ? pnstrdup((const char *) msg->payload, msg->len)
							  : pstrdup("");

	for (int i = 0; marks[i] != NULL && !marked; i++)
		marked = strstr(text, marks[i]) != NULL;
	if (!marked)
	{
		(*others)++;
		pfree(text);
		return;
	}
	if (*value != NULL)
		pfree(*value);
	*value = text;
	*others = 0;
}

/*
 * ensure_topic: the progress topic exists, or is created now.  Asked with
 * a full metadata request: asking for the topic by name would let the
 * broker create it with its defaults, not compacted.
 */
static KafkaTxnResult
ensure_topic(const char *topic, int timeout_ms, char *why, size_t size)
{
	const struct rd_kafka_metadata *md;
	rd_kafka_resp_err_t err;
	bool found = false;

	err = rd_kafka_metadata(outbox_kafka_producer(), 1, NULL, &md, timeout_ms);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(why, size, "could not list the cluster's topics: %s",
				 rd_kafka_err2str(err));
		return KAFKA_TXN_AGAIN;
	}
	for (int t = 0; t < md->topic_cnt && !found; t++)
		found = strcmp(md->topics[t].topic, topic) == 0 &&
				md->topics[t].err == RD_KAFKA_RESP_ERR_NO_ERROR;
	rd_kafka_metadata_destroy(md);
	return found ? KAFKA_TXN_DONE : create_topic(topic, timeout_ms, why, size);
}

/*
 * create_topic: create the progress topic: one partition, compacted, the
 * cluster's default replication.  A cluster that refuses says why, and
 * what to do.
 */
static KafkaTxnResult
create_topic(const char *topic, int timeout_ms, char *why, size_t size)
{
	rd_kafka_t *producer = outbox_kafka_producer();
	rd_kafka_NewTopic_t *new_topic;
	rd_kafka_queue_t *queue;
	rd_kafka_event_t *event;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
	const char *text = "no answer in time";

	new_topic = rd_kafka_NewTopic_new(topic, 1, -1, why, size);
	if (new_topic == NULL)
		return KAFKA_TXN_FAILED;
	(void) rd_kafka_NewTopic_set_config(new_topic, "cleanup.policy", "compact");
	(void) rd_kafka_NewTopic_set_config(new_topic, "segment.ms",
										PROGRESS_SEGMENT_MS);
	queue = rd_kafka_queue_new(producer);
	rd_kafka_CreateTopics(producer, &new_topic, 1, NULL, queue);
	event = rd_kafka_queue_poll(queue, timeout_ms);
	if (event != NULL)
	{
		const rd_kafka_CreateTopics_result_t *res =
			rd_kafka_event_CreateTopics_result(event);
		size_t n = 0;
		const rd_kafka_topic_result_t **topics =
			res ? rd_kafka_CreateTopics_result_topics(res, &n) : NULL;

		err = rd_kafka_event_error(event);
		text = rd_kafka_event_error_string(event);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && n == 1)
		{
			err = rd_kafka_topic_result_error(topics[0]);
			text = rd_kafka_topic_result_error_string(topics[0]);
		}
		create_failure(topic, err, text, why, size);
		rd_kafka_event_destroy(event);
	}
	else
		snprintf(why, size, "could not create the progress topic \"%s\": %s",
				 topic, text);
	rd_kafka_NewTopic_destroy(new_topic);
	rd_kafka_queue_destroy(queue);
	if (err == RD_KAFKA_RESP_ERR_NO_ERROR ||
		err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
		return KAFKA_TXN_DONE;
	if (err == RD_KAFKA_RESP_ERR__TIMED_OUT)
		return KAFKA_TXN_AGAIN;
	refusal = refusal_of(err);
	return KAFKA_TXN_FAILED;
}

/*
 * create_failure: why the cluster did not create the progress topic.  A
 * refusal for want of an ACL gets Kafka's text alone, its period dropped:
 * the relay says what to grant (say_create_refused); another failure gets
 * what to do.
 */
static void
create_failure(const char *topic, rd_kafka_resp_err_t err, const char *text,
			   char *why, size_t size)
{
	size_t len;

	snprintf(why, size, "could not create the progress topic \"%s\": %s",
			 topic, text ? text : rd_kafka_err2str(err));
	len = strlen(why);
	while (len > 0 && why[len - 1] == '.')
		why[--len] = '\0';
	if (refusal_of(err) == KAFKA_TXN_ALLOWED)
		strlcat(why,
				"; create it with one partition and cleanup.policy=compact, "
				"or let the relay's principal create topics (if it exists, "
				"the principal may not see it: grant it Read and Write there)",
				size);
}

/*
 * outcome: what librdkafka's answer to a transactional call means here;
 * why says it in words.  A fatal error of a producer another one fenced
 * is said apart: waiting is the cure, not a new producer.
 */
static KafkaTxnResult
outcome(rd_kafka_error_t *error, char *why, size_t size)
{
	KafkaTxnResult result;

	refusal = KAFKA_TXN_ALLOWED;
	if (error == NULL)
		return KAFKA_TXN_DONE;
	outbox_scrub(rd_kafka_error_string(error), why, size);
	refusal = refusal_of(rd_kafka_error_code(error));
	if (rd_kafka_error_is_fatal(error))
	{
		rd_kafka_resp_err_t cause =
			rd_kafka_fatal_error(outbox_kafka_producer(), NULL, 0);
		KafkaFence fence;

		if (refusal == KAFKA_TXN_ALLOWED)
			refusal = refusal_of(cause);

		fence = fence_of(cause);
		result = fence == KAFKA_FENCED_BY_OTHER ? KAFKA_TXN_FENCED
												: KAFKA_TXN_FAILED;
		/* librdkafka's words would name a newer instance: there is none. */
		if (fence == KAFKA_FENCE_OUTLIVED)
			strlcpy(why, OUTBOX_TXN_OUTLIVED, size);
	}
	else if (rd_kafka_error_txn_requires_abort(error))
		result = KAFKA_TXN_ABORT;
	else if (rd_kafka_error_is_retriable(error))
		result = KAFKA_TXN_AGAIN;
	else
		result = KAFKA_TXN_FAILED;
	rd_kafka_error_destroy(error);
	return result;
}

/*
 * outbox_kafka_txn_refusal: whether the latest transactional step, or
 * the latest read of the progress topic, failed for want of an ACL, and
 * of which one.
 */
KafkaTxnRefusal
outbox_kafka_txn_refusal(void)
{
	return refusal;
}

/*
 * refusal_of: which ACL an error of the cluster says is missing.
 */
static KafkaTxnRefusal
refusal_of(rd_kafka_resp_err_t err)
{
	if (err == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
		return KAFKA_TXN_REFUSED_TRANSACTIONAL_ID;
	if (err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
		err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED)
		return KAFKA_TXN_REFUSED_TOPIC;
	return KAFKA_TXN_ALLOWED;
}

/*
 * remaining_ms: milliseconds left until deadline, 0 if past.
 */
static int
remaining_ms(TimestampTz deadline)
{
	long secs;
	int usecs;

	TimestampDifference(GetCurrentTimestamp(), deadline, &secs, &usecs);
	return (int) (secs * 1000 + usecs / 1000);
}
