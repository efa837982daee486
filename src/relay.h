/*
 * relay.h
 *		Declarations shared by the relay worker's files: the loop (worker.c),
 *		batches of events (batch.c), first sends (relay.c) and retries
 *		(retry.c).
 *
 * src/relay.h
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include "postgres.h"

#include "executor/spi.h"
#include "utils/hsearch.h"

#include "kafka.h"

/* Columns every batch query returns, in this order. */
#define BATCH_COL_ID 1
#define BATCH_COL_TOPIC 2
#define BATCH_COL_MSG_KEY 3
#define BATCH_COL_PAYLOAD 4
#define BATCH_COL_HEADERS 5
#define BATCH_COL_BIZ_TYPE 6
#define BATCH_COL_BIZ_KEY 7
#define BATCH_COL_ATTEMPTS 8 /* retry batches only */

/*
 * The settings a batch is judged by, taken when it is read: a reload while
 * it waits for Kafka must not change how its outcome is recorded.
 */
typedef struct RelaySettings
{
	int batch_size;
	int max_attempts;
	int backoff_min;
	int backoff_max;
} RelaySettings;

/*
 * Events read for one round of sending, in id order.  An event sent but
 * not answered (msgs[i].done false after the wait) was cut short by a
 * reload: it is neither delivered nor failed, and goes again.
 */
typedef struct RelayBatch
{
	int count;
	RelaySettings settings; /* as when the batch was read */
	OutboxMessage *msgs;
	uint64 *key_hash; /* hash of (topic, msg_key), per event */
	bool *held;       /* not sent: an earlier event of its key waits */
	int *attempts;    /* failed attempts so far (retries only) */
} RelayBatch;

/* How a round of sending went, for the loop's pacing and status. */
typedef enum RelayOutcome
{
	RELAY_IDLE,        /* nothing to send */
	RELAY_SENT,        /* sent everything that was due */
	RELAY_MORE,        /* sent a full batch; more is waiting */
	RELAY_UNREACHABLE, /* the broker did not answer in time */
	RELAY_BACKOFF,     /* nothing due: retries wait for their time */
	RELAY_INTERRUPTED, /* a reload cut the wait for Kafka short */
	RELAY_LOCKED       /* a step gave up waiting for a lock */
} RelayOutcome;

/* What a step does after relay_begin; a lock timeout in it is caught. */
typedef void (*RelayStep)(void *arg);

/* batch.c */
extern bool relay_begin(const char *activity);
extern void relay_commit(void);
extern HTAB *relay_key_set(void);
extern void relay_key_add(HTAB *keys, uint64 hash);
extern bool relay_key_has(HTAB *keys, uint64 hash);
extern void relay_key_remove(HTAB *keys, uint64 hash);
extern uint64 relay_key_hash(const char *topic, const char *key);
extern const char *relay_activity(void);
extern RelaySettings relay_settings_now(void);
extern RelayBatch *relay_batch_load(SPITupleTable *rows, uint64 n,
									const RelaySettings *settings);
extern bool relay_batch_send(RelayBatch *batch, HTAB *blocked);
extern bool relay_unanswered(const RelayBatch *batch, int i);
extern HTAB *relay_pending_keys(void);
extern int relay_backoff_ms(const RelaySettings *settings, int attempts);

/* relay.c */
extern RelayOutcome relay_first_sends(void);

/* retry.c */
extern RelayOutcome relay_retries(void);
extern void relay_record_failure(const RelayBatch *batch, int i);
extern void relay_set_state(int64 id, const char *status, int attempts,
							int delay_ms, const char *error);

/* housekeeping.c */
extern bool relay_paused(void);
extern void relay_housekeeping(void);
extern void relay_check_alert(void);

/* worker.c */
extern bool relay_guarded(RelayStep step, void *arg, const char *what);
extern MemoryContext relay_batch_context(void);
extern void relay_count(RelayBatch *batch, int upto);

#endif /* OUTBOX_RELAY_H */
