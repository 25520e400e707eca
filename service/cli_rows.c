/* cli_rows.c: the option rows of crun-rdzvd and crunctl, in the form of
 * crun's option table (service.h), with the text of their --help and man
 * pages that no row holds. cli_doc.c prints them with the row printers, so
 * a flag added here is parsed (getopt), documented (--help, man page),
 * completed and, with a JSON path, a --config key at once.
 */
#include <stdio.h>
#include <string.h>

#include "store/server.h"
#include "store/store_ext.h"
#include "common/common.h"
#include "service/rows_int.h"
#include "service/service.h"

/* The actions every program has: help, version, man page, completion. */
#define ACTION_ROWS(P)                                                                         \
	[P##_HELP] = {"help", 'h',  CT_ACTION, 0, NULL, NULL,                                  \
		      NULL,   NULL, NULL,      0, 0,	"show this help and exit",             \
		      NULL,   0,    NULL},                                                     \
	[P##_VERSION] = {"version", 0,	  CT_ACTION, 0, NULL, NULL,                            \
			 NULL,	    NULL, NULL,	     0, 0,    "print the version and exit",    \
			 NULL,	    0,	  NULL},                                               \
	[P##_PRINT_MAN] = {"print-man", 0,    CT_ACTION, CF_HIDDEN,                            \
			   NULL,	NULL, NULL,	 NULL,                                 \
			   NULL,	0,    0,	 "print the man page (roff) and exit", \
			   NULL,	0,    NULL},                                           \
	[P##_PRINT_COMPLETION] = {"print-completion",                                          \
				  0,                                                           \
				  CT_ACTION,                                                   \
				  0,                                                           \
				  NULL,                                                        \
				  NULL,                                                        \
				  NULL,                                                        \
				  "SHELL",                                                     \
				  "bash|zsh|tcsh",                                             \
				  0,                                                           \
				  0,                                                           \
				  "print a completion script for the shell and exit",          \
				  NULL,                                                        \
				  0,                                                           \
				  NULL}

/* Fields: name, short, type, flags, def, env, json, metavar, choices, min,
 * max, help, apply, off, section. */
