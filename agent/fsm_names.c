/* fsm_names.c: the names of the state table's states and events, for log
 * lines, the status page and the unit tests. A leaf apart from fsm.c (it
 * calls nothing): the status page names the state without calling into the
 * state table, which kept status.c in the agent's call loop (issue 24).
 */
#include "agent/fsm.h"

static const char *const state_names[AS__MAX] = {
    [AS_INIT] = "init",		  [AS_RENDEZVOUS] = "rendezvous", [AS_RUNNING] = "running",
    [AS_STOPPING] = "stopping",	  [AS_BARRIER] = "barrier",	  [AS_DONE] = "done",
    [AS_CHECKING] = "node-check",
};
static const char *const event_names[AE__MAX] = {
    [AE_START] = "start",
    [AE_RDZV_COMPLETE] = "rdzv-complete",
    [AE_RDZV_FAILED] = "rdzv-failed",
    [AE_WORKER_EXIT] = "worker-exit",
    [AE_PEER_CHANGED] = "peer-changed",
    [AE_TERM_SIGNAL] = "term-signal",
    [AE_GRACE_EXPIRED] = "grace-expired",
    [AE_BARRIER_DONE] = "barrier-done",
    [AE_SPARE_DONE] = "spare-done",
    [AE_FAILURE_WINDOW] = "failure-window",
    [AE_CHECK_DONE] = "check-done",
};

const char *agent_state_name(enum agent_state s)
{
	return (unsigned)s < AS__MAX ? state_names[s] : "?";
}

const char *agent_event_name(enum agent_event e)
{
	return (unsigned)e < AE__MAX ? event_names[e] : "?";
}
