/* signals.c: signal names, both ways: "SIGTERM" for a number (the agent's
 * log lines, failure reports, TORCHELASTIC_SIGNALS_TO_HANDLE) and the mask of
 * a --signals_to_handle list. A leaf (it calls nothing in agent/): the
 * option parser, the failure reports and the orphan sweep name signals
 * without depending on supervise.c, which keeps them out of the agent's
 * call loop (issue 24).
 */
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "agent/workers.h"
#include "common/common.h"

static const struct {
	int sig;
	const char *name;
} sig_names[] = {
    {SIGHUP, "SIGHUP"},	  {SIGINT, "SIGINT"},	{SIGQUIT, "SIGQUIT"},	  {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},	  {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"},	  {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},	  {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},	  {SIGXCPU, "SIGXCPU"},
    {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},	{SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"},
};

const char *supervise_signame(int sig)
{
	for (size_t i = 0; i < ARRAY_SIZE(sig_names); i++)
		if (sig_names[i].sig == sig)
			return sig_names[i].name;
	return "SIG?";
}

int supervise_parse_signals(const char *list, uint64_t *ret_mask)
{
	uint64_t mask = 0;
	const char *p = list;

	if (!list)
		return CRUN_EINVAL;
	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char name[32];
		int sig = 0;
		uint64_t num;

		while (len && *p == ' ') {
			p++;
			len--;
		}
		while (len && p[len - 1] == ' ')
			len--;
		if (len == 0 || len >= sizeof(name))
			return CRUN_EINVAL;
		memcpy(name, p, len);
		name[len] = '\0';
		if (parse_uint_range(name, 1, 31, &num) == 0) {
			sig = (int)num;
		} else {
			for (size_t i = 0; i < ARRAY_SIZE(sig_names); i++)
				if (strcmp(sig_names[i].name, name) == 0 ||
				    strcmp(sig_names[i].name + 3, name) == 0)
					sig = sig_names[i].sig;
		}
		/* CHLD drives the reaper; KILL and STOP cannot be caught. */
		if (!sig || sig == SIGCHLD || sig == SIGKILL || sig == SIGSTOP)
			return CRUN_EINVAL;
		mask |= 1ull << sig;
		if (!end)
			break;
		p = end + 1;
	}
	if (!mask)
		return CRUN_EINVAL;
	*ret_mask = mask;
	return 0;
}
