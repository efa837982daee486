/*
 * log_spy.c
 *		A test-only module: an emit_log_hook that writes every field of every
 *		message it is passed to log_spy.out in the data directory.
 *
 * Preloaded before outbox (shared_preload_libraries = 'outbox_log_spy,
 * outbox'), its hook is the one outbox's hook chains to: what it writes is
 * what another extension's hook would see.  test/integration/secrets.sh
 * checks that no secret of outbox.kafka_properties is among it.
 */
#include "postgres.h"

#include "fmgr.h"
#include "tcop/tcopprot.h"
#include "utils/elog.h"

PG_MODULE_MAGIC;

void _PG_init(void);

static emit_log_hook_type prev_emit_log_hook = NULL;

/*
 * spy: append the message's fields (and its statement, unless hidden) to
 * log_spy.out, then chain.
 */
static void
spy(ErrorData *edata)
{
	FILE *out = fopen("log_spy.out", "a");

	if (out != NULL)
	{
		fprintf(out, "message: %s\n", edata->message ? edata->message : "");
		if (edata->detail)
			fprintf(out, "detail: %s\n", edata->detail);
		if (edata->detail_log)
			fprintf(out, "detail_log: %s\n", edata->detail_log);
		if (edata->context)
			fprintf(out, "context: %s\n", edata->context);
		if (edata->internalquery)
			fprintf(out, "internalquery: %s\n", edata->internalquery);
		if (debug_query_string && !edata->hide_stmt)
			fprintf(out, "statement: %s\n", debug_query_string);
		fclose(out);
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * _PG_init: install the hook.
 */
void
_PG_init(void)
{
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = spy;
}
