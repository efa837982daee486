/*
 * progress_fuzz.c
 *		A seeded fuzz of the progress record's parser (src/progress_record.c),
 *		built with it alone under AddressSanitizer and
 *		UndefinedBehaviorSanitizer (make test/tools/outbox-progress-fuzz).
 *
 * What the exactly_once relay reads back from its progress topic is
 * untrusted: anyone with write access to the topic can put any bytes
 * there, and a 25-byte record once crashed the relay.  Each round makes a
 * genuine record (the relay's own format, its fields in any order, ids up
 * to INT64_MAX, lists of hundreds of kB at times), which must be accepted
 * with exactly its values, then hostile variants of it: truncated at every
 * length, bytes changed (NUL included), random binary, a field repeated
 * or missing, numbers overlong, zero, negative or with a sign, another
 * database, another proof (empty, shorter, longer), stray spaces and
 * separators, nothing at all.  Those built to be malformed must be
 * rejected; and whatever the parser accepts, of any case, must be exactly
 * well-formed: this database, one of the non-empty proofs, from and to
 * together, and written back from the values it gave, the same fields as
 * the text, byte for byte.  A sanitizer report ends the run with a
 * non-zero status; ASan's names the case first (UBSan's runtime keeps a
 * death callback of its own, so test/fuzz/run says that one failed).
 *
 * The text reaches the parser as kafka_txn.c gives it: the record's bytes
 * up to the first NUL, in a buffer of exactly that size (so that ASan sees
 * a read past it).  palloc and pfree are malloc and free.
 *
 * usage: test/tools/outbox-progress-fuzz
 *        PROGRESS_FUZZ_CASES=N PROGRESS_FUZZ_SEED=S test/tools/outbox-progress-fuzz
 * Prints the seed and the case count first, a summary last; a failure is a
 * line "not ok - ..." (test/mutations/run counts those), and the exit
 * status is non-zero.  make test runs it from test/fuzz/run, make fuzz a
 * long version.
 *
 * test/tools/progress_fuzz.c
 */
#include "postgres.h"

#include <sanitizer/common_interface_defs.h>
#include <time.h>

#include "progress_record.h"

/* The harness links no libpgport: stdio as the C library has it. */
#undef printf
#undef fprintf
#undef snprintf
#undef vsnprintf
#undef qsort

/* Cases when PROGRESS_FUZZ_CASES is not set: a few seconds. */
#define DEFAULT_CASES 300000

/* Failures shown before the run stops. */
#define MAX_FAILURES 10

/* A record longer than this is truncated at a few lengths, not all. */
#define TRUNCATE_ALL_MAX 600

/* Ids in a huge list: hundreds of kB of text. */
#define HUGE_IDS 40000

/* Bytes of a failing case's text shown. */
#define SHOW_BYTES 160

/* What a case must come to. */
typedef enum Expect
{
	EXPECT_ANY,    /* either, but an accepted text must be well-formed */
	EXPECT_REJECT, /* malformed by construction */
	EXPECT_ACCEPT  /* genuine: accepted, with exactly its values */
} Expect;

/* A growing text. */
typedef struct Buf
{
	char *data;
	size_t len;
	size_t cap;
} Buf;

/* A genuine record: its values, and its fields as written, in order. */
typedef struct Genuine
{
	Oid database;
	uint32 timeline; /* and wal: both 0 in a record of 0.2.0 */
	uint64 wal;
	char current[33]; /* the relay's proofs: current, and seen (or "") */
	char seen[33];
	const char *proofs[3];
	const char *proof; /* the one the record carries */
	char *from;
	char *to;
	int64 *sent;
	int nsent;
	int64 *held;
	int nheld;
	char *fields[8];
	int nfields;
} Genuine;

static uint64 rng_state;
static uint64 seed;
static long cases;
static long accepted;
static long failures;
static long genuine_huge; /* genuine records with a list of HUGE_IDS or more */
static const char *case_kind = "start";

static void leading_space(const Genuine *g, Buf *work);

/*
 * palloc: the parser's allocations, seen by ASan as the heap blocks they
 * are.
 */