static const struct cli_opt rd_rows[CLI_RD_LIMIT] = {
    [CLI_RD_HOST] = {"host", 'H', CT_STR, 0, "127.0.0.1", NULL, "host", "ADDR", NULL, 0, 0,
		     "address or name to bind (\"\" or :: = every interface, dual stack)", NULL, 0,
		     "options:"},
    [CLI_RD_PORT] = {"port", 'p', CT_INT, 0, "29400", NULL, "port", "N", NULL, 0, 65535,
		     "TCP port, 0 picks a free one", NULL, 0, NULL},
    [CLI_RD_BACKLOG] = {"backlog", 0, CT_INT, 0, NULL, NULL, "backlog", "N", NULL, 1, 1 << 20,
			"listen backlog (default: SOMAXCONN)", NULL, 0, NULL},
    [CLI_RD_LOG_LEVEL] = {"log-level", 0, CT_STR, CF_LIVE, "info", "CRUN_LOG_LEVEL", "log-level",
			  "LEVEL", NULL, 0, 0, LOG_LEVEL_NAMES, NULL, 0, NULL},
    [CLI_RD_STATUS] = {"status", 0, CT_STR, 0, "127.0.0.1:0", NULL, "status", "ADDR:PORT", NULL, 0,
		       0,
		       "serve /healthz, /status, /jobs and /metrics over HTTP; 'off' for none "
		       "(port 0: a free one, printed once listening)",
		       NULL, 0, NULL},
    [CLI_RD_CONFIG] = {"config", 0, CT_STR, 0, NULL, NULL, NULL, "FILE.json", NULL, 0, 0,
		       "settings as JSON, keyed by the JSON names below (limits.NAME for the "
		       "limits); a flag wins over the file; SIGHUP reads it again: log-level and "
		       "the limits apply at once, other changes are named as needing a restart",
		       NULL, 0, NULL},
    [CLI_RD_PRINT_SCHEMA] = {"print-schema", 0, CT_ACTION, 0, NULL, NULL, NULL, NULL, NULL, 0, 0,
			     "print the JSON schema of --config and exit", NULL, 0, NULL},
    [CLI_RD_EXT_VERSION] = {"ext-version", 0, CT_INT, 0, NULL, NULL, NULL, "N", NULL, 1,
			    STORE_EXT_VERSION,
			    "serve crun's store extension as version N (default: the newest), as "
			    "an older crun-rdzvd would: for testing clients' fallbacks",
			    NULL, 0, NULL},
    ACTION_ROWS(CLI_RD),
    [CLI_RD_AUTH_FILE] = {"auth-secret-file", 0, CT_STR, 0, NULL, "CRUN_AUTH_SECRET_FILE",
			  "auth-secret-file", "FILE", NULL, 0, 0,
			  "every client must prove it knows this secret (mode 0600, 16+ bytes)",
			  NULL, 0,
			  "security (without a secret or TLS only loopback addresses are "
			  "served):"},
    [CLI_RD_AUTH_DIR] = {"auth-secrets-dir", 0, CT_STR, 0, NULL, NULL, "auth-secrets-dir", "DIR",
			 NULL, 0, 0,
			 "one secret file per run id (the file name): a client of run id J sees "
			 "only J's keys",
			 NULL, 0, NULL},
    [CLI_RD_INSECURE] = {"insecure", 0, CT_FLAG, 0, NULL, NULL, NULL, NULL, NULL, 0, 0,
			 "allow a non-loopback --host without a secret or TLS (command line "
			 "only: never read from a file)",
			 NULL, 0, NULL},
    [CLI_RD_ADMIN_TOKEN] = {"admin-token-file", 0, CT_STR, 0, NULL, NULL, NULL, "FILE", NULL, 0, 0,
			    "turn on the status page's POST /drop (crunctl drop --job J: delete "
			    "one job's keys) for requests with this token (mode 0600, 16+ bytes)",
			    NULL, 0, NULL},
    [CLI_RD_TLS_CERT] = {"tls-cert", 0, CT_STR, 0, NULL, NULL, "tls-cert", "FILE", NULL, 0, 0,
			 "serve TLS with this PEM certificate chain", NULL, 0, NULL},
    [CLI_RD_TLS_KEY] = {"tls-key", 0, CT_STR, 0, NULL, NULL, "tls-key", "FILE", NULL, 0, 0,
			"its PEM private key (default: in --tls-cert)", NULL, 0, NULL},
    [CLI_RD_TLS_CA] = {"tls-ca", 0, CT_STR, 0, NULL, NULL, "tls-ca", "FILE", NULL, 0, 0,
		       "require client certificates signed by this CA (mutual TLS)", NULL, 0, NULL},
    [CLI_RD_TLS_MIN] = {"tls-min-version", 0, CT_STR, 0, "1.3", NULL, "tls-min-version", "V",
			"1.2|1.3", 0, 0, "the oldest TLS version served", NULL, 0, NULL},
};

