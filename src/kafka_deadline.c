/*
 * kafka_deadline.c
 *		message.timeout.ms, applied by the relay rather than librdkafka.
 *
 * librdkafka's idempotent producer keeps a partition's order only among
 * the messages it delivers: once it gives up on one (message.timeout.ms),
 * it sends the younger ones of its partition under a new epoch, and they
 * reach Kafka before the relay sends the failed one again (librdkafka's
 * INTRODUCTION, "Message timeout considerations").  Taking back what
 * librdkafka holds once the failure is reported is too late: the report
 * waits for the relay to serve it, and a relay held meanwhile (in its
 * wait for a synchronous standby, say) found the younger ones delivered.
 *
 * So, outside a Kafka transaction, librdkafka never gives up (its
 * message.timeout.ms is 0, infinite) and the relay keeps the timeout
 * itself: when the oldest unanswered message has waited that long, it
 * takes back every message librdkafka holds (rd_kafka_purge), on its own
 * thread, before anything younger can leave.  Those that waited that long
 * are answered as timed out, as librdkafka would have answered them, each
 * a failed attempt; the rest as taken back, uncounted, and sent again
 * after them in order.  In a Kafka transaction a timeout aborts it, with
 * every younger message, so there librdkafka keeps the timeout.
 *
 * src/kafka_deadline.c
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "lib/ilist.h"

#include "kafka.h"

/* The relay's message.timeout.ms; 0: librdkafka's own, or none. */
static int timeout_ms = 0;

/* Messages queued and not yet answered, oldest first. */
static dlist_head unanswered = DLIST_STATIC_INIT(unanswered);

/* The newest message the relay gave up on: taken back, it timed out. */
static uint64 overdue_seq = 0;

/*
 * outbox_kafka_deadline_conf: take message.timeout.ms over from conf, a
 * producer's without a transactional.id.  False, with problem, if
 * librdkafka refuses to be told 0.
 */
bool
outbox_kafka_deadline_conf(struct rd_kafka_conf_s *conf, char *problem,
						   size_t size)
{
	char value[32];
	size_t len = sizeof(value);

	if (rd_kafka_conf_get(conf, "message.timeout.ms", value, &len) !=
		RD_KAFKA_CONF_OK)
		return false;
	if (rd_kafka_conf_set(conf, "message.timeout.ms", "0", problem, size) !=
		RD_KAFKA_CONF_OK)
		return false;
	timeout_ms = atoi(value);
	return true;
}

/*
 * outbox_kafka_deadline_reset: no producer, or a new one: what the old one
 * held was answered or forgotten with it.
 */
void
outbox_kafka_deadline_reset(void)
{
	timeout_ms = 0;
	dlist_init(&unanswered);
}

/*
 * outbox_kafka_deadline_queued: msg was handed to librdkafka just now.
 */
void
outbox_kafka_deadline_queued(OutboxMessage *msg)
{
	msg->queued_at = 0;
	if (timeout_ms == 0)
		return;
	msg->queued_at = GetCurrentTimestamp();
	dlist_push_tail(&unanswered, &msg->unanswered);
}

/*
 * outbox_kafka_deadline_answered: msg was answered with err; the error it
 * counts as (a message taken back because it waited too long timed out).
 */
int
outbox_kafka_deadline_answered(OutboxMessage *msg, int err)
{
	if (msg->queued_at == 0)
		return err;
	dlist_delete(&msg->unanswered);
	msg->queued_at = 0;
	if (msg->seq <= overdue_seq && (err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
									err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT))
		return RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
	return err;
}

/*
 * outbox_kafka_deadline_passed: whether the oldest unanswered message has
 * waited message.timeout.ms; if so, the messages that have are
 * marked overdue, and the caller takes back everything.
 */
bool
outbox_kafka_deadline_passed(void)
{
	TimestampTz due = outbox_kafka_deadline();
	TimestampTz now;
	TimestampTz cutoff;
	dlist_iter iter;

	if (due == 0)
		return false;
	now = GetCurrentTimestamp();
	if (due > now)
		return false;
	cutoff = TimestampTzPlusMilliseconds(now, -timeout_ms);
	dlist_foreach(iter, &unanswered)
	{
		OutboxMessage *msg =
			dlist_container(OutboxMessage, unanswered, iter.cur);

		if (msg->queued_at > cutoff)
			break;
		overdue_seq = Max(overdue_seq, msg->seq);
	}
	return true;
}

/*
 * outbox_kafka_deadline: when the oldest unanswered message will have
 * waited message.timeout.ms (0 if none waits, or librdkafka keeps it).
 */
TimestampTz
outbox_kafka_deadline(void)
{
	if (timeout_ms == 0 || dlist_is_empty(&unanswered))
		return 0;
	return TimestampTzPlusMilliseconds(
		dlist_head_element(OutboxMessage, unanswered, &unanswered)->queued_at,
		timeout_ms);
}