void *
palloc(Size size)
{
	void *p = malloc(size == 0 ? 1 : size);

	if (p == NULL)
	{
		fprintf(stderr, "progress_fuzz: out of memory\n");
		exit(2);
	}
	return p;
}

/*
 * pfree: the other half of palloc.
 */
void
pfree(void *pointer)
{
	free(pointer);
}

/*
 * next: the next pseudo-random number (splitmix64): the same seed makes
 * the same cases.
 */
static uint64
next(void)
{
	uint64 z = (rng_state += UINT64CONST(0x9E3779B97F4A7C15));

	z = (z ^ (z >> 30)) * UINT64CONST(0xBF58476D1CE4E5B9);
	z = (z ^ (z >> 27)) * UINT64CONST(0x94D049BB133111EB);
	return z ^ (z >> 31);
}

/*
 * below: a number in [0, n).
 */
static uint64
below(uint64 n)
{
	return n == 0 ? 0 : next() % n;
}

/*
 * chance: true one time in n.
 */
static bool
chance(uint64 n)
{
	return below(n) == 0;
}

/*
 * buf_add: len bytes appended to b, kept NUL-terminated.
 */
static void
buf_add(Buf *b, const char *bytes, size_t len)
{
	if (b->len + len + 1 > b->cap)
	{
		b->cap = (b->len + len + 1) * 2;
		b->data = realloc(b->data, b->cap);
		if (b->data == NULL)
			exit(2);
	}
	memcpy(b->data + b->len, bytes, len);
	b->len += len;
	b->data[b->len] = '\0';
}

/*
 * buf_str: a string appended to b.
 */
static void
buf_str(Buf *b, const char *s)
{
	buf_add(b, s, strlen(s));
}

/*
 * buf_reset: b emptied, its memory kept.
 */
static void
buf_reset(Buf *b)
{
	b->len = 0;
	if (b->data != NULL)
		b->data[0] = '\0';
}

/*
 * copy_text: a malloc'd copy of s.
 */
static char *
copy_text(const char *s)
{
	size_t n = strlen(s) + 1;

	return memcpy(palloc(n), s, n);
}

/*
 * random_id: an event id, from 1 to INT64_MAX, with the edges often.
 */
static int64
random_id(void)
{
	switch (below(8))
	{
		case 0:
			return 1;
		case 1:
			return PG_INT64_MAX;
		case 2:
			return (int64) (next() >> 1) | 1;
		default:
			return (int64) below(1000000) + 1;
	}
}

/*
 * random_oid: a database OID, from 1 to 4294967295.
 */
static Oid
random_oid(void)
{
	switch (below(4))
	{
		case 0:
			return 1;
		case 1:
			return PG_UINT32_MAX;
		default:
			return (Oid) below(PG_UINT32_MAX) + 1;
	}
}

/*
 * random_hex: n random hex digits into out (n + 1 bytes).
 */
static void
random_hex(char *out, int n)
{
	for (int i = 0; i < n; i++)
		out[i] = "0123456789abcdef"[below(16)];
	out[n] = '\0';
}

/*
 * random_place: a place as relay_pos_text writes it ("done/window/tx/id");
 * the parser keeps it as text, first_sends.c judges it.
 */
static char *
random_place(void)
{
	char text[200];
	uint64 xmin = below(5000000) + 3;
	uint64 xmax = xmin + below(20);

	if (chance(2))
		snprintf(text, sizeof(text), "%llu:%llu:/-/0/0",
				 (unsigned long long) xmin, (unsigned long long) xmax);
	else
		snprintf(text, sizeof(text), "%llu:%llu:%llu/%llu:%llu:/%llu/%lld",
				 (unsigned long long) xmin, (unsigned long long) xmax,
				 (unsigned long long) xmin, (unsigned long long) xmin,
				 (unsigned long long) xmax, (unsigned long long) xmin,
				 (long long) random_id());
	return copy_text(text);
}

/*
 * random_ids: a list of ids, mostly short, hundreds of kB at times.
 */
