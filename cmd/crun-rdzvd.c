/* crun-rdzvd: serves crun's TCPStore-compatible store (store/server/server.c) in the
 * foreground. Argument parsing (flags, or --config FILE.json read as flags),
 * limits, signals, systemd's notify protocol (common/notify.c) and the status
 * page (service/status.c) only; the store itself lives in store/. Exit codes: 0
 * after SIGTERM/SIGINT, 1 when the store cannot start, 2 for a bad flag or
 * value.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "common/common.h"
#include "service/service.h"
#include "store/auth.h"
#include "store/server.h"
#include "store/store_ext.h"
#include "store/tls.h"

#define PROG "crun-rdzvd"

extern char **environ;

/* Security flags (see usage): where the secrets come from, and whether a
 * non-loopback listener without them is allowed. */
struct sec_opts {
	const char *secret_file;
	const char *secrets_dir;
	bool insecure;
	struct store_tls_opts tls;
};

/* Prints what crun-rdzvd's rows (service/cli_rows.c) give for kind ("help",
 * "man", "schema" or a shell) and exits 0; 2 for a shell it has no script for. */
static _Noreturn void print_doc(const char *kind);

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

/* What the daemon keeps beside the store's config. */
struct daemon_opts {
	const char *status;		 /* --status, NULL: off */
	const char *admin_token;	 /* --admin-token-file, NULL: POST /drop is off */
	struct store_auth_secret *token; /* its bytes (owned), read before the loop */
	const char *config;		 /* --config, or NULL */
	char **file_argv;		 /* the file's settings as flags (owned) */
	int file_argc;
	char **cmd_argv; /* the command line (borrowed): its limits win on reload too */
	int cmd_argc;
	struct option *longs; /* getopt's tables from the rows (owned) */
	char *shorts;
};

/* The store tunable a row id names (CLI_RD_LIMIT + i), or NULL. */
static const char *limit_name(int id)
{
	size_t n;
	const struct store_server_limit *l = store_server_limits(&n);

	return id >= CLI_RD_LIMIT && (size_t)(id - CLI_RD_LIMIT) < n ? l[id - CLI_RD_LIMIT].name
								     : NULL;
}

static void parse_one(int id, char *arg, struct store_server_config *cfg, struct sec_opts *sec,
		      struct daemon_opts *d)
{
	char err[256];
	uint64_t v;
	int lvl;

	switch (id) {
	case CLI_RD_HOST:
		cfg->host = arg;
		/* "[::1]" as in host:port notation: bind "::1". */
		if (arg[0] == '[' && arg[strlen(arg) - 1] == ']') {
			arg[strlen(arg) - 1] = '\0';
			cfg->host = arg + 1;
		}
		break;
	case CLI_RD_PORT:
		if (parse_uint_range(arg, 0, 65535, &v) < 0)
			bad_usage("--port: expected an integer in [0, 65535], got '%s'", arg);
		cfg->port = (uint16_t)v;
		break;
	case CLI_RD_BACKLOG:
		if (parse_uint_range(arg, 1, 1 << 20, &v) < 0)
			bad_usage("--backlog: expected an integer in [1, 1048576], got '%s'", arg);
		cfg->backlog = (int)v;
		break;
	case CLI_RD_LOG_LEVEL:
		lvl = log_level_from_name(arg);
		if (lvl < 0)
			bad_usage("--log-level: expected " LOG_LEVEL_NAMES ", got '%s'", arg);
		log_set_level(lvl);
		break;
	case CLI_RD_STATUS:
		d->status = strcmp(arg, "off") == 0 || !*arg ? NULL : arg;
		break;
	case CLI_RD_CONFIG:
		break; /* read before the flags (read_config) */
	case CLI_RD_EXT_VERSION:
		if (parse_uint_range(arg, 1, STORE_EXT_VERSION, &v) < 0)
			bad_usage("--ext-version: expected an integer in [1, %u], got '%s'",
				  STORE_EXT_VERSION, arg);
		cfg->ext_version = (uint32_t)v;
		break;
	case CLI_RD_PRINT_SCHEMA:
		print_doc("schema");
	case CLI_RD_HELP:
		print_doc("help");
	case CLI_RD_PRINT_MAN:
		print_doc("man");
	case CLI_RD_PRINT_COMPLETION:
		print_doc(arg);
	case CLI_RD_VERSION:
		printf(PROG " %s\n", CRUN_VERSION_STRING);
		exit(0);
	case CLI_RD_AUTH_FILE:
		sec->secret_file = arg;
		break;
	case CLI_RD_AUTH_DIR:
		sec->secrets_dir = arg;
		break;
	case CLI_RD_INSECURE:
		sec->insecure = true;
		break;
	case CLI_RD_ADMIN_TOKEN:
		d->admin_token = arg;
		break;
	case CLI_RD_TLS_CERT:
		sec->tls.cert = arg;
		break;
	case CLI_RD_TLS_KEY:
		sec->tls.key = arg;
		break;
	case CLI_RD_TLS_CA:
		sec->tls.ca = arg;
		break;
	case CLI_RD_TLS_MIN:
		if (strcmp(arg, "1.2") && strcmp(arg, "1.3"))
			bad_usage("--tls-min-version: expected 1.2 or 1.3, got '%s'", arg);
		sec->tls.min_version = arg[2] == '2' ? 12 : 13;
		break;
	default:
		if (!limit_name(id) ||
		    store_server_config_set(cfg, limit_name(id), arg, err, sizeof(err)) < 0)
			bad_usage("--%s", limit_name(id) ? err : "?");
		break;
	}
}

