/*
 * relay.h
 *		Declarations shared by the relay worker's files.
 *
 * The relay reads top-down, and every call goes down:
 *
 *	 worker.c		the loop: the only place that waits, applies a reload,
 *					starts or stops the producer and publishes status
 *	 exactly_once.c	with outbox.delivery = exactly_once: each round's
 *					batches in one Kafka transaction, with the progress
 *					they make; the progress Kafka holds read at start
 *	 first_sends.c	committed events in windows, in order; progress recorded
 *	 retries.c		events one by one: due retries and handed-over ones
 *	 housekeeping.c	pause flag, retention, the backlog alert
 *	 flight.c		the batches Kafka has not answered for, and their bounds
 *	 batch.c		a batch: its rows as messages, the settings it was read with
 *	 event_state.c	rows of outbox.event_state: failures, backoff, death
 *	 sender.c		who the relay is to Kafka: the source its messages name;
 *					in exactly_once its sender number and the proof its
 *					progress records carry
 *	 progress_record.c	a progress record read back from Kafka, taken
 *					apart: untrusted text, no backend state (fuzzed)
 *	 step.c			the transaction bracket around every step
 *	 db_settings.c	what ALTER DATABASE ... SET gave the relay
 *	 kafka.c		librdkafka, and nothing above it
 *	 kafka_txn.c	librdkafka's transactions and the progress topic
 *	 kafka_scrub.c	property values cut out of librdkafka's words
 *
 * src/relay.h
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include "postgres.h"

#include "executor/spi.h"
#include "lib/ilist.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "kafka.h"

/* Columns every batch query returns, in this order. */
#define BATCH_COL_ID 1
#define BATCH_COL_TOPIC 2
#define BATCH_COL_MSG_KEY 3
#define BATCH_COL_PAYLOAD 4 /* JSON, or NULL when: */
#define BATCH_COL_PAYLOAD_BYTES 5
#define BATCH_COL_HEADERS 6
#define BATCH_COL_BIZ_TYPE 7
#define BATCH_COL_BIZ_KEY 8
#define BATCH_COL_INCARNATION 9
#define BATCH_COL_TX 10       /* first sends only */
#define BATCH_COL_ATTEMPTS 10 /* retries only */
#define BATCH_MAX_COLS 11

/*
 * One batch row, its columns taken apart once: reading them one by one
 * walked the row from its start for each column after the first text.
 */
typedef struct BatchRow
{
	Datum values[BATCH_MAX_COLS];
	bool nulls[BATCH_MAX_COLS];
} BatchRow;

/*
 * The settings a batch is judged by, taken when it is read: a reload while
 * it is in flight must not change how its outcome is recorded.
 */
typedef struct RelaySettings
{
	int batch_size;
	int max_attempts;
	int backoff_min;
	int backoff_max;
	bool missing_topic_dead; /* a missing topic's events count toward death */
	int max_in_flight_events;
	int max_in_flight_size;
} RelaySettings;

/*
 * A place in the stream of first sends, as outbox.relay_cursor keeps it:
 * every transaction visible in done is relayed; of the window (visible in
 * window, not in done; window is 0 when none is open), the events up to
 * (last_tx, last_id) in (tx, id) order are.
 */
typedef struct RelayPos
{
	Datum done;   /* pg_snapshot */
	Datum window; /* pg_snapshot, or 0 */
	uint64 last_tx;
	int64 last_id;
} RelayPos;

/* What a message of a batch is to the relay. */
typedef enum MsgFate
{
	FATE_IN_BATCH, /* its batch records it */
	FATE_HELD,     /* not sent: waits behind an earlier event of its key */
	FATE_HANDED,   /* recorded as 'sending'; its report is recorded alone */
	FATE_SETTLED,  /* handed over, and its report recorded */
	FATE_DROPPED   /* its batch was given up: it is read again */
} MsgFate;

/*
 * Events read in one go, in order, and sent to Kafka.  Its memory is its
 * own and lives until Kafka has answered for every message sent, however
 * the batch was recorded meanwhile.
 */
