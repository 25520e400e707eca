/* crun-agent: the node agent of one job as a service (systemd unit
 * configs/systemd/crun-agent@.service). Settings come from crun's option
 * table: --config FILE.json, flags (which win) and the environment. Speaks
 * the notify protocol, re-reads the config on SIGHUP and serves a status
 * page (agent/daemon.c, agent/status.c over service/). Exit codes, for systemd to act on
 * (Restart=on-failure, RestartPreventExitStatus=2): 0 the job succeeded, 1
 * it failed (a restart may help), 2 it can never succeed as configured (bad
 * config or secret, a spent run id, a port taken); an operator's SIGTERM or
 * SIGINT stops the job and the agent dies by that signal: a clean stop.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "agent/cli.h"
#include "agent/daemon.h"
#include "agent/timerfile.h"
#include "common/common.h"

extern char **environ;

static int print_text(char *s)
{
	if (!s) {
		fprintf(stderr, "crun-agent: out of memory\n");
		return 1;
	}
	fputs(s, stdout);
	free(s);
	return 0;
}

/* job.env from the config: the agent copies this process's environment into
 * every worker's. */
static int export_job_env(char **kv)
{
	for (int i = 0; kv && kv[i]; i++) {
		char *eq = strchr(kv[i], '=');

		*eq = '\0';
		if (setenv(kv[i], eq + 1, 1) < 0) {
			*eq = '=';
			return -1;
		}
		*eq = '=';
	}
	return 0;
}

/* A requested stop ends as the signal's own death (a shell sees 128+sig),
 * which systemd counts as clean for SIGTERM and SIGINT; a signal whose
 * default action is a core dump (SIGQUIT) ends as exit 0 instead. */
static int die_by(int sig)
{
	sigset_t one;

	if (sig != SIGTERM && sig != SIGINT)
		return 0;
	fflush(stderr);
	signal(sig, SIG_DFL);
	sigemptyset(&one);
	sigaddset(&one, sig);
	(void)sigprocmask(SIG_UNBLOCK, &one, NULL);
	(void)raise(sig);
	return 128 + sig; /* not reached */
}

int main(int argc, char **argv)
{
	struct agent_daemon *daemon = NULL;
	struct agent_timers *timers = NULL;
	char timer_path[PATH_MAX];
	struct event_base *base;
	crun_agent_t *agent = NULL;
	struct cli c;
	int stop_sig = 0;
	int code = 1;
	int r;

	log_init("crun-agent", LL_INFO);
	if (cli_parse_prog(&c, CLI_AGENT, argc, argv, environ) < 0) {
		fprintf(stderr, "crun-agent: error: %s\n", c.err);
		cli_free(&c);
		return 2;
	}
	if (c.help || c.version || c.completion || c.schema || c.man) {
		code = c.man	      ? print_text(cli_man_new(CLI_AGENT))
		       : c.help	      ? print_text(cli_help_new(CLI_AGENT))
		       : c.completion ? print_text(cli_completion_new(CLI_AGENT, c.completion))
		       : c.schema     ? print_text(cli_schema_new())
				      : printf("crun-agent %s\n", crun_version_string()) < 0;
		cli_free(&c);
		return code;
	}
	/* What the parser cannot see but would stop the agent: also under
	 * --print-config, which must not pass a config that cannot run. */
	r = agent_daemon_check(&c, environ, c.err, sizeof(c.err));
	if (r < 0)
		fprintf(stderr, "crun-agent: error: %s\n", c.err);
	if (r < 0 || c.print_config) {
		code = r < 0 ? 2 : print_text(cli_resolved_json(&c));
		cli_free(&c);
		return code;
	}
	if (c.log_level >= 0)
		log_set_level(c.log_level);
	if (c.warn[0])
		log_at(LL_WARN, SUB_CMD, "%s", c.warn);
	if (c.note[0])
		setenv("OMP_NUM_THREADS", "1", 1);
	if (export_job_env(c.job_env) < 0) {
		fprintf(stderr, "crun-agent: error: cannot set job.env\n");
		cli_free(&c);
		return 2;
	}
	base = event_base_new();
	if (!base) {
		fprintf(stderr, "crun-agent: cannot create the event loop\n");
		goto out;
	}
	c.cfg.event_base = base;
	r = agent_daemon_new(base, &c, argc, argv, environ, &daemon);
	if (r < 0) {
		fprintf(stderr, "crun-agent: error: %s\n", crun_strerror(r));
		code = agent_daemon_exit_code(r);
		goto out_base;
	}
	r = agent_timers_from_env(base, environ, timer_path, sizeof(timer_path), &timers);
	if (r < 0) {
		fprintf(stderr, "crun-agent: error: TORCHELASTIC_TIMER_FILE: %s\n",
			crun_strerror(r));
		goto out_daemon;
	}
	if (timers) /* the workers inherit it, as torchrun's do */
		setenv("TORCHELASTIC_TIMER_FILE", timer_path, 1);
	r = crun_agent_new(&c.cfg, &agent);
	if (r < 0) {
		fprintf(stderr, "crun-agent: error: %s\n", crun_strerror(r));
		code = agent_daemon_exit_code(r);
		goto out_daemon;
	}
	agent_daemon_attach(daemon, agent);
	agent_timers_attach(timers, agent);
	r = crun_agent_run(agent, &code);
	if (r < 0)
		code = agent_daemon_exit_code(r);
	stop_sig = agent_daemon_stop_signal(agent);
	agent_daemon_attach(daemon, NULL);
	agent_timers_attach(timers, NULL);
	crun_agent_free(agent);
out_daemon:
	agent_timers_stop(timers);
	agent_daemon_free(daemon);
out_base:
	event_base_free(base);
out:
	cli_free(&c);
	fflush(stdout);
	return stop_sig ? die_by(stop_sig) : code;
}
