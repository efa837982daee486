/*
 * outbox.c
 *		Module entry point: _PG_init and the extension's settings.
 *
 * The library is loaded on first use of an outbox function in a backend.
 * Settings are defined here so they are known, checked and documented in
 * one place.
 *
 * src/outbox.c
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "outbox.h"

PG_MODULE_MAGIC;

/* Constants: setting defaults and limits */

#define DEFAULT_TOPIC_PATTERN "outbox.event." OUTBOX_TOPIC_PLACEHOLDER
#define DEFAULT_MAX_PAYLOAD_SIZE (1024 * 1024) /* Kafka's message.max.bytes */
#define MIN_MAX_PAYLOAD_SIZE 1
#define MAX_MAX_PAYLOAD_SIZE (256 * 1024 * 1024)

/* Variables */

char *outbox_default_topic = NULL;
int outbox_max_payload_size = DEFAULT_MAX_PAYLOAD_SIZE;

/* Prototypes */

void _PG_init(void);
static bool check_default_topic(char **newval, void **extra, GucSource source);

/*
 * _PG_init: define the settings.
 */
void
_PG_init(void)
{
	/* pg_upgrade loads libraries only to check them; do nothing there. */
	if (IsBinaryUpgrade)
		return;

	DefineCustomStringVariable(
		"outbox.default_topic",
		gettext_noop("Kafka topic of events enqueued without one."),
		gettext_noop("\"{biz_type}\" is replaced by the event's biz_type."),
		&outbox_default_topic, DEFAULT_TOPIC_PATTERN, PGC_USERSET, 0,
		check_default_topic, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.max_payload_size",
		gettext_noop("Largest payload outbox.enqueue() accepts, as JSON text."),
		gettext_noop("Keep it at or below the broker's message.max.bytes."),
		&outbox_max_payload_size, DEFAULT_MAX_PAYLOAD_SIZE, MIN_MAX_PAYLOAD_SIZE,
		MAX_MAX_PAYLOAD_SIZE, PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);

	MarkGUCPrefixReserved("outbox");
}

/*
 * check_default_topic: accept a pattern only if it yields a legal topic
 * name for a plain biz_type.
 */
static bool
check_default_topic(char **newval, void **extra, GucSource source)
{
	const char *problem;
	char *example;

	if (*newval == NULL)
		return true;
	example = outbox_topic_from_pattern(*newval, "x");
	problem = outbox_topic_problem(example);
	pfree(example);
	if (problem != NULL)
	{
		GUC_check_errdetail("A Kafka topic name made from it %s.", problem);
		return false;
	}
	return true;
}
