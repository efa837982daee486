/*
 * kafka.h
 *		The relay's Kafka producer, as seen by the rest of the extension.
 *
 * Only kafka.c includes rdkafka.h; everything else deals in OutboxMessage.
 *
 * src/kafka.h
 */
#ifndef OUTBOX_KAFKA_H
#define OUTBOX_KAFKA_H

#include "postgres.h"

#include "outbox.h"

/* Most headers one message carries: event_id, biz_type, biz_key + user's. */
#define OUTBOX_MAX_HEADERS (3 + OUTBOX_MAX_USER_HEADERS)

/* One event on its way to Kafka, and what became of it. */
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

	/* Set by the delivery report, served on the worker's own thread. */
	bool done;
	int error;              /* 0 when Kafka acknowledged it */
	bool transient;         /* failed for the broker's sake, not its own */
	const char *error_text; /* static text from librdkafka */
} OutboxMessage;

extern bool outbox_kafka_start(const char *brokers, const char *properties);
extern void outbox_kafka_stop(void);
extern bool outbox_kafka_running(void);
extern bool outbox_kafka_send(OutboxMessage *msg);
extern bool outbox_kafka_wait(int timeout_ms);
extern void outbox_kafka_serve(void);
extern bool outbox_kafka_fatal(void);
extern const char *outbox_kafka_version(void);
extern const char *outbox_kafka_broker_state(void);
extern char *outbox_kafka_stall_reason(void);
extern bool outbox_kafka_check_properties(const char *properties,
										  char *problem, size_t size);

#endif /* OUTBOX_KAFKA_H */
