/*
 * compat.h
 *		What differs between the PostgreSQL versions outbox builds against,
 *		in one place: the code calls these names, whatever the version.
 *
 * src/compat.h
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/memutils.h"

/* PostgreSQL 16 folded the per-kind owner checks into object_ownercheck. */
#if PG_VERSION_NUM >= 160000
#define database_ownercheck(dboid, roleid)                                    \
	object_ownercheck(DatabaseRelationId, (dboid), (roleid))
#else
#define database_ownercheck(dboid, roleid)                                    \
	pg_database_ownercheck((dboid), (roleid))
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

#endif /* OUTBOX_COMPAT_H */
