/*
 * redact.c
 *		Keep outbox.kafka_properties out of the server log and off the wire.
 *
 * The setting may hold SASL passwords and TLS key passphrases.  PostgreSQL
 * itself would write its value, or part of it, wherever a message quotes
 * the setting or the statement that sets it: "parameter ... changed to"
 * at reload, "invalid value for parameter" at start and reload, the
 * statement logged by log_statement or log_min_error_statement, the
 * statement's parameters, the CONTEXT of a function that sets it, and the
 * token a syntax error quotes, in SQL or in a configuration file.  An
 * emit_log_hook cuts the value from such messages before anything is
 * written or sent, and before any other extension's hook sees them.
 *
 * The setting is recognised by "kafka_properties" in any case, whatever
 * stands around it (quotes, white space, comments between "outbox" and
 * the dot): a superset of the ways to spell it.  A name built at run time
 * (set_config('outbox.kafka_' || 'properties', ...)) or written with
 * Unicode escapes (U&"...") is not recognised: no one types that by
 * accident.  The hook exists only where the module is loaded, which for
 * the setting to mean anything is everywhere (shared_preload_libraries).
 *
 * src/redact.c
 */
#include "postgres.h"

#include "miscadmin.h"
#include "tcop/tcopprot.h"
#include "utils/backend_status.h"
#include "utils/elog.h"

#include "outbox.h"

#define SECRET_NAME "kafka_properties"
#define HIDDEN_ACTIVITY                                                       \
	"-- (hidden: the statement names outbox.kafka_properties)"

/* Message ids (untranslated formats) this file knows. */
#define CHECK_FAILED_MESSAGE "invalid value for parameter \"%s\": \"%s\""
#define CONF_TOKEN_MESSAGE                                                    \
	"syntax error in file \"%s\" line %u, near token \"%s\""
#define SQL_TOKEN_MESSAGE "%s at or near \"%s\""

static emit_log_hook_type prev_emit_log_hook = NULL;

static void redact(ErrorData *edata);
static void redact_statement_message(ErrorData *edata);
static const char *secret_named(const char *text);
static char *redacted(char *text);
static bool quotes_only_the_name(ErrorData *edata);
static bool has_message_id(ErrorData *edata, const char *id);
static char *without_last_argument(ErrorData *edata);
static const char *last_conversion(const char *fmt, const char **prev_end);

/*
 * outbox_redact_init: install the hook.
 */
void
outbox_redact_init(void)
{
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = redact;
}

/*
 * outbox_redact_activity: in a client backend running a statement that
 * names the setting, show pg_stat_activity a placeholder instead of the
 * statement.  pg_read_all_stats members (pg_monitor) read other sessions'
 * statements there, and an idle session's last one stays for hours.
 */
void
outbox_redact_activity(void)
{
	/* The state stays what it is: only the text changes. */
	if (MyBackendType == B_BACKEND && MyBEEntry != NULL &&
		debug_query_string != NULL && secret_named(debug_query_string))
		pgstat_report_activity(MyBEEntry->st_state, HIDDEN_ACTIVITY);
}

/*
 * redact: the hook: cut the secret setting's value from every part of the
 * message, then pass the message on to the hook installed before ours.
 */
