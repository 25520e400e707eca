/* daemon.c: crun-agent's exit status, for systemd to act on, and the check
 * of what would stop it but its parser cannot see. The unit itself
 * (notify, watchdog, status page) is service/unit.c, driven by the agent's
 * public events; the reload is the program's (cmd/crun-agent.c).
 */
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/cli.h"
#include "agent/daemon.h"
#include "agent/env.h"
#include "store/auth.h"
#include "common/common.h"

/* ---- crun-agent's exit status ------------------------------------------------------ */

int agent_daemon_exit_code(int err)
{
	return err == CRUN_ECONFIG || err == CRUN_EADDRINUSE ? 2 : 1;
}

int agent_daemon_stop_signal(const struct crun_agent *a)
{
	/* A signal that arrived while a failure was already being handled
	 * does not turn the failure into a requested stop. */
	if (a->failing || a->stop_reason == STOP_FAILED || a->stop_reason == STOP_PEER_FAILED)
		return 0;
	return a->stop_signal;
}

int agent_daemon_check(const struct cli *c, char *const *env, char *err, size_t cap)
{
	const char *path = c->cfg.auth_secret_file;
	struct store_auth_secret s;
	int r;

	if (!path || !*path)
		path = env_get(env, "CRUN_AUTH_SECRET_FILE");
	if (!path || !*path || !c->cfg.rdzv_backend || strcmp(c->cfg.rdzv_backend, "static") == 0)
		return 0;
	r = store_auth_secret_read(path, &s, err, cap);
	memset(&s, 0, sizeof(s));
	return r < 0 ? CRUN_ECONFIG : 0;
}
