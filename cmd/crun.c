/* crun: the torchrun-compatible launcher. Parses torchrun's flags into a
 * crun_agent_config_t (agent/cli.c), creates the one event_base and runs a
 * local agent on it. Exit codes as torchrun: 0 success, 1 any failure, 2 bad
 * command line.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "common/common.h"

extern char **environ;

/* torchrun's LOGLEVEL (Python logging names) when CRUN_LOG_LEVEL is unset. */
static int level_from_loglevel(const char *v)
{
	static const struct {
		const char *name;
		int level;
	} map[] = {
	    {"CRITICAL", LL_ERROR}, {"FATAL", LL_ERROR}, {"ERROR", LL_ERROR},
	    {"WARNING", LL_WARN},   {"WARN", LL_WARN},	 {"INFO", LL_INFO},
	    {"DEBUG", LL_DEBUG},    {"NOTSET", LL_DEBUG},
	};

	for (size_t i = 0; v && i < sizeof(map) / sizeof(map[0]); i++)
		if (strcasecmp(v, map[i].name) == 0)
			return map[i].level;
	return LL_WARN;
}

int main(int argc, char **argv)
{
	struct event_base *base;
	crun_agent_t *agent = NULL;
	struct cli c;
	int code = 1;
	int r;

	log_init("crun", level_from_loglevel(getenv("LOGLEVEL")));
	/* The program's choices, not the library's (an embedding host keeps
	 * its own): adopt what workers orphan, so the agent reaps it, and
	 * take EPIPE from a vanished peer instead of dying. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		log_at(LL_WARN, SUB_CMD, "PR_SET_CHILD_SUBREAPER: %s, ignoring", strerror(errno));
	signal(SIGPIPE, SIG_IGN);
	if (cli_parse(&c, argc, argv, environ) < 0) {
		fprintf(stderr,
			"usage: crun [options] training_script [training_script_args ...]\n"
			"crun: error: %s\n",
			c.err);
		cli_free(&c);
		return 2;
	}
	if (c.help || c.version) {
		if (c.help)
			fputs(cli_help_text(), stdout);
		else
			printf("crun %s (torchrun-compatible)\n", crun_version_string());
		cli_free(&c);
		return 0;
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
