/* crunctl: look at running crun agents (and crun-rdzvd) through their
 * status pages (--status ADDR:PORT): a multi-call tool with one entry per
 * command, as git's. Exit codes: 0 ok, 1 the page could not be read (or
 * watch: the job failed), 2 bad usage.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/common.h"
#include "store/auth.h"

#define PROG "crunctl"

struct opts {
	const char *endpoint;
	const char *rdzv_id;
	bool json;
	uint64_t interval_ms;
	uint64_t count; /* watch: stop after this many changes; 0 = until the page goes away */
	uint32_t timeout_ms;
	const char *token_file; /* drop: the admin token */
};

static int fetch(const struct opts *o, const char *path, char **ret_body)
{
	int status = 0, r = agent_ctl_get(o->endpoint, path, o->timeout_ms, &status, ret_body);

	if (r < 0) {
		fprintf(stderr, PROG ": cannot read http://%s%s: %s\n", o->endpoint, path,
			crun_strerror(r));
		return 1;
	}
	if (status == 404 && o->rdzv_id && strncmp(path, "/status?", 8) == 0) {
		/* a page of many jobs holds no key of this one */
		fprintf(stderr, PROG ": %s does not serve job '%s'\n", o->endpoint, o->rdzv_id);
		free(*ret_body);
		return 1;
	}
	if (status != 200) {
		fprintf(stderr, PROG ": http://%s%s: HTTP %d\n", o->endpoint, path, status);
		free(*ret_body);
		return 1;
	}
	return 0;
}

/* The page's job must be the one asked for (--rdzv_id), so a script never
 * reads another job's state from a reused port. */
static int check_job(const struct opts *o, const char *body)
{
	if (!o->rdzv_id || agent_ctl_serves_job(body, o->rdzv_id))
		return 0;
	fprintf(stderr, PROG ": %s does not serve job '%s'\n", o->endpoint, o->rdzv_id);
	return 1;
}

static int show(const struct opts *o, const char *path, int (*print)(FILE *out, const char *json))
{
	char *body;
	int rc = fetch(o, path, &body);

	if (rc)
		return rc;
	rc = check_job(o, body);
	if (!rc && o->json)
		printf("%s\n", body);
	else if (!rc && print(stdout, body) < 0) {
		fprintf(stderr, PROG ": http://%s%s: not a crun status page\n", o->endpoint, path);
		rc = 1;
	}
	free(body);
	return rc;
}

static int cmd_status(const struct opts *o)
{
	char path[600] = "/status";

	/* A page of many jobs (crun-rdzvd's) answers for the one asked for;
	 * an agent's ignores the query and check_job compares its run id. */
	if (o->rdzv_id && agent_ctl_query(path, sizeof(path), "/status?rdzv_id=", o->rdzv_id) < 0) {
		fprintf(stderr, PROG ": --rdzv_id: too long\n");
		return 2;
	}
	return show(o, path, agent_ctl_print_status);
}

static int cmd_jobs(const struct opts *o)
{
	return show(o, "/jobs", agent_ctl_print_jobs);
}

/* How a watch that saw `last` ends when the page goes away or says "done":
 * 0 for a job that succeeded (or a page without a job: crun-rdzvd's), 1 for
 * one that failed or vanished before its end, which it names. */
static int watch_end(const struct opts *o, const struct agent_ctl_state *last)
{
	if (strcmp(last->state, "done") == 0 && last->exit_code == 0)
		return 0;
	if (strcmp(last->state, "done") == 0) {
		fprintf(stderr, PROG ": the job failed (exit code %d)\n", last->exit_code);
		return 1;
	}
	if (!last->state[0])
		return 0;
	fprintf(stderr, PROG ": http://%s/status went away while the job was %s\n", o->endpoint,
		last->state);
	return 1;
}

/* Prints /status whenever it changes, until the job's end (its final state;
 * exit 0 only if it succeeded), the page going away or --count changes. A
 * page with a version is long-polled: it answers at the next state change
 * or after the interval, so no state, the end included, is missed. */
