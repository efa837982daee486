/*
 * redact.c
 *		Keep outbox.kafka_properties out of the server log.
 *
 * The setting may hold SASL passwords and TLS key passphrases.  PostgreSQL
 * itself would write its value to the log when a reload changes it
 * ("parameter ... changed to ...") or refuses it ("invalid value for
 * parameter ..."), and the text of an ALTER SYSTEM statement that sets it
 * on error.  An emit_log_hook cuts the value from such messages and hides
 * such statements, before anything is written or sent.
 *
 * src/redact.c
 */
#include "postgres.h"

#include "tcop/tcopprot.h"
#include "utils/elog.h"

#include "outbox.h"

#define SECRET_SETTING "outbox.kafka_properties"
#define SECRET_NAME "kafka_properties"

static emit_log_hook_type prev_emit_log_hook = NULL;

static void redact(ErrorData *edata);
static char *redacted(const char *text);

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
 * redact: the hook: strip the secret setting's value from the message and
 * its detail, and never show a statement that names the setting.
 */
static void
redact(ErrorData *edata)
{
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);

	if (edata->message && strstr(edata->message, SECRET_NAME))
		edata->message = redacted(edata->message);
	if (edata->detail && strstr(edata->detail, SECRET_NAME))
		edata->detail = redacted(edata->detail);
	if (debug_query_string && strstr(debug_query_string, SECRET_NAME))
		edata->hide_stmt = true;
}

/*
 * redacted: text up to the first mention of the setting's name, then that
 * name and nothing more: what followed is, or may be, its value.
 */
static char *
redacted(const char *text)
{
	const char *at = strstr(text, SECRET_NAME);

	return psprintf("%.*s%s\" (value hidden)", (int) (at - text), text,
					SECRET_NAME);
}
