/* stacks.c: each worker's stack before crun stops it, on demand (GET
 * /stacks) and on a hang (hang.c). See stacks_int.h for the tools and why
 * no signal is sent. The capture blocks the loop for at most
 * STACKS_DEADLINE_MS: it runs only when the workers are about to be stopped
 * anyway (a restart waits for their exit just after), on a hang, or on an
 * operator's rate-limited request.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/stacks_int.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"

/* ---- capture ---------------------------------------------------------------- */

struct probe {
	struct worker *w;
	char path[PATH_MAX];
	pid_t tool; /* 0: none started or already reaped */
	bool ok;    /* the tool exited 0 */
};

static bool is_python(pid_t pid)
{
	char link[64], exe[PATH_MAX];
	const char *base;
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/%d/exe", (int)pid);
	n = readlink(link, exe, sizeof(exe) - 1);
	if (n <= 0)
		return false;
	exe[n] = '\0';
	base = strrchr(exe, '/');
	return strstr(base ? base + 1 : exe, "python") != NULL;
}

/* Starts the best tool for p's worker writing into p->path. */
static int start_tool(struct crun_agent *a, struct probe *p, const char *pyspy, const char *gdb)
{
	char pid[16];
	char *py_argv[] = {(char *)"py-spy", (char *)"dump", (char *)"--pid", pid, NULL};
	char *gdb_argv[] = {(char *)"gdb",
			    (char *)"-nx",
			    (char *)"-batch",
			    (char *)"-p",
			    pid,
			    (char *)"-ex",
			    (char *)"thread apply all bt",
			    NULL};
	struct spawn_req req = {.deathsig = SIGKILL};
	int fd, r;

	snprintf(pid, sizeof(pid), "%d", (int)p->w->pid);
	if (pyspy && is_python(p->w->pid)) {
		req.path = pyspy;
		req.argv = py_argv;
	} else if (gdb) {
		req.path = gdb;
		req.argv = gdb_argv;
	} else {
		return CRUN_ENOENT;
	}
	fd = open(p->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	req.envp = a->envp_base;
	req.stdout_fd = req.stderr_fd = fd;
	r = spawn_worker(&req, &a->orig_mask, &p->tool);
	fd_close(fd);
	return r;
}

/* Waits for every tool until the deadline, then kills what is left. */
static void wait_tools(struct probe *p, int n, uint64_t deadline_ms)
{
	const struct timespec step = {0, 5 * 1000 * 1000};
	int left = n;

	for (int i = 0; i < n; i++)
		left -= p[i].tool == 0;
	while (left > 0 && clock_now_ms() < deadline_ms) {
		for (int i = 0; i < n; i++) {
			int st;

			if (p[i].tool == 0 || waitpid(p[i].tool, &st, WNOHANG) != p[i].tool)
				continue;
			p[i].ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
			p[i].tool = 0;
			left--;
		}
		if (left > 0)
			(void)nanosleep(&step, NULL);
	}
	for (int i = 0; i < n; i++) {
		if (p[i].tool == 0)
			continue;
		(void)kill(-p[i].tool, SIGKILL);
		while (waitpid(p[i].tool, NULL, 0) < 0 && errno == EINTR)
			;
		p[i].tool = 0;
		/* A tracer killed mid-attach can leave its SIGSTOP pending in the
		 * worker: a worker that goes on running must not stay stopped. */
		(void)kill(p[i].w->pid, SIGCONT);
	}
}

/* The /proc view of every thread: always there, even for a process no tool
 * could attach to (or one a tool was too slow for). */
static void proc_fallback(const struct probe *p)
{
	char dir[64], file[PATH_MAX], buf[256];
	struct dirent *de;
	DIR *d;
	FILE *out = fopen(p->path, "ae");
	int threads = 0;

	if (!out)
		return;
	fprintf(out, "--- /proc/%d (each thread's kernel wait; no tool gave frames)\n",
		(int)p->w->pid);
	snprintf(dir, sizeof(dir), "/proc/%d/task", (int)p->w->pid);
	d = opendir(dir);
	while (d && (de = readdir(d)) && threads < 256) {
		ssize_t len;
		int fd;

		if (de->d_name[0] == '.')
			continue;
		threads++;
		fprintf(out, "thread %s\n", de->d_name);
		snprintf(file, sizeof(file), "%s/%s/wchan", dir, de->d_name);
		fd = open(file, O_RDONLY | O_CLOEXEC);
		len = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
		if (fd >= 0)
			fd_close(fd);
		buf[len > 0 ? len : 0] = '\0';
		fprintf(out, "wchan: %s\n", buf[0] && strcmp(buf, "0") ? buf : "running");
	}
	if (d)
		closedir(d);
	fclose(out);
}

char *stacks_read_text(const char *path)
{
	char *buf = malloc(STACKS_FILE_MAX + 1);
	ssize_t n;
	int fd;

	if (!buf)
		return NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, STACKS_FILE_MAX) : -1;
	if (fd >= 0)
		fd_close(fd);
	buf[n > 0 ? n : 0] = '\0';
	return buf;
}