static int cmd_watch(const struct opts *o)
{
	struct agent_ctl_state st = {.version = -1};
	char *last = NULL, path[96] = "/status";
	uint64_t changes = 0;
	int rc;

	for (;;) {
		char *body;
		int status = 0, r;

		r = agent_ctl_get(o->endpoint, path, o->timeout_ms + (uint32_t)o->interval_ms,
				  &status, &body);
		if (r == 0 && status == 503 && last) { /* every watcher slot taken: poll */
			free(body);
			usleep((useconds_t)(o->interval_ms * 1000));
			continue;
		}
		if (r < 0 || status != 200) {
			if (r == 0)
				free(body);
			if (last) {
				rc = watch_end(o, &st);
				break;
			}
			fprintf(stderr, PROG ": cannot read http://%s/status: %s\n", o->endpoint,
				r < 0 ? crun_strerror(r) : "not 200");
			rc = 1;
			break;
		}
		if (!last || strcmp(last, body) != 0) {
			if (o->json)
				printf("%s\n", body);
			else if (agent_ctl_print_status(stdout, body) == 0)
				printf("\n");
			fflush(stdout);
			free(last);
			last = body;
			(void)agent_ctl_read_state(last, &st);
			if (strcmp(st.state, "done") == 0) {
				rc = watch_end(o, &st);
				break;
			}
			if (o->count && ++changes >= o->count) {
				rc = 0;
				break;
			}
		} else {
			free(body);
		}
		if (st.version >= 0)
			snprintf(path, sizeof(path), "/status?after=%" PRId64 "&wait_ms=%" PRIu64,
				 st.version, o->interval_ms);
		else
			usleep((useconds_t)(o->interval_ms * 1000));
	}
	free(last);
	return rc;
}

static int cmd_usage(const struct opts *o)
{
	return show(o, "/usage", agent_ctl_print_usage);
}

/* The admin token of --token-file as a header value: the file passes the
 * secret files' checks (mode 0600, 16..4096 bytes) and holds printable text. */
static int read_token(const struct opts *o, struct store_auth_secret *tok, char *out, size_t cap)
{
	char err[600];

	if (!o->token_file) {
		fprintf(stderr, PROG ": drop: --token-file FILE (crun-rdzvd's --admin-token-file) "
				     "is required\n");
		return 2;
	}
	if (store_auth_secret_read(o->token_file, tok, err, sizeof(err)) < 0) {
		fprintf(stderr, PROG ": --token-file: %s\n", err);
		return 2;
	}
	for (size_t i = 0; i < tok->len; i++)
		if (tok->bytes[i] < 0x20 || tok->bytes[i] == 0x7f || i + 1 >= cap) {
			fprintf(stderr, PROG ": --token-file: '%s' must be printable text\n",
				o->token_file);
			return 2;
		}
	memcpy(out, tok->bytes, tok->len);
	out[tok->len] = '\0';
	return 0;
}

/* POST /drop?job=J with the admin token: job J's keys are deleted. */
static int cmd_drop(const struct opts *o)
{
	struct store_auth_secret *tok = malloc(sizeof(*tok));
	char path[600], bearer[STORE_AUTH_SECRET_MAX + 1], *body = NULL;
	int status = 0, rc = 2, r;

	if (!tok)
		return 1;
	if (!o->rdzv_id) {
		fprintf(stderr, PROG ": drop: --job JOB is required\n");
		goto out;
	}
	if (agent_ctl_query(path, sizeof(path), "/drop?job=", o->rdzv_id) < 0) {
		fprintf(stderr, PROG ": --job: too long\n");
		goto out;
	}
	rc = read_token(o, tok, bearer, sizeof(bearer));
	if (rc)
		goto out;
	r = agent_ctl_post(o->endpoint, path, bearer, o->timeout_ms, &status, &body);
	rc = 1;
	if (r < 0)
		fprintf(stderr, PROG ": cannot post http://%s/drop: %s\n", o->endpoint,
			crun_strerror(r));
	else if (status != 200)
		fprintf(stderr, PROG ": drop of job '%s' refused: HTTP %d%s%s\n", o->rdzv_id,
			status, status == 401 ? " (wrong token)" : "",
			status == 404 ? " (the job holds no keys)" : "");
	else if (o->json)
		rc = printf("%s\n", body) < 0;
	else
		rc = printf("dropped the keys of job '%s': %s\n", o->rdzv_id, body) < 0;
out:
	free(body);
	explicit_bzero(bearer, sizeof(bearer));
	explicit_bzero(tok, sizeof(*tok));
	free(tok);
	return rc;
}

static const struct command {
	const char *name;
	int (*fn)(const struct opts *o);
	const char *help;
} commands[] = {
    {"status", cmd_status, "a job's state, ranks, restarts and workers (GET /status)"},
    {"jobs", cmd_jobs, "the jobs a page serves (GET /jobs)"},
    {"watch", cmd_watch, "print /status again whenever it changes"},
    {"usage", cmd_usage, "which job holds what of crun-rdzvd's store (GET /usage)"},
    {"drop", cmd_drop, "delete one job's keys (--job, --token-file; POST /drop)"},
};