static void
redact(ErrorData *edata)
{
	/* A configuration file's syntax error may quote any setting's value. */
	if (has_message_id(edata, CONF_TOKEN_MESSAGE))
		edata->message = without_last_argument(edata);

	if (debug_query_string != NULL && secret_named(debug_query_string))
		redact_statement_message(edata);
	else if (edata->message != NULL && secret_named(edata->message) &&
			 !quotes_only_the_name(edata))
	{
		edata->message = redacted(edata->message);
		/* Such as log_statement's "parameters: $1 = ...". */
		if (!has_message_id(edata, CHECK_FAILED_MESSAGE))
			edata->detail = edata->detail_log = NULL;
	}
	edata->detail = redacted(edata->detail);
	edata->detail_log = redacted(edata->detail_log);
	edata->context = redacted(edata->context);
	if (edata->internalquery != NULL && secret_named(edata->internalquery))
	{
		edata->internalquery = NULL;
		edata->internalpos = 0;
	}

	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * redact_statement_message: a message raised while running a statement
 * that names the setting.  Anything in it may quote the statement: keep
 * only the message (cut) and the check hook's detail, which is ours.
 */
static void
redact_statement_message(ErrorData *edata)
{
	/* A statement that fails never reaches the check hook: hide it here. */
	outbox_redact_activity();
	edata->hide_stmt = true;
	if (has_message_id(edata, SQL_TOKEN_MESSAGE))
		edata->message = without_last_argument(edata);
	if (!quotes_only_the_name(edata))
		edata->message = redacted(edata->message);
	if (!has_message_id(edata, CHECK_FAILED_MESSAGE))
		edata->detail = edata->detail_log = NULL;
	edata->context = NULL;
	edata->internalquery = NULL;
	edata->internalpos = 0;
}

/*
 * secret_named: where text first names the setting, case ignored; NULL if
 * it does not.
 */
static const char *
secret_named(const char *text)
{
	size_t len = strlen(SECRET_NAME);

	for (const char *p = text; *p != '\0'; p++)
		if (pg_strncasecmp(p, SECRET_NAME, len) == 0)
			return p;
	return NULL;
}

/*
 * redacted: text up to and with the first mention of the setting's name
 * (and the quote closing it), then "(value hidden)": what followed is, or
 * may be, its value.  Text that does not name the setting, as is.
 */
static char *
redacted(char *text)
{
	const char *at = text ? secret_named(text) : NULL;
	const char *end;

	if (at == NULL)
		return text;
	end = at + strlen(SECRET_NAME);
	if (*end == '"')
		end++;
	return psprintf("%.*s (value hidden)", (int) (end - text), text);
}

/*
 * quotes_only_the_name: whether the message's one argument is the
 * setting's name and nothing more, as in "parameter "%s" cannot be changed
 * now": such a message holds no value and is kept whole.  "statement: %s"
 * is not one of them.
 */
static bool
quotes_only_the_name(ErrorData *edata)
{
	const char *fmt;
	const char *prev_end;
	const char *conv;
	size_t prefix;
	size_t suffix;
	size_t len;
	StringInfoData arg;

	if (edata->message == NULL || edata->message_id == NULL)
		return false;
	fmt = dgettext(edata->domain, edata->message_id);
	conv = last_conversion(fmt, &prev_end);
	if (conv == NULL || prev_end != fmt || strncmp(conv, "%s", 2) != 0)
		return false;
	prefix = conv - fmt;
	suffix = strlen(conv + 2);
	len = strlen(edata->message);
	if (len < prefix + suffix || strncmp(edata->message, fmt, prefix) != 0 ||
		strcmp(edata->message + len - suffix, conv + 2) != 0)
		return false;
	/* The argument, without quotes and white space, is the name. */
	initStringInfo(&arg);
	for (const char *p = edata->message + prefix;
		 p < edata->message + len - suffix; p++)
		if (*p != '"' && !isspace((unsigned char) *p))
			appendStringInfoChar(&arg, *p);
	return pg_strcasecmp(arg.data, "outbox." SECRET_NAME) == 0;
}

/*
 * has_message_id: whether the message was made from the format id.
 */
static bool
has_message_id(ErrorData *edata, const char *id)
{
	return edata->message != NULL && edata->message_id != NULL &&
		   strcmp(edata->message_id, id) == 0;
}

/*
 * without_last_argument: the message without the text its format's last
 * %s put there (a token that may be part of a secret), whatever language
 * the message is in: cut where the literal text before that %s first
 * appears.  Cutting too early hides more, never less.
 */
static char *
without_last_argument(ErrorData *edata)
{
	const char *fmt = dgettext(edata->domain, edata->message_id);
	const char *prev_end;
	const char *last = last_conversion(fmt, &prev_end);
	char *literal;
	const char *at;

	if (last == NULL || last == prev_end)
		return pstrdup("syntax error (token hidden)");
	literal = pnstrdup(prev_end, last - prev_end);
	at = strstr(edata->message, literal);
	pfree(literal);
	if (at == NULL)
		return pstrdup("syntax error (token hidden)");
	return psprintf("%.*s (token hidden)", (int) (at - edata->message),
					edata->message);
}

/*
 * last_conversion: where fmt's last conversion (%s, %u...) starts, and in
 * *prev_end where the one before it ends (or fmt starts); NULL if there is
 * none, or if a translation reorders its arguments (%1$s).
 */
static const char *
last_conversion(const char *fmt, const char **prev_end)
{
	const char *last = NULL;
	const char *end = fmt;

	*prev_end = fmt;
	for (const char *p = fmt; *p != '\0'; p++)
	{
		if (*p != '%')
			continue;
		if (p[1] == '%')
		{
			p++;
			continue;
		}
		*prev_end = end;
		last = p;
		p += strspn(p + 1, "0123456789.-+ #lhzjt$") + 1;
		if (*p == '\0' || memchr(last, '$', p - last) != NULL)
			return NULL;
		end = p + 1;
	}
	return last;
}
