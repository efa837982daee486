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
#include "lib/stringinfo.h"
#include "port/atomics.h"
#include "storage/spin.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* Constants */

/* Kafka limits a topic name to 249 characters of [A-Za-z0-9._-]. */
#define OUTBOX_TOPIC_MAX_LEN 249

/* Longest biz_type, biz_key or msg_key accepted, in bytes. */
#define OUTBOX_KEY_MAX_LEN 1024

/*
 * Longest consumer name accepted, in bytes: short enough that a claim's
 * (consumer, biz_type, biz_key), biz_type and biz_key at their limit and
 * incompressible, still fits in one btree entry (2704 bytes at most).
 */
#define OUTBOX_CONSUMER_MAX_LEN 256
#define OUTBOX_SOURCE_MAX_LEN 64 /* a claim's source: a uuid is 36 */

/* Headers an event may carry besides event_id, biz_type and biz_key. */
#define OUTBOX_MAX_USER_HEADERS 61

/* Placeholder in outbox.default_topic replaced by the event's biz_type. */
#define OUTBOX_TOPIC_PLACEHOLDER "{biz_type}"

/* What the relay is doing, as outbox.relay_status() will show it. */
typedef enum OutboxRelayState
{
	RELAY_STATE_STARTING = 0,
	RELAY_STATE_IDLE,
	RELAY_STATE_SENDING,
	RELAY_STATE_UNREACHABLE,
	RELAY_STATE_UNCONFIGURED,
	RELAY_STATE_BACKING_OFF,
	RELAY_STATE_PAUSED,
	RELAY_STATE_WAITING_FOR_LOCK,
	RELAY_STATE_NO_TRANSACTIONS,
	RELAY_STATE_FENCED
} OutboxRelayState;

/* Seconds of delivery counts kept for the "last minute" figures. */
#define OUTBOX_MINUTE_SLOTS 60
#define OUTBOX_ERROR_LEN 256

/* Deliveries in one second, for the last-minute figures. */
typedef struct OutboxSecond
{
	int64 second; /* Unix time of this slot's second */
	uint64 sent;
	uint64 failed;
} OutboxSecond;

/*
 * One relay's place in shared memory.  The launcher takes a free slot for
 * a database and frees it once that relay has stopped; the relay fills in
 * the rest while it runs.
 */
typedef struct OutboxRelaySlot
{
	Oid database;            /* InvalidOid: the slot is free */
	uint32 generation;       /* bumped each time the slot is freed */
	pid_t pid;               /* 0 until the relay attaches */
	bool absent;             /* the relay found no extension here */
	pg_atomic_uint64 proc;   /* PGPROC of the relay, 0 if none */
	pg_atomic_uint32 paused; /* the relay's last read found it paused */
	pg_atomic_uint32 told;   /* an operator's change woke it since */
	volatile OutboxRelayState state;
	pg_atomic_uint64 sent_total;
	pg_atomic_uint64 failed_total;
	pg_atomic_uint64 retried_total;
	/* The rest is protected by OutboxShared.mutex. */
	TimestampTz started_at;
	TimestampTz last_batch_at;
	TimestampTz last_error_at;
	char last_error[OUTBOX_ERROR_LEN];
	char broker_state[16];
	OutboxSecond seconds[OUTBOX_MINUTE_SLOTS];
} OutboxRelaySlot;

/* What the launcher tells a relay it starts (in bgw_extra). */
typedef struct OutboxRelayStart
{
	int slot;
	uint32 generation;
} OutboxRelayStart;

/* Why a database that wants a relay has none (the launcher says). */
typedef enum OutboxWaitReason
{
	WAIT_RELAY_SLOT = 0, /* outbox.max_relays relays run */
	WAIT_WORKER_SLOT,    /* no background worker slot is free */
	WAIT_LOCK            /* another session holds the database locked */
} OutboxWaitReason;

/* A database left without a relay, as relay_status() shows it. */
typedef struct OutboxWaiting
{
	Oid database;
	OutboxWaitReason reason;
	TimestampTz since;
} OutboxWaiting;

/* Databases whose CREATE EXTENSION the launcher has yet to hear of. */
#define OUTBOX_WAKE_SLOTS 8
/* Waiting databases shown by relay_status(); the rest are counted. */
#define OUTBOX_MAX_WAITING 128