int stacks_ensure(struct crun_agent *a)
{
	if (!a->stk)
		a->stk = calloc(1, sizeof(*a->stk));
	return a->stk ? 0 : CRUN_ENOMEM;
}

/* The capture's deadline: STACKS_DEADLINE_MS, which keeps a restart under a
 * second, or CRUN_STACKS_DEADLINE_MS (1..60000) where the tools' frames
 * matter more than a fast restart - a loaded host, and the tests: three gdb
 * attaches missed 800 ms beside a second full test run. */
static uint64_t capture_deadline_ms(void)
{
	const char *v = getenv("CRUN_STACKS_DEADLINE_MS");
	char *end = NULL;
	unsigned long ms;

	if (!v || !*v)
		return STACKS_DEADLINE_MS;
	errno = 0;
	ms = strtoul(v, &end, 10);
	if (errno || *end || ms < 1 || ms > 60000) {
		log_at(LL_WARN, SUB_AGENT,
		       "CRUN_STACKS_DEADLINE_MS=%.40s is not 1..60000 ms; using %u ms", v,
		       STACKS_DEADLINE_MS);
		return STACKS_DEADLINE_MS;
	}
	return ms;
}

int stacks_capture(struct crun_agent *a)
{
	struct probe p[CRUN_AGENT_MAX_LOCAL];
	char *pyspy = spawn_resolve("py-spy"), *gdb = spawn_resolve("gdb");
	uint64_t t0 = clock_now_ms();
	int n = 0;

	if (!a->run_dir[0] || stacks_ensure(a) < 0)
		goto out;
	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		struct worker *w = &a->wk.workers[i];

		a->stk->frame[i][0] = '\0';
		a->stk->taken[i] = false;
		if (w->state != W_RUNNING || w->stopping)
			continue;
		p[n] = (struct probe){.w = w};
		if (str_printf(p[n].path, sizeof(p[n].path), "%s/attempt_%d/%d/stack.txt",
			       a->run_dir, a->restart_count, w->local_rank) < 0)
			continue;
		if (start_tool(a, &p[n], pyspy, gdb) < 0)
			p[n].tool = 0;
		n++;
	}
	wait_tools(p, n, t0 + capture_deadline_ms());
	for (int i = 0; i < n; i++) {
		char *text;

		if (!p[i].ok)
			proc_fallback(&p[i]);
		text = stacks_read_text(p[i].path);
		if (text &&
		    stacks_top_frame(text, a->stk->frame[p[i].w->local_rank], STACKS_FRAME_MAX) < 0)
			a->stk->frame[p[i].w->local_rank][0] = '\0';
		a->stk->taken[p[i].w->local_rank] = true;
		free(text);
	}
	log_at(LL_INFO, SUB_AGENT, "stacks of %d workers captured in %llu ms (%s)", n,
	       (unsigned long long)(clock_now_ms() - t0),
	       pyspy ? "py-spy"
	       : gdb ? "gdb"
		     : "/proc only");
out:
	free(pyspy);
	free(gdb);
	return n;
}

/* The digest of the last capture; odd (a hang) names the stragglers. */
static void make_digest(struct crun_agent *a, bool with_odd, const char *when)
{
	int ranks[CRUN_AGENT_MAX_LOCAL];
	const char *frames[CRUN_AGENT_MAX_LOCAL];
	bool odd[CRUN_AGENT_MAX_LOCAL];
	int n = 0;

	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		if (!a->stk->taken[i])
			continue;
		ranks[n] = a->wk.workers[i].global_rank;
		frames[n++] = a->stk->frame[i];
	}
	if (with_odd && stacks_stragglers(frames, n, odd) > 0)
		stacks_digest(ranks, frames, odd, n, when, a->stk->digest, sizeof(a->stk->digest));
	else
		stacks_digest(ranks, frames, NULL, n, when, a->stk->digest, sizeof(a->stk->digest));
}

/* "rank 1 failed", "ranks 1,3 failed", "another node failed", ... */
static void stop_cause(const struct crun_agent *a, enum stop_reason reason, char *buf, size_t cap)
{
	size_t len = 0;

	buf[0] = '\0';
	switch (reason) {
	case STOP_FAILED:
	case STOP_RESTART:
		if (a->fail.nfailures == 0)
			break;
		stacks_append(buf, cap, &len, "rank%s ", a->fail.nfailures > 1 ? "s" : "");
		for (int i = 0; i < a->fail.nfailures && i < 8; i++)
			stacks_append(buf, cap, &len, "%s%d", i ? "," : "",
				      a->fail.failures[i].global_rank);
		stacks_append(buf, cap, &len, " failed");
		break;
	case STOP_PEER_FAILED: /* as fsm.c words it: a lost store is no node's failure */
		stacks_append(buf, cap, &len, "%s",
			      rdzv_change_kind(a->rdzv) == RDZV_CHANGE_LOST
				  ? "the rendezvous store was lost"
				  : "the job failed on another node");
		break;
	case STOP_PEER:
		stacks_append(buf, cap, &len, "the membership changed");
		break;
	case STOP_SIGNAL:
		stacks_append(buf, cap, &len, "crun got signal %d", a->stop_signal);
		break;
	default:
		break;
	}
}

