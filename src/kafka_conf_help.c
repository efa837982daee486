/*
 * kafka_conf_help.c
 *		What the relay tells an operator about a Kafka property librdkafka
 *		refused, and about a file the properties name that it cannot read.
 *
 * librdkafka's own reason for refusing a value quotes the value, which
 * may be a secret, so the relay never shows it (kafka.c).  It says
 * instead what the property takes, from librdkafka's table of properties
 * (its "Range" column: named choices, booleans, a range of numbers).
 *
 * A certificate or key the server cannot read makes librdkafka fail with
 * an OpenSSL code that names no file.  The relay
 * checks each such property's file first and names the file, the
 * property and the operating system's reason.  A path is no secret: it
 * says where a secret is, and the server's user can already read it.
 *
 * librdkafka reads those files once, when the producer is made: a
 * certificate renewed in place is not seen by a producer already made.
 * So the producer's identity includes a fingerprint of every file they
 * name (the path, size and a hash of the content), which the worker
 * takes at a reload (worker.c) on its own thread.  Not the modification
 * time: a file rewritten with what it held (a renewal agent that renders
 * its templates again, a touch) would make a new producer for nothing,
 * and the content is read anyway.  It is hashed a buffer at a time and
 * the buffer cleared: nothing of a key is kept or said.
 *
 * Some of librdkafka's connection errors name no setting: the broker's
 * TLS alert when it refuses the client's certificate (expired, or signed
 * by a CA it does not trust, or none sent), and a SCRAM failure that
 * librdkafka before 2.6.1 meets with Kafka 4 even with the right password
 * (it repeats the client's nonce, which Kafka 4 checks; librdkafka
 * #4895).  The relay adds a hint naming what to check.
 *
 * src/kafka_conf_help.c
 */
#include "postgres.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/hashfn.h"

#include "kafka.h"

/*
 * Properties whose value is a file OpenSSL must read.  (A Kerberos keytab
 * is read by the kinit command librdkafka runs, whose failure the log
 * already quotes, scrubbed.)
 */
static const char *const file_properties[] = {
	"ssl.ca.location",       "ssl.certificate.location", "ssl.key.location",
	"ssl.keystore.location", "ssl.crl.location",         NULL};

/*
 * Properties whose file goes into the producer's fingerprint: the above,
 * and the keytab (kinit reads it again on its own; a new producer after a
 * change does no harm).
 */
static const char *const fingerprinted[] = {"ssl.ca.location",
											"ssl.certificate.location",
											"ssl.key.location",
											"ssl.keystore.location",
											"ssl.crl.location",
											"sasl.kerberos.keytab",
											NULL};

/* How much of a file is hashed at a time. */
#define FINGERPRINT_CHUNK 8192

/* The TLS alerts a broker sends when it refuses the client's certificate. */
static const char *const certificate_alerts[] = {"alert bad certificate",
												 "alert unsupported certificate",
												 "alert certificate revoked",
												 "alert certificate expired",
												 "alert certificate unknown",
												 "alert unknown ca",
												 NULL};

/* The first librdkafka whose SCRAM Kafka 4 brokers accept (#4895). */
#define SCRAM_KAFKA4_VERSION 0x020601ff

static bool range_of(const char *table, const char *key, char *out, size_t size);
static bool fingerprint_path(const char *path, uint64 *fingerprint);
static bool fingerprint_directory(const char *path, uint64 *fingerprint);
static bool fingerprint_file(const char *path, const struct stat *st,
							 uint64 *fingerprint);

/*
 * outbox_kafka_property_range: what librdkafka takes for property key
 * ("true, false", "0 .. 900000", "none, gzip, ..."), into out; false if
 * its table gives nothing (a property of free text, or an unknown one).
 */
bool
outbox_kafka_property_range(const char *key, char *out, size_t size)
{
	char *table = NULL;
	size_t length = 0;
	FILE *stream = open_memstream(&table, &length);
	bool found;

	if (stream == NULL)
		return false;
	rd_kafka_conf_properties_show(stream);
	fclose(stream);
	found = table != NULL && range_of(table, key, out, size);
	free(table);
	return found;
}

/*
 * range_of: the Range column of key's first row in librdkafka's table,
 * whose rows are "name | C/P | range | default | importance | text".
 */
