/* daemon.c: what makes the node agent a service (crun-agent): systemd's
 * notify protocol (common/notify.c) driven by the agent's state changes, the
 * watchdog ping, SIGHUP as "re-read the config", and the status page
 * (status.c). All of it runs on the agent's loop; the agent itself does not
 * know it is a daemon.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "agent/cli.h"
#include "agent/daemon.h"
#include "agent/env.h"
#include "agent/event_print.h"
#include "agent/status.h"
#include "rendezvous/rdzv.h"
#include "store/auth.h"
#include "common/common.h"

struct agent_daemon {
	struct event_base *base; /* borrowed */
	struct cli *cli;	 /* borrowed: the running config */
	int argc;
	char *const *argv, *const *env; /* borrowed, parsed again on SIGHUP */
	struct crun_agent *agent;	/* borrowed, NULL until attached */
	struct service svc;
	struct agent_status *status; /* NULL when --status is off */
	bool ready;
	int reloads;
	crun_agent_state_t last_st; /* what STATUS= said last, for the ticks */
	int last_restarts;
};

static const char *state_name(crun_agent_state_t st)
{
	static const char *const names[] = {"rendezvous", "running", "stopping", "exit barrier",
					    "done"};

	return (unsigned)st < ARRAY_SIZE(names) ? names[st] : "?";
}

/* STATUS= text: what an operator sees in `systemctl status`; while
 * rendezvousing (and once running) the round's line (rdzv_progress_line). */
static void send_status(struct agent_daemon *d, crun_agent_state_t st, int restarts)
{
	struct crun_agent *a = d->agent;
	char where[160] = "", round[1024] = "";
	struct rdzv_progress *p;

	d->last_st = st;
	d->last_restarts = restarts;
	if (d->svc.stopping)
		return;
	if (a && a->rdzv && (st == CRUN_AGENT_RENDEZVOUS || st == CRUN_AGENT_RUNNING) &&
	    (p = malloc(sizeof(*p)))) {
		rdzv_get_progress(a->rdzv, p);
		if ((p->round >= 0 || p->waiting) &&
		    rdzv_progress_line(p, a->run_id, round + 2, sizeof(round) - 2) == 0)
			memcpy(round, "; ", 2);
		free(p);
	}

	if (a && st == CRUN_AGENT_RUNNING && a->rdzv) {
		const struct rdzv_info *ri = rdzv_info(a->rdzv);

		snprintf(where, sizeof(where), ", node %d/%d, world size %d", ri->group_rank,
			 ri->group_world_size, ri->world_size);
	}
	(void)notify_send(d->svc.notify, "STATUS=%s: job '%s' %s%s, %d restart%s%s%s%s",
			  d->cli->config_path ? d->cli->config_path : "crun-agent",
			  a && a->run_id[0] ? a->run_id : "?", state_name(st), where, restarts,
			  restarts == 1 ? "" : "s", round,
			  agent_daemon_status_addr(d)[0] ? ", status on " : "",
			  agent_daemon_status_addr(d));
}

/* Every tick while rendezvousing: the round's progress moves between state
 * changes. */
static void on_tick(void *arg)
{
	struct agent_daemon *d = arg;

	if (d->last_st == CRUN_AGENT_RENDEZVOUS)
		send_status(d, d->last_st, d->last_restarts);
}

static void on_state(crun_agent_state_t st, int restarts, void *arg)
{
	struct agent_daemon *d = arg;

	log_at(LL_INFO, SUB_AGENT, "agent %s (restart %d)", state_name(st), restarts);
	agent_status_on_state(d->status, st);
	if (strcmp(d->cli->event_log_handler, "console") == 0)
		agent_event_print(stderr, st, restarts, d->cli->cfg.role);
	/* READY=1 once workers run: before that the unit is "activating", so a
	 * job that cannot rendezvous never looks started. */
	if (st == CRUN_AGENT_RUNNING && !d->ready) {
		d->ready = true;
		(void)notify_send(d->svc.notify, "READY=1");
	}
	/* "done" first, then STOPPING=1 as the last message. */
	send_status(d, st, restarts);
	if (st == CRUN_AGENT_DONE)
		service_stopping(&d->svc);
}

