/*
 * compat.h
 *		What differs between the PostgreSQL versions outbox builds against,
 *		in one place: the code calls these names, whatever the version.
 *
 * src/compat.h
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "catalog/pg_database.h"
#include "catalog/pg_tablespace.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/memutils.h"

/* PostgreSQL 16 folded the per-kind owner checks into object_ownercheck. */
#if PG_VERSION_NUM >= 160000
#define database_ownercheck(dboid, roleid)                                    \
	object_ownercheck(DatabaseRelationId, (dboid), (roleid))
#else
#define database_ownercheck(dboid, roleid)                                    \
	pg_database_ownercheck((dboid), (roleid))
#endif

/* And the per-kind privilege checks into object_aclcheck. */
#if PG_VERSION_NUM >= 160000
#define tablespace_aclcheck(spcoid, roleid, mode)                             \
	object_aclcheck(TableSpaceRelationId, (spcoid), (roleid), (mode))
#else
#define tablespace_aclcheck(spcoid, roleid, mode)                             \
	pg_tablespace_aclcheck((spcoid), (roleid), (mode))
#endif

/*
 * A wait event set that lives as long as the process.  PostgreSQL 17
 * tracks sets by resource owner (none here: the set is never released
 * early), earlier versions by memory context.
 */
#if PG_VERSION_NUM >= 170000
#define outbox_wait_set_create(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define outbox_wait_set_create(nevents)                                       \
	CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/*
 * GUC "extra" data, which the server frees itself: with free() up to
 * PostgreSQL 15, from 16 on with guc_free(), so it must come from
 * guc_malloc().  NULL when out of memory (logged, never thrown: check
 * hooks report their own problems).
 */
#if PG_VERSION_NUM >= 160000
#define outbox_guc_malloc(size) guc_malloc(LOG, (size))
#define outbox_guc_free(ptr) guc_free(ptr)
#else
#define outbox_guc_malloc(size) malloc(size)
#define outbox_guc_free(ptr) free(ptr)
#endif

#endif /* OUTBOX_COMPAT_H */
