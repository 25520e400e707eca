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

#include "agent/cli.h"
#include "agent/ctl.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "store/auth.h"

#define PROG "crunctl"

struct opts {
	const char *endpoint;
	const char *rdzv_id;
	bool json;
	uint64_t interval_ms;
	uint64_t count; /* watch: stop after this many changes; 0 = until the page goes away */
	uint32_t timeout_ms;
	int64_t rank;		/* stacks: only this global rank; -1 = every one */
	bool all;		/* stacks: every node's ranks (the job board) */
	uint32_t wait_ms;	/* stacks --all/--job: the page's wait (0: its default) */
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
		const char *b = *ret_body ? *ret_body : "";
		/* A plain-text error says what to do (GET /stacks); HTML does not. */
		bool text = b[0] && b[0] != '<';

		fprintf(stderr, PROG ": http://%s%s: HTTP %d%s%.*s\n", o->endpoint, path, status,
			text ? ": " : "", text ? (int)strcspn(b, "\n") : 0, b);
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

/* Every local rank's stack on the page's node, now (GET /stacks); with
 * --all every node's of the agent's job, with --job (crun-rdzvd's page)
 * every node's of that job of its store. */
static int cmd_stacks(const struct opts *o)
{
	char path[600] = "/stacks", *body;
	struct opts waiting = *o; /* the request's timeout covers the page's wait */
	int rc;

	if (o->rdzv_id && (o->all || o->rank >= 0)) {
		fprintf(stderr, PROG ": stacks: --job is for crun-rdzvd's page, without "
				     "--all or --rank\n");
		return 2;
	}
	if (o->rdzv_id && agent_ctl_query(path, sizeof(path), "/stacks?rdzv_id=", o->rdzv_id) < 0) {
		fprintf(stderr, PROG ": --job: the run id is too long\n");
		return 2;
	}
	if (o->wait_ms && !o->all && !o->rdzv_id) {
		fprintf(stderr, PROG ": stacks: --wait is for --all or --job (a gather)\n");
		return 2;
	}
	if (o->all)
		snprintf(path, sizeof(path), "/stacks?all=1");
	else if (o->rank >= 0)
		snprintf(path, sizeof(path), "/stacks?rank=%lld", (long long)o->rank);
	if (o->wait_ms)
		snprintf(path + strlen(path), sizeof(path) - strlen(path), "&wait_ms=%u",
			 o->wait_ms);
	waiting.timeout_ms += o->wait_ms;
	rc = fetch(&waiting, path, &body);
	if (rc)
		return rc;
	fputs(body, stdout);
	free(body);
	return 0;
}

/* Whether a page's state is a job's end: an agent's "done" (with its exit
 * code), crun-rdzvd's "done" (every node passed the exit barrier) or
 * "failed" (the job was closed as failed). */
static bool watch_final(const struct agent_ctl_state *st)
{
	return strcmp(st->state, "done") == 0 || strcmp(st->state, "failed") == 0;
}

/* How a watch that saw `last` ends when the page goes away or says the end:
 * 0 for a job that succeeded (or a page without a job: crun-rdzvd's), 1 for
 * one that failed or vanished before its end, which it names. */
static int watch_end(const struct opts *o, const struct agent_ctl_state *last)
{
	if (strcmp(last->state, "done") == 0 && last->exit_code <= 0)
		return 0; /* -1: crun-rdzvd's view, which has no exit code */
	if (strcmp(last->state, "done") == 0) {
		fprintf(stderr, PROG ": the job failed (exit code %d)\n", last->exit_code);
		return 1;
	}
	if (strcmp(last->state, "failed") == 0) {
		fprintf(stderr, PROG ": the job failed\n");
		return 1;
	}
	if (!last->state[0])
		return 0;
	fprintf(stderr, PROG ": http://%s/status went away while the job was %s\n", o->endpoint,
		last->state);
	return 1;
}

/* The page watch reads: /status, or with --rdzv_id /status?rdzv_id=JOB (one
 * job of crun-rdzvd's store; an agent's page ignores the query), and once
 * the page gave a version, the long poll for the next one. */
static int watch_path(const struct opts *o, const struct agent_ctl_state *st, char *path,
		      size_t cap)
{
	size_t n;

	if (!o->rdzv_id)
		snprintf(path, cap, "/status");
	else if (agent_ctl_query(path, cap, "/status?rdzv_id=", o->rdzv_id) < 0)
		return -1;
	n = strlen(path);
	if (st->version >= 0 &&
	    snprintf(path + n, cap - n, "%cafter=%" PRId64 "&wait_ms=%" PRIu64,
		     o->rdzv_id ? '&' : '?', st->version, o->interval_ms) >= (int)(cap - n))
		return -1;
	return 0;
}

/* Prints /status whenever it changes, until the job's end (its final state;
 * exit 0 only if it succeeded), the page going away or --count changes. A
 * page with a version is long-polled: it answers at the next state change
 * or after the interval, so no state, the end included, is missed. With
 * --rdzv_id, crun-rdzvd's page is watched for that job (its rounds, then
 * done or failed) and an agent's page must serve that job. */
static int cmd_watch(const struct opts *o)
{
	struct agent_ctl_state st = {.version = -1};
	char *last = NULL, path[600];
	uint64_t changes = 0;
	int rc;

	for (;;) {
		char *body;
		int status = 0, r;

		if (watch_path(o, &st, path, sizeof(path)) < 0) {
			fprintf(stderr, PROG ": --rdzv_id: too long\n");
			rc = 2;
			break;
		}
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
			if (r == 0 && status == 404 && o->rdzv_id)
				fprintf(stderr, PROG ": %s does not serve job '%s'\n", o->endpoint,
					o->rdzv_id);
			else
				fprintf(stderr, PROG ": cannot read http://%s/status: %s\n",
					o->endpoint, r < 0 ? crun_strerror(r) : "not 200");
			rc = 1;
			break;
		}
		if (!last && check_job(o, body)) {
			free(body);
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
			if (watch_final(&st)) {
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
		if (st.version < 0)
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
    {"watch", cmd_watch, "print /status again whenever it changes, until the job's end"},
    {"stacks", cmd_stacks,
     "every local rank's stack now (GET /stacks on an agent's page); --all: every node's "
     "of its job; --job J on crun-rdzvd's page: every node's of job J"},
    {"usage", cmd_usage, "which job holds what of crun-rdzvd's store (GET /usage)"},
    {"drop", cmd_drop, "delete one job's keys (--job, --token-file; POST /drop)"},
};

/* Prints what crunctl's rows (service/cli_rows.c) and commands give for
 * kind ("help", "man" or a shell) to f; 0, or 2 for a shell it has no
 * script for. */
static int print_doc(FILE *f, const char *kind)
{
	struct cli_command cmds[ARRAY_SIZE(commands)];
	char *text;

	for (size_t i = 0; i < ARRAY_SIZE(commands); i++)
		cmds[i] = (struct cli_command){commands[i].name, commands[i].help};
	text = cli_doc_new(CLI_CTL, kind, cmds, ARRAY_SIZE(cmds));
	if (!text) {
		fprintf(stderr, PROG ": --print-completion: expected bash, zsh or tcsh, got '%s'\n",
			kind);
		return 2;
	}
	fputs(text, f);
	free(text);
	return 0;
}

static void usage(FILE *f)
{
	(void)print_doc(f, "help");
}

static int seconds(const char *flag, const char *v, uint64_t *ret_ms)
{
	if (parse_seconds_ms(v, ret_ms) < 0) {
		fprintf(stderr, PROG ": %s: invalid number of seconds '%s'\n", flag, v);
		return -1;
	}
	return 0;
}

/* Applies row id's value; -1 to end main with the code in *ret_rc. */
static int apply_opt(struct opts *o, int id, const char *arg, int *ret_rc)
{
	uint64_t ms;

	switch (id) {
	case CLI_CTL_ENDPOINT:
		o->endpoint = arg;
		break;
	case CLI_CTL_RDZV_ID:
	case CLI_CTL_JOB:
		o->rdzv_id = arg;
		break;
	case CLI_CTL_JSON:
		o->json = true;
		break;
	case CLI_CTL_INTERVAL:
		if (seconds("--interval", arg, &o->interval_ms) < 0)
			return *ret_rc = 2, -1;
		o->interval_ms = MAX(o->interval_ms, 10); /* a poll, not a busy loop */
		break;
	case CLI_CTL_TIMEOUT:
		if (seconds("--timeout", arg, &ms) < 0 || ms == 0 || ms > UINT32_MAX)
			return *ret_rc = 2, -1;
		o->timeout_ms = (uint32_t)ms;
		break;
	case CLI_CTL_COUNT:
		if (parse_u64(arg, &o->count) < 0) {
			fprintf(stderr, PROG ": --count: invalid number '%s'\n", arg);
			return *ret_rc = 2, -1;
		}
		break;
	case CLI_CTL_TOKEN_FILE:
		o->token_file = arg;
		break;
	case CLI_CTL_ALL:
		o->all = true;
		break;
	case CLI_CTL_WAIT:
		if (seconds("--wait", arg, &ms) < 0)
			return *ret_rc = 2, -1;
		if (ms == 0 || ms > RDZV_BOARD_GATHER_MAX_MS) {
			fprintf(stderr,
				PROG ": --wait: expected more than 0 and at most %u s, got '%s'\n",
				RDZV_BOARD_GATHER_MAX_MS / 1000, arg);
			return *ret_rc = 2, -1;
		}
		o->wait_ms = (uint32_t)ms;
		break;
	case CLI_CTL_RANK:
		if (parse_i64(arg, &o->rank) < 0 || o->rank < 0) {
			fprintf(stderr, PROG ": --rank: invalid rank '%s'\n", arg);
			return *ret_rc = 2, -1;
		}
		break;
	case CLI_CTL_HELP:
		return *ret_rc = print_doc(stdout, "help"), -1;
	case CLI_CTL_VERSION:
		return *ret_rc = printf(PROG " %s\n", crun_version_string()) < 0, -1;
	case CLI_CTL_PRINT_MAN:
		return *ret_rc = print_doc(stdout, "man"), -1;
	case CLI_CTL_PRINT_COMPLETION:
		return *ret_rc = print_doc(stdout, arg), -1;
	default:
		return *ret_rc = 2, -1;
	}
	return 0;
}

/* Parses the options in argv[from..]: 0, or -1 to end main with *ret_rc. */
static int parse_opts(struct opts *o, int argc, char **argv, int from, int *ret_rc)
{
	struct option *longs;
	char *shorts;
	int c, r = 0;

	if (cli_getopt_new(CLI_CTL, &longs, &shorts) < 0) {
		fprintf(stderr, PROG ": out of memory\n");
		return *ret_rc = 1, -1;
	}
	opterr = 0;
	optind = 1;
	while (r == 0 &&
	       (c = getopt_long(argc - from + 1, argv + from - 1, shorts, longs, NULL)) != -1) {
		const char *flag = argv[from - 1 + optind - 1];

		if (c == ':' || c == '?' || cli_getopt_id(CLI_CTL, c) < 0) {
			fprintf(stderr, PROG ": %s '%s'\n",
				c == ':' ? "missing value for" : "unknown option", flag);
			*ret_rc = 2;
			r = -1;
		} else {
			r = apply_opt(o, cli_getopt_id(CLI_CTL, c), optarg, ret_rc);
		}
	}
	free(longs);
	free(shorts);
	return r;
}

int main(int argc, char **argv)
{
	struct opts o = {.interval_ms = 1000, .timeout_ms = 5000, .rank = -1};
	const struct command *cmd;
	int rc = 0;

	log_init(PROG, LL_WARN);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	/* An action without a command (--help, --version, --print-man). */
	if (argv[1][0] == '-') {
		if (parse_opts(&o, argc, argv, 1, &rc) < 0)
			return rc;
		fprintf(stderr, PROG ": a command is required\n");
		usage(stderr);
		return 2;
	}
	/* The command first: a typo is named as one, not as a missing flag. */
	for (cmd = commands; cmd < commands + ARRAY_SIZE(commands); cmd++)
		if (strcmp(argv[1], cmd->name) == 0)
			break;
	if (cmd == commands + ARRAY_SIZE(commands)) {
		fprintf(stderr, PROG ": unknown command '%s'\n", argv[1]);
		usage(stderr);
		return 2;
	}
	if (parse_opts(&o, argc, argv, 2, &rc) < 0)
		return rc;
	if (!o.endpoint) {
		fprintf(stderr, PROG ": %s: --endpoint HOST:PORT is required\n", argv[1]);
		return 2;
	}
	return cmd->fn(&o);
}
