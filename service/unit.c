/* unit.c: a node agent as a systemd unit (crun-agent). It subscribes to
 * the agent's public events (crun_agent_event_t, as an embedder of libcrun
 * would through on_event) and speaks the notify protocol from them: READY=1
 * once the workers run, STATUS= at every state change and, while a round
 * forms, at every tick, STOPPING=1 at the end. It serves the status page
 * and passes the events on to it. SIGHUP is the owner's: it re-reads its
 * config and reports with service_unit_reloaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "service/service.h"

struct service_unit {
	struct service svc;
	struct status_page *page; /* NULL when the page is off */
	struct status_job *job;	  /* what the events said: the round */
	struct status_source src; /* the job's, meaningful while has_src */
	bool has_src;
	char label[256];	   /* what STATUS= names the unit by */
	void (*reload)(void *arg); /* the owner's, on SIGHUP */
	void *reload_arg;
	bool ready;
	crun_agent_state_t last_st; /* what STATUS= said last, for the ticks */
	int last_restarts;
};

static const char *state_name(crun_agent_state_t st)
{
	static const char *const names[] = {"rendezvous", "running", "stopping", "exit barrier",
					    "done"};

	return (unsigned)st < ARRAY_SIZE(names) ? names[st] : "?";
}

/* "; <the round's line>" while a round forms or runs (rdzv_progress_line),
 * or "". */
static void round_line(const struct service_unit *u, crun_agent_state_t st, char *buf, size_t cap)
{
	struct rdzv *r = u->has_src ? u->src.rdzv(u->src.arg) : NULL;
	struct rdzv_progress *p;

	buf[0] = '\0';
	if (!r || (st != CRUN_AGENT_RENDEZVOUS && st != CRUN_AGENT_RUNNING) ||
	    !(p = malloc(sizeof(*p))))
		return;
	rdzv_get_progress(r, p);
	if ((p->round >= 0 || p->waiting) &&
	    rdzv_progress_line(p, u->src.run_id(u->src.arg), buf + 2, cap - 2) == 0)
		memcpy(buf, "; ", 2);
	free(p);
}

/* STATUS= text: what an operator sees in `systemctl status`. */
static void send_status(struct service_unit *u, crun_agent_state_t st, int restarts)
{
	char where[160] = "", round[1024];
	const char *run_id = u->has_src ? u->src.run_id(u->src.arg) : "";
	const char *addr = service_unit_status_addr(u);
	int group_rank, group_world_size, world_size;

	u->last_st = st;
	u->last_restarts = restarts;
	if (u->svc.stopping)
		return;
	round_line(u, st, round, sizeof(round));
	if (st == CRUN_AGENT_RUNNING &&
	    status_job_round(u->job, &group_rank, &group_world_size, &world_size))
		snprintf(where, sizeof(where), ", node %d/%d, world size %d", group_rank,
			 group_world_size, world_size);
	(void)notify_send(u->svc.notify, "STATUS=%s: job '%s' %s%s, %d restart%s%s%s%s", u->label,
			  run_id[0] ? run_id : "?", state_name(st), where, restarts,
			  restarts == 1 ? "" : "s", round, addr[0] ? ", status on " : "", addr);
}

/* Every tick while rendezvousing: the round's progress moves between state
 * changes. */
static void on_tick(void *arg)
{
	struct service_unit *u = arg;

	if (u->last_st == CRUN_AGENT_RENDEZVOUS)
		send_status(u, u->last_st, u->last_restarts);
}

static void on_sighup(void *arg)
{
	struct service_unit *u = arg;

	u->reload(u->reload_arg); /* ends with service_unit_reloaded */
}

void service_unit_on_event(const crun_agent_event_t *ev, void *unit)
{
	struct service_unit *u = unit;

	status_job_apply(u->job, ev);
	if (u->page)
		status_page_on_event(ev, u->page);
	if (ev->type != CRUN_AGENT_EV_STATE)
		return;
	log_at(LL_INFO, SUB_AGENT, "agent %s (restart %d)", state_name(ev->state),
	       ev->restart_count);
	/* READY=1 once workers run: before that the unit is "activating", so a
	 * job that cannot rendezvous never looks started. */
	if (ev->state == CRUN_AGENT_RUNNING && !u->ready) {
		u->ready = true;
		(void)notify_send(u->svc.notify, "READY=1");
	}
	/* "done" first, then STOPPING=1 as the last message. */
	send_status(u, ev->state, ev->restart_count);
	if (ev->state == CRUN_AGENT_DONE)
		service_stopping(&u->svc);
}

void service_unit_reloaded(struct service_unit *u, const char *err, const char *live,
			   const char *restart)
{
	if (err)
		(void)notify_send(u->svc.notify, "READY=1\nSTATUS=reload failed: %s", err);
	else
		(void)notify_send(u->svc.notify,
				  "READY=1\nSTATUS=reloaded: applied %s; needs a restart: %s",
				  live[0] ? live : "nothing", restart[0] ? restart : "nothing");
}

int service_unit_new(struct event_base *base, char *const *env, const char *label,
		     const char *status_listen, void (*on_reload)(void *arg), void *arg,
		     struct service_unit **ret)
{
	struct service_unit *u = calloc(1, sizeof(*u));
	int r;

	if (!u)
		return CRUN_ENOMEM;
	snprintf(u->label, sizeof(u->label), "%s", label);
	u->reload = on_reload;
	u->reload_arg = arg;
	r = status_job_new(&u->job);
	if (r < 0)
		goto fail;
	r = service_start(&u->svc, base, env, on_sighup, on_tick, u);
	if (r < 0)
		goto fail;
	if (status_listen) {
		r = status_page_start(base, status_listen, &u->page);
		if (r < 0)
			goto fail;
	}
	*ret = u;
	return 0;
fail:
	service_unit_free(u);
	return r;
}

void service_unit_attach(struct service_unit *u, const struct status_source *src)
{
	u->has_src = src != NULL;
	if (src)
		u->src = *src;
	status_page_attach(u->page, src);
	send_status(u, CRUN_AGENT_RENDEZVOUS, 0);
}

const char *service_unit_status_addr(const struct service_unit *u)
{
	return u->page ? status_page_addr(u->page) : "";
}

void service_unit_free(struct service_unit *u)
{
	if (!u)
		return;
	status_page_stop(u->page);
	service_stop(&u->svc);
	status_job_free(u->job);
	free(u);
}