static int64 *
random_ids(int *n)
{
	int64 *ids;

	*n = chance(300) ? HUGE_IDS + (int) below(HUGE_IDS) : 1 + (int) below(20);
	genuine_huge += *n >= HUGE_IDS;
	ids = palloc(sizeof(int64) * *n);
	for (int i = 0; i < *n; i++)
		ids[i] = random_id();
	return ids;
}

/*
 * ids_field: "label id id ...", malloc'd.
 */
static char *
ids_field(const char *label, const int64 *ids, int n)
{
	Buf b = {0};
	char word[32];

	buf_str(&b, label);
	for (int i = 0; i < n; i++)
	{
		snprintf(word, sizeof(word), " %lld", (long long) ids[i]);
		buf_str(&b, word);
	}
	return b.data;
}

/*
 * text_field: "label value", malloc'd.
 */
static char *
text_field(const char *label, const char *value)
{
	Buf b = {0};

	buf_str(&b, label);
	buf_str(&b, " ");
	buf_str(&b, value);
	return b.data;
}

/*
 * shuffle: the fields of g in a random order: the parser takes them in
 * any.
 */
static void
shuffle(Genuine *g)
{
	for (int i = g->nfields - 1; i > 0; i--)
	{
		int j = (int) below(i + 1);
		char *t = g->fields[i];

		g->fields[i] = g->fields[j];
		g->fields[j] = t;
	}
}

/*
 * genuine_make: a record as the relay writes it, with random values.
 */
static void
genuine_make(Genuine *g)
{
	char number[16];

	memset(g, 0, sizeof(*g));
	g->database = random_oid();
	random_hex(g->current, 32);
	if (chance(2))
		random_hex(g->seen, 32);
	g->proofs[0] = g->current;
	g->proofs[1] = g->seen;
	g->proofs[2] = NULL;
	g->proof = g->seen[0] != '\0' && chance(2) ? g->seen : g->current;
	snprintf(number, sizeof(number), "%u", g->database);
	g->fields[g->nfields++] = text_field("database", number);
	g->fields[g->nfields++] = text_field("proof", g->proof);
	if (!chance(4))
	{
		char wal[24];

		g->timeline = (uint32) (1 + below(PG_UINT32_MAX));
		g->wal = 1 + below(PG_INT64_MAX);
		snprintf(number, sizeof(number), "%u", g->timeline);
		snprintf(wal, sizeof(wal), UINT64_FORMAT, g->wal);
		g->fields[g->nfields++] = text_field("timeline", number);
		g->fields[g->nfields++] = text_field("wal", wal);
	}
	if (!chance(3))
	{
		g->from = random_place();
		g->to = random_place();
		g->fields[g->nfields++] = text_field("from", g->from);
		g->fields[g->nfields++] = text_field("to", g->to);
	}
	if (chance(2))
	{
		g->sent = random_ids(&g->nsent);
		g->fields[g->nfields++] = ids_field("sent", g->sent, g->nsent);
	}
	if (chance(2))
	{
		g->held = random_ids(&g->nheld);
		g->fields[g->nfields++] = ids_field("held", g->held, g->nheld);
	}
	if (!chance(4))
		shuffle(g);
}

/*
 * genuine_free: what genuine_make allocated.
 */
static void
genuine_free(Genuine *g)
{
	for (int i = 0; i < g->nfields; i++)
		free(g->fields[i]);
	free(g->from);
	free(g->to);
	free(g->sent);
	free(g->held);
}

/*
 * render: g's record into b, field skip left out (-1: none) and extra put
 * in at position at (NULL: none).
 */
static void
render(const Genuine *g, Buf *b, int skip, const char *extra, int at)
{
	buf_reset(b);
	buf_str(b, PROGRESS_FORMAT);
	for (int i = 0; i <= g->nfields; i++)
	{
		if (extra != NULL && i == at)
		{
			buf_str(b, "; ");
			buf_str(b, extra);
		}
		if (i < g->nfields && i != skip)
		{
			buf_str(b, "; ");
			buf_str(b, g->fields[i]);
		}
	}
}

/*
 * field_index: where the field named label is in g, or -1.
 */
static int
field_index(const Genuine *g, const char *label)
{
	size_t n = strlen(label);

	for (int i = 0; i < g->nfields; i++)
	{
		if (strncmp(g->fields[i], label, n) == 0 && g->fields[i][n] == ' ')
			return i;
	}
	return -1;
}