static void parse_args(int argc, char **argv, struct store_server_config *cfg, struct sec_opts *sec,
		       struct daemon_opts *d)
{
	int o;

	if (cli_getopt_new(CLI_RDZVD, &d->longs, &d->shorts) < 0)
		bad_usage("out of memory");
	opterr = 0;
	while ((o = getopt_long(argc, argv, d->shorts, d->longs, NULL)) != -1) {
		if (o == ':')
			bad_usage("%s: missing value", argv[optind - 1]);
		if (o == '?' || cli_getopt_id(CLI_RDZVD, o) < 0)
			bad_usage("unknown flag '%s'", argv[optind - 1]);
		parse_one(cli_getopt_id(CLI_RDZVD, o), optarg, cfg, sec, d);
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

static _Noreturn void print_doc(const char *kind)
{
	char *text = cli_doc_new(CLI_RDZVD, kind, NULL, 0);

	if (!text)
		bad_usage("--print-completion: expected bash, zsh or tcsh, got '%s'", kind);
	fputs(text, stdout);
	free(text);
	exit(0);
}

/* --config: the file's JSON keys are the rows' JSON names (limits under
 * "limits."), so the file needs no list of its own. */
static int config_flags(const char *path, char ***ret_argv, int *ret_argc, char *err, size_t cap)
{
	struct cli_json_flag *t;
	size_t n;
	int r = cli_config_flags_new(CLI_RDZVD, &t, &n);

	if (r < 0) {
		snprintf(err, cap, "%s: %s", path, crun_strerror(r));
		return r;
	}
	r = cli_json_flags(path, t, n, ret_argv, ret_argc, err, cap);
	free(t);
	return r;
}

/* Finds --config and puts the file's flags first: argv[0], the file's, then
 * the command line's (which win, being parsed last). */
static char **read_config(int *argc, char **argv, struct daemon_opts *d)
{
	char err[512], **all;

	for (int i = 1; i < *argc && !d->config; i++) {
		if (strcmp(argv[i], "--config") == 0 && i + 1 < *argc)
			d->config = argv[i + 1];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			d->config = argv[i] + 9;
		else if (strcmp(argv[i], "--") == 0)
			break;
	}
	if (!d->config)
		return argv;
	if (config_flags(d->config, &d->file_argv, &d->file_argc, err, sizeof(err)) < 0)
		bad_usage("%s", err);
	all = calloc((size_t)(*argc + d->file_argc + 1), sizeof(char *));
	if (!all)
		bad_usage("out of memory");
	all[0] = argv[0];
	memcpy(all + 1, d->file_argv, (size_t)d->file_argc * sizeof(char *));
	memcpy(all + 1 + d->file_argc, argv + 1, (size_t)(*argc - 1) * sizeof(char *));
	*argc += d->file_argc;
	return all;
}

struct daemon {
	struct event_base *base;
	struct store_server *srv;
	struct daemon_opts *opts;
	struct service svc; /* notify socket, watchdog, SIGHUP */
	struct status_page *status;
};

static void send_status(struct daemon *d)
{
	struct store_server_stats st;

	store_server_get_stats(d->srv, &st);
	(void)notify_send(
	    d->svc.notify,
	    "STATUS=serving on port %u: %llu connections, %llu keys, %llu waiters%s%s",
	    store_server_port(d->srv), (unsigned long long)st.conns, (unsigned long long)st.keys,
	    (unsigned long long)st.waiters, d->status ? ", status on " : "",
	    d->status ? status_page_addr(d->status) : "");
}

static void on_tick(void *arg)
{
	send_status(arg);
}

/* Whether flag text "--NAME=..." (cli_json_flags' form) is a store tunable. */
static bool is_limit_flag(const char *flag)
{
	size_t n, len = strcspn(flag + 2, "=");
	const struct store_server_limit *l = store_server_limits(&n);

	for (size_t i = 0; i < n; i++)
		if (strlen(l[i].name) == len && strncmp(flag + 2, l[i].name, len) == 0)
			return true;
	return false;
}

/* The limits a reload puts in force: the defaults, the file's flags, then
 * the command line's (which win, as at start; they were checked then).
 * 0, or CRUN_EINVAL with err naming the flag (nothing applied). */
static int reload_limits(const struct daemon_opts *o, char **fresh, int n,
			 struct store_server_config *cfg, char *err, size_t cap)
{
	int opt;

	for (int i = 0; i < n; i++) {
		char name[80];
		const char *eq = strchr(fresh[i], '=');

		if (!eq || !is_limit_flag(fresh[i]))
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(eq - fresh[i] - 2), fresh[i] + 2);
		if (store_server_config_set(cfg, name, eq + 1, err, cap) < 0)
			return CRUN_EINVAL;
	}
	optind = 0; /* GNU: start over */
	opterr = 0;
	while ((opt = getopt_long(o->cmd_argc, o->cmd_argv, o->shorts, o->longs, NULL)) != -1)
		if (opt != ':' && opt != '?' && limit_name(cli_getopt_id(CLI_RDZVD, opt)))
			(void)store_server_config_set(
			    cfg, limit_name(cli_getopt_id(CLI_RDZVD, opt)), optarg, err, cap);
	return 0;
}

/* Appends "what" to a ", "-separated list (bounded; past the end: dropped). */
static void list_add(char *list, size_t cap, const char *what, size_t len)
{
	size_t o = strlen(list);

	/* A changed value is both a flag gone and a flag added: name it once. */
	for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] ? 2 : 0))
		if (strcspn(p, ",") == len && strncmp(p, what, len) == 0)
			return;
	if (o + len + 3 < cap)
		snprintf(list + o, cap - o, "%s%.*s", o ? ", " : "", (int)len, what);
}

