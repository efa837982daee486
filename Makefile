# outbox: PGXS build, plus the project's two front-door commands:
#   make demo   the main job end to end (see README)
#   make test   every test suite on a throwaway cluster

EXTENSION  = outbox
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" outbox.control)

MODULE_big = outbox
OBJS       = src/outbox.o src/shmem.o src/validate.o src/json_compact.o src/plan.o \
             src/enqueue.o src/claim.o src/launcher.o src/worker.o \
             src/first_sends.o src/retries.o src/housekeeping.o src/flight.o \
             src/batch.o src/event_state.o src/step.o src/status.o src/kafka.o \
             src/redact.o src/kafka_scrub.o src/kafka_deadline.o src/exactly_once.o src/kafka_txn.o src/utility.o src/incarnation.o \
             src/db_settings.o src/sender.o src/progress_record.o \
             src/kafka_conf_help.o
DATA       = $(wildcard sql/outbox--*.sql)
SHLIB_LINK = -lrdkafka
PG_CFLAGS  = -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
             -DOUTBOX_VERSION='"$(EXTVERSION)"'

# pg_regress: SQL behaviour (sql/, expected/) and the pgTAP contract.
REGRESS      = setup enqueue claim privileges settings operations contract restore upgrade upgrade_grants install_guard
REGRESS_OPTS = --load-extension=outbox

# Isolation specs: concurrent sessions (test/specs, test/expected).
ISOLATION      = enqueue_same_key claim_concurrent claim_forms purge_locked stats_late_xid discard_locked
ISOLATION_OPTS = --inputdir=test --load-extension=outbox

# The functions are tiny; JIT bitcode would only add a clang dependency.
override with_llvm = no

# PG: the PostgreSQL major version to build and test against (15 is
# Debian 12's, this project's own); PG_CONFIG follows it.  Both reach the
# test scripts through the environment.
PG        ?= 15
PG_CONFIG ?= $(firstword $(wildcard /usr/lib/postgresql/$(PG)/bin/pg_config) pg_config)
export PG PG_CONFIG
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
endif

