/* crun-rdzvd: serves crun's TCPStore-compatible store (store/server.c) in the
 * foreground. Argument parsing, limits, signals and readiness only; the store
 * itself lives in store/. Exit codes: 0 after SIGTERM/SIGINT, 1 when the store
 * cannot start, 2 for a bad flag or value.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/store.h"
#include "store/tls.h"

#define PROG "crun-rdzvd"

enum {
	OPT_MAX_KEY = 0x100,
	OPT_MAX_VALUE,
	OPT_MAX_ITEMS,
	OPT_MAX_CONNS,
	OPT_MAX_CONN_BUF,
	OPT_MAX_TOTAL,
	OPT_BACKLOG,
	OPT_LOG_LEVEL,
	OPT_VERSION,
	OPT_AUTH_FILE,
	OPT_AUTH_DIR,
	OPT_INSECURE,
	OPT_TLS_CERT,
	OPT_TLS_KEY,
	OPT_TLS_CA,
	OPT_TLS_MIN,
};

/* Security flags (see usage): where the secrets come from, and whether a
 * non-loopback listener without them is allowed. */
struct sec_opts {
	const char *secret_file;
	const char *secrets_dir;
	bool insecure;
	struct store_tls_opts tls;
};

static const struct option long_opts[] = {
    {"host", required_argument, NULL, 'H'},
    {"port", required_argument, NULL, 'p'},
    {"max-key-bytes", required_argument, NULL, OPT_MAX_KEY},
    {"max-value-bytes", required_argument, NULL, OPT_MAX_VALUE},
    {"max-keys-per-request", required_argument, NULL, OPT_MAX_ITEMS},
    {"max-conns", required_argument, NULL, OPT_MAX_CONNS},
    {"max-conn-buffer-bytes", required_argument, NULL, OPT_MAX_CONN_BUF},
    {"max-total-value-bytes", required_argument, NULL, OPT_MAX_TOTAL},
    {"backlog", required_argument, NULL, OPT_BACKLOG},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"auth-secret-file", required_argument, NULL, OPT_AUTH_FILE},
    {"auth-secrets-dir", required_argument, NULL, OPT_AUTH_DIR},
    {"insecure", no_argument, NULL, OPT_INSECURE},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
    {"tls-min-version", required_argument, NULL, OPT_TLS_MIN},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *f)
{
	const struct store_server_config d = STORE_SERVER_CONFIG_DEFAULT;

	fprintf(
	    f,
	    "usage: " PROG " [--host ADDR] [--port N] [options]\n"
	    "\n"
	    "Serves a key-value store that speaks PyTorch's TCPStore protocol (torch 1.13\n"
	    "and 2.x clients, dialect detected per connection) in the foreground. Prints\n"
	    "'" PROG " listening on ADDR:PORT' once ready; exits 0 on SIGTERM or SIGINT.\n"
	    "\n"
	    "  -H, --host ADDR               address or name to bind (default 127.0.0.1;\n"
	    "                                \"\" or :: = every interface, IPv6 dual stack)\n"
	    "  -p, --port N                  TCP port, 0 picks a free one (default 29400)\n"
	    "      --max-key-bytes N         longest key accepted (default %zu)\n"
	    "      --max-value-bytes N       longest value accepted (default %zu)\n"
	    "      --max-keys-per-request N  keys per CHECK/WAIT/MULTI_* (default %llu)\n"
	    "      --max-conns N             open client connections (default %u)\n"
	    "      --max-conn-buffer-bytes N input or output buffered per connection\n"
	    "                                (default %zu)\n"
	    "      --max-total-value-bytes N all values and queued items together\n"
	    "                                (default %zu)\n"
	    "      --backlog N               listen backlog (default: SOMAXCONN)\n"
	    "      --log-level LEVEL         error, warn, info (default), debug, trace\n"
	    "      --auth-secret-file FILE   every client must prove it knows this secret\n"
	    "                                (mode 0600, 16+ bytes; env CRUN_AUTH_SECRET_FILE)\n"
	    "      --auth-secrets-dir DIR    one secret file per run id (the file name): a\n"
	    "                                client of run id J sees only J's keys\n"
	    "      --insecure                allow a non-loopback --host without a secret\n"
	    "                                or TLS\n"
	    "      --tls-cert FILE           serve TLS with this PEM certificate chain\n"
	    "      --tls-key FILE            its PEM private key (default: in --tls-cert)\n"
	    "      --tls-ca FILE             require client certificates signed by this CA\n"
	    "                                (mutual TLS)\n"
	    "      --tls-min-version V       1.3 (default) or 1.2\n"
	    "  -h, --help                    show this help and exit\n"
	    "      --version                 print the version and exit\n"
	    "\n"
	    "A request over a limit, or a malformed one, closes that connection only.\n"
	    "Without a secret only loopback addresses are served, unless --insecure.\n"
	    "Exit status: 0 after SIGTERM/SIGINT, 1 if the store cannot start, 2 for a bad flag.\n",
	    d.limits.max_key_bytes, d.limits.max_value_bytes,
	    (unsigned long long)d.limits.max_items, d.max_conns, d.max_conn_buffered_bytes,
	    d.max_total_value_bytes);
}