/* Whether flag text is in argv (exactly). */
static bool has_flag(char **argv, int n, const char *flag)
{
	for (int k = 0; k < n; k++)
		if (strcmp(argv[k], flag) == 0)
			return true;
	return false;
}

/* SIGHUP: the log level and the store's limits apply at once (limits to
 * every request and new connection from then on); any other change of the
 * file (address, port, backlog, status page, secrets, TLS) is named as
 * needing a restart, compared with the file the daemon started with. */
static void on_reload(void *arg)
{
	struct daemon *d = arg;
	const struct store_server_config *run = store_server_get_config(d->srv);
	struct store_server_config lim = STORE_SERVER_CONFIG_DEFAULT;
	char err[512], applied[512] = "", restart[512] = "", **fresh = NULL;
	uint64_t before[32];
	size_t nl;
	const struct store_server_limit *l = store_server_limits(&nl);
	int n = 0, lvl = -1, r = 0;

	if (d->opts->config)
		r = config_flags(d->opts->config, &fresh, &n, err, sizeof(err));
	if (r == 0 && d->opts->config)
		r = reload_limits(d->opts, fresh, n, &lim, err, sizeof(err));
	for (int i = 0; r == 0 && i < n; i++)
		if (strncmp(fresh[i], "--log-level=", 12) == 0 &&
		    (lvl = log_level_from_name(fresh[i] + 12)) < 0) {
			snprintf(err, sizeof(err),
				 "log-level: expected " LOG_LEVEL_NAMES ", got '%.64s'",
				 fresh[i] + 12);
			r = CRUN_EINVAL;
		}
	if (!d->opts->config || r < 0) {
		if (d->opts->config)
			log_at(LL_ERROR, SUB_CMD, "reload: %s; keeping the running config", err);
		(void)notify_send(d->svc.notify, "READY=1\nSTATUS=reload: %s",
				  d->opts->config ? "failed, see the log" : "no --config to read");
		goto out;
	}
	if (lvl >= 0) {
		if (lvl != log_max_level)
			list_add(applied, sizeof(applied), "log-level", 9);
		log_set_level(lvl);
	}
	for (size_t i = 0; i < nl && i < ARRAY_SIZE(before); i++)
		before[i] = store_server_limit_get(run, i);
	store_server_set_limits(d->srv, &lim);
	for (size_t i = 0; i < nl && i < ARRAY_SIZE(before); i++)
		if (store_server_limit_get(run, i) != before[i])
			list_add(applied, sizeof(applied), l[i].name, strlen(l[i].name));
	/* Anything else that differs from the file the daemon started with,
	 * added or removed. */
	for (int i = 0; i < n; i++)
		if (strncmp(fresh[i], "--log-level=", 12) && !is_limit_flag(fresh[i]) &&
		    !has_flag(d->opts->file_argv, d->opts->file_argc, fresh[i]))
			list_add(restart, sizeof(restart), fresh[i] + 2,
				 strcspn(fresh[i] + 2, "="));
	for (int k = 0; k < d->opts->file_argc; k++) {
		const char *f = d->opts->file_argv[k];

		if (strncmp(f, "--log-level=", 12) && !is_limit_flag(f) && !has_flag(fresh, n, f))
			list_add(restart, sizeof(restart), f + 2, strcspn(f + 2, "="));
	}
	/* Applied in full is a normal event; a change that waits for a restart
	 * is something to act on. */
	log_at(restart[0] ? LL_WARN : LL_NOTICE, SUB_CMD,
	       "reload: applied: %s; needs a restart: %s", applied[0] ? applied : "nothing",
	       restart[0] ? restart : "nothing");
	if (applied[0])
		log_limits(d->srv);
	(void)notify_send(d->svc.notify,
			  "READY=1\nSTATUS=reloaded: applied %s; needs a restart: %s",
			  applied[0] ? applied : "nothing", restart[0] ? restart : "nothing");
out:
	for (int i = 0; i < n; i++)
		free(fresh[i]);
	free(fresh);
}

