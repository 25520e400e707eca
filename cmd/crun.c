/* crun: the torchrun-compatible launcher. Parses torchrun's flags into a
 * crun_agent_config_t (agent/cli.c), creates the one event_base and runs a
 * local agent on it. Exit codes as torchrun: 0 success, 1 any failure, 2 bad
 * command line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "common/common.h"

extern char **environ;

/* --event_log_handler=console: one JSON line per agent state change on
 * stderr, in the shape of torchrun's events (name, source, timestamp,
 * metadata); the names are crun's states, not torchrun's event set. */
static void on_state_console(crun_agent_state_t st, int restart_count, void *arg)
{
	static const char *const names[] = {"RENDEZVOUS", "RUNNING", "STOPPING", "BARRIER", "DONE"};
	const struct cli *c = arg;
	struct timeval tv;

	gettimeofday(&tv, NULL);
	fprintf(stderr,
		"{\"name\": \"crun.agent.state.%s\", \"source\": \"AGENT\", \"timestamp\": "
		"%lld, \"metadata\": {\"state\": \"%s\", \"role\": \"%s\", "
		"\"agent_restarts\": %d}}\n",
		names[st < 5 ? st : 4], (long long)tv.tv_sec, names[st < 5 ? st : 4],
		c->cfg.role ? c->cfg.role : "default", restart_count);
}

static int print_text(char *s)
{
	if (!s) {
		fprintf(stderr, "crun: out of memory\n");
		return 1;
	}
	fputs(s, stdout);
	free(s);
	return 0;
}

int main(int argc, char **argv)
{
	struct event_base *base;
	crun_agent_t *agent = NULL;
	struct cli c;
	int code = 1;
	int r;

	log_init("crun", LL_WARN);
	if (cli_parse(&c, argc, argv, environ) < 0) {
		fprintf(stderr,
			"usage: crun [options] training_script [training_script_args ...]\n"
			"crun: error: %s\n",
			c.err);
		cli_free(&c);
		return 2;
	}
	if (c.help || c.version || c.completion) {
		code = 0;
		if (c.help)
			code = print_text(cli_help_new(CLI_CRUN));
		else if (c.completion)
			code = print_text(cli_completion_new(CLI_CRUN, c.completion));
		else
			printf("crun %s (torchrun-compatible)\n", crun_version_string());
		cli_free(&c);
		return code;
	}
	if (c.log_level >= 0) /* --log_level, PET_LOG_LEVEL, CRUN_LOG_LEVEL or LOGLEVEL */
		crun_set_log_level((crun_log_level_t)c.log_level);
	if (c.warn[0])
		log_at(LL_WARN, SUB_CMD, "%s", c.warn);
	if (strcmp(c.event_log_handler, "console") == 0) {
		c.cfg.on_state = on_state_console;
		c.cfg.on_state_arg = &c;
	}
	if (c.note[0]) {
		/* torchrun sets it in its own environment; the workers inherit. */
		setenv("OMP_NUM_THREADS", "1", 1);
		log_at(LL_WARN, SUB_CMD, "%s", c.note);
	}
	base = event_base_new();
	if (!base) {
		fprintf(stderr, "crun: cannot create the event loop\n");
		goto out;
	}
	c.cfg.event_base = base;
	r = crun_agent_new(&c.cfg, &agent);
	if (r < 0) {
		fprintf(stderr, "crun: error: %s\n", crun_strerror(r));
		if (r == CRUN_ECONFIG)
			code = 2; /* bad input (a secret file, a TLS file...), already named */
		goto out_base;
	}
	r = crun_agent_run(agent, &code);
	if (r < 0 && code == 0)
		code = 1;
	crun_agent_free(agent);
out_base:
	event_base_free(base);
out:
	cli_free(&c);
	fflush(stdout);
	return code;
}