static _Noreturn void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static _Noreturn void bad_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\ntry '" PROG " --help'\n");
	exit(2);
}

/* A flag's integer in [min, max]; exits 2 naming the flag otherwise. */
static uint64_t flag_uint(const char *flag, const char *val, uint64_t min, uint64_t max)
{
	char range[64];
	uint64_t v;

	if (parse_uint_range(val, min, max, &v) == 0)
		return v;
	if (str_printf(range, sizeof(range), "an integer in [%llu, %llu]", (unsigned long long)min,
		       (unsigned long long)max) < 0)
		range[0] = '\0';
	fprintf(stderr, PROG ": --%s: expected %s, got '%s'\ntry '" PROG " --help'\n", flag, range,
		val);
	exit(2);
}

static int level_from_name(const char *s)
{
	static const char *const names[] = {"error", "warn", "info", "debug", "trace"};

	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (!strcmp(s, names[i]))
			return (int)i;
	return -1;
}

static void parse_args(int argc, char **argv, struct store_server_config *cfg, struct sec_opts *sec)
{
	const uint64_t big = (uint64_t)1 << 40; /* 1 TiB: keeps size arithmetic safe */
	int o, lvl;

	opterr = 0;
	while ((o = getopt_long(argc, argv, ":H:p:h", long_opts, NULL)) != -1) {
		switch (o) {
		case 'H':
			cfg->host = optarg;
			/* "[::1]" as in host:port notation: bind "::1". */
			if (optarg[0] == '[' && optarg[strlen(optarg) - 1] == ']') {
				optarg[strlen(optarg) - 1] = '\0';
				cfg->host = optarg + 1;
			}
			break;
		case 'p':
			cfg->port = (uint16_t)flag_uint("port", optarg, 0, 65535);
			break;
		case OPT_MAX_KEY:
			cfg->limits.max_key_bytes = flag_uint("max-key-bytes", optarg, 1, big);
			break;
		case OPT_MAX_VALUE:
			cfg->limits.max_value_bytes = flag_uint("max-value-bytes", optarg, 1, big);
			break;
		case OPT_MAX_ITEMS:
			cfg->limits.max_items = flag_uint("max-keys-per-request", optarg, 1, big);
			break;
		case OPT_MAX_CONNS:
			cfg->max_conns = (uint32_t)flag_uint("max-conns", optarg, 1, UINT32_MAX);
			break;
		case OPT_MAX_CONN_BUF:
			cfg->max_conn_buffered_bytes =
			    flag_uint("max-conn-buffer-bytes", optarg, 64, big);
			break;
		case OPT_MAX_TOTAL:
			cfg->max_total_value_bytes =
			    flag_uint("max-total-value-bytes", optarg, 1, big * 64);
			break;
		case OPT_BACKLOG:
			cfg->backlog = (int)flag_uint("backlog", optarg, 1, 1 << 20);
			break;
		case OPT_LOG_LEVEL:
			lvl = level_from_name(optarg);
			if (lvl < 0)
				bad_usage("--log-level: expected error, warn, info, debug or "
					  "trace, got '%s'",
					  optarg);
			log_max_level = lvl;
			break;
		case OPT_AUTH_FILE:
			sec->secret_file = optarg;
			break;
		case OPT_AUTH_DIR:
			sec->secrets_dir = optarg;
			break;
		case OPT_INSECURE:
			sec->insecure = true;
			break;
		case OPT_TLS_CERT:
			sec->tls.cert = optarg;
			break;
		case OPT_TLS_KEY:
			sec->tls.key = optarg;
			break;
		case OPT_TLS_CA:
			sec->tls.ca = optarg;
			break;
		case OPT_TLS_MIN:
			if (strcmp(optarg, "1.2") && strcmp(optarg, "1.3"))
				bad_usage("--tls-min-version: expected 1.2 or 1.3, got '%s'",
					  optarg);
			sec->tls.min_version = optarg[2] == '2' ? 12 : 13;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case OPT_VERSION:
			printf(PROG " %s\n", CRUN_VERSION_STRING);
			exit(0);
		case ':':
			bad_usage("%s: missing value", argv[optind - 1]);
		default:
			bad_usage("unknown flag '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad_usage("unexpected argument '%s'", argv[optind]);
}

/* 10k idle clients need 10k fds: lift the soft limit to the hard one. */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		log_at(LL_WARN, SUB_CMD, "cannot raise RLIMIT_NOFILE: %s", strerror(errno));
}

/* systemd Type=notify readiness without libsystemd: one datagram to
 * $NOTIFY_SOCKET ('@' = abstract namespace). Best effort. */
static void notify_ready(void)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len;
	int fd;

	if (!path || (path[0] != '/' && path[0] != '@'))
		return;
	len = strlen(path);
	if (len >= sizeof(sa.sun_path))
		return;
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0';
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	if (sendto(fd, "READY=1", 7, MSG_NOSIGNAL, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
		log_at(LL_WARN, SUB_CMD, "NOTIFY_SOCKET: %s", strerror(errno));
	close(fd);
}

/* Loads the secrets the flags name into a table (NULL: none) and enforces
 * the secure default: no unauthenticated listener beyond loopback. Exits 2
 * naming the flag on a bad secret. */
static struct store_auth_keys *load_secrets(const struct sec_opts *sec, const char *host)
{
	struct store_auth_keys *keys = NULL;
	struct store_auth_secret s;
	char err[600];
	int r;

	if (!sec->secret_file && !sec->secrets_dir) {
		if (sec->tls.cert)
			return NULL; /* TLS: clients are verified if --tls-ca is given */
		if (!sec->insecure && !store_host_is_loopback(host))
			bad_usage("refusing to serve '%s' without authentication: give "
				  "--auth-secret-file, --auth-secrets-dir or --tls-cert, or "
				  "--insecure",
				  host && *host ? host : "*");
		if (!store_host_is_loopback(host))
			log_at(LL_WARN, SUB_CMD, "serving %s without authentication (--insecure)",
			       host && *host ? host : "every interface");
		return NULL;
	}
	if (store_auth_keys_new(&keys) < 0)
		bad_usage("out of memory");
	if (sec->secret_file) {
		r = store_auth_secret_read(sec->secret_file, &s, err, sizeof(err));
		if (r == 0)
			r = store_auth_keys_add(keys, "", &s);
		if (r < 0)
			bad_usage("--auth-secret-file: %s", err);
	}
	if (sec->secrets_dir &&
	    store_auth_keys_load_dir(keys, sec->secrets_dir, err, sizeof(err)) < 0)
		bad_usage("--auth-secrets-dir: %s", err);
	log_at(LL_INFO, SUB_CMD, "clients must authenticate (%zu secret%s)",
	       store_auth_keys_count(keys), store_auth_keys_count(keys) == 1 ? "" : "s");
	return keys;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)what;
	log_at(LL_INFO, SUB_CMD, "%s: shutting down", strsignal((int)sig));
	event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv)
{
	struct store_server_config cfg = STORE_SERVER_CONFIG_DEFAULT;
	struct store_server *srv = NULL;
	struct sec_opts sec = {.secret_file = getenv("CRUN_AUTH_SECRET_FILE")};
	struct store_auth_keys *keys;
	struct store_tls *tls = NULL;
	char tls_err[700];
	struct event *sig_term = NULL, *sig_int = NULL;
	struct event_base *base;
	int r, rc = 1;

	cfg.port = 29400;
	cfg.host = "127.0.0.1"; /* secure default: say --host to serve further */
	log_init(PROG, LL_INFO);
	if (sec.secret_file && !*sec.secret_file)
		sec.secret_file = NULL;
	parse_args(argc, argv, &cfg, &sec);
	keys = load_secrets(&sec, cfg.host);
	cfg.auth = keys;
	if ((sec.tls.key || sec.tls.ca || sec.tls.min_version) && !sec.tls.cert)
		bad_usage("--tls-key, --tls-ca and --tls-min-version need --tls-cert");
	if (sec.tls.cert && store_tls_new_server(&sec.tls, &tls, tls_err, sizeof(tls_err)) < 0)
		bad_usage("--tls-cert: %s", tls_err);
	cfg.tls = tls;
	signal(SIGPIPE, SIG_IGN);
	raise_nofile();

	base = event_base_new();
	if (!base) {
		fprintf(stderr, PROG ": cannot create the event loop\n");
		return 1;
	}
	sig_term = evsignal_new(base, SIGTERM, on_signal, base);
	sig_int = evsignal_new(base, SIGINT, on_signal, base);
	if (!sig_term || !sig_int || evsignal_add(sig_term, NULL) < 0 ||
	    evsignal_add(sig_int, NULL) < 0) {
		fprintf(stderr, PROG ": cannot install signal handlers\n");
		goto out;
	}
	r = store_server_new(base, &cfg, &srv);
	if (r < 0) {
		fprintf(stderr, PROG ": cannot serve on %s:%u: %s\n",
			cfg.host && *cfg.host ? cfg.host : "*", cfg.port, crun_strerror(r));
		goto out;
	}
	printf(PROG " listening on %s:%u\n",
	       cfg.host && *cfg.host ? cfg.host : "::", store_server_port(srv));
	fflush(stdout);
	notify_ready();

	if (event_base_dispatch(base) < 0) {
		fprintf(stderr, PROG ": event loop failed\n");
		goto out;
	}
	rc = 0;
out:
	store_server_free(srv); /* closes every client connection */
	if (sig_int)
		event_free(sig_int);
	if (sig_term)
		event_free(sig_term);
	event_base_free(base);
	store_auth_keys_free(keys);
	store_tls_free(tls);
	return rc;
}
