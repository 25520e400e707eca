/* daemon.h: crun-agent as a service: notify, reload, exit codes (daemon.c). */
#ifndef CRUN_AGENT_DAEMON_H
#define CRUN_AGENT_DAEMON_H

#include "agent/cli.h"

struct event_base;
struct crun_agent;
struct agent_daemon;

/* Speaks systemd's notify protocol ($NOTIFY_SOCKET: READY=1 once workers run,
 * STATUS= at every state change, WATCHDOG=1 at half $WATCHDOG_USEC,
 * STOPPING=1 at the end) and reloads the config on SIGHUP (RELOADING=1 ...
 * READY=1; the log level applies live, other changes are named as needing a
 * restart). Takes SIGHUP out of c->cfg.signals_to_handle (it means reload
 * here) and sets c->cfg.on_state. c, argv and env are borrowed for the
 * daemon's life (argv/env are parsed again on reload). */
int agent_daemon_new(struct event_base *base, struct cli *c, int argc, char *const *argv,
		     char *const *env, struct agent_daemon **ret);
/* The agent whose state STATUS= and the status page report (borrowed). */
void agent_daemon_attach(struct agent_daemon *d, struct crun_agent *a);
/* The address the status page bound ("127.0.0.1:8123"), or "" when off. */
const char *agent_daemon_status_addr(const struct agent_daemon *d);
void agent_daemon_free(struct agent_daemon *d); /* sends STOPPING=1; NULL: no-op */
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
