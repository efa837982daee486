/*
 * kafka.h
 *		The relay's Kafka producer, as seen by the rest of the extension.
 *
 * Only the kafka*.c files call librdkafka; everything else deals in
 * OutboxMessage.  Nothing in kafka.c waits: the worker's loop waits on
 * outbox_kafka_wake_fd().  kafka_txn.c's calls wait, each for at most the
 * time its caller gives.
 *
 * src/kafka.h
 */
#ifndef OUTBOX_KAFKA_H
#define OUTBOX_KAFKA_H

#include "postgres.h"

#include "lib/ilist.h"
#include "utils/timestamp.h"

#include "outbox.h"

/* Most headers one message carries: event_id, biz_type, biz_key + user's. */
/* event_id, biz_type, biz_key, outbox_source: the relay's own headers. */
#define OUTBOX_RELAY_HEADERS 4
#define OUTBOX_MAX_HEADERS (OUTBOX_RELAY_HEADERS + OUTBOX_MAX_USER_HEADERS)

/*
 * One event on its way to Kafka, and what became of it.  The value, key
 * and headers are needed only until librdkafka has copied them; the
 * struct itself lives until the delivery report (librdkafka points to it).
 */
typedef struct OutboxMessage
{
	int64 event_id;
	const char *topic;
	const char *key;
	size_t key_len;
	const char *value;
	size_t value_len;
	int nheaders;
	const char *header_names[OUTBOX_MAX_HEADERS];
	const char *header_values[OUTBOX_MAX_HEADERS];

	/*
	 * The relay's own progress record (exactly_once.c), not an event: its
	 * answer tells nothing of the events' partitions, and does not count
	 * as a later message acknowledged (outbox_kafka_acked_seq).
	 */
	bool progress;

	bool queued; /* handed to librdkafka: a delivery report will come */
	uint64 seq;  /* when queued: how many were queued before, plus one */
	TimestampTz queued_at; /* when, while kafka_deadline.c watches it */
	dlist_node unanswered; /* its place in kafka_deadline.c's list */

	/* Set by the delivery report, served on the worker's own thread. */
	bool done;
	int error;              /* 0 when Kafka acknowledged it */
	bool transient;         /* failed for the broker's sake, not its own */
	bool timed_out;         /* librdkafka gave up waiting for the broker */
	bool topic_unknown;     /* librdkafka or the broker found no such topic */
	bool purged;            /* the producer was stopped before an answer */
	const char *error_text; /* static text from librdkafka */
} OutboxMessage;

/*
 * The error a message is given when the relay gives up waiting for it
 * itself (librdkafka's own code for a message timed out).
 */
#define OUTBOX_KAFKA_GAVE_UP (-192)

/* What became of a message handed to outbox_kafka_send. */
typedef enum KafkaSendResult
{
	KAFKA_QUEUED,  /* on its way; a delivery report will follow */
	KAFKA_REFUSED, /* refused at once; msg->error says why */
	KAFKA_FULL     /* librdkafka's queue is full: send it later */
} KafkaSendResult;

/* What a transactional step of kafka_txn.c came to. */
typedef enum KafkaTxnResult
{
	KAFKA_TXN_DONE,   /* done */
	KAFKA_TXN_AGAIN,  /* not done in the time given: call it again */
	KAFKA_TXN_ABORT,  /* the transaction can only be aborted */
	KAFKA_TXN_FENCED, /* another producer took over the transactional.id */
	KAFKA_TXN_FAILED  /* cannot be done with this producer or cluster */
} KafkaTxnResult;

/*
 * What the cluster refused the relay's principal at the latest step of
 * kafka_txn.c, if that step failed for want of an ACL.
 */
/* Whose doing a producer's fatal error is, if it is a fence. */
typedef enum KafkaFence
{
	KAFKA_NOT_FENCED,     /* no fatal error, or not a fence */
	KAFKA_FENCE_OUTLIVED, /* its own transaction outlived its timeout */
	KAFKA_FENCED_BY_OTHER /* another producer of its transactional.id */
} KafkaFence;

typedef enum KafkaTxnRefusal
{
	KAFKA_TXN_ALLOWED,                 /* no authorization error */
	KAFKA_TXN_REFUSED_TOPIC,           /* a topic: the progress topic's ACLs */
	KAFKA_TXN_REFUSED_TRANSACTIONAL_ID /* the transactional.id's ACLs */
} KafkaTxnRefusal;

struct rd_kafka_s;
struct rd_kafka_conf_s;