typedef struct RelayBatch
{
	dlist_node node;
	MemoryContext memory;
	MemoryContext scratch;  /* a message being made, reset after each */
	bool retry;             /* retries: no place in the stream */
	bool admitted;          /* counted against outbox.max_in_flight_events */
	RelaySettings settings; /* as when the batch was read */
	int count;
	int capacity;
	OutboxMessage *msgs;
	MsgFate *fate;
	uint64 *key_hash; /* hash of (topic, msg_key), per event */
	uint64 *tx;       /* first sends: each event's transaction */
	int *attempts;    /* retries: failed attempts so far */
	bool *due;        /* retries: due when read */
	int recorded;     /* messages whose outcome is recorded or moot */
	TimestampTz sent_at;
	RelayPos before; /* first sends: the place before its first event */
	RelayPos after;  /* and after its last */
} RelayBatch;

/* One event of a batch. */
typedef struct RelayRef
{
	RelayBatch *batch;
	int i;
} RelayRef;

/* Outcomes counted for relay_status(), published by the loop. */
typedef struct RelayTally
{
	uint64 sent;
	uint64 failed;
	uint64 retried;
	const char *error; /* the latest failure's, in flight.c's memory */
} RelayTally;

/* step.c */
extern bool relay_begin(const char *activity);
extern bool relay_recreated(void);
extern bool relay_extension_absent(void);
extern bool relay_extension_installed(void);
extern bool relay_needs_update(void);
/* db_settings.c */
extern char *relay_db_settings(void);
extern void relay_commit(void);
extern const char *relay_activity(void);
extern bool relay_pause_set(void);
extern Datum relay_first_value(SPIPlanPtr *cache, const char *sql, int nargs,
							   const Oid *types, Datum *values, bool read_only,
							   bool *isnull);
extern void relay_wait_replicated(void);
extern void relay_run_plan(SPIPlanPtr *cache, const char *sql, int nargs,
						   const Oid *types, Datum *values, int expect,
						   bool custom);

/* batch.c */
extern RelaySettings relay_settings_now(void);
extern RelayBatch *relay_batch_new(bool retry, const RelaySettings *settings,
								   int capacity);
extern void relay_batch_free(RelayBatch *batch);
extern void relay_batch_row(BatchRow *out, HeapTuple row, TupleDesc desc);
extern int relay_batch_add(RelayBatch *batch, const BatchRow *row);
extern bool relay_batch_send(RelayBatch *batch, int i, const BatchRow *row);
extern bool relay_batch_answered(const RelayBatch *batch, int i);
extern uint64 relay_batch_first_waiting(const RelayBatch *batch);
extern bool relay_batch_all_answered(const RelayBatch *batch);
extern HTAB *relay_key_set(MemoryContext memory);
extern void relay_key_add(HTAB *keys, uint64 hash);
extern bool relay_key_has(HTAB *keys, uint64 hash);
extern uint64 relay_key_hash(const char *topic, const char *key);
extern uint64 relay_topic_hash(const char *topic);

/* event_state.c */
extern void relay_set_state(int64 id, const char *status, int attempts,
							int delay_ms, const char *error);
extern void relay_record_failure(const RelayBatch *batch, int i);
extern const char *relay_topic_missing_text(const char *topic, bool dead);
extern void relay_say_topic_missing(const char *topic, bool dead);
extern void relay_record_outcome(const RelayBatch *batch, int i);
extern int relay_backoff_ms(const RelaySettings *settings, int attempts);
extern void relay_pending_keys(HTAB *keys);
extern void relay_reset_sending(void);
extern void relay_mark_sent(const int64 *ids, int n);
extern bool relay_refused_before(int64 id);

/* flight.c */
extern void relay_flight_init(void);
extern void relay_flight_push(RelayBatch *batch);
extern RelayBatch *relay_flight_head(void);
extern RelayBatch *relay_flight_next(RelayBatch *batch);
extern RelayBatch *relay_flight_retry(void);
extern void relay_flight_set_retry(RelayBatch *batch);
extern void relay_flight_done(RelayBatch *batch);
extern void relay_flight_drop_from(RelayBatch *batch, int from);
extern void relay_flight_drop_all(bool handed_too);
extern void relay_flight_admit(RelayBatch *batch);
extern int relay_flight_room(const RelaySettings *settings,
							 const RelayBatch *reading);
