/* daemon.h: crun-agent's exit status and its pre-flight check (daemon.c). */
#ifndef CRUN_AGENT_DAEMON_H
#define CRUN_AGENT_DAEMON_H

#include "agent/cli.h"

struct crun_agent;

/* crun-agent's exit status for an error `err` (< 0) that ended it: 2 when
 * retrying cannot help (CRUN_ECONFIG: config, secret, a spent run id;
 * CRUN_EADDRINUSE: a port taken), else 1. The units' RestartPreventExitStatus=2. */
int agent_daemon_exit_code(int err);
/* After crun_agent_run(): the signal that stopped the agent because an
 * operator asked (SIGTERM, SIGINT, ...: not a job that failed meanwhile),
 * or 0. crun-agent dies by it, which systemd counts as a clean stop. */
int agent_daemon_stop_signal(const struct crun_agent *a);
/* What crun_agent_new() would refuse but the parser cannot see: the secret
 * file (--auth_secret_file, security.secret_file, CRUN_AUTH_SECRET_FILE) of a
 * c10d or etcd rendezvous is readable and private. 0, or CRUN_ECONFIG with
 * err; for --print-config, which must not say yes to a config that cannot run. */
int agent_daemon_check(const struct cli *c, char *const *env, char *err, size_t cap);

#endif /* CRUN_AGENT_DAEMON_H */