/* The one list of crunctl's options: getopt's table, --help and (through
 * --help) crunctl(1) are loops over it. */
static const struct ctl_opt {
	const char *name;
	int val;
	const char *metavar; /* NULL: a flag */
	const char *help;
} ctl_opts[] = {
    {"endpoint", 'e', "HOST:PORT", "the status page to ask (required)"},
    {"rdzv_id", 'j', "JOB", "only this job (its run id); also --rdzv-id"},
    {"json", 'J', NULL, "print the page's JSON instead of a table"},
    {"interval", 'i', "S", "watch: seconds between polls where a page cannot long-poll [1]"},
    {"count", 'c', "N", "watch: stop after N changes [0: at the job's end]"},
    {"timeout", 't', "S", "seconds to wait for each answer [5]"},
    {"job", 'j', "JOB", "drop: the job whose keys go (the same as --rdzv_id)"},
    {"token-file", 'T', "FILE", "drop: crun-rdzvd's admin token (--admin-token-file)"},
    {"help", 'h', NULL, "show this help and exit"},
};

static void usage(FILE *f)
{
	char head[64];

	fprintf(f, "usage: " PROG " COMMAND --endpoint HOST:PORT [--rdzv_id JOB] [--json]\n"
		   "               [--interval S] [--count N] [--timeout S]\n"
		   "       " PROG " --version\n\n"
		   "Shows the state of crun jobs from the status page of crun, crun-agent or\n"
		   "crun-rdzvd (their --status flag). Exit status: 0; 1 when watch saw the job\n"
		   "fail or the page go away before the end, or a page does not answer; 2 for\n"
		   "bad usage.\n\ncommands:\n");
	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
	fprintf(f, "\noptions:\n");
	for (size_t i = 0; i < ARRAY_SIZE(ctl_opts); i++) {
		snprintf(head, sizeof(head), "--%s%s%s", ctl_opts[i].name,
			 ctl_opts[i].metavar ? " " : "",
			 ctl_opts[i].metavar ? ctl_opts[i].metavar : "");
		fprintf(f, "  %-22s %s\n", head, ctl_opts[i].help);
	}
	fprintf(f, "  %-22s %s\n", "--version", "print the version and exit");
}

static int seconds(const char *flag, const char *v, uint64_t *ret_ms)
{
	if (parse_seconds_ms(v, ret_ms) < 0) {
		fprintf(stderr, PROG ": %s: invalid number of seconds '%s'\n", flag, v);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct option longs[ARRAY_SIZE(ctl_opts) + 2] = {{"rdzv-id", required_argument, NULL, 'j'}};
	struct opts o = {.interval_ms = 1000, .timeout_ms = 5000};
	const struct command *cmd;
	uint64_t ms;
	int c;

	log_init(PROG, LL_WARN);
	for (size_t i = 0; i < ARRAY_SIZE(ctl_opts); i++)
		longs[i + 1] = (struct option){
		    ctl_opts[i].name, ctl_opts[i].metavar ? required_argument : no_argument, NULL,
		    ctl_opts[i].val};
	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0)
		return printf(PROG " %s\n", crun_version_string()) < 0;
	/* The command first: a typo is named as one, not as a missing flag. */
	for (cmd = commands; cmd < commands + ARRAY_SIZE(commands); cmd++)
		if (strcmp(argv[1], cmd->name) == 0)
			break;
	if (cmd == commands + ARRAY_SIZE(commands)) {
		fprintf(stderr, PROG ": unknown command '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	while ((c = getopt_long(argc - 1, argv + 1, "+h", longs, NULL)) != -1) {
		switch (c) {
		case 'e':
			o.endpoint = optarg;
			break;
		case 'j':
			o.rdzv_id = optarg;
			break;
		case 'J':
			o.json = true;
			break;
		case 'T':
			o.token_file = optarg;
			break;
		case 'i':
			if (seconds("--interval", optarg, &o.interval_ms) < 0)
				return 2;
			o.interval_ms = MAX(o.interval_ms, 10); /* a poll, not a busy loop */
			break;
		case 't':
			if (seconds("--timeout", optarg, &ms) < 0 || ms == 0 || ms > UINT32_MAX)
				return 2;
			o.timeout_ms = (uint32_t)ms;
			break;
		case 'c':
			if (parse_u64(optarg, &o.count) < 0) {
				fprintf(stderr, PROG ": --count: invalid number '%s'\n", optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			return 2;
		}
	}
	if (!o.endpoint) {
		fprintf(stderr, PROG ": %s: --endpoint HOST:PORT is required\n", argv[1]);
		return 2;
	}
	return cmd->fn(&o);
}
