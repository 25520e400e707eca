/* crun-agent: the node agent of one job as a service (systemd unit
 * configs/systemd/crun-agent@.service). Settings come from crun's option
 * table: --config FILE.json, flags (which win) and the environment. Speaks
 * the notify protocol, re-reads the config on SIGHUP and serves a status
 * page (service/unit.c, fed by the agent's public events as an embedder's
 * host would be; agent/status.c answers what only the agent knows). Exit
 * codes (agent/daemon.c), for systemd to act on
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
#include "agent/event_print.h"
#include "agent/status.h"
#include "agent/timerfile.h"
#include "common/common.h"
#include "service/service.h"

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

/* The program around its agent: the running config, which SIGHUP re-reads
 * (from the same argv and environment), and the unit its events drive. */
struct agent_service {
	struct cli *cli;
	int argc;
	char *const *argv, *const *env;
	struct service_unit *unit;
	int reloads;
};

/* SIGHUP: the log level applies live; other changes are named as needing
 * a restart of the agent. */
static void on_reload(void *arg)
{
	struct agent_service *as = arg;
	char live[256], restart[512];
	struct cli fresh;

	if (cli_parse_prog(&fresh, CLI_AGENT, as->argc, as->argv, as->env) < 0) {
		log_at(LL_ERROR, SUB_AGENT, "reload: %s; keeping the running config", fresh.err);
		service_unit_reloaded(as->unit, fresh.err, NULL, NULL);
		cli_free(&fresh);
		return;
	}
	cli_changes(as->cli, &fresh, live, sizeof(live), restart, sizeof(restart));
	if (fresh.log_level != as->cli->log_level)
		log_set_level(fresh.log_level >= 0 ? fresh.log_level : LL_INFO);
	as->cli->log_level = fresh.log_level;
	as->reloads++;
	/* Applied in full is a normal event; a change that waits for a restart
	 * is something to act on. */
	log_at(restart[0] ? LL_WARN : LL_NOTICE, SUB_AGENT,
	       "reload %d: applied: %s; needs a restart of the agent: %s", as->reloads,
	       live[0] ? live : "nothing", restart[0] ? restart : "nothing");
	service_unit_reloaded(as->unit, NULL, live, restart);
	cli_free(&fresh);
}

/* The agent's events, as an embedder gets them: console lines
 * (--event_log_handler=console), then the unit and its page. */
static void on_event(const crun_agent_event_t *ev, void *arg)
{
	const struct agent_service *as = arg;

	if (ev->type == CRUN_AGENT_EV_STATE && strcmp(as->cli->event_log_handler, "console") == 0)
		agent_event_print(stderr, ev->state, ev->restart_count, as->cli->cfg.role);
	service_unit_on_event(ev, as->unit);
}

/* Under a service manager SIGHUP means "reload", not "forward"; the unit
 * hears the agent's events. */
static int start_unit(struct event_base *base, struct agent_service *as)
{
	struct cli *c = as->cli;
	uint64_t mask = c->cfg.signals_to_handle;

	if (!mask)
		mask = 1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT;
	c->cfg.signals_to_handle = mask & ~(1ull << SIGHUP);
	c->cfg.on_event = on_event;
	c->cfg.on_event_arg = as;
	return service_unit_new(base, as->env, c->config_path ? c->config_path : "crun-agent",
				c->status_listen, on_reload, as, &as->unit);
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
	struct agent_service as = {.argc = argc, .argv = argv, .env = environ};
	struct status_source src;
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
	as.cli = &c;
	r = start_unit(base, &as);
	if (r < 0) {
		fprintf(stderr, "crun-agent: error: %s\n", crun_strerror(r));
		code = agent_daemon_exit_code(r);
		goto out_base;
	}
	r = agent_timers_from_env(base, environ, timer_path, sizeof(timer_path), &timers);
	if (r < 0) {
		fprintf(stderr, "crun-agent: error: TORCHELASTIC_TIMER_FILE: %s\n",
			crun_strerror(r));
		goto out_unit;
	}
	if (timers) /* the workers inherit it, as torchrun's do */
		setenv("TORCHELASTIC_TIMER_FILE", timer_path, 1);
	r = crun_agent_new(&c.cfg, &agent);
	if (r < 0) {
		fprintf(stderr, "crun-agent: error: %s\n", crun_strerror(r));
		code = agent_daemon_exit_code(r);
		goto out_unit;
	}
	agent_status_source(agent, &src);
	service_unit_attach(as.unit, &src);
	agent_timers_attach(timers, agent);
	r = crun_agent_run(agent, &code);
	if (r < 0)
		code = agent_daemon_exit_code(r);
	stop_sig = agent_daemon_stop_signal(agent);
	service_unit_attach(as.unit, NULL);
	agent_timers_attach(timers, NULL);
	crun_agent_free(agent);
out_unit:
	agent_timers_stop(timers);
	service_unit_free(as.unit);
out_base:
	event_base_free(base);
out:
	cli_free(&c);
	fflush(stdout);
	return stop_sig ? die_by(stop_sig) : code;
}
