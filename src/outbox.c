/*
 * outbox.c
 *		Module entry point: _PG_init and the extension's settings.
 *
 * Loaded through shared_preload_libraries, the module also sets up shared
 * memory and the launcher that runs the relay.  Loaded on first use only,
 * it offers enqueue and claim, and events wait until a relay runs.
 *
 * src/outbox.c
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/guc.h"

#include "kafka.h"
#include "outbox.h"

PG_MODULE_MAGIC;

/* Constants: setting defaults and limits */

#define DEFAULT_TOPIC_PATTERN "outbox.event." OUTBOX_TOPIC_PLACEHOLDER
/*
 * librdkafka's default message.max.bytes: the largest event enqueue
 * accepts, counted as librdkafka counts it (validate.c), is one the
 * relay's producer sends.  Kafka's own default for a topic is larger
 * (max.message.bytes 1048588).
 */
#define DEFAULT_MAX_PAYLOAD_SIZE 1000000
#define MAX_MAX_PAYLOAD_SIZE (256 * 1024 * 1024)
#define DEFAULT_MAX_ATTEMPTS 10
#define DEFAULT_BACKOFF_MIN_MS 1000
#define DEFAULT_BACKOFF_MAX_MS 60000
#define MAX_BACKOFF_MS (24 * 3600 * 1000)
#define DEFAULT_BATCH_SIZE 5000
#define MAX_BATCH_SIZE 100000
/* Enough to keep a broker busy; payloads beyond it wait in the table. */
#define DEFAULT_MAX_IN_FLIGHT_EVENTS 20000
#define MAX_MAX_IN_FLIGHT_EVENTS 1000000
#define DEFAULT_MAX_IN_FLIGHT_SIZE (32 * 1024 * 1024)
#define MAX_MAX_IN_FLIGHT_SIZE (1024 * 1024 * 1024)
#define DEFAULT_POLL_INTERVAL_MS 1000
#define MAX_POLL_INTERVAL_MS 600000
#define DEFAULT_SENT_RETENTION_S 3600
#define DEFAULT_DEDUP_RETENTION_S (7 * 24 * 3600)
#define DEFAULT_ALERT_DELAY_S 60
#define MAX_RETENTION_S (INT_MAX / 2)
#define DEFAULT_MAX_RELAYS 8
#define MAX_MAX_RELAYS 256

/* Variables */

char *outbox_default_topic = NULL;
int outbox_max_payload_size = DEFAULT_MAX_PAYLOAD_SIZE;
OutboxNameList *outbox_allowed_topic_list = NULL;
OutboxNameList *outbox_allowed_consumer_list = NULL;
static char *allowed_topics = NULL;
static char *allowed_consumers = NULL;
char *outbox_database = NULL;
int outbox_max_relays = DEFAULT_MAX_RELAYS;
char *outbox_kafka_brokers = NULL;
char *outbox_kafka_properties = NULL;
int outbox_delivery = OUTBOX_DELIVERY_AT_LEAST_ONCE;
int outbox_message_format = OUTBOX_FORMAT_OUTBOX;
char *outbox_progress_topic = NULL;
int outbox_max_attempts = DEFAULT_MAX_ATTEMPTS;
int outbox_backoff_min = DEFAULT_BACKOFF_MIN_MS;
int outbox_backoff_max = DEFAULT_BACKOFF_MAX_MS;
bool outbox_missing_topic_dead = false;
int outbox_batch_size = DEFAULT_BATCH_SIZE;
int outbox_max_in_flight_events = DEFAULT_MAX_IN_FLIGHT_EVENTS;
int outbox_max_in_flight_size = DEFAULT_MAX_IN_FLIGHT_SIZE;
int outbox_poll_interval = DEFAULT_POLL_INTERVAL_MS;
int outbox_sent_retention = DEFAULT_SENT_RETENTION_S;
int outbox_dedup_retention = DEFAULT_DEDUP_RETENTION_S;
int outbox_alert_delay = DEFAULT_ALERT_DELAY_S;

static const struct config_enum_entry delivery_options[] = {
	{"at_least_once", OUTBOX_DELIVERY_AT_LEAST_ONCE, false},
	{"exactly_once", OUTBOX_DELIVERY_EXACTLY_ONCE, false},
	{NULL, 0, false}};