# PGXS does not track header dependencies: without this a header change
# leaves stale objects (once a false crash).  outbox.control gives
# OUTBOX_VERSION.
$(OBJS): $(wildcard src/*.h) outbox.control

# A variable's value, for test/run: make -s print-REGRESS.
print-%:
	@echo '$($*)'

.PHONY: test demo deb chaos partitions fuzz mutations kafka-versions bench bench-retention bench-enqueue bench-stats bench-txn bench-update format format-check tools

# A PostgreSQL whose server this system lacks is tested in the Debian
# release that ships it (test/matrix, in a root file system of its own).
test:
	@if [ -x /usr/lib/postgresql/$(PG)/bin/postgres ]; then test/run; else test/matrix $(PG); fi

demo:
	scripts/demo

# The client examples (examples/): a producer and a consumer in Python,
# Node.js, Go and Java, run end to end on a throwaway cluster and a real
# broker.  Phony: examples/ is a directory of that name.
.PHONY: examples
examples:
	examples/run

# The docs' checks (test/docs/run): the example runner's self-test,
# docs/reference.md's settings and relay states against a running server,
# and every sql and sh example of README.md and docs/, its output compared.
.PHONY: docs-check
docs-check:
	test/docs/run

# The integration suite's long real-broker cases (test/integration/run
# --long), which make test leaves out: a 3-broker cluster's leaders
# killed, certificates renewed, the transaction coordinator gone, TLS
# mistakes, an old transaction's cost.  About 7 minutes.
.PHONY: integration-long
integration-long:
	test/integration/run --long

# The integration suite's real-broker cases against Kafka 3.6.2 and 3.9.1,
# one version after the other (make test runs every case on 4.1.1, and a
# few on these two).  KAFKA_VERSIONS="..." picks others.
kafka-versions:
	test/integration/versions

# The Debian package postgresql-NN-outbox, built from a copy of the tree;
# the .deb lands in build/deb/.
deb:
	scripts/deb

# The chaos suite, long version, in both delivery modes (make test runs
# one round of each).
chaos:
	CHAOS_ROUNDS=$${CHAOS_ROUNDS:-5} test/chaos/run
	CHAOS_ROUNDS=$${CHAOS_ROUNDS:-5} CHAOS_DELIVERY=exactly_once test/chaos/run

# The partition suite, long version: every fault alone, then 20 random
# sequences, in both delivery modes (make test runs two faults in each
# and one sequence in at_least_once).  As root.
partitions:
	PARTITION_FAULTS=$${PARTITION_FAULTS:-all} PARTITION_SEQUENCES=$${PARTITION_SEQUENCES:-20} \
	    test/partitions/run
	PARTITION_FAULTS=$${PARTITION_FAULTS:-all} PARTITION_SEQUENCES=$${PARTITION_SEQUENCES:-20} \
	    PARTITION_DELIVERY=exactly_once test/partitions/run

# The fuzz run of the progress record's parser (make test runs 300,000
# cases), then of enqueue and claim (3,000), long versions.
fuzz:
	PROGRESS_FUZZ_CASES=$${PROGRESS_FUZZ_CASES:-10000000} \
	    FUZZ_CASES=$${FUZZ_CASES:-100000} test/fuzz/run

# The mutation check: plausible bugs applied one at a time to a copy of
# the source, each caught by the checks it names (test/mutations/run;
# make test runs the short version, --ci).  MUTATIONS="name ..." runs only
# those.
mutations:
	test/mutations/run $(MUTATIONS)

bench:
	bench/run

bench-retention:
	bench/retention

bench-enqueue:
	bench/enqueue

bench-stats:
	bench/stats

bench-txn:
	bench/txn

# How long ALTER EXTENSION outbox UPDATE from 0.2.0 takes at CLAIMS claims
# and EVENTS kept events, and the locks it holds (bench/update).
bench-update:
	bench/update

# The layout is clang-format 14's (Debian 12's): other versions lay a few
# constructs out differently, so test/run checks it only with that one.
CLANG_FORMAT_VERSION = 14

format:
	clang-format -i src/*.c src/*.h

format-check:
	clang-format --dry-run --Werror src/*.c src/*.h

# Test tools: a Kafka consumer, a librdkafka mock-cluster broker, the
# chaos suite's order writer and inventory consumer, and a server module
# whose log hook records what another extension's hook would see.
TOOLS = test/tools/outbox-consume test/tools/outbox-mock-broker \
        test/tools/outbox-chaos-writer test/tools/outbox-chaos-inventory \
        test/tools/outbox_log_spy.so
LIBPQ = -I$(shell $(PG_CONFIG) --includedir) -L$(shell $(PG_CONFIG) --libdir) -lpq

tools: $(TOOLS)

test/tools/outbox-consume: test/tools/consume.c
	$(CC) -O2 -Wall -Wextra -o $@ $< -lrdkafka

test/tools/outbox-mock-broker: test/tools/mock_broker.c
	$(CC) -O2 -Wall -Wextra -o $@ $< -lrdkafka

test/tools/outbox-chaos-writer: test/tools/chaos_writer.c test/tools/chaos_client.h
	$(CC) -O2 -Wall -Wextra -Wno-unused-parameter -o $@ $< $(LIBPQ)

test/tools/outbox_log_spy.so: test/tools/log_spy.c
	$(CC) -O2 -Wall -Wextra -Wno-unused-parameter -shared -fPIC \
	    -I$(shell $(PG_CONFIG) --includedir-server) -o $@ $<

test/tools/outbox-chaos-inventory: test/tools/chaos_inventory.c test/tools/chaos_client.h
	$(CC) -O2 -Wall -Wextra -Wno-unused-parameter -o $@ $< $(LIBPQ) -lrdkafka

# The fuzz harness of the progress record's parser: src/progress_record.c
# built alone with it, under AddressSanitizer and UndefinedBehaviorSanitizer
# (test/fuzz/run runs it).  Not one of TOOLS: the suites that build those
# need no sanitizer runtime.
PROGRESS_FUZZ = test/tools/outbox-progress-fuzz

$(PROGRESS_FUZZ): test/tools/progress_fuzz.c src/progress_record.c src/progress_record.h
	$(CC) -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
	    -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter \
	    -I$(shell $(PG_CONFIG) --includedir-server) -Isrc -o $@ \
	    test/tools/progress_fuzz.c src/progress_record.c

EXTRA_CLEAN = $(TOOLS) $(PROGRESS_FUZZ)
