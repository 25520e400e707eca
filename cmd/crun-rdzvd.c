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
	OPT_BACKLOG = 0x100,
	OPT_LOG_LEVEL,
	OPT_VERSION,
	OPT_AUTH_FILE,
	OPT_AUTH_DIR,
	OPT_INSECURE,
	OPT_TLS_CERT,
	OPT_TLS_KEY,
	OPT_TLS_CA,
	OPT_TLS_MIN,
	OPT_LIMIT, /* OPT_LIMIT + i: tunable i of store_server_limits() */
};

/* Security flags (see usage): where the secrets come from, and whether a
 * non-loopback listener without them is allowed. */
struct sec_opts {
	const char *secret_file;
	const char *secrets_dir;
	bool insecure;
	struct store_tls_opts tls;
};

static const struct option fixed_opts[] = {
    {"host", required_argument, NULL, 'H'},
    {"port", required_argument, NULL, 'p'},
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
};

/* The fixed flags, then one --NAME per store tunable, then the terminator. */
static struct option long_opts[ARRAY_SIZE(fixed_opts) + 32 + 1];

static void build_opts(void)
{
	size_t n, k = ARRAY_SIZE(fixed_opts);
	const struct store_server_limit *l = store_server_limits(&n);

	memcpy(long_opts, fixed_opts, sizeof(fixed_opts));
	for (size_t i = 0; i < n && k < ARRAY_SIZE(long_opts) - 1; i++, k++)
		long_opts[k] =
		    (struct option){l[i].name, required_argument, NULL, OPT_LIMIT + (int)i};
}

/* "--max-keys N", then its help and default word-wrapped under it. */
static void usage_limit(FILE *f, const struct store_server_limit *l, uint64_t def)
{
	char text[320];
	const char *p = text;
	int r;

	fprintf(f, "      --%s %s\n", l->name, strcmp(l->unit, "seconds") ? "N" : "SECONDS");
	if (def == 0 && l->zero)
		r = str_printf(text, sizeof(text), "%s (default: %s)", l->help, l->zero);
	else
		r = str_printf(text, sizeof(text), "%s (default %llu%s%s)", l->help,
			       (unsigned long long)def, l->zero ? "; 0: " : "",
			       l->zero ? l->zero : "");
	if (r < 0)
		return;
	while (*p) {
		size_t n = strlen(p);

		if (n > 68) {
			n = 68;
			while (n && p[n] != ' ')
				n--;
			if (!n)
				n = 68;
		}
		fprintf(f, "          %.*s\n", (int)n, p);
		p += n;
		while (*p == ' ')
			p++;
	}
}