/* Shared memory: one struct for the cluster. */
typedef struct OutboxShared
{
	slock_t mutex;             /* protects every field but the atomics */
	Oid hold_database;         /* DROP DATABASE under way: no relay here */
	pid_t hold_pid;            /* the process running that DROP DATABASE */
	pg_atomic_uint64 launcher; /* PGPROC of the launcher, 0 if none */
	/* Where CREATE EXTENSION outbox committed since the launcher looked. */
	Oid created_in[OUTBOX_WAKE_SLOTS];
	int ncreated;
	bool created_more; /* more than fit: look everywhere */
	int nwaiting;      /* databases without a relay, that want one */
	OutboxWaiting waiting[OUTBOX_MAX_WAITING];
	uint64 incarnation;    /* events' incarnation (incarnation.c), set once */
	bool began_as_standby; /* standby.signal was there at this start */
	int nslots;            /* outbox.max_relays */
	OutboxRelaySlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxShared;

/* A parsed outbox.allowed_topics or outbox.allowed_consumers. */
typedef struct OutboxNameList OutboxNameList;

/* Settings (outbox.c) */

extern char *outbox_default_topic;
extern int outbox_max_payload_size;
extern OutboxNameList *outbox_allowed_topic_list;
extern OutboxNameList *outbox_allowed_consumer_list;
extern char *outbox_database;
extern int outbox_max_relays;
extern char *outbox_kafka_brokers;
extern char *outbox_kafka_properties;
/* outbox.delivery */
#define OUTBOX_DELIVERY_AT_LEAST_ONCE 0
#define OUTBOX_DELIVERY_EXACTLY_ONCE 1
extern int outbox_delivery;
/* outbox.message_format */
#define OUTBOX_FORMAT_OUTBOX 0
#define OUTBOX_FORMAT_DEBEZIUM 1
extern int outbox_message_format;
extern char *outbox_progress_topic;
extern int outbox_max_attempts;
extern int outbox_backoff_min;
extern int outbox_backoff_max;
extern bool outbox_missing_topic_dead;
extern int outbox_batch_size;
extern int outbox_max_in_flight_events;
extern int outbox_max_in_flight_size;
extern int outbox_poll_interval;
extern int outbox_sent_retention;
extern int outbox_dedup_retention;
extern int outbox_alert_delay;

/* Shared memory and wake-up at commit (shmem.c) */

extern OutboxShared *outbox_shared;
extern OutboxRelaySlot *outbox_my_relay;
extern void outbox_shmem_init(void);
extern uint64 outbox_draw_incarnation(void);
extern void outbox_wake_init(void);
extern void outbox_wake_relay_at_commit(void);
extern void outbox_events_at_commit(void);
extern void outbox_wake_launcher_at_commit(void);
extern void outbox_wake_relay(bool only_if_relaying);
extern void outbox_relay_paused_flag(bool paused);
extern bool outbox_relay_told(void);
extern void outbox_nudge_launcher(void);
extern void outbox_relay_attach(const OutboxRelayStart *start);
extern void outbox_relay_absent(void);

/* The relay's status in shared memory (status.c) */

extern void outbox_status_started(void);
extern void outbox_status_state(OutboxRelayState state);
extern void outbox_status_error(const char *error);
extern void outbox_status_clear_error(void);
extern void outbox_status_batch(uint64 sent, uint64 failed);
extern void outbox_status_totals(uint64 sent, uint64 failed, uint64 retried);
extern OutboxRelayState outbox_status_current(void);
extern void outbox_status_broker(const char *state);
extern const char *outbox_wait_reason(OutboxWaitReason reason);

/* Keeping outbox.kafka_properties out of the log (redact.c) */

extern void outbox_redact_init(void);
extern void outbox_redact_activity(void);

/* Launcher (launcher.c) */

extern void outbox_launcher_register(void);

/* The statement hook (utility.c) */

extern void outbox_utility_init(void);
extern bool outbox_relay_held(void);

/* Input checks (validate.c) */

extern const char *outbox_topic_problem(const char *topic, size_t len);
extern void outbox_check_topic(const char *topic, size_t len, bool from_default);
extern bool outbox_is_progress_topic(const char *topic, size_t len);
extern char *outbox_topic_from_pattern(const char *pattern, const char *biz_type,
									   int type_len, size_t *len);
extern int outbox_check_key(const char *name, text *value);
extern int outbox_check_consumer(text *value);
extern int outbox_check_source(text *value);
extern void outbox_check_size(Jsonb *payload, int key_len, size_t header_len);
extern void outbox_check_bytes_size(size_t value_len, int key_len,
									size_t header_len);
extern size_t outbox_check_headers(Jsonb *headers);
extern size_t outbox_relay_headers_size(int type_len, int biz_key_len);
extern OutboxNameList *outbox_name_list_parse(const char *value, bool topics,
											  const char **problem);
extern bool outbox_name_allowed(const OutboxNameList *list, const char *name,
								size_t len);
extern void outbox_check_allowed_topic(const char *topic, size_t len);
extern void outbox_check_allowed_consumer(text *consumer);

/* Compact JSON text (json_compact.c) */

extern bool outbox_json_compact(StringInfo out, Jsonb *jb, int limit);
extern bool outbox_json_compact_size(Jsonb *jb, int64 limit, size_t *size);

/* Prepared statements kept for the life of the backend (plan.c) */

extern SPIPlanPtr outbox_keep_plan(SPIPlanPtr *cache, const char *sql,
								   int nargs, const Oid *argtypes, bool custom);

#endif /* OUTBOX_H */
