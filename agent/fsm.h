/* fsm.h: the agent's state machine: states, events, the transition table and the restart policy
 * (fsm.c, fsm_names.c). */
#ifndef CRUN_AGENT_FSM_H
#define CRUN_AGENT_FSM_H

#include <stddef.h>

#include "crun/agent.h"

struct crun_agent;

/* AS_CHECKING: the node check between a round and its workers (nodecheck.c). */
enum agent_state {
	AS_INIT,
	AS_RENDEZVOUS,
	AS_RUNNING,
	AS_STOPPING,
	AS_BARRIER,
	AS_DONE,
	AS_CHECKING,
	AS__MAX
};
enum agent_event {
	AE_START,	  /* crun_agent_run() began */
	AE_RDZV_COMPLETE, /* round result available */
	AE_RDZV_FAILED,
	AE_WORKER_EXIT,	  /* one or more workers were reaped */
	AE_PEER_CHANGED,  /* membership changed (c10d) */
	AE_TERM_SIGNAL,	  /* operator signal or crun_agent_stop() */
	AE_GRACE_EXPIRED, /* shutdown timeout passed */
	AE_BARRIER_DONE,
	AE_SPARE_DONE,	   /* c10d: the job ended while this node waited as a spare */
	AE_FAILURE_WINDOW, /* monitor_interval_ms passed since the first failure */
	AE_CHECK_DONE,	   /* the node check ended (nodecheck.c) */
	AE__MAX,
};

/* Why the workers are being stopped; decides what follows AS_STOPPING. */
enum stop_reason { STOP_NONE, STOP_RESTART, STOP_FAILED, STOP_SIGNAL, STOP_PEER, STOP_PEER_FAILED };

struct crun_agent;

typedef enum agent_state (*agent_action)(struct crun_agent *a);

/* The transition table; a NULL cell means the event is ignored there.
 * Exposed for unit tests of the table. */
extern const agent_action agent_fsm[AS__MAX][AE__MAX];
crun_agent_state_t agent_public_state(enum agent_state s); /* the API's name for s */
/* "running", "worker-exit": log lines, the status page (fsm_names.c, a leaf) */
const char *agent_state_name(enum agent_state s);
const char *agent_event_name(enum agent_event e);
void agent_fire(struct crun_agent *a, enum agent_event ev);

/* The restart policy as a pure function (unit-tested): what to do after a
 * worker exit given the failures of this attempt and the workers still up. */
enum agent_decision { DECIDE_WAIT, DECIDE_SUCCESS, DECIDE_RESTART, DECIDE_FAIL };
enum agent_decision agent_decide(int nfailed, int nrunning, int restart_count, int max_restarts);
enum agent_state agent_after_stop(struct crun_agent *a);

/* agent.c, used by the actions: */
/* The worker store admits this round's nodes (and loopback) only; the node
 * check reaches it before the workers do. */
void agent_allow_round_peers(struct crun_agent *a);
int agent_start_attempt(struct crun_agent *a); /* spawn every worker of the attempt */
void agent_end_attempt(struct crun_agent *a);  /* close logs, drop failure records */
/* Records the new failures of reaped workers (failures.h; which exits count
 * is the restart policy); returns the count of the attempt. */
int agent_collect_failures(struct crun_agent *a);
void agent_report_failure(struct crun_agent *a); /* root-cause summary on stderr */
/* One line naming the root cause's node, rank and exit code ("" if none). */
void agent_root_cause_line(struct crun_agent *a, char *buf, size_t cap);

#endif /* CRUN_AGENT_FSM_H */
