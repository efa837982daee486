/*
 * chaos_client.h
 *		What the chaos suite's two clients (chaos_writer.c,
 *		chaos_inventory.c) share: a stop flag set by SIGTERM or SIGINT,
 *		sleeping, and connecting until a read-write server answers.
 */
#ifndef CHAOS_CLIENT_H
#define CHAOS_CLIENT_H

#include <signal.h>
#include <time.h>

#include <libpq-fe.h>

static volatile sig_atomic_t stop;
static long connect_retries;

static void
on_signal(int sig)
{
	(void) sig;
	stop = 1;
}

/* Stop cleanly on SIGTERM and SIGINT. */
static void
stop_on_signals(void)
{
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
}

static void
sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/*
 * Connect, retrying every 100 ms until a server answers (the conninfo may
 * list several hosts, with target_session_attrs=read-write); NULL once
 * stopped.
 */
static PGconn *
connect_db(const char *conninfo)
{
	while (!stop)
	{
		PGconn	   *conn = PQconnectdb(conninfo);

		if (PQstatus(conn) == CONNECTION_OK)
			return conn;
		PQfinish(conn);
		connect_retries++;
		sleep_ms(100);
	}
	return NULL;
}

#endif							/* CHAOS_CLIENT_H */
