/*
 * chaos_writer.c
 *		outbox-chaos-writer: one order-placing client of the chaos suite.
 *
 * It runs order transactions against the shop database through
 * place_order(ref, sku, qty, seq, topic) (test/chaos/schema.sql), which
 * writes the order and enqueues its event in one transaction:
 *
 *	- a share of them (-r) is rolled back on purpose, with biz keys "rb-...";
 *	- a share of the committed ones (-R) is run again with the same biz key,
 *	  as an application retrying after a lost answer does, and must get the
 *	  same event id back;
 *	- when the server goes away mid-transaction (crash, failover) the
 *	  outcome is unknown: it reconnects (the conninfo may list several
 *	  hosts) and runs the same transaction again until it is known.
 *
 * Each of its keys (msg_key "wW-kK") is written by this client only, with
 * a sequence number that grows by one per committed order, so consumers
 * can check per-key order.  One line per acknowledged commit on stdout:
 *
 *		ref <TAB> event_id
 *
 * and a summary line on stderr at the end ("writer W: NAME COUNT ...").
 *
 * usage: outbox-chaos-writer -d CONNINFO -w WRITER -t TOPIC [-k KEYS]
 *                            [-r ROLLBACK_PCT] [-R RETRY_PCT] [-p PAUSE_MS]
 *		Runs until SIGTERM or SIGINT.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "chaos_client.h"

#define MAX_KEYS 64

static struct
{
	long		committed;
	long		rolled_back;
	long		retried;
	long		retry_mismatches;
	long		unknown_outcomes;
}			counts;

/* Run a command that returns no rows; false on any failure. */
static int
exec_ok(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);
	int			ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	PQclear(res);
	return ok;
}

/*
 * One order transaction: BEGIN, place_order, then COMMIT or ROLLBACK.
 * Returns the event id, 0 when rolled back as asked, -1 when the outcome
 * is unknown (the connection failed somewhere).
 */
static long long
order_txn(PGconn *conn, const char *ref, const char *sku, int qty, int seq,
		  const char *topic, int rollback)
{
	char		qty_s[16], seq_s[16];
	const char *params[5] = {ref, sku, qty_s, seq_s, topic};
	PGresult   *res;
	long long	id;

	snprintf(qty_s, sizeof(qty_s), "%d", qty);
	snprintf(seq_s, sizeof(seq_s), "%d", seq);
	if (!exec_ok(conn, "BEGIN"))
		return -1;
	res = PQexecParams(conn, "SELECT place_order($1, $2, $3, $4, $5)", 5, NULL, params,
					   NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (PQstatus(conn) == CONNECTION_OK)
			fprintf(stderr, "outbox-chaos-writer: %s", PQresultErrorMessage(res));
		PQclear(res);
		return -1;
	}
	id = atoll(PQgetvalue(res, 0, 0));
	PQclear(res);
	if (rollback)
		return exec_ok(conn, "ROLLBACK") ? 0 : -1;
	return exec_ok(conn, "COMMIT") ? id : -1;
}

/*
 * After a failed transaction: roll back what is left of it, or reconnect
 * when the connection is gone.  False once we are stopped.
 */
static int
recover(PGconn **conn, const char *conninfo)
{
	if (PQstatus(*conn) == CONNECTION_OK)
		exec_ok(*conn, "ROLLBACK");
	else
	{
		PQfinish(*conn);
		if ((*conn = connect_db(conninfo)) == NULL)
			return 0;
	}
	return !stop;
}

/*
 * Commit one order, whatever it takes: on an unknown outcome run the same
 * transaction (same biz key, same content) again.  -1 once stopped.
 */
static long long
commit_order(PGconn **conn, const char *conninfo, const char *ref, const char *sku,
			 int qty, int seq, const char *topic)
{
	for (;;)
	{
		long long	id = order_txn(*conn, ref, sku, qty, seq, topic, 0);

		if (id > 0)
			return id;
		counts.unknown_outcomes++;
		if (!recover(conn, conninfo))
			return -1;
		sleep_ms(50);
	}
}

/* A rolled-back order: nothing of it may survive, whatever happens. */
static int
rollback_order(PGconn **conn, const char *conninfo, int writer, long n,
			   const char *sku, const char *topic)
{
	char		ref[64];

	snprintf(ref, sizeof(ref), "rb-w%d-%ld", writer, n);
	if (order_txn(*conn, ref, sku, 1, 0, topic, 1) == 0)
	{
		counts.rolled_back++;
		return 1;
	}
	return recover(conn, conninfo);
}

int
main(int argc, char **argv)
{
	const char *conninfo = NULL, *topic = NULL;
	int			writer = -1, keys = 8, rollback_pct = 15, retry_pct = 10, pause_ms = 5;
	int			seq[MAX_KEYS] = {0};
	PGconn	   *conn;
	int			opt;

	while ((opt = getopt(argc, argv, "d:w:t:k:r:R:p:")) != -1)
	{
		switch (opt)
		{
			case 'd': conninfo = optarg; break;
			case 'w': writer = atoi(optarg); break;
			case 't': topic = optarg; break;
			case 'k': keys = atoi(optarg); break;
			case 'r': rollback_pct = atoi(optarg); break;
			case 'R': retry_pct = atoi(optarg); break;
			case 'p': pause_ms = atoi(optarg); break;
			default: conninfo = NULL; break;
		}
	}
	if (!conninfo || !topic || writer < 0 || keys < 1 || keys > MAX_KEYS)
	{
		fprintf(stderr, "usage: outbox-chaos-writer -d CONNINFO -w WRITER -t TOPIC [-k KEYS] [-r ROLLBACK_PCT] [-R RETRY_PCT] [-p PAUSE_MS]\n");
		return 2;
	}
	stop_on_signals();
	setvbuf(stdout, NULL, _IOLBF, 0);
	srandom(writer * 7919 + time(NULL));
	if ((conn = connect_db(conninfo)) == NULL)
		return 1;

	for (long n = 1; !stop; n++)
	{
		int			k = random() % keys;
		int			qty = 1 + random() % 5;
		char		sku[32], ref[64];
		long long	id;

		snprintf(sku, sizeof(sku), "w%d-k%d", writer, k);
		if (random() % 100 < rollback_pct)
		{
			if (!rollback_order(&conn, conninfo, writer, n, sku, topic))
				break;
			continue;
		}
		snprintf(ref, sizeof(ref), "w%d-%ld", writer, n);
		if ((id = commit_order(&conn, conninfo, ref, sku, qty, seq[k] + 1, topic)) < 0)
			break;
		seq[k]++;
		counts.committed++;
		printf("%s\t%lld\n", ref, id);
		if (random() % 100 < retry_pct)
		{
			long long	again = commit_order(&conn, conninfo, ref, sku, qty, seq[k], topic);

			counts.retried++;
			if (again >= 0 && again != id)
			{
				fprintf(stderr, "outbox-chaos-writer: retry of %s got event %lld, not %lld\n", ref, again, id);
				counts.retry_mismatches++;
			}
		}
		if (pause_ms > 0)
			sleep_ms(pause_ms);
	}
	fprintf(stderr, "writer %d: committed %ld rolled_back %ld retried %ld retry_mismatches %ld unknown_outcomes %ld reconnects %ld\n",
			writer, counts.committed, counts.rolled_back, counts.retried,
			counts.retry_mismatches, counts.unknown_outcomes, connect_retries);
	PQfinish(conn);
	return counts.retry_mismatches ? 1 : 0;
}