/*
 * show: a case's text, escaped and cut, for a failure's line.
 */
static void
show(const char *text)
{
	size_t n = strlen(text);

	fputs("  # text: \"", stdout);
	for (size_t i = 0; i < n && i < SHOW_BYTES; i++)
	{
		unsigned char c = (unsigned char) text[i];

		if (c >= 32 && c < 127 && c != '"' && c != '\\')
			putchar(c);
		else
			printf("\\x%02x", c);
	}
	printf("\"%s (%zu bytes)\n", n > SHOW_BYTES ? "..." : "", n);
}

/*
 * fail: a case went wrong: say which and why.
 */
static void
fail(const char *why, const char *text)
{
	failures++;
	printf("not ok - case %ld (%s, seed %llu): %s\n", cases, case_kind,
		   (unsigned long long) seed, why);
	show(text);
	fflush(stdout);
	if (failures >= MAX_FAILURES)
	{
		printf("progress_fuzz: stopped after %d failures\n", MAX_FAILURES);
		exit(1);
	}
}

/*
 * on_sanitizer_report: the sanitizers are about to end the run: name the
 * case (their report, on stderr, says what and where).
 */
static void
on_sanitizer_report(void)
{
	printf("not ok - case %ld (%s, seed %llu): sanitizer report (on stderr)\n",
		   cases, case_kind, (unsigned long long) seed);
	fflush(stdout);
}

/*
 * cmp_str: strcmp for qsort.
 */
static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/*
 * split_fields: text cut at each "; " (cut is the copy cut up); the
 * number of parts, at most max.
 */
static int
split_fields(char *cut, char **parts, int max)
{
	int n = 0;
	char *p = cut;

	while (n < max)
	{
		char *sep = strstr(p, "; ");

		parts[n++] = p;
		if (sep == NULL)
			break;
		*sep = '\0';
		p = sep + 2;
	}
	return n;
}

/*
 * written_back: the fields of r, written as the relay writes them, into
 * parts (malloc'd); how many.
 */
static int
written_back(const ProgressRecord *r, char **parts)
{
	char number[16];
	int n = 0;

	snprintf(number, sizeof(number), "%u", r->database);
	parts[n++] = text_field("database", number);
	parts[n++] = text_field("proof", r->proof);
	if (r->timeline != 0)
	{
		char wal[24];

		snprintf(number, sizeof(number), "%u", r->timeline);
		snprintf(wal, sizeof(wal), UINT64_FORMAT, r->wal);
		parts[n++] = text_field("timeline", number);
		parts[n++] = text_field("wal", wal);
	}
	if (r->from != NULL)
		parts[n++] = text_field("from", r->from);
	if (r->to != NULL)
		parts[n++] = text_field("to", r->to);
	if (r->sent != NULL)
		parts[n++] = ids_field("sent", r->sent, r->nsent);
	if (r->held != NULL)
		parts[n++] = ids_field("held", r->held, r->nheld);
	return n;
}

/*
 * round_trips: whether text is exactly r written back: the format line,
 * then the same fields (in any order), byte for byte.
 */
static bool
round_trips(const char *text, const ProgressRecord *r)
{
	char *cut = copy_text(text);
	char *in[10];
	char *out[8];
	int nin = split_fields(cut, in, 10);
	int nout = written_back(r, out);
	bool same = nin == nout + 1 && strcmp(in[0], PROGRESS_FORMAT) == 0;

	if (same)
	{
		qsort(in + 1, nin - 1, sizeof(char *), cmp_str);
		qsort(out, nout, sizeof(char *), cmp_str);
		for (int i = 0; i < nout && same; i++)
			same = strcmp(in[i + 1], out[i]) == 0;
	}
	for (int i = 0; i < nout; i++)
		free(out[i]);
	free(cut);
	return same;
}

/*
 * proof_known: whether proof is one of the non-empty proofs.
 */