static const struct config_enum_entry message_format_options[] = {
	{"outbox", OUTBOX_FORMAT_OUTBOX, false},
	{"debezium", OUTBOX_FORMAT_DEBEZIUM, false},
	{NULL, 0, false}};

/* Prototypes */

void _PG_init(void);
static void define_enqueue_settings(void);
static void define_relay_settings(void);
static void define_allowed_settings(void);
static bool check_default_topic(char **newval, void **extra, GucSource source);
static bool check_allowed_topics(char **newval, void **extra, GucSource source);
static bool check_allowed_consumers(char **newval, void **extra,
									GucSource source);
static bool check_name_list(char **newval, void **extra, bool topics);
static void assign_allowed_topics(const char *newval, void *extra);
static void assign_allowed_consumers(const char *newval, void *extra);
static bool check_progress_topic(char **newval, void **extra, GucSource source);
static bool check_kafka_properties(char **newval, void **extra,
								   GucSource source);

/*
 * _PG_init: define the settings; when preloaded, also shared memory, the
 * launcher and the DROP DATABASE hook.
 */
void
_PG_init(void)
{
	/* pg_upgrade loads libraries only to check them; do nothing there. */
	if (IsBinaryUpgrade)
		return;

	/*
	 * The log hook first: defining outbox.kafka_properties checks the value
	 * read from the configuration files, and a refusal quotes it.
	 */
	outbox_redact_init();
	define_enqueue_settings();
	define_relay_settings();
	/* Sizes shared memory: defined, like it, only when preloaded. */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable(
			"outbox.max_relays",
			gettext_noop("Most relays running at once, one per database."),
			gettext_noop("Each also takes one of max_worker_processes."),
			&outbox_max_relays, DEFAULT_MAX_RELAYS, 1, MAX_MAX_RELAYS,
			PGC_POSTMASTER, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("outbox");
	outbox_wake_init();

	if (!process_shared_preload_libraries_in_progress)
		return;
	outbox_shmem_init();
	outbox_launcher_register();
}

/*
 * define_enqueue_settings: settings read by outbox.enqueue() and
 * outbox.claim().  All are for superusers: they route events and bound
 * what one service may do to another's topics and claims.
 */
static void
define_enqueue_settings(void)
{
	DefineCustomStringVariable(
		"outbox.default_topic",
		gettext_noop("Kafka topic of events enqueued without one."),
		gettext_noop("\"{biz_type}\" is replaced by the event's biz_type."),
		&outbox_default_topic, DEFAULT_TOPIC_PATTERN, PGC_SUSET, 0,
		check_default_topic, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.max_payload_size",
		gettext_noop(
			"Largest event outbox.enqueue() and enqueue_bytes() accept: value, key and headers."),
		gettext_noop(
			"Counts what librdkafka's message.max.bytes counts: the message value (enqueue's payload as compact JSON text, enqueue_bytes' bytes), the message key, the names and values of the event's headers and of the relay's (event_id, biz_type, biz_key), and the record's framing. Keep it at or below message.max.bytes in outbox.kafka_properties and the topics' max.message.bytes on the brokers."),
		&outbox_max_payload_size, DEFAULT_MAX_PAYLOAD_SIZE, 1,
		MAX_MAX_PAYLOAD_SIZE, PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);

	define_allowed_settings();
}

/*
 * define_allowed_settings: the topics and consumer names a session may
 * use, set per role or database by a superuser.
 */
static void
define_allowed_settings(void)
{
	DefineCustomStringVariable(
		"outbox.allowed_topics",
		gettext_noop("Topics outbox.enqueue() may write to; empty: any."),
		gettext_noop(
			"Comma-separated topic names; a trailing \"*\" makes a prefix. Set per role with ALTER ROLE ... SET."),
		&allowed_topics, "", PGC_SUSET, 0, check_allowed_topics,
		assign_allowed_topics, NULL);

	DefineCustomStringVariable(
		"outbox.allowed_consumers",
		gettext_noop("Consumer names outbox.claim() may claim under; empty: any."),
		gettext_noop(
			"Comma-separated consumer names; a trailing \"*\" makes a prefix. Set per role with ALTER ROLE ... SET."),
		&allowed_consumers, "", PGC_SUSET, 0, check_allowed_consumers,
		assign_allowed_consumers, NULL);
}

/*
 * define_relay_settings: settings read by the launcher and the relays;
 * all take effect on reload.  Those a database may have its own value of
 * (ALTER DATABASE ... SET, by a superuser) are PGC_SUSET; the relay runs
 * no query of a session's, so a session's SET reaches no relay.
 * outbox.kafka_properties may hold secrets and stays in the configuration
 * files: every role can read pg_db_role_setting.
 */
static void
define_relay_settings(void)
{
	DefineCustomStringVariable(
		"outbox.database",
		gettext_noop("The only database relayed; empty: every database where "
					 "the extension is installed."),
		NULL, &outbox_database, "", PGC_SIGHUP, 0, NULL, NULL, NULL);

	DefineCustomStringVariable(
		"outbox.kafka_brokers",
		gettext_noop("Kafka bootstrap servers, host:port[,host:port...]."),
		gettext_noop("Empty: the relay stays idle."), &outbox_kafka_brokers,
		"", PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomStringVariable(
		"outbox.kafka_properties",
		gettext_noop("librdkafka producer properties, as key=value;key=value."),
		gettext_noop("For TLS, SASL and tuning; \\; in a value is a ;, \\\\ a \\. "
					 "Readable by superusers and pg_read_all_settings only."),
		&outbox_kafka_properties, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY,
		check_kafka_properties, NULL, NULL);

	DefineCustomEnumVariable(
		"outbox.delivery",
		gettext_noop("at_least_once, or exactly_once: each batch in one Kafka "
					 "transaction with the relay's progress."),
		gettext_noop("exactly_once needs a cluster with transactions; consumers "
					 "see each event once when they read with "
					 "isolation.level=read_committed."),
		&outbox_delivery, OUTBOX_DELIVERY_AT_LEAST_ONCE, delivery_options,
		PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomEnumVariable(
		"outbox.message_format",
		gettext_noop("outbox, or debezium: messages shaped as Debezium's outbox "
					 "event router writes them."),
		gettext_noop("debezium: the payload as jsonb's text, and headers id and "
					 "type in place of event_id and biz_type."),
		&outbox_message_format, OUTBOX_FORMAT_OUTBOX, message_format_options,
		PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomStringVariable(
		"outbox.progress_topic",
		gettext_noop("Compacted Kafka topic where exactly_once keeps the "
					 "relay's progress."),
		gettext_noop("Created by the relay when missing; one record per "
					 "relayed database."),
		&outbox_progress_topic, "outbox_progress", PGC_SUSET, 0,
		check_progress_topic, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.max_attempts",
		gettext_noop("Failed deliveries after which an event becomes dead."),
		gettext_noop(
			"Only failures the broker reports for the event count toward death; timeouts never do."),
		&outbox_max_attempts, DEFAULT_MAX_ATTEMPTS, 1, 1000, PGC_SUSET, 0,
		NULL, NULL, NULL);

	DefineCustomBoolVariable(
		"outbox.missing_topic_dead",
		gettext_noop("Whether an event whose topic does not exist becomes "
					 "dead after outbox.max_attempts."),
		gettext_noop("Off: it waits, retried with backoff, until the topic is "
					 "created."),
		&outbox_missing_topic_dead, false, PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.backoff_min",
		gettext_noop("Shortest wait before retrying a failed event."), NULL,
		&outbox_backoff_min, DEFAULT_BACKOFF_MIN_MS, 1, MAX_BACKOFF_MS,
		PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.backoff_max",
		gettext_noop("Longest wait before retrying a failed event."), NULL,
		&outbox_backoff_max, DEFAULT_BACKOFF_MAX_MS, 1, MAX_BACKOFF_MS,
		PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.batch_size",
		gettext_noop("Most events the relay reads and sends in one batch."),
		NULL, &outbox_batch_size, DEFAULT_BATCH_SIZE, 1, MAX_BATCH_SIZE,
		PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.max_in_flight_events",
		gettext_noop(
			"Most events the relay has sent and Kafka not yet answered for."),
		gettext_noop(
			"Several batches are in flight while the oldest is answered."),
		&outbox_max_in_flight_events, DEFAULT_MAX_IN_FLIGHT_EVENTS, 1,
		MAX_MAX_IN_FLIGHT_EVENTS, PGC_SUSET, 0, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.max_in_flight_size",
		gettext_noop(
			"Most payload bytes the relay has sent and Kafka not yet answered for."),
		gettext_noop("Bounds the relay's memory whatever the payloads: "
					 "librdkafka holds a copy of each event in flight."),
		&outbox_max_in_flight_size, DEFAULT_MAX_IN_FLIGHT_SIZE, 1,
		MAX_MAX_IN_FLIGHT_SIZE, PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.poll_interval",
		gettext_noop("Longest the relay sleeps without a commit waking it."),
		gettext_noop("Commits wake the relay at once; the poll serves retries."),
		&outbox_poll_interval, DEFAULT_POLL_INTERVAL_MS, 10,
		MAX_POLL_INTERVAL_MS, PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.sent_retention",
		gettext_noop(
			"How long sent events are kept before the relay removes them."),
		gettext_noop(
			"Also how long enqueue's idempotency on (biz_type, biz_key) lasts."),
		&outbox_sent_retention, DEFAULT_SENT_RETENTION_S, 0, MAX_RETENTION_S,
		PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.dedup_retention",
		gettext_noop(
			"How long consumer claims are kept before the relay removes them."),
		gettext_noop("Must exceed how long Kafka can redeliver an event."),
		&outbox_dedup_retention, DEFAULT_DEDUP_RETENTION_S, 0, MAX_RETENTION_S,
		PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);

	DefineCustomIntVariable(
		"outbox.alert_delay",
		gettext_noop("Age of the oldest unsent event that makes the relay warn."),
		gettext_noop("0 turns the warning off."), &outbox_alert_delay,
		DEFAULT_ALERT_DELAY_S, 0, MAX_RETENTION_S, PGC_SUSET, GUC_UNIT_S, NULL,
		NULL, NULL);
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
	size_t len;

	if (*newval == NULL)
		return true;
	example = outbox_topic_from_pattern(*newval, "x", 1, &len);
	problem = outbox_topic_problem(example, len);
	pfree(example);
	if (problem != NULL)
	{
		GUC_check_errdetail("A Kafka topic name made from it %s.", problem);
		return false;
	}
	return true;
}

/*
 * check_allowed_topics: parse outbox.allowed_topics once per new value.
 */
static bool
check_allowed_topics(char **newval, void **extra, GucSource source)
{
	return check_name_list(newval, extra, true);
}

/*
 * check_allowed_consumers: parse outbox.allowed_consumers once per new
 * value.
 */
static bool
check_allowed_consumers(char **newval, void **extra, GucSource source)
{
	return check_name_list(newval, extra, false);
}

/*
 * check_name_list: parse a name list into *extra, which the assign hook
 * then publishes, so that enqueue and claim never parse it per call.
 */
static bool
check_name_list(char **newval, void **extra, bool topics)
{
	const char *problem = NULL;

	if (*newval == NULL)
		return true;
	*extra = outbox_name_list_parse(*newval, topics, &problem);
	if (problem != NULL)
	{
		GUC_check_errdetail("%s", problem);
		return false;
	}
	return true;
}

/*
 * assign_allowed_topics: publish the list check_allowed_topics parsed.
 */
static void
assign_allowed_topics(const char *newval, void *extra)
{
	outbox_allowed_topic_list = (OutboxNameList *) extra;
}

/*
 * assign_allowed_consumers: publish the list check_allowed_consumers
 * parsed.
 */
static void
assign_allowed_consumers(const char *newval, void *extra)
{
	outbox_allowed_consumer_list = (OutboxNameList *) extra;
}

/*
 * check_progress_topic: a legal Kafka topic name.
 */
static bool
check_progress_topic(char **newval, void **extra, GucSource source)
{
	const char *problem;

	if (*newval == NULL)
		return true;
	problem = outbox_topic_problem(*newval, strlen(*newval));
	if (problem == NULL)
		return true;
	GUC_check_errdetail("A Kafka topic name %s.", problem);
	return false;
}

/*
 * check_kafka_properties: refuse properties librdkafka would refuse, so a
 * typo fails at ALTER SYSTEM or reload instead of silently idling the
 * relay, and those that would crash it.  The message names a property
 * librdkafka knows, or the entry's position, never a value.  The statement
 * that sets a value is hidden from pg_stat_activity.
 */
static bool
check_kafka_properties(char **newval, void **extra, GucSource source)
{
	char problem[256];
	const char *hint;

	outbox_redact_activity();
	if (*newval == NULL ||
		outbox_kafka_check_properties(*newval, problem, sizeof(problem), &hint))
		return true;
	GUC_check_errdetail("%s", problem);
	if (hint != NULL)
		GUC_check_errhint("%s", hint);
	return false;
}
