/*
 * refusals.c
 *		Which refused events are retried alone.
 *
 * Kafka refuses a partition's whole batch of records for one record it
 * cannot take (one larger than the topic's max.message.bytes: the limit is
 * the batch's; a record without a key on a compacted topic), so the events
 * sent with the guilty one are refused with it; retried together they are
 * refused together again, and would die with it.  An event refused on a
 * retry too is therefore retried alone (retries.c), and its neighbours go
 * through, if Kafka accepted other events of its topic between its two
 * refusals: then the refusal is the event's (or a neighbour's), not the
 * topic's.  When Kafka refuses a whole topic for a while (its limit
 * lowered, then raised again), it accepts nothing of it in between, and
 * its events keep draining together, at the pace of batches: sent one by
 * one, thousands of them would hold their keys back for minutes.
 *
 * Kept in memory only: after a restart the refused events travel together
 * once more, which costs each an attempt, no more.
 *
 * src/refusals.c
 */
#include "postgres.h"

#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "relay.h"

/* A refused event waiting for its retry. */
typedef struct Refusal
{
	int64 id;        /* hash key */
	uint64 accepted; /* its topic's acceptances at its latest refusal */
	bool alone;      /* retried alone */
} Refusal;

/* Events of a topic Kafka accepted since the relay started. */
typedef struct Acceptances
{
	uint64 topic_hash; /* hash key */
	uint64 count;
} Acceptances;

static HTAB *refusals = NULL;
static HTAB *acceptances = NULL;

static uint64 *accepted_of(const char *topic);
static HTAB *map_create(const char *name, Size entrysize);

/*
 * relay_note_accepted: Kafka accepted an event of topic.
 */
void
relay_note_accepted(const char *topic)
{
	(*accepted_of(topic))++;
}

/*
 * relay_note_refused: the broker refused event id of topic (is_refused),
 * or the event needs no more retries (delivered, dead): remember it or
 * forget it.
 */
void
relay_note_refused(int64 id, const char *topic, bool is_refused)
{
	Refusal *refusal;
	uint64 accepted;
	bool found;

	if (!is_refused)
	{
		if (refusals != NULL)
			(void) hash_search(refusals, &id, HASH_REMOVE, NULL);
		return;
	}
	if (refusals == NULL)
		refusals = map_create("outbox refused events", sizeof(Refusal));
	accepted = *accepted_of(topic);
	refusal = hash_search(refusals, &id, HASH_ENTER, &found);
	refusal->alone = found && (refusal->alone || accepted > refusal->accepted);
	refusal->accepted = accepted;
}

/*
 * relay_refused_alone: whether event id is to be retried alone.
 */
bool
relay_refused_alone(int64 id)
{
	Refusal *refusal;

	if (refusals == NULL)
		return false;
	refusal = hash_search(refusals, &id, HASH_FIND, NULL);
	return refusal != NULL && refusal->alone;
}

/*
 * accepted_of: the counter of topic's acceptances.
 */
static uint64 *
accepted_of(const char *topic)
{
	uint64 hash = relay_topic_hash(topic);
	Acceptances *entry;
	bool found;

	if (acceptances == NULL)
		acceptances =
			map_create("outbox acceptances per topic", sizeof(Acceptances));
	entry = hash_search(acceptances, &hash, HASH_ENTER, &found);
	if (!found)
		entry->count = 0;
	return &entry->count;
}

/*
 * map_create: a table for the process's life, keyed by its entries' first
 * 8 bytes.
 */
static HTAB *
map_create(const char *name, Size entrysize)
{
	HASHCTL ctl = {.keysize = sizeof(uint64),
				   .entrysize = entrysize,
				   .hcxt = TopMemoryContext};

	return hash_create(name, 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}
