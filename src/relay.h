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

/* Events read for one round of sending, in id order. */
typedef struct RelayBatch
{
	int count;
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
	RELAY_BACKOFF      /* nothing due: retries wait for their time */
} RelayOutcome;

/* batch.c */
extern bool relay_begin(const char *activity);
extern void relay_commit(void);
extern HTAB *relay_key_set(void);
extern void relay_key_add(HTAB *keys, uint64 hash);
extern bool relay_key_has(HTAB *keys, uint64 hash);
extern void relay_key_remove(HTAB *keys, uint64 hash);
extern uint64 relay_key_hash(const char *topic, const char *key);
extern RelayBatch *relay_batch_load(SPITupleTable *rows, uint64 n);
extern void relay_batch_send(RelayBatch *batch, HTAB *blocked);
extern HTAB *relay_pending_keys(void);
extern int relay_backoff_ms(int attempts);

/* relay.c */
extern RelayOutcome relay_first_sends(void);

/* retry.c */
extern RelayOutcome relay_retries(void);
extern void relay_record_failure(const OutboxMessage *msg, int attempts);
extern void relay_set_state(int64 id, const char *status, int attempts,
							int delay_ms, const char *error);

/* housekeeping.c */
extern bool relay_paused(void);
extern void relay_housekeeping(void);
extern void relay_check_alert(void);

/* worker.c */
extern bool relay_settings_changed(void);
extern MemoryContext relay_batch_context(void);
extern void relay_count(RelayBatch *batch, int upto);

#endif /* OUTBOX_RELAY_H */
