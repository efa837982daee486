/*
 * db_settings.c
 *		The outbox settings ALTER DATABASE ... SET gave the relay's database.
 *
 * The relay takes them as it connects, like any session.  A reload does
 * not read them again: the server applies only the configuration files.
 * So the relay compares them at each reload with those it started with,
 * and restarts when they changed (the launcher starts it again at once);
 * they are read from pg_db_role_setting, the entries set for the database
 * and every role (ALTER DATABASE ... SET).
 *
 * src/db_settings.c
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_db_role_setting.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "relay.h"

static void append_outbox_entries(StringInfo out, Datum setconfig);

/*
 * relay_db_settings: this database's outbox.* entries, one per line, in
 * TopMemoryContext.
 */
char *
relay_db_settings(void)
{
	StringInfoData out;
	Relation rel;
	ScanKeyData keys[2];
	SysScanDesc scan;
	HeapTuple tup;
	char *settings;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DbRoleSettingRelationId, AccessShareLock);
	ScanKeyInit(&keys[0], Anum_pg_db_role_setting_setdatabase,
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(MyDatabaseId));
	ScanKeyInit(&keys[1], Anum_pg_db_role_setting_setrole,
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(InvalidOid));
	scan = systable_beginscan(rel, DbRoleSettingDatidRolidIndexId, true, NULL,
							  2, keys);
	initStringInfo(&out);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool isnull;
		Datum setconfig = heap_getattr(tup, Anum_pg_db_role_setting_setconfig,
									   RelationGetDescr(rel), &isnull);

		if (!isnull)
			append_outbox_entries(&out, setconfig);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	settings = MemoryContextStrdup(TopMemoryContext, out.data);
	PopActiveSnapshot();
	CommitTransactionCommand();
	return settings;
}

/*
 * append_outbox_entries: the "outbox.name=value" entries of a setconfig
 * array, each on a line of out.
 */
static void
append_outbox_entries(StringInfo out, Datum setconfig)
{
	ArrayType *array = DatumGetArrayTypeP(setconfig);
	Datum *items;
	bool *nulls;
	int n;

	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &items, &nulls,
					  &n);
	for (int i = 0; i < n; i++)
	{
		char *entry;

		if (nulls[i])
			continue;
		entry = TextDatumGetCString(items[i]);
		if (strncmp(entry, "outbox.", 7) == 0)
			appendStringInfo(out, "%s\n", entry);
		pfree(entry);
	}
}
