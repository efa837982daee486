/*
 * outbox.h
 *		Declarations shared by the outbox extension's source files.
 *
 * src/outbox.h
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "executor/spi.h"
#include "utils/jsonb.h"

/* Constants */

/* Kafka limits a topic name to 249 characters of [A-Za-z0-9._-]. */
#define OUTBOX_TOPIC_MAX_LEN 249

/* Longest biz_type, biz_key or msg_key accepted, in bytes. */
#define OUTBOX_KEY_MAX_LEN 1024

/* Placeholder in outbox.default_topic replaced by the event's biz_type. */
#define OUTBOX_TOPIC_PLACEHOLDER "{biz_type}"

/* Settings (outbox.c) */

extern char *outbox_default_topic;
extern int outbox_max_payload_size;

/* Input checks (validate.c) */

extern const char *outbox_topic_problem(const char *topic);
extern char *outbox_topic_from_pattern(const char *pattern,
									   const char *biz_type);
extern void outbox_check_key(const char *name, const char *value);
extern void outbox_check_payload(Jsonb *payload);
extern void outbox_check_headers(Jsonb *headers);

/* Prepared statements kept for the life of the backend (plan.c) */

extern SPIPlanPtr outbox_keep_plan(SPIPlanPtr *cache, const char *sql,
								   int nargs, const Oid *argtypes);

#endif /* OUTBOX_H */
