/*
 * plan.c
 *		Prepared SPI statements kept for the life of the backend.
 *
 * enqueue and claim run once per event; planning their statement once per
 * backend instead of once per call keeps them close to a plain INSERT.
 *
 * src/plan.c
 */
#include "postgres.h"

#include "executor/spi.h"

#include "outbox.h"

/*
 * outbox_keep_plan: the plan in *cache, prepared and kept on first use,
 * and planned once (generic); with custom, planned anew for each call's
 * parameter values.  Call between SPI_connect and SPI_finish.
 *
 * Generic is said outright: left to plan_cache_mode's default, a query
 * whose parameters select a narrow range (the relay's window parts) has
 * custom plans that look cheaper than the generic one forever, and was
 * planned on every call, a third of the relay's time at 1,000 events/s.
 */
SPIPlanPtr
outbox_keep_plan(SPIPlanPtr *cache, const char *sql, int nargs,
				 const Oid *argtypes, bool custom)
{
	SPIPlanPtr plan;

	if (*cache != NULL)
		return *cache;

	plan = SPI_prepare_cursor(sql, nargs, (Oid *) argtypes,
							  custom ? CURSOR_OPT_CUSTOM_PLAN
									 : CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "could not prepare \"%s\": %s", sql,
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "could not keep the plan of \"%s\"", sql);
	*cache = plan;
	return plan;
}
