/* crun: the torchrun-compatible launcher. Parses torchrun's flags into a
 * crun_agent_config_t (agent/cli.c), creates the one event_base and runs a
 * local agent on it. Exit codes as torchrun: 0 success, 1 any failure, 2 bad
 * command line.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include <event2/event.h>

#include "agent/cli.h"
#include "agent/event_print.h"
#include "agent/status.h"
#include "agent/timerfile.h"
#include "common/common.h"
#include "service/service.h"

extern char **environ;

/* tests/helpers/embed_crun.c compiles this file again with these two
 * replaced, to run the same command line through the embedding API (poll
 * mode and a spawn hook); crun itself runs the agent blocking. */
#ifndef CRUN_CONFIGURE_AGENT
#define CRUN_CONFIGURE_AGENT(cfg) ((void)(cfg))
#endif
#ifndef CRUN_RUN_AGENT
#define CRUN_RUN_AGENT(agent, cfg, code) crun_agent_run((agent), (code))
#endif

/* crun subscribes to its agent's events as any embedder of libcrun would
 * (crun_agent_config_t.on_event): --event_log_handler=console's lines at
 * each state change, and everything to the status page. */
struct on_event_ctx {
	const struct cli *c;
	struct status_page *page;
};

static void on_event(const crun_agent_event_t *ev, void *arg)
{
	const struct on_event_ctx *x = arg;

	if (ev->type == CRUN_AGENT_EV_STATE && strcmp(x->c->event_log_handler, "console") == 0)
		agent_event_print(stderr, ev->state, ev->restart_count, x->c->cfg.role);
	if (x->page)
		status_page_on_event(ev, x->page);
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

/* --man, --help, --print-completion or --version: what crun prints about
 * itself instead of running. */
static int print_about(const struct cli *c)
{
	if (c->man)
		return print_text(cli_man_new(CLI_CRUN));
	if (c->help)
		return print_text(cli_help_new(CLI_CRUN));
	if (c->completion)
		return print_text(cli_completion_new(CLI_CRUN, c->completion));
	printf("crun %s (torchrun-compatible)\n", crun_version_string());
	return 0;
}

int main(int argc, char **argv)
{
	struct event_base *base;
	struct status_page *status = NULL;
	struct status_source src;
	struct agent_timers *timers = NULL;
	char timer_path[PATH_MAX];
	crun_agent_t *agent = NULL;
	struct cli c;
	struct on_event_ctx event_ctx = {.c = &c};
	int code = 1;
	int r;

	/* NOTICE: normal events (a round complete) show, as they always did. */
	log_init("crun", LL_NOTICE);
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
	if (c.help || c.version || c.completion || c.man) {
		code = print_about(&c);
		cli_free(&c);
		return code;
	}
	if (c.log_level >= 0) /* --log_level, PET_LOG_LEVEL, CRUN_LOG_LEVEL or LOGLEVEL */
		log_set_level(c.log_level);
	if (c.warn[0])
		log_at(LL_WARN, SUB_CMD, "%s", c.warn);
	c.cfg.on_event = on_event;
	c.cfg.on_event_arg = &event_ctx;
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
	r = agent_timers_from_env(base, environ, timer_path, sizeof(timer_path), &timers);
	if (r < 0) {
		fprintf(stderr, "crun: error: TORCHELASTIC_TIMER_FILE: %s\n", crun_strerror(r));
		goto out_base;
	}
	if (timers) /* the workers inherit it, as torchrun's do */
		setenv("TORCHELASTIC_TIMER_FILE", timer_path, 1);
	if (c.status_listen) {
		r = status_page_start(base, c.status_listen, &status);
		if (r < 0) {
			fprintf(stderr, "crun: error: --status %s: %s\n", c.status_listen,
				crun_strerror(r));
			goto out_base;
		}
		fprintf(stderr, "crun: status page on http://%s/status\n",
			status_page_addr(status));
	}
	CRUN_CONFIGURE_AGENT(&c.cfg);
	r = crun_agent_new(&c.cfg, &agent);
	if (r < 0) {
		fprintf(stderr, "crun: error: %s\n", crun_strerror(r));
		if (r == CRUN_ECONFIG)
			code = 2; /* bad input (a secret file, a TLS file...), already named */
		goto out_base;
	}
	agent_status_source(agent, &src);
	status_page_attach(status, &src);
	event_ctx.page = status;
	agent_timers_attach(timers, agent);
	r = CRUN_RUN_AGENT(agent, &c.cfg, &code);
	if (r < 0 && code == 0)
		code = 1;
	status_page_attach(status, NULL);
	agent_timers_attach(timers, NULL);
	crun_agent_free(agent);
out_base:
	status_page_stop(status);
	agent_timers_stop(timers);
	event_base_free(base);
out:
	cli_free(&c);
	fflush(stdout);
	return code;
}