static void usage(FILE *f)
{
	const struct store_server_config d = STORE_SERVER_CONFIG_DEFAULT;
	const struct store_server_limit *l;
	size_t n;

	fprintf(f,
		"usage: " PROG " [--host ADDR] [--port N] [options]\n"
		"\n"
		"Serves a key-value store that speaks PyTorch's TCPStore protocol (torch 1.13\n"
		"and 2.x clients, dialect detected per connection) in the foreground. Prints\n"
		"'" PROG " listening on ADDR:PORT' once ready; exits 0 on SIGTERM or SIGINT.\n"
		"\n"
		"  -H, --host ADDR                   address or name to bind (default 127.0.0.1;\n"
		"                                    \"\" or :: = every interface, dual stack)\n"
		"  -p, --port N                      TCP port, 0 picks a free one (default 29400)\n"
		"      --backlog N                   listen backlog (default: SOMAXCONN)\n"
		"      --log-level LEVEL             error, warn, info (default), debug, trace\n"
		"\n"
		"Security (without a secret or TLS only loopback addresses are served):\n"
		"      --auth-secret-file FILE       every client must prove it knows this secret\n"
		"                                    (mode 0600, 16+ bytes; env\n"
		"                                    CRUN_AUTH_SECRET_FILE)\n"
		"      --auth-secrets-dir DIR        one secret file per run id (the file name):\n"
		"                                    a client of run id J sees only J's keys\n"
		"      --insecure                    allow a non-loopback --host without a secret\n"
		"                                    or TLS\n"
		"      --tls-cert FILE               serve TLS with this PEM certificate chain\n"
		"      --tls-key FILE                its PEM private key (default: in --tls-cert)\n"
		"      --tls-ca FILE                 require client certificates signed by this\n"
		"                                    CA (mutual TLS)\n"
		"      --tls-min-version V           1.3 (default) or 1.2\n"
		"  -h, --help                        show this help and exit\n"
		"      --version                     print the version and exit\n"
		"\n"
		"Limits (every one is on by default; sizes in bytes, times in seconds):\n");
	l = store_server_limits(&n);
	for (size_t i = 0; i < n; i++)
		usage_limit(f, &l[i], store_server_limit_get(&d, i));
	fprintf(f,
		"\n"
		"A request over a limit, a malformed one, or a client over a budget closes that\n"
		"connection only, with a WARN line (at most 10 a second) naming the reason.\n"
		"A client whose replies are not read is not read either (backpressure).\n"
		"Exit status: 0 after SIGTERM/SIGINT, 1 if the store cannot start, 2 for a bad "
		"flag.\n");
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
	char err[256];
	uint64_t v;
	int o, lvl;

	build_opts();
	opterr = 0;
	while ((o = getopt_long(argc, argv, ":H:p:h", long_opts, NULL)) != -1) {
		if (o >= OPT_LIMIT) {
			/* long_opts[] lists the tunables in table order. */
			const char *name = long_opts[ARRAY_SIZE(fixed_opts) + (o - OPT_LIMIT)].name;

			if (store_server_config_set(cfg, name, optarg, err, sizeof(err)) < 0)
				bad_usage("--%s", err);
			continue;
		}
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
			if (parse_uint_range(optarg, 0, 65535, &v) < 0)
				bad_usage("--port: expected an integer in [0, 65535], got '%s'",
					  optarg);
			cfg->port = (uint16_t)v;
			break;
		case OPT_BACKLOG:
			if (parse_uint_range(optarg, 1, 1 << 20, &v) < 0)
				bad_usage(
				    "--backlog: expected an integer in [1, 1048576], got '%s'",
				    optarg);
			cfg->backlog = (int)v;
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

/* One INFO line with the limits an operator asks about first; a --max-conns
 * the fd limit cannot back is worth a WARN (those clients are refused at
 * accept, cleanly, but refused). */
static void log_limits(const struct store_server *srv)
{
	const struct store_server_config *c = store_server_get_config(srv);
	struct rlimit rl;

	log_at(LL_INFO, SUB_CMD,
	       "limits: max-conns %u, max-keys %llu, max-total-value-bytes %zu, "
	       "max-total-input-bytes %zu, max-total-output-bytes %zu (--help lists all)",
	       c->max_conns, (unsigned long long)c->max_keys, c->max_total_value_bytes,
	       c->max_total_input_bytes, c->max_total_output_bytes);
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    c->max_conns + 16 > rl.rlim_cur)
		log_at(LL_WARN, SUB_CMD,
		       "--max-conns %u is at or above the fd limit (%llu): clients past the "
		       "limit are refused at accept",
		       c->max_conns, (unsigned long long)rl.rlim_cur);
}

/* At exit, one INFO line with every non-zero refusal/limit counter (the
 * store's metric table), so an operator sees what was refused and why. */
static void log_metrics(const struct store_server *srv)
{
	char line[1024];
	size_t off = 0;

	if (!srv)
		return;
	line[0] = '\0';
	for (int m = 0; m < STORE_M__MAX; m++) {
		uint64_t v = store_server_metric(srv, (enum store_metric)m);
		int n;

		if (!v)
			continue;
		n = snprintf(line + off, sizeof(line) - off, " %s=%llu",
			     store_metric_name((enum store_metric)m), (unsigned long long)v);
		if (n < 0 || (size_t)n >= sizeof(line) - off)
			break;
		off += (size_t)n;
	}
	log_at(LL_INFO, SUB_CMD, "store metrics:%s", off ? line : " none");
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
	log_limits(srv);
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
	log_metrics(srv);
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