static const struct cli_doc rd_doc = {
    .man_section = 8,
    .what = "TCPStore-compatible store and rendezvous daemon",
    .usage = "crun-rdzvd [--host ADDR] [--port N] [--config FILE.json] [options]",
    .synopsis = "\\fBcrun\\-rdzvd\\fR [\\fB\\-\\-host\\fR \\fIADDR\\fR] [\\fB\\-\\-port\\fR "
		"\\fIN\\fR] [\\fB\\-\\-config\\fR \\fIFILE.json\\fR] [\\fIoptions\\fR]",
    .description = "Serves a key-value store that speaks PyTorch's TCPStore protocol (torch "
		   "1.13 and 2.x clients, dialect detected per connection) in the foreground: "
		   "the rendezvous store of crun's c10d jobs. Prints 'crun-rdzvd listening on "
		   "ADDR:PORT' once ready. A flag wins over --config, which wins over the "
		   "default in [].",
    .help_tail = "A request over a limit, a malformed one, or a client over a budget closes "
		 "that connection only, with a WARN line (at most 10 a second) naming the "
		 "reason. A client whose replies are not read is not read either "
		 "(backpressure). Exit status: 0 after SIGTERM/SIGINT, 1 if the store cannot "
		 "start, 2 for a bad flag, config or secret file.",
    .man_tail =
	".SH EXIT STATUS\n0 after SIGTERM or SIGINT; 1 when the store cannot start; 2 for a "
	"bad flag, config or secret file (crun\\-rdzvd.service: RestartPreventExitStatus=2).\n"
	".SH SIGNALS\n.TP\n.B SIGTERM\\fR, \\fBSIGINT\nclose every connection and exit 0 "
	"(systemctl stop)\n.TP\n.B SIGHUP\nread \\fB\\-\\-config\\fR again: the log level and "
	"the limits apply at once; a changed address, port, status page, secret or TLS file "
	"is named as needing a restart (systemctl reload)\n"
	".SH ENVIRONMENT\n.TP\n.B CRUN_AUTH_SECRET_FILE\nthe secret file when "
	"\\fB\\-\\-auth\\-secret\\-file\\fR is not given\n.TP\n.B CRUN_LOG_LEVEL\\fR, "
	"\\fBCRUN_LOG_SUBSYS\nthe log level when \\fB\\-\\-log\\-level\\fR is not given, and "
	"the subsystems logged\n.TP\n.B NOTIFY_SOCKET\\fR, \\fBWATCHDOG_USEC\nset by systemd: "
	"READY=1 once listening, STATUS= with the connections and keys, watchdog pings from "
	"the event loop\n"
	".SH FILES\n.TP\n.I /etc/crun/rdzvd.json\nthe config of crun\\-rdzvd.service (schema: "
	"/usr/share/crun/crun\\-rdzvd.schema.json)\n.TP\n.I /etc/crun/rdzvd.secret\nits shared "
	"secret: mode 0600, owned by the crun user (tmpfiles.d/crun.conf)\n"
	".SH EXAMPLES\nA daemon for a cluster, every agent given the same secret:\n.PP\n.nf\n"
	"head \\-c 32 /dev/urandom | base64 > /etc/crun/rdzvd.secret\n"
	"chmod 600 /etc/crun/rdzvd.secret; chown crun:crun /etc/crun/rdzvd.secret\n"
	"systemctl enable \\-\\-now crun\\-rdzvd\n"
	"crun \\-\\-rdzv_backend=c10d \\-\\-rdzv_endpoint=HOST:29400 \\e\n"
	"     \\-\\-auth_secret_file=/etc/crun/rdzvd.secret ... train.py\n.fi\n"
	".PP\nFor a test, on loopback with a free port:\n.PP\n.nf\n"
	"crun\\-rdzvd \\-\\-port 0 \\-\\-status off\n.fi\n" CLI_MAN_SEE_ALSO,
};

static const struct cli_opt ctl_rows[CLI_CTL__MAX] = {
    [CLI_CTL_ENDPOINT] = {"endpoint", 'e', CT_STR, 0, NULL, NULL, NULL, "HOST:PORT", NULL, 0, 0,
			  "the status page to ask (required)", NULL, 0, "options:"},
    [CLI_CTL_RDZV_ID] = {"rdzv_id", 'j', CT_STR, 0, NULL, NULL, NULL, "JOB", NULL, 0, 0,
			 "only this job (its run id): an agent's page must serve it; on "
			 "crun-rdzvd's page, that job of its store",
			 NULL, 0, NULL},
    [CLI_CTL_JSON] = {"json", 0, CT_FLAG, 0, NULL, NULL, NULL, NULL, NULL, 0, 0,
		      "print the page's JSON instead of a table", NULL, 0, NULL},
    [CLI_CTL_INTERVAL] = {"interval", 0, CT_SECS, 0, "1", NULL, NULL, "S", NULL, 0, 0,
			  "watch: seconds between polls where a page cannot long-poll", NULL, 0,
			  NULL},
    [CLI_CTL_COUNT] = {"count", 0, CT_INT, 0, "0", NULL, NULL, "N", NULL, 0, INT64_MAX,
		       "watch: stop after N changes (0: at the job's end)", NULL, 0, NULL},
    [CLI_CTL_TIMEOUT] = {"timeout", 0, CT_SECS, 0, "5", NULL, NULL, "S", NULL, 0, 0,
			 "seconds to wait for each answer", NULL, 0, NULL},
    [CLI_CTL_RANK] = {"rank", 0, CT_INT, 0, NULL, NULL, NULL, "RANK", NULL, 0, INT64_MAX,
		      "stacks: only this global rank", NULL, 0, NULL},
    [CLI_CTL_JOB] = {"job", 0, CT_STR, 0, NULL, NULL, NULL, "JOB", NULL, 0, 0,
		     "drop: the job whose keys go; stacks on crun-rdzvd's page: the job whose "
		     "ranks print (the same as --rdzv_id)",
		     NULL, 0, NULL},
    [CLI_CTL_TOKEN_FILE] = {"token-file", 0, CT_STR, 0, NULL, NULL, NULL, "FILE", NULL, 0, 0,
			    "drop: crun-rdzvd's admin token (its --admin-token-file)", NULL, 0,
			    NULL},
    [CLI_CTL_ALL] = {"all", 0, CT_FLAG, 0, NULL, NULL, NULL, NULL, NULL, 0, 0,
		     "stacks: every rank of every node of the agent's job (c10d, etcd)", NULL, 0,
		     NULL},
    [CLI_CTL_WAIT] = {"wait", 0, CT_SECS, 0, NULL, NULL, NULL, "S", NULL, 0, 0,
		      "stacks --all or --job: seconds the page waits for every node's answer "
		      "(default 2.5, at most 120); it answers as soon as all are in",
		      NULL, 0, NULL},
    ACTION_ROWS(CLI_CTL),
};

