/*
 * progress_record.h
 *		A progress record of exactly_once, taken apart (progress_record.c).
 *
 * Kept apart from relay.h so that the parser can be built without a
 * backend: the fuzz harness (test/tools/progress_fuzz.c) compiles
 * progress_record.c alone, under AddressSanitizer and
 * UndefinedBehaviorSanitizer.
 *
 * src/progress_record.h
 */
#ifndef OUTBOX_PROGRESS_RECORD_H
#define OUTBOX_PROGRESS_RECORD_H

#include "c.h"

/* The progress record's first line: its format. */
#define PROGRESS_FORMAT "outbox progress 1"

/*
 * A progress record, taken apart.  The texts point into the record's own
 * text; the id lists are palloc'd.
 */
typedef struct ProgressRecord
{
	Oid database;
	uint32 timeline; /* where it was written: WAL timeline, 0 if unsaid */
	uint64 wal;      /* and WAL insert position then, 0 if unsaid */
	char *proof;
	char *from;
	char *to;
	int64 *sent;
	int nsent;
	int64 *held;
	int nheld;
} ProgressRecord;

extern bool progress_record_parse(char *text, Oid database,
								  const char *const *proofs,
								  ProgressRecord *out);

#endif /* OUTBOX_PROGRESS_RECORD_H */
