/* static_int.h: what the loop glue of the static backend (static.c) and its
 * blocking job bodies (static_jobs.c) share: one helper job's input and
 * results, and the bodies that run on a helper thread. */
#ifndef CRUN_RENDEZVOUS_STATIC_INT_H
#define CRUN_RENDEZVOUS_STATIC_INT_H

#include <stdint.h>

#include "crun/store.h"
#include "rendezvous/helper_int.h"
#include "rendezvous/rdzv.h"

#define RESTART_POLL_MS 500 /* the monitor's longest wait between stop checks */

enum job_kind { JOB_JOIN, JOB_BARRIER, JOB_RESTART, JOB_GO, JOB_FAIL, JOB_MONITOR };

/* One helper job (helper_int.h): rdzv_free() never waits for a thread
 * blocked in the store client. */
struct rdzv_job {
	struct helper_job h; /* first */
	enum job_kind kind;
	char host[RDZV_HOST_MAX];
	uint16_t port;
	char run_id[256];
	int node_rank, nnodes, nproc;
	uint32_t join_timeout_ms, barrier_timeout_ms;
	int attempt;   /* the attempt running (RESTART: the one that ended) */
	char why[512]; /* FAIL: root cause, "" when a peer failed the job */
	/* results, read by the loop only after the post */
	int *nprocs;
	enum rdzv_change change; /* MONITOR */
	char err[512];
};

/* Fills j->err with "what: error[ - detail]" and returns r. */
int static_job_fail(struct rdzv_job *j, crun_store_t *s, int r, const char *what);
/* "crun/rdzv/<what>/<v>" */
int static_key(char *buf, size_t cap, const char *what, int v);
/* The bodies, one per job kind but JOB_GO..JOB_MONITOR (static.c's file
 * comment says what each does). */
int static_job_join(struct rdzv_job *j, crun_store_t *s);
int static_job_barrier(struct rdzv_job *j, crun_store_t *s);
int static_job_restart(struct rdzv_job *j, crun_store_t *s);
int static_job_go(struct rdzv_job *j, crun_store_t *s);
int static_job_fail_all(struct rdzv_job *j, crun_store_t *s);
int static_job_monitor(struct rdzv_job *j, crun_store_t *s);

#endif /* CRUN_RENDEZVOUS_STATIC_INT_H */