static const struct cli_doc ctl_doc = {
    .man_section = 1,
    .what = "status of crun jobs, agents and rendezvous daemons",
    .usage = "crunctl COMMAND --endpoint HOST:PORT [--rdzv_id JOB] [options]",
    .synopsis = "\\fBcrunctl\\fR \\fICOMMAND\\fR \\fB\\-\\-endpoint\\fR \\fIHOST:PORT\\fR "
		"[\\fIoptions\\fR]\n.br\n\\fBcrunctl\\fR \\fB\\-\\-version\\fR",
    .description = "Shows the state of crun jobs from the status page of crun, crun-agent or "
		   "crun-rdzvd (their --status flag).",
    .help_tail = "Exit status: 0; 1 when watch saw the job fail or the page go away before "
		 "the end, or a page does not answer; 2 for bad usage.",
    .man_tail =
	".SH EXIT STATUS\n0; 1 when \\fBwatch\\fR saw the job fail or the page go away before "
	"the end, or a page does not answer (refused, unresolvable or timed out, said "
	"apart); 2 for bad usage.\n"
	".SH ENVIRONMENT\ncrunctl reads no environment variables.\n"
	".SH EXAMPLES\n.nf\ncrunctl status \\-\\-endpoint 127.0.0.1:29510\n"
	"crunctl watch \\-\\-endpoint 127.0.0.1:29510 \\-\\-rdzv_id job42\n"
	"crunctl watch \\-\\-endpoint rdzv.example:29401 \\-\\-rdzv_id job42\n"
	"crunctl jobs \\-\\-endpoint rdzv.example:29401 \\-\\-json\n.fi\n" CLI_MAN_SEE_ALSO,
};

/* A store limit's row: its flag, its range, its default (into def). */
static struct cli_opt limit_row(const struct store_server_limit *l, uint64_t dflt, char *def,
				size_t cap)
{
	if (dflt == 0 && l->zero) /* the store's own choice, which no flag can ask for */
		snprintf(def, cap, "%s", l->zero);
	else
		snprintf(def, cap, "%llu", (unsigned long long)dflt);
	return (struct cli_opt){
	    .name = l->name,
	    .type = CT_INT,
	    .def = def,
	    .metavar = strcmp(l->unit, "seconds") ? "N" : "SECONDS",
	    .min = (int64_t)l->min,
	    .max = (int64_t)l->max,
	    .help = l->help,
	    .flags = CF_LIVE,
	};
}

size_t cli_daemon_rows(enum cli_prog prog, struct cli_opt *out, size_t cap,
		       struct cli_daemon_buf *buf, const struct cli_doc **ret_doc)
{
	const struct store_server_config d = STORE_SERVER_CONFIG_DEFAULT;
	const struct store_server_limit *l;
	size_t n = 0, nl;

	if (prog == CLI_CTL) {
		*ret_doc = &ctl_doc;
		n = MIN(cap, (size_t)CLI_CTL__MAX);
		memcpy(out, ctl_rows, n * sizeof(*out));
		return n;
	}
	*ret_doc = &rd_doc;
	n = MIN(cap, (size_t)CLI_RD_LIMIT);
	memcpy(out, rd_rows, n * sizeof(*out));
	l = store_server_limits(&nl);
	for (size_t i = 0; i < nl && n < cap && i < CLI_DAEMON_ROWS_MAX; i++, n++) {
		out[n] = limit_row(&l[i], store_server_limit_get(&d, i), buf->def[i],
				   sizeof(buf->def[i]));
		snprintf(buf->json[i], sizeof(buf->json[i]), "limits.%s", l[i].name);
		out[n].json = buf->json[i];
		if (i == 0)
			out[n].section =
			    "limits (every one is on by default; sizes in bytes, times "
			    "in seconds):";
	}
	return n;
}
