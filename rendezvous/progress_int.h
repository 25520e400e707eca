/* progress_int.h: the shared progress record behind rdzv_get_progress()
 * (progress.c). The loop side (c10d.c) and every helper job hold a
 * reference, so a job that outlives its backend (helper_drop) still writes
 * into live memory. Every function accepts NULL (no record: nothing to do).
 */
#ifndef CRUN_RENDEZVOUS_PROGRESS_INT_H
#define CRUN_RENDEZVOUS_PROGRESS_INT_H

#include <stdint.h>

#include "rendezvous/rdzv.h"

struct rdzv_prog;

/* NULL on ENOMEM (then the status page shows no round: not fatal). */
struct rdzv_prog *rdzv_prog_new(int min, int max);
struct rdzv_prog *rdzv_prog_ref(struct rdzv_prog *p);
void rdzv_prog_unref(struct rdzv_prog *p);
/* A consistent copy; a NULL p gives round -1. */
void rdzv_prog_copy(struct rdzv_prog *p, struct rdzv_progress *ret);

/* A join starts (round not known yet). */
void rdzv_prog_joining(struct rdzv_prog *p);
/* The join loop's periodic look at round `round`: `joined` tickets, the
 * hosts of the first nhosts of them, ms to the last call (-1: MIN not
 * reached) and to the join timeout. */
void rdzv_prog_waiting(struct rdzv_prog *p, int round, int joined, int64_t last_call_ms,
		       int64_t left_ms, const char (*hosts)[RDZV_HOST_MAX], int nhosts);
void rdzv_prog_abandoned(struct rdzv_prog *p);
/* Round `round` completed with n members; m: the first nlisted of them in
 * group rank order; continuing: members that were in this node's previous
 * round (-1: not known, nodes joined and lost are not counted), prev_n: that
 * round's size (0: none). */
void rdzv_prog_completed(struct rdzv_prog *p, int round, int n, const struct rdzv_progress_node *m,
			 int nlisted, int continuing, int prev_n);

#endif /* CRUN_RENDEZVOUS_PROGRESS_INT_H */
