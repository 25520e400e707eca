/* ctl.h: crunctl's client of the status pages (ctl.c, ctl_usage.c). */
#ifndef CRUN_AGENT_CTL_H
#define CRUN_AGENT_CTL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
/* GET http://endpoint/path within timeout_ms: 0 with the HTTP status and the
 * body (malloc'd, NUL-terminated; free()), CRUN_EINVAL (bad endpoint),
 * CRUN_ERESOLVE (the name does not resolve), CRUN_ECONNREFUSED (nothing
 * listens), CRUN_ETIMEDOUT (no answer in time), CRUN_ECLOSED (closed before
 * a reply), CRUN_EHOSTUNREACH/CRUN_ENETUNREACH, CRUN_ETOOBIG or CRUN_ENOMEM. */
int agent_ctl_get(const char *endpoint, const char *path, uint32_t timeout_ms, int *ret_status,
		  char **ret_body);
/* As agent_ctl_get, a POST with no body and, unless bearer is NULL, an
 * "Authorization: Bearer <bearer>" header (crunctl drop). */
int agent_ctl_post(const char *endpoint, const char *path, const char *bearer, uint32_t timeout_ms,
		   int *ret_status, char **ret_body);
/* prefix then value percent-encoded (RFC 3986 unreserved bytes kept) into
 * buf: 0, or CRUN_ETOOBIG when it does not fit. */
int agent_ctl_query(char *buf, size_t cap, const char *prefix, const char *value);
/* Whether a /status or /jobs JSON body is about job run_id (its run_id, or
 * one of its jobs'). */
bool agent_ctl_serves_job(const char *json, const char *run_id);
/* What crunctl watch follows in a /status body (status.c). */
struct agent_ctl_state {
	int64_t version; /* state changes so far; -1: none on this page (crun-rdzvd) */
	char state[32];	 /* the agent's state; "" on a page without an agent */
	int exit_code;	 /* the agent's exit code once state is "done", else -1 */
};
/* 0, or CRUN_EPROTO when json is not a status page's body. */
int agent_ctl_read_state(const char *json, struct agent_ctl_state *ret);
/* The /status and /jobs JSON as tables; CRUN_EPROTO for something else. */
int agent_ctl_print_status(FILE *out, const char *json);
int agent_ctl_print_jobs(FILE *out, const char *json);
/* The /usage JSON as a table: JOB KEYS KEY_BYTES VALUE_BYTES WAITERS REFUSED
 * (ctl_usage.c); CRUN_EPROTO for something else. */
int agent_ctl_print_usage(FILE *out, const char *json);

#endif /* CRUN_AGENT_CTL_H */