extern bool relay_flight_failed_uncut(void);
extern bool relay_flight_empty(void);
extern bool relay_flight_idle(void);
extern bool relay_flight_may_hand_over(const RelayBatch *batch, TimestampTz now);
extern TimestampTz relay_flight_next_handover(void);
extern void relay_flight_hand_over(RelayBatch *batch, int i);
extern bool relay_flight_round_stuck(const RelayBatch *batch, uint64 round_seq,
									 TimestampTz now);
extern void relay_flight_hold_topic(const char *topic_name, TimestampTz until);
extern bool relay_flight_topic_stuck(uint64 topic_hash);
extern void relay_flight_held_keys(HTAB *keys);
extern int relay_flight_answered_handed(RelayRef *out, int max);
extern void relay_flight_settled(RelayRef *refs, int n);
extern void relay_flight_sweep(void);
extern void relay_tally(const OutboxMessage *msg, int attempts);
extern RelayTally relay_flight_take_tally(void);

/* first_sends.c */
typedef enum RelayRead
{
	READ_NOTHING, /* nothing new */
	READ_SOME,    /* a batch was read and sent; more may wait */
	READ_ALL,     /* a batch was read and sent, the window with it */
	READ_FULL,    /* no room in flight, or Kafka's queue is full */
	READ_GONE,    /* the extension is gone or being dropped */
	READ_PAUSED   /* an operator paused the relay: nothing read */
} RelayRead;

extern RelayRead relay_first_sends_read(int *taken);
extern bool relay_first_sends_settle(TimestampTz now, bool *unreachable);
extern TimestampTz relay_first_sends_record_at(void);
extern void relay_first_sends_abandon(void);
extern void relay_first_sends_restart(void);
extern char *relay_first_sends_recorded(void);
extern char *relay_first_sends_place(void);
extern bool relay_first_sends_move(const char *text);
extern char *relay_pos_text(const RelayPos *pos);

/* retries.c */
extern RelayRead relay_retries_read(void);
extern bool relay_retries_settle(TimestampTz now, bool *unreachable);
extern bool relay_handed_settle(void);
extern void relay_retries_abandon(void);
extern bool relay_retries_alone(void);
extern bool relay_retries_first(void);

/* worker.c */
typedef void (*RelayStep)(void *arg);
extern bool relay_guarded(RelayStep step, void *arg, const char *what);

/* exactly_once.c */
extern void relay_eos_restart(bool transactional);
extern bool relay_eos_tend(TimestampTz now, bool *unreachable);
extern bool relay_eos_may_read(void);
extern TimestampTz relay_eos_begin_at(void);
extern bool relay_eos_reads_more(void);
extern void relay_eos_reads_done(void);
extern void relay_eos_abandon(void);
extern bool relay_eos_may_settle(void);
extern const char *relay_eos_halted(void);
extern const char *relay_eos_broken(void);
extern bool relay_eos_waiting(void);
extern bool relay_eos_refused(void);
extern char *relay_eos_transactional_id(void);

/* sender.c */
extern bool relay_sender_load(void);
extern const char *relay_source(void);
extern int64 relay_sender(void);
extern const char *relay_sender_proof(void);
extern const char *relay_sender_proof_seen(void);
extern const char *relay_sender_new_proof(char *out, const char *seen);
extern void relay_sender_proof_committed(const char *token, const char *seen);

/* housekeeping.c */
extern bool relay_paused(void);
extern void relay_purge_step(void *arg);
extern bool relay_purge_due(TimestampTz now);
extern void relay_purge_done(TimestampTz now, int64 removed);
extern bool relay_alert_due(TimestampTz now);
extern void relay_alert_step(void *arg);

#endif /* OUTBOX_RELAY_H */