static void on_reload(void *arg)
{
	struct agent_daemon *d = arg;
	char live[256], restart[512];
	struct cli fresh;

	if (cli_parse_prog(&fresh, CLI_AGENT, d->argc, d->argv, d->env) < 0) {
		log_at(LL_ERROR, SUB_AGENT, "reload: %s; keeping the running config", fresh.err);
		(void)notify_send(d->svc.notify, "READY=1\nSTATUS=reload failed: %s", fresh.err);
		cli_free(&fresh);
		return;
	}
	cli_changes(d->cli, &fresh, live, sizeof(live), restart, sizeof(restart));
	if (fresh.log_level != d->cli->log_level)
		log_set_level(fresh.log_level >= 0 ? fresh.log_level : LL_INFO);
	d->cli->log_level = fresh.log_level;
	d->reloads++;
	/* Applied in full is a normal event; a change that waits for a restart
	 * is something to act on. */
	log_at(restart[0] ? LL_WARN : LL_NOTICE, SUB_AGENT,
	       "reload %d: applied: %s; needs a restart of the agent: %s", d->reloads,
	       live[0] ? live : "nothing", restart[0] ? restart : "nothing");
	(void)notify_send(d->svc.notify,
			  "READY=1\nSTATUS=reloaded: applied %s; needs a restart: %s",
			  live[0] ? live : "nothing", restart[0] ? restart : "nothing");
	cli_free(&fresh);
}

int agent_daemon_new(struct event_base *base, struct cli *c, int argc, char *const *argv,
		     char *const *env, struct agent_daemon **ret)
{
	struct agent_daemon *d = calloc(1, sizeof(*d));
	uint64_t mask = c->cfg.signals_to_handle;
	int r;

	if (!d)
		return CRUN_ENOMEM;
	d->base = base;
	d->cli = c;
	d->argc = argc;
	d->argv = argv;
	d->env = env;
	/* Under a service manager SIGHUP means "reload", not "forward". */
	if (!mask)
		mask = 1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT;
	c->cfg.signals_to_handle = mask & ~(1ull << SIGHUP);
	c->cfg.on_state = on_state;
	c->cfg.on_state_arg = d;
	r = service_start(&d->svc, base, env, on_reload, on_tick, d);
	if (r < 0)
		goto fail;
	if (c->status_listen) {
		r = agent_status_start(base, c->status_listen, &d->status);
		if (r < 0)
			goto fail;
	}
	*ret = d;
	return 0;
fail:
	agent_daemon_free(d);
	return r;
}

void agent_daemon_attach(struct agent_daemon *d, struct crun_agent *a)
{
	d->agent = a;
	agent_status_attach(d->status, a);
	send_status(d, CRUN_AGENT_RENDEZVOUS, 0);
}

const char *agent_daemon_status_addr(const struct agent_daemon *d)
{
	return d->status ? agent_status_addr(d->status) : "";
}

void agent_daemon_free(struct agent_daemon *d)
{
	if (!d)
		return;
	agent_status_stop(d->status);
	service_stop(&d->svc);
	free(d);
}

/* ---- crun-agent's exit status ------------------------------------------------------ */

int agent_daemon_exit_code(int err)
{
	return err == CRUN_ECONFIG || err == CRUN_EADDRINUSE ? 2 : 1;
}

int agent_daemon_stop_signal(const struct crun_agent *a)
{
	/* A signal that arrived while a failure was already being handled
	 * does not turn the failure into a requested stop. */
	if (a->failing || a->stop_reason == STOP_FAILED || a->stop_reason == STOP_PEER_FAILED)
		return 0;
	return a->stop_signal;
}

int agent_daemon_check(const struct cli *c, char *const *env, char *err, size_t cap)
{
	const char *path = c->cfg.auth_secret_file;
	struct store_auth_secret s;
	int r;

	if (!path || !*path)
		path = env_get(env, "CRUN_AUTH_SECRET_FILE");
	if (!path || !*path || !c->cfg.rdzv_backend || strcmp(c->cfg.rdzv_backend, "static") == 0)
		return 0;
	r = store_auth_secret_read(path, &s, err, cap);
	memset(&s, 0, sizeof(s));
	return r < 0 ? CRUN_ECONFIG : 0;
}