static bool
range_of(const char *table, const char *key, char *out, size_t size)
{
	size_t key_len = strlen(key);

	for (const char *line = table; line != NULL && *line != '\0';
		 line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
	{
		const char *range;
		const char *end;

		if (strncmp(line, key, key_len) != 0 || line[key_len] != ' ')
			continue;
		range = strchr(line, '|');
		range = range ? strchr(range + 1, '|') : NULL;
		end = range ? strchr(range + 1, '|') : NULL;
		if (end == NULL)
			return false;
		for (range++; range < end && *range == ' ';)
			range++;
		while (end > range && end[-1] == ' ')
			end--;
		if (end == range)
			return false;
		snprintf(out, size, "%.*s", (int) (end - range), range);
		return true;
	}
	return false;
}

/*
 * outbox_kafka_is_file_property: whether property key names a file OpenSSL
 * reads.
 */
bool
outbox_kafka_is_file_property(const char *key)
{
	for (int i = 0; file_properties[i] != NULL; i++)
		if (strcmp(key, file_properties[i]) == 0)
			return true;
	return false;
}

/*
 * outbox_kafka_unreadable_file: whether a file that conf names cannot be
 * read by the server; if so, problem says which, of which property, and
 * why (errno), and *property is the property's name.
 */
bool
outbox_kafka_unreadable_file(rd_kafka_conf_t *conf, char *problem, size_t size,
							 const char **property)
{
	for (int i = 0; file_properties[i] != NULL; i++)
	{
		char path[MAXPGPATH];
		size_t path_size = sizeof(path);

		if (rd_kafka_conf_get(conf, file_properties[i], path, &path_size) !=
				RD_KAFKA_CONF_OK ||
			path[0] == '\0' || strcmp(path, "probe") == 0)
			continue;
		if (access(path, R_OK) == 0)
			continue;
		snprintf(problem, size,
				 "could not read file \"%s\" of property \"%s\": %s", path,
				 file_properties[i], strerror(errno));
		*property = file_properties[i];
		return true;
	}
	return false;
}

/*
 * outbox_kafka_conf_fingerprint: into *fingerprint, a fingerprint of every
 * file conf names (fingerprinted): one that changes when a file's content
 * does, or the path.  False if one could not be read; problem then says
 * which, of which property, and why (errno), as outbox_kafka_unreadable_file
 * does, and *fingerprint is left as it was.
 */
bool
outbox_kafka_conf_fingerprint(rd_kafka_conf_t *conf, uint64 *fingerprint,
							  char *problem, size_t size)
{
	uint64 all = 0;

	for (int i = 0; fingerprinted[i] != NULL; i++)
	{
		char path[MAXPGPATH];
		size_t path_size = sizeof(path);
		uint64 one;

		if (rd_kafka_conf_get(conf, fingerprinted[i], path, &path_size) !=
				RD_KAFKA_CONF_OK ||
			path[0] == '\0' || strcmp(path, "probe") == 0)
			continue;
		one = hash_bytes_extended((const unsigned char *) path, strlen(path),
								  (uint64) i);
		if (!fingerprint_path(path, &one))
		{
			snprintf(problem, size,
					 "could not read file \"%s\" of property \"%s\": %s", path,
					 fingerprinted[i], strerror(errno));
			return false;
		}
		all = hash_combine64(all, one);
	}
	*fingerprint = all;
	return true;
}

/*
 * fingerprint_path: add the file at path, or each file of the directory
 * there (ssl.ca.location may name one), to *fingerprint; false, with
 * errno set, if one could not be read.
 */
static bool
fingerprint_path(const char *path, uint64 *fingerprint)
{
	struct stat st;

	if (stat(path, &st) != 0)
		return false;
	if (S_ISDIR(st.st_mode))
		return fingerprint_directory(path, fingerprint);
	return fingerprint_file(path, &st, fingerprint);
}

/*
 * fingerprint_directory: add each regular file of directory path to
 * *fingerprint, whatever order readdir gives them in.
 */
static bool
fingerprint_directory(const char *path, uint64 *fingerprint)
{
	DIR *dir = opendir(path);
	struct dirent *entry;
	uint64 sum = 0;
	bool ok = true;
	int saved;

	if (dir == NULL)
		return false;
	while (ok && (errno = 0, entry = readdir(dir)) != NULL)
	{
		char file[MAXPGPATH];
		struct stat st;
		uint64 one;

		snprintf(file, sizeof(file), "%s/%s", path, entry->d_name);
		if (stat(file, &st) != 0 || !S_ISREG(st.st_mode))
			continue; /* ".", "..", a dangling link: OpenSSL skips it too */
		one = hash_bytes_extended((const unsigned char *) entry->d_name,
								  strlen(entry->d_name), 0);
		ok = fingerprint_file(file, &st, &one);
		sum += one;
	}
	saved = errno; /* readdir's, or the failed file's */
	closedir(dir);
	errno = saved;
	if (!ok || saved != 0)
		return false;
	*fingerprint = hash_combine64(*fingerprint, sum);
	return true;
}

/*
 * fingerprint_file: add the regular file at path, whose status is *st, to
 * *fingerprint: its size and content.
 */
static bool
fingerprint_file(const char *path, const struct stat *st, uint64 *fingerprint)
{
	unsigned char chunk[FINGERPRINT_CHUNK];
	uint64 hash = (uint64) st->st_size;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t got;
	int saved;

	if (fd < 0)
		return false;
	while ((got = read(fd, chunk, sizeof(chunk))) > 0)
		hash = hash_bytes_extended(chunk, got, hash);
	saved = errno;
	close(fd);
	explicit_bzero(chunk, sizeof(chunk)); /* it may have held a key */
	errno = saved;
	if (got < 0)
		return false;
	*fingerprint = hash_combine64(*fingerprint, hash);
	return true;
}

/*
 * outbox_kafka_line_hint: what to check when librdkafka's line names no
 * setting (see the file's header), or NULL.
 */
const char *
outbox_kafka_line_hint(const char *line)
{
	for (int i = 0; certificate_alerts[i] != NULL; i++)
		if (strstr(line, certificate_alerts[i]) != NULL)
			return "The broker refused the client certificate, or got none: "
				   "check that ssl.certificate.location (or "
				   "ssl.keystore.location) names a certificate that has not "
				   "expired, signed by a CA the broker trusts.";
	if (strstr(line, "invalid credentials with SASL mechanism SCRAM-") != NULL &&
		rd_kafka_version() < SCRAM_KAFKA4_VERSION)
		return "Check sasl.username and sasl.password.  Kafka 4.0 and later "
			   "also refuse the right password from librdkafka before 2.6.1 "
			   "(librdkafka issue 4895): with such brokers, use a later "
			   "librdkafka or sasl.mechanism PLAIN over SASL_SSL.";
	return NULL;
}