static bool
proof_known(const char *proof, const char *const *proofs)
{
	for (int i = 0; proof != NULL && proofs[i] != NULL; i++)
	{
		if (proofs[i][0] != '\0' && strcmp(proof, proofs[i]) == 0)
			return true;
	}
	return false;
}

/*
 * well_formed: why what the parser accepted is not a well-formed record
 * of this relay, or NULL.
 */
static const char *
well_formed(const char *text, const ProgressRecord *r, Oid database,
			const char *const *proofs)
{
	if (r->database != database)
		return "accepted with another database";
	if (!proof_known(r->proof, proofs))
		return "accepted without one of the relay's proofs";
	if ((r->from == NULL) != (r->to == NULL))
		return "accepted with from or to alone";
	if ((r->from != NULL && r->from[0] == '\0') ||
		(r->to != NULL && r->to[0] == '\0'))
		return "accepted with an empty place";
	if ((r->sent == NULL) != (r->nsent == 0) ||
		(r->held == NULL) != (r->nheld == 0))
		return "accepted with an empty id list";
	for (int i = 0; i < r->nsent; i++)
		if (r->sent[i] <= 0)
			return "accepted a sent id that is not positive";
	for (int i = 0; i < r->nheld; i++)
		if (r->held[i] <= 0)
			return "accepted a held id that is not positive";
	if (!round_trips(text, r))
		return "accepted, but its values do not write back to its text";
	return NULL;
}

/*
 * same_ids: whether two id lists are equal.
 */
static bool
same_ids(const int64 *a, int na, const int64 *b, int nb)
{
	return na == nb && (na == 0 || memcmp(a, b, sizeof(int64) * na) == 0);
}

/*
 * same_text: whether two optional texts are equal.
 */