extern bool outbox_kafka_start(const char *brokers, const char *properties,
							   const char *transactional_id);
extern struct rd_kafka_s *outbox_kafka_producer(void);
extern uint64 outbox_kafka_generation(void);
extern struct rd_kafka_conf_s *outbox_kafka_reader_conf(const char *brokers,
														const char *properties,
														char *problem,
														size_t size);
extern void outbox_kafka_stop(void);
extern bool outbox_kafka_running(void);
extern int outbox_kafka_max_message_bytes(void);
extern KafkaSendResult outbox_kafka_send(OutboxMessage *msg);
extern KafkaSendResult outbox_kafka_refuse(OutboxMessage *msg, const char *text);
extern void outbox_kafka_serve(void);
extern void outbox_kafka_push(void);
extern void outbox_kafka_in_flight(int *messages, size_t *bytes);
extern TimestampTz outbox_kafka_last_ack(void);
extern uint64 outbox_kafka_acked_seq(void);
extern uint64 outbox_kafka_failures(void);
extern int outbox_kafka_wake_fd(void);
extern bool outbox_kafka_fatal(void);
extern bool outbox_kafka_fence(int err);
extern bool outbox_kafka_topic_refused(const char *topic, char *text,
									   size_t size);
extern bool outbox_kafka_unauthorized(int err);
extern bool outbox_kafka_topic_missing(const char *topic);
extern const char *outbox_kafka_version(void);
extern const char *outbox_kafka_broker_state(void);
extern char *outbox_kafka_stall_reason(void);
extern const char *outbox_kafka_new_problem(void);
extern bool outbox_kafka_check_properties(const char *properties, char *problem,
										  size_t size, const char **hint);
extern bool outbox_kafka_files_fingerprint(const char *properties,
										   uint64 *fingerprint, char *problem,
										   size_t size);
extern void outbox_kafka_forget_problem(void);
extern void outbox_kafka_judge_again(void);
extern const char *outbox_kafka_start_problem(void);

/* kafka_conf_help.c */
struct rd_kafka_conf_s;
extern const char *outbox_kafka_line_hint(const char *line);
extern bool outbox_kafka_property_range(const char *key, char *out, size_t size);
extern bool outbox_kafka_is_file_property(const char *key);
extern bool outbox_kafka_unreadable_file(struct rd_kafka_conf_s *conf,
										 char *problem, size_t size,
										 const char **property);
extern bool outbox_kafka_conf_fingerprint(struct rd_kafka_conf_s *conf,
										  uint64 *fingerprint, char *problem,
										  size_t size);

/* kafka_scrub.c */
extern void outbox_scrub_forget(void);
extern void outbox_scrub_add(const char *value);
extern void outbox_scrub(const char *text, char *out, size_t size);

/* kafka_deadline.c: message.timeout.ms outside a Kafka transaction. */
extern bool outbox_kafka_deadline_conf(struct rd_kafka_conf_s *conf,
									   char *problem, size_t size);
extern void outbox_kafka_deadline_reset(void);
extern void outbox_kafka_deadline_queued(OutboxMessage *msg);
extern int outbox_kafka_deadline_answered(OutboxMessage *msg, int err);
extern bool outbox_kafka_deadline_passed(void);
extern TimestampTz outbox_kafka_deadline(void);

/* kafka_txn.c */
extern KafkaTxnResult outbox_kafka_txn_init(int timeout_ms, char *why,
											size_t size);
extern KafkaTxnResult outbox_kafka_txn_begin(char *why, size_t size);
extern bool outbox_kafka_txn_open(void);
extern KafkaFence outbox_kafka_txn_fenced(void);

/* Why a producer whose transaction outlived its timeout was fenced. */
#define OUTBOX_TXN_OUTLIVED                                                   \
	"the transaction outlived transaction.timeout.ms, so its coordinator "    \
	"aborted it and fenced the producer's epoch"
extern KafkaTxnResult outbox_kafka_txn_commit(int timeout_ms, char *why,
											  size_t size);
extern KafkaTxnResult outbox_kafka_txn_abort(int timeout_ms, char *why,
											 size_t size);
extern KafkaTxnRefusal outbox_kafka_txn_refusal(void);
extern KafkaTxnResult
outbox_kafka_progress_read(const char *brokers, const char *properties,
						   const char *topic, const char *key,
						   const char *const *marks, int timeout_ms,
						   char **value, int *others, char *why, size_t size);

#endif /* OUTBOX_KAFKA_H */
