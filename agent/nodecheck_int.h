/* nodecheck_int.h: the node check (--node_check) and the retiring of nodes
 * whose workers keep failing (--max_node_failures), agent/nodecheck.c.
 *
 * After a round, before the workers, every node runs crun-nodecheck (a
 * program next to the agent's own, cmd/crun-nodecheck.c): a GEMM, a ring
 * all_reduce between the round's nodes, and an exchange of every node's
 * result (and its failure count) through the round's worker store, so every
 * node reads the same table and comes to the same verdict (nodecheck_decide,
 * pure). A node the verdict excludes leaves the job (exit 2); the others open
 * the next round without it (a spare, if one waits, joins that round).
 */
#ifndef CRUN_AGENT_NODECHECK_INT_H
#define CRUN_AGENT_NODECHECK_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct crun_agent;
struct cJSON;

#define NC_HOST_MAX  256
#define NC_NODES_MAX 4096

enum nc_status { NC_OK, NC_FAILED, NC_MISSING };

/* Why a node is named (bits of nc_row.why). */
enum nc_why {
	NC_WHY_FAILED = 1,   /* its check failed, or it never reported */
	NC_WHY_GFLOPS = 2,   /* GEMM below the threshold of the median */
	NC_WHY_GBPS = 4,     /* all_reduce below the threshold of the median */
	NC_WHY_FAILURES = 8, /* its workers failed max_node_failures times */
};

/* Why a named node stays (nc_row.kept). */
enum nc_kept { NC_KEPT_NO, NC_KEPT_PINNED, NC_KEPT_MIN };

struct nc_row {
	int rank;
	double gflops, gbps;
	int failures;
	bool pinned; /* serves the rendezvous store: leaving would end the job */
	enum nc_status st;
	char host[NC_HOST_MAX];
	unsigned why; /* enum nc_why bits; 0: healthy */
	enum nc_kept kept;
	bool excluded;
};

struct nc_policy {
	int threshold_pct; /* 0: no speed check (failures only) */
	int max_failures;  /* 0: off */
	int min_nodes;	   /* the job's MIN */
};

/* Pure: one "node RANK GFLOPS GBPS FAILURES PINNED STATUS HOST" line of
 * crun-nodecheck's output. 0 or CRUN_EINVAL. */
int nodecheck_parse_line(const char *line, struct nc_row *ret);

/* Pure: marks rows[].why, kept and excluded. A node is named when it failed
 * or went missing, is below threshold_pct of the median GFLOP/s (or GB/s,
 * where measured) of the nodes that passed, or has max_failures failures. A
 * named node is excluded unless it is pinned, and none is when fewer than
 * min_nodes would remain. Returns how many are excluded. *ret_med_gf and
 * *ret_med_bw (may be NULL) receive the medians. */
int nodecheck_decide(struct nc_row *rows, int n, const struct nc_policy *p, double *ret_med_gf,
		     double *ret_med_bw);

/* Pure: "the GEMM at 12.3 GFLOP/s is below 50% of the median 40.0" and the
 * like, for a named row. */
void nodecheck_why_text(const struct nc_row *r, const struct nc_policy *p, double med_gf,
			double med_bw, char *buf, size_t cap);

/* Whether the agent runs the check after each round. */
bool nodecheck_wanted(const struct crun_agent *a);

/* Starts crun-nodecheck for the round just completed; AE_CHECK_DONE fires
 * when it ended. 0 or a negative code (nothing started). */
int nodecheck_start(struct crun_agent *a);
/* During the check: reads what the child wrote so far; when its table is
 * complete, kills and reaps it and returns true (nodecheck_verdict may then
 * be asked), else false (the child runs on). */
bool nodecheck_take_table(struct crun_agent *a);
/* Kills a running check (SIGKILL) and reaps it. No-op when none runs. */
void nodecheck_stop(struct crun_agent *a);

enum nc_verdict {
	NC_START, /* start the workers */
	NC_LEAVE, /* this node is excluded: exit 2, `why` says why */
	NC_AGAIN, /* other nodes are excluded: open the next round without them */
};
/* After AE_CHECK_DONE: logs the table and decides. `why` gets the message. */
enum nc_verdict nodecheck_verdict(struct crun_agent *a, char *why, size_t cap);

/* A worker failure of this node's attempt (counted once per attempt). */
void nodecheck_count_failure(struct crun_agent *a);

/* For the status page: the last table under "node_check" (and this node's
 * failure count); the counters on /metrics. */
void nodecheck_status_json(const struct crun_agent *a, struct cJSON *root);
void nodecheck_metrics(FILE *f, const struct crun_agent *a);

void nodecheck_free(struct crun_agent *a);

#endif /* CRUN_AGENT_NODECHECK_INT_H */