void stacks_before_stop(struct crun_agent *a, enum stop_reason reason)
{
	char when[160];

	if (a->stk && a->stk->held)
		return; /* a hang's capture, already digested */
	if (a->cfg.stack_dump_on_stop == STACKS_NEVER ||
	    (a->cfg.stack_dump_on_stop != STACKS_ALWAYS &&
	     (reason == STOP_SIGNAL || reason == STOP_PEER)))
		return;
	if (stacks_capture(a) <= 0)
		return;
	stop_cause(a, reason, when, sizeof(when));
	make_digest(a, false, when);
	if (a->stk->digest[0])
		log_at(LL_WARN, SUB_AGENT, "%s (stacks: %s/attempt_%d/*/stack.txt)", a->stk->digest,
		       a->run_dir, a->restart_count);
}

void stacks_report(struct crun_agent *a)
{
	if (!a->stk || !a->stk->digest[0])
		return;
	fprintf(stderr, "crun: stacks: %s (in %s/attempt_%d/RANK/stack.txt)\n", a->stk->digest,
		a->run_dir, a->restart_count);
	fflush(stderr);
}

void stacks_reset(struct crun_agent *a)
{
	uint64_t last;

	if (!a->stk)
		return;
	last = a->stk->last_demand_ms;
	free(a->stk->answer);
	memset(a->stk, 0, sizeof(*a->stk));
	a->stk->last_demand_ms = last;
}

void stacks_free(struct crun_agent *a)
{
	if (a->stk)
		free(a->stk->answer);
	free(a->stk);
	a->stk = NULL;
}

/* A hang (hang.c): capture, digest naming the stragglers, kept for the stop
 * that follows. Returns the local rank to blame: the first straggler, else
 * the first captured rank, or -1. */
int stacks_on_hang(struct crun_agent *a, const char *when)
{
	const char *frames[CRUN_AGENT_MAX_LOCAL] = {0};
	bool odd[CRUN_AGENT_MAX_LOCAL] = {0};
	int idx[CRUN_AGENT_MAX_LOCAL] = {0};
	int n = 0, blame = -1;

	if (stacks_capture(a) <= 0)
		return -1;
	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++)
		if (a->stk->taken[i]) {
			idx[n] = i;
			frames[n++] = a->stk->frame[i];
		}
	if (stacks_stragglers(frames, n, odd) > 0)
		for (int k = n - 1; k >= 0; k--)
			blame = odd[k] ? idx[k] : blame;
	if (blame < 0 && n > 0)
		blame = idx[0];
	make_digest(a, true, when);
	a->stk->held = true;
	return blame;
}

const char *stacks_last_digest(const struct crun_agent *a)
{
	return a->stk ? a->stk->digest : "";
}

int stacks_on_demand(struct crun_agent *a, int rank, char **ret_body)
{
	char *body = NULL, *text;
	size_t cap = 0;
	FILE *f;
	uint64_t now = clock_now_ms();
	int n;

	TRY(stacks_ensure(a));
	if (a->stk->last_demand_ms && now - a->stk->last_demand_ms < STACKS_MIN_GAP_MS)
		return CRUN_EAGAIN;
	a->stk->last_demand_ms = now;
	if (a->state != AS_RUNNING || a->stk->held)
		return CRUN_ENOENT;
	n = stacks_capture(a);
	if (n <= 0)
		return CRUN_ENOENT;
	f = open_memstream(&body, &cap);
	if (!f)
		return CRUN_ENOMEM;
	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		const struct worker *w = &a->wk.workers[i];
		char path[PATH_MAX];

		if (!a->stk->taken[i] || (rank >= 0 && w->global_rank != rank))
			continue;
		if (str_printf(path, sizeof(path), "%s/attempt_%d/%d/stack.txt", a->run_dir,
			       a->restart_count, i) < 0)
			continue;
		text = stacks_read_text(path);
		fprintf(f, "=== rank %d (local rank %d, pid %d): %s\n%s\n", w->global_rank, i,
			(int)w->pid, a->stk->frame[i][0] ? a->stk->frame[i] : "?",
			text ? text : "");
		free(text);
	}
	/* The capture belongs to nobody's stop: the next stop takes its own. */
	for (int i = 0; i < CRUN_AGENT_MAX_LOCAL; i++)
		a->stk->taken[i] = false;
	if (fclose(f) != 0) {
		free(body);
		return CRUN_ENOMEM;
	}
	*ret_body = body;
	return 0;
}
