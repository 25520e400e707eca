/* cli_rdzv_int.h: the rendezvous settings text of the command line, JSON
 * config and crun_agent_config_t.rdzv_conf, parsed into the typed settings
 * the rendezvous backends take (cli_rdzv.c). Small on purpose: benchmarks
 * and tests that drive rendezvous clients include it without the agent.
 */
#ifndef CRUN_AGENT_CLI_RDZV_INT_H
#define CRUN_AGENT_CLI_RDZV_INT_H

#include <stddef.h>
#include <stdint.h>

#include "crun/agent.h"

struct c10d_conf;

/* cli_rdzv.c: --rdzv_conf "k=v,..." over the rendezvous key rows
 * (rendezvous/c10d.h), the one parser of rendezvous settings text.
 * Errors go to err ("argument --rdzv_conf: <key>..."), CRUN_EINVAL. */
/* Every row at its default. */
void cli_rdzv_conf_init(struct c10d_conf *c);
/* Sets the keys of text that `backend` ("c10d" or "etcd") reads over *c,
 * then checks the rules between keys; an unknown key is an error. */
int cli_rdzv_conf_set(struct c10d_conf *c, const char *backend, const char *text, char *err,
		      size_t cap);
/* Static and standalone read only the RS_ALL rows (timeout, join_timeout,
 * read_timeout), the last one given into *ret_join_ms (untouched if none);
 * the other keys are listed in unknown ("'a', 'b'") for a warning. */
int cli_rdzv_conf_static(const char *text, uint32_t *ret_join_ms, char *unknown, size_t ucap,
			 char *err, size_t cap);
/* The typed rendezvous settings of a config (its rdzv_conf text, for an
 * elastic backend; for static, the defaults with cfg->join_timeout_ms as
 * join_ms): what crun_agent_new hands down. */
int cli_rdzv_conf_of(const crun_agent_config_t *cfg, struct c10d_conf *ret, char *err, size_t cap);
/* Whether text is a valid --rdzv_conf for `backend` (cli_rdzv_conf_set over
 * the defaults, result dropped); CRUN_ENOTSUP for a backend with no keys. */
int cli_rdzv_conf_check(const char *backend, const char *text, char *err, size_t cap);
/* Earlier names the tests and benchmarks use: cli_rdzv_conf_set over the
 * defaults for "c10d" (into *ret only on success); cli_rdzv_conf_check. */
int c10d_parse_conf(const char *s, struct c10d_conf *ret, char *err, size_t cap);
int rdzv_conf_check(const char *backend, const char *conf, char *err, size_t cap);

#endif /* CRUN_AGENT_CLI_RDZV_INT_H */