static bool
same_text(const char *a, const char *b)
{
	return (a == NULL && b == NULL) ||
		   (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/*
 * values_differ: why r is not g's values, or NULL.
 */
static const char *
values_differ(const ProgressRecord *r, const Genuine *g)
{
	if (r->database != g->database || !same_text(r->proof, g->proof))
		return "a genuine record's database or proof came back changed";
	if (r->timeline != g->timeline || r->wal != g->wal)
		return "a genuine record's timeline or wal came back changed";
	if (!same_text(r->from, g->from) || !same_text(r->to, g->to))
		return "a genuine record's from or to came back changed";
	if (!same_ids(r->sent, r->nsent, g->sent, g->nsent) ||
		!same_ids(r->held, r->nheld, g->held, g->nheld))
		return "a genuine record's ids came back changed";
	return NULL;
}

/*
 * judge: the parser's verdict on text against what the case expects.
 */
static void
judge(const char *text, bool ok, const ProgressRecord *r, Oid database,
	  const char *const *proofs, Expect expect, const Genuine *g)
{
	const char *why;

	if (!ok)
	{
		if (expect == EXPECT_ACCEPT)
			fail("a genuine record was rejected", text);
		return;
	}
	accepted++;
	if (expect == EXPECT_REJECT)
		fail("a malformed record was accepted", text);
	else if ((why = well_formed(text, r, database, proofs)) != NULL)
		fail(why, text);
	else if (expect == EXPECT_ACCEPT && (why = values_differ(r, g)) != NULL)
		fail(why, text);
}

/*
 * run_case: the parser on len bytes (up to the first NUL, in a buffer of
 * exactly that size, as kafka_txn.c gives them), judged.
 */
static void
run_case(const char *kind, const char *bytes, size_t len, const Genuine *g,
		 Expect expect)
{
	size_t n = strnlen(bytes, len);
	char *text = memcpy(palloc(n + 1), bytes, n);
	char *pristine;
	ProgressRecord r = {0};
	bool ok;

	text[n] = '\0';
	pristine = copy_text(text);
	cases++;
	case_kind = kind;
	ok = progress_record_parse(text, g->database, g->proofs, &r);
	judge(pristine, ok, &r, g->database, g->proofs, expect, g);
	if (r.sent != NULL)
		pfree(r.sent);
	if (r.held != NULL)
		pfree(r.held);
	pfree(text);
	free(pristine);
}

/*
 * run_text: run_case on a string.
 */
static void
run_text(const char *kind, const char *text, const Genuine *g, Expect expect)
{
	run_case(kind, text, strlen(text), g, expect);
}

/*
 * truncations: the record cut at every length (at a few, when long); a
 * cut may leave a well-formed record (within a place or an id list), so
 * the verdict is free, but what is accepted must be well-formed.
 */
static void
truncations(const Buf *rec, const Genuine *g)
{
	if (rec->len <= TRUNCATE_ALL_MAX)
	{
		for (size_t n = 0; n < rec->len; n++)
			run_case("truncated", rec->data, n, g, EXPECT_ANY);
		return;
	}
	for (int i = 0; i < 64; i++)
		run_case("truncated", rec->data, below(rec->len), g, EXPECT_ANY);
}

/*
 * flips: the record with a few bytes changed to any byte (NUL included).
 */
static void
flips(const Buf *rec, const Genuine *g, Buf *work)
{
	for (int k = 0; k < 8; k++)
	{
		buf_reset(work);
		buf_add(work, rec->data, rec->len);
		for (int i = 1 + (int) below(3); i > 0 && rec->len > 0; i--)
			work->data[below(rec->len)] = (char) below(256);
		run_case("byte changed", work->data, work->len, g, EXPECT_ANY);
	}
}

/*
 * binary: random bytes, alone or after the format line and a field or
 * two of the record, so that the parser reaches them.
 */
static void
binary(const Genuine *g, Buf *work)
{
	for (int k = 0; k < 4; k++)
	{
		size_t n = chance(50) ? 70000 : below(300);

		buf_reset(work);
		if (k > 0)
		{
			buf_str(work, PROGRESS_FORMAT "; ");
			buf_str(work, g->fields[below(g->nfields)]);
			buf_str(work, k > 1 ? "; " : "");
		}
		for (size_t i = 0; i < n; i++)
		{
			char c = chance(3) ? " ;0123456789"[below(12)] : (char) below(256);

			buf_add(work, &c, 1);
		}
		run_case("random binary", work->data, work->len, g, EXPECT_ANY);
	}
}

/*
 * repeats: a field of the record written twice (the same value, or
 * another's): each field appears once.
 */
static void
repeats(const Genuine *g, Buf *work)
{
	static const char *const others[] = {
		"database 1", "proof 0", "from 1:1:/-/0/0", "to 1:1:/-/0/0",
		"sent 1",     "held 1",  "timeline 1",      "wal 1"};
	int i = (int) below(g->nfields);

	render(g, work, -1, g->fields[i], (int) below(g->nfields + 1));
	run_text("field repeated", work->data, g, EXPECT_REJECT);
	for (int k = 0; k < 8; k++)
	{
		char label[16];

		snprintf(label, sizeof(label), "%.*s", (int) strcspn(others[k], " "),
				 others[k]);
		if (field_index(g, label) < 0)
			continue;
		render(g, work, -1, others[k], (int) below(g->nfields + 1));
		run_text("field repeated, another value", work->data, g, EXPECT_REJECT);
	}
}

/*
 * missing: the record without one of its fields: database, proof, and
 * from or to, or timeline or wal, alone make it malformed; without sent or held it is still
 * the relay's, with no such list.
 */
static void
missing(const Genuine *g, Buf *work)
{
	static const char *const needed[] = {"database", "proof", "from",
										 "to",       "timeline", "wal"};
	Genuine less;

	for (int k = 0; k < 6; k++)
	{
		int i = field_index(g, needed[k]);

		if (i < 0)
			continue;
		render(g, work, i, NULL, 0);
		run_text("field missing", work->data, g, EXPECT_REJECT);
	}
	for (int k = 0; k < 2; k++)
	{
		int i = field_index(g, k == 0 ? "sent" : "held");

		if (i < 0)
			continue;
		less = *g;
		if (k == 0)
		{
			less.sent = NULL;
			less.nsent = 0;
		}
		else
		{
			less.held = NULL;
			less.nheld = 0;
		}
		render(g, work, i, NULL, 0);
		run_text("list left out", work->data, &less, EXPECT_ACCEPT);
	}
}

/*
 * bad_field: the record with its field label's value replaced by value
 * (added if the record has none); must be rejected.
 */
static void
bad_field(const Genuine *g, Buf *work, const char *kind, const char *label,
		  const char *value)
{
	char *field = text_field(label, value);
	int i = field_index(g, label);

	render(g, work, i, field, i < 0 ? (int) below(g->nfields + 1) : i);
	run_text(kind, work->data, g, EXPECT_REJECT);
	free(field);
}

/*
 * bad_numbers: ids and OIDs that are not positive numbers in range, or
 * not written as the relay writes them.
 */
static void
bad_numbers(const Genuine *g, Buf *work)
{
	static const char *const ids[] = {"0",
									  "-1",
									  "-9223372036854775808",
									  "9223372036854775808",
									  "18446744073709551616",
									  "99999999999999999999999999999999",
									  "+5",
									  "05",
									  "1 0",
									  "1 -2",
									  "1  2",
									  " 1",
									  "1 ",
									  "",
									  "1,2",
									  "1\t2",
									  "\t1",
									  "0x10",
									  "1e3",
									  "1.0",
									  "12a",
									  "1 2 3 99999999999999999999"};
	static const char *const oids[] = {
		"0",  "-1", "4294967296", "18446744073709551617", "+1", "01", " 1",
		"1 ", "",   "1x",         "-4294967295"};

	for (size_t k = 0; k < lengthof(ids); k++)
		bad_field(g, work, "bad id", chance(2) ? "sent" : "held", ids[k]);
	for (size_t k = 0; k < lengthof(oids); k++)
		bad_field(g, work, "bad database", "database", oids[k]);
}

/*
 * bad_identity: another database, or a proof that is not the relay's:
 * empty, shorter, longer, changed, or the empty "seen" one.
 */
static void
bad_identity(const Genuine *g, Buf *work)
{
	char number[16];
	char proof[80];
	size_t n = strlen(g->proof);

	snprintf(number, sizeof(number), "%u",
			 g->database == PG_UINT32_MAX ? 1 : g->database + 1);
	bad_field(g, work, "other database", "database", number);
	bad_field(g, work, "empty proof", "proof", "");
	snprintf(proof, sizeof(proof), "%.*s", (int) (n - 1 - below(n - 1)),
			 g->proof);
	bad_field(g, work, "short proof", "proof", proof);
	snprintf(proof, sizeof(proof), "%s%c", g->proof, "0a "[below(3)]);
	bad_field(g, work, "long proof", "proof", proof);
	snprintf(proof, sizeof(proof), "%s", g->proof);
	proof[below(n)] ^= 0x20;
	bad_field(g, work, "changed proof", "proof", proof);
}

/*
 * bad_layout: separators, spaces and labels out of place, and texts with
 * nothing in them.
 */
static void
bad_layout(const Genuine *g, Buf *work)
{
	static const char *const texts[] = {"",
										";",
										"; ",
										";;;;",
										" ; ; ; ",
										"          ",
										PROGRESS_FORMAT,
										PROGRESS_FORMAT ";",
										PROGRESS_FORMAT "; ",
										PROGRESS_FORMAT ";;",
										"outbox progress 2",
										"outbox progress",
										"OUTBOX PROGRESS 1",
										"outbox progress 1 ",
										"outbox  progress 1",
										"progress 1"};
	static const char *const labels[] = {"database", "proof", "from",
										 "to",       "sent",  "held"};
	const char *label = labels[below(lengthof(labels))];
	int i = field_index(g, label);
	int at = (int) below(g->nfields + 1);

	for (size_t k = 0; k < lengthof(texts); k++)
		run_text("separators or nothing", texts[k], g, EXPECT_REJECT);
	render(g, work, -1, NULL, 0);
	buf_str(work, chance(2) ? ";" : "; ");
	run_text("separator at the end", work->data, g, EXPECT_REJECT);
	render(g, work, -1, "", at);
	run_text("empty field", work->data, g, EXPECT_REJECT);
	render(g, work, -1, "unknown 1", at);
	run_text("unknown field", work->data, g, EXPECT_REJECT);
	render(g, work, i, label, i < 0 ? at : i);
	run_text("label alone", work->data, g, EXPECT_REJECT);
	leading_space(g, work);
}

/*
 * leading_space: the record with a space before its format line.
 */
static void
leading_space(const Genuine *g, Buf *work)
{
	Buf other = {0};

	render(g, work, -1, NULL, 0);
	buf_str(&other, " ");
	buf_str(&other, work->data);
	run_text("space before the format", other.data, g, EXPECT_REJECT);
	free(other.data);
}

/*
 * spacing: the record with one "; " written another way (";", ";  ",
 * " ; ") or a space doubled inside a field: not as the relay writes it.
 */
static void
spacing(const Genuine *g, Buf *work)
{
	static const char *const seps[] = {";", ";  ", " ; ", ";\t", "\t; "};
	char *p;

	render(g, work, -1, NULL, 0);
	p = strstr(work->data, "; ");
	if (p == NULL)
		return;
	for (size_t k = 0; k < lengthof(seps); k++)
	{
		Buf other = {0};

		buf_add(&other, work->data, p - work->data);
		buf_str(&other, seps[k]);
		buf_str(&other, p + 2);
		run_text("separator spaced otherwise", other.data, g, EXPECT_REJECT);
		free(other.data);
	}
}

/*
 * huge_bad_list: a list of hundreds of kB whose last id is not one.
 */
static void
huge_bad_list(const Genuine *g, Buf *work)
{
	Buf ids = {0};
	char word[32];

	for (int i = 0; i < HUGE_IDS; i++)
	{
		snprintf(word, sizeof(word), "%s%lld", i ? " " : "",
				 (long long) random_id());
		buf_str(&ids, word);
	}
	buf_str(&ids, chance(2) ? " 0" : " 9223372036854775808");
	bad_field(g, work, "huge list, last id bad", "sent", ids.data);
	free(ids.data);
}

/*
 * one_round: a genuine record, and every kind of hostile variant of it.
 */
static void
one_round(Buf *rec, Buf *work)
{
	Genuine g;

	genuine_make(&g);
	render(&g, rec, -1, NULL, 0);
	run_text("genuine", rec->data, &g, EXPECT_ACCEPT);
	truncations(rec, &g);
	flips(rec, &g, work);
	binary(&g, work);
	repeats(&g, work);
	missing(&g, work);
	bad_numbers(&g, work);
	bad_identity(&g, work);
	bad_layout(&g, work);
	spacing(&g, work);
	if (chance(200))
		huge_bad_list(&g, work);
	genuine_free(&g);
}

/*
 * env_number: an environment variable's value as a number, or fallback.
 */
static uint64
env_number(const char *name, uint64 fallback)
{
	const char *v = getenv(name);

	return v != NULL && v[0] != '\0' ? strtoull(v, NULL, 10) : fallback;
}

/*
 * main: rounds until the case count is reached or a failure stops them.
 */
int
main(void)
{
	long want = (long) env_number("PROGRESS_FUZZ_CASES", DEFAULT_CASES);
	Buf rec = {0};
	Buf work = {0};
	struct timespec t0;
	struct timespec t1;
	double secs;

	seed = env_number("PROGRESS_FUZZ_SEED", (uint64) time(NULL) % 1000000);
	rng_state = seed;
	__sanitizer_set_death_callback(on_sanitizer_report);
	printf("progress_fuzz: seed %llu, %ld cases (repeat: "
		   "PROGRESS_FUZZ_SEED=%llu PROGRESS_FUZZ_CASES=%ld)\n",
		   (unsigned long long) seed, want, (unsigned long long) seed, want);
	fflush(stdout);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (cases < want)
		one_round(&rec, &work);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("progress_fuzz: %ld cases (seed %llu): %ld accepted, %ld "
		   "rejected, %ld failed (%ld genuine records with a list of %d "
		   "ids or more); %.1f s, %.0f cases/s\n",
		   cases, (unsigned long long) seed, accepted, cases - accepted,
		   failures, genuine_huge, HUGE_IDS, secs,
		   cases / (secs > 0 ? secs : 1));
	free(rec.data);
	free(work.data);
	return failures == 0 ? 0 : 1;
}