static int daemon_start(struct daemon *d)
{
	int r;

	r = service_start(&d->svc, d->base, environ, on_reload, on_tick, d);
	if (r < 0)
		return r;
	if (d->opts->status) {
		r = status_page_start(d->base, d->opts->status, &d->status);
		if (r < 0)
			return r;
		status_page_attach_store(d->status, d->srv);
		if (d->opts->token) {
			r = status_page_allow_drop(d->status, d->srv, d->opts->token);
			if (r < 0) {
				fprintf(stderr,
					PROG ": --admin-token-file: a token must be printable "
					     "text (it travels in an HTTP header)\n");
				return r;
			}
		}
		printf(PROG " status on http://%s/status\n", status_page_addr(d->status));
	}
	(void)notify_send(d->svc.notify, "READY=1");
	send_status(d);
	return 0;
}

static void daemon_stop(struct daemon *d)
{
	status_page_stop(d->status);
	service_stop(&d->svc);
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

/* --admin-token-file: read once, with the secret files' checks (mode 0600,
 * 16..4096 bytes); exits 2 naming the flag. */
static void read_admin_token(struct daemon_opts *d)
{
	char err[600];

	if (!d->admin_token)
		return;
	if (!d->status)
		bad_usage("--admin-token-file needs the status page (--status)");
	d->token = malloc(sizeof(*d->token));
	if (!d->token)
		bad_usage("out of memory");
	if (store_auth_secret_read(d->admin_token, d->token, err, sizeof(err)) < 0)
		bad_usage("--admin-token-file: %s", err);
}

int main(int argc, char **argv)
{
	struct store_server_config cfg = STORE_SERVER_CONFIG_DEFAULT;
	struct daemon_opts opts = {.status = "127.0.0.1:0"};
	struct daemon d = {.opts = &opts};
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
	opts.cmd_argv = argv;
	opts.cmd_argc = argc;
	argv = read_config(&argc, argv, &opts);
	parse_args(argc, argv, &cfg, &sec, &opts);
	keys = load_secrets(&sec, cfg.host);
	read_admin_token(&opts);
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
	d.base = base;
	d.srv = srv;
	r = daemon_start(&d);
	fflush(stdout);
	if (r < 0) {
		fprintf(stderr, PROG ": cannot start the status page on %s: %s\n", opts.status,
			crun_strerror(r));
		goto out;
	}

	if (event_base_dispatch(base) < 0) {
		fprintf(stderr, PROG ": event loop failed\n");
		goto out;
	}
	rc = 0;
out:
	daemon_stop(&d);
	log_metrics(srv);
	store_server_free(srv); /* closes every client connection */
	if (sig_int)
		event_free(sig_int);
	if (sig_term)
		event_free(sig_term);
	event_base_free(base);
	for (int i = 0; i < opts.file_argc; i++)
		free(opts.file_argv[i]);
	free(opts.file_argv);
	if (opts.token)
		explicit_bzero(opts.token, sizeof(*opts.token));
	free(opts.token);
	if (opts.file_argv)
		free(argv); /* read_config's array; its strings belong to others */
	free(opts.longs);
	free(opts.shorts);
	store_auth_keys_free(keys);
	store_tls_free(tls);
	return rc;
}
