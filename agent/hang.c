/* hang.c: --hang_timeout. A job is hung when none of this node's workers
 * made progress for the timeout. Progress is read from outside, with the
 * workers unchanged: the CPU time of each worker's process tree (the
 * worker and its live descendants, /proc/PID/stat), the size of its
 * stdout/stderr log files and the mtime of its heartbeat file when those
 * exist. CPU time counts only above HANG_CPU_PERMILLE of the wall time, so
 * an idle interpreter's housekeeping threads are not progress. A rank that
 * busy-waits (an NCCL kernel spinning) burns CPU and so counts as
 * progressing: comparing successive stack samples is not done here.
 * On a hang: the stacks of every rank of every node through the job board
 * (rdzv.h; c10d and etcd), else of every local rank (stacks.c), a digest
 * naming the ranks whose innermost frame differs from the majority's, an
 * error file for the straggler (so the failure summary names it as the root
 * cause) and SIGKILL for it; the usual failure path then restarts or fails
 * the job.
 * One look costs a few /proc reads per worker, every HANG_CHECK_MAX_MS at
 * most.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "agent/stacks_int.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"

#define HANG_CHECK_MIN_MS 100
#define HANG_CHECK_MAX_MS 2000
#define HANG_TREE_MAX	  64 /* processes of one worker's tree looked at */

struct hang_rank {
	struct hang_sample last;
	uint64_t last_ms; /* when last was taken */
};

struct agent_hang {
	struct crun_agent *a; /* borrowed back-pointer */
	struct event *timer;
	char attempt_dir[PATH_MAX];
	uint64_t progress_ms; /* monotonic: the last progress of any worker */
	long tick_ms;
	uint32_t every_ms;
	/* A hang declared: its words, and the job board's gather (asked_ms:
	 * when it was declared); deferred: the straggler is another node's */
	char when[160];
	uint64_t asked_ms;
	bool gathering, deferred;
	struct hang_rank rank[CRUN_AGENT_MAX_LOCAL];
};

bool hang_progressed(const struct hang_sample *last, const struct hang_sample *now,
		     uint64_t elapsed_ms)
{
	if (now->out_bytes != last->out_bytes || now->beat_ns != last->beat_ns)
		return true;
	return now->cpu_ms > last->cpu_ms &&
	       (now->cpu_ms - last->cpu_ms) * 1000 > elapsed_ms * HANG_CPU_PERMILLE;
}

/* utime + stime of one process (ms); 0 when gone. */
static uint64_t proc_cpu_ms(pid_t pid, long tick_ms)
{
	char path[64], buf[1024];
	unsigned long long ut = 0, st = 0;
	const char *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	fd_close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return 0;
	return (ut + st) * (uint64_t)tick_ms;
}

/* The worker's tree, breadth first through /proc/PID/task/TID/children. */
static uint64_t tree_cpu_ms(pid_t root, long tick_ms)
{
	pid_t q[HANG_TREE_MAX];
	int head = 0, tail = 0;
	uint64_t sum = 0;

	q[tail++] = root;
	while (head < tail) {
		pid_t pid = q[head++];
		char path[64], buf[1024];
		ssize_t n;
		int fd;

		sum += proc_cpu_ms(pid, tick_ms);
		snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		fd_close(fd);
		buf[n > 0 ? n : 0] = '\0';
		for (char *s = buf, *end; *s && tail < HANG_TREE_MAX; s = end) {
			long c = strtol(s, &end, 10);

			if (end == s)
				break;
			q[tail++] = (pid_t)c;
		}
	}
	return sum;
}

static void sample(const struct agent_hang *h, const struct worker *w, struct hang_sample *s)
{
	static const char *const files[] = {"stdout.log", "stderr.log"};
	char path[PATH_MAX];
	struct stat st;

	s->cpu_ms = tree_cpu_ms(w->pid, h->tick_ms);
	s->out_bytes = 0;
	s->beat_ns = 0;
	if (!h->attempt_dir[0])
		return;
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		if (str_printf(path, sizeof(path), "%s/%d/%s", h->attempt_dir, w->local_rank,
			       files[i]) >= 0 &&
		    stat(path, &st) == 0)
			s->out_bytes += (uint64_t)st.st_size;
	if (str_printf(path, sizeof(path), "%s/%d/heartbeat", h->attempt_dir, w->local_rank) >= 0 &&
	    stat(path, &st) == 0)
		s->beat_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

/* The straggler's error file, torchrun's format: the summary names it. */
static void write_reason(const struct worker *w, const char *why)
{
	cJSON *root = cJSON_CreateObject(), *msg = cJSON_AddObjectToObject(root, "message");
	cJSON *extra = msg ? cJSON_AddObjectToObject(msg, "extraInfo") : NULL;
	char ts[32], *text = NULL;
	int fd;

	snprintf(ts, sizeof(ts), "%.0f", clock_wall_s());
	if (!extra || !cJSON_AddStringToObject(msg, "message", why) ||
	    !cJSON_AddStringToObject(extra, "py_callstack", why) ||
	    !cJSON_AddStringToObject(extra, "timestamp", ts) || !w->errfile[0])
		goto out;
	text = cJSON_PrintUnformatted(root);
	fd = text ? open(w->errfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
	if (fd < 0)
		goto out;
	if (fd_write_all(fd, text, strlen(text)) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot write '%s', ignoring", w->errfile);
	fd_close(fd);
out:
	free(text);
	cJSON_Delete(root);
}

/* Kills local rank idx (the straggler, else the first running rank) with
 * the digest as its reason; the usual failure path follows. */
static void blame(struct agent_hang *h, int idx, const char *when)
{
	struct crun_agent *a = h->a;
	char why[STACKS_DIGEST_MAX + 256];
	struct worker *w;

	for (int i = 0; idx < 0 && i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++)
		if (a->wk.workers[i].state == W_RUNNING)
			idx = i;
	if (idx < 0)
		return;
	w = &a->wk.workers[idx];
	snprintf(why, sizeof(why), "crun: hung: %s",
		 stacks_last_digest(a)[0] ? stacks_last_digest(a) : when);
	log_at(LL_WARN, SUB_AGENT, "%s; killing rank %d (pid %d)", why, w->global_rank,
	       (int)w->pid);
	write_reason(w, why);
	w->sigkilled_by_us = true; /* a failure, but not an OOM kill */
	if (kill(-w->pid, SIGKILL) < 0 && errno != ESRCH)
		log_at(LL_WARN, SUB_AGENT, "kill(-%d, SIGKILL): %s, ignoring", (int)w->pid,
		       strerror(errno));
}

/* The job board's answers (rdzv_gather_fn): the job-wide digest. A
 * straggler on another node is that node's to kill (its own watch sees
 * the hang too); this node kills its own first rank only when it is still
 * hung after another --hang_timeout (a straggler that burns CPU keeps its
 * node from ever seeing the hang). */
static void on_gathered(int r, int64_t ask, char *const *answers, int n, void *arg)
{
	struct crun_agent *a = arg;
	struct agent_hang *h = a->hang;
	struct timeval tv = {.tv_sec = 0, .tv_usec = 0};
	bool remote = false;
	int idx;

	if (!h || !h->gathering)
		return; /* a new attempt meanwhile: this answer is stale */
	h->gathering = false;
	if (a->state != AS_RUNNING)
		return;
	idx = r < 0 ? stacks_on_hang(a, h->when)
		    : stacks_on_hang_job(a, h->when, ask, answers, n, h->asked_ms, &remote);
	if (!remote) {
		blame(h, idx, h->when);
		return;
	}
	h->deferred = true;
	h->progress_ms = clock_now_ms();
	tv.tv_sec = h->every_ms / 1000;
	tv.tv_usec = (h->every_ms % 1000) * 1000;
	log_at(LL_WARN, SUB_AGENT,
	       "crun: hung: %s; the straggler is on another node: this node kills its own "
	       "first rank if still hung after another --hang_timeout",
	       stacks_last_digest(a));
	if (event_add(h->timer, &tv) < 0)
		blame(h, -1, h->when);
}

static void declare_hung(struct agent_hang *h, uint64_t silent_ms)
{
	struct crun_agent *a = h->a;
	char ask[512];
	int idx;

	event_del(h->timer); /* once per attempt: the stop follows */
	if (h->deferred) {   /* the job-wide digest named another node's rank */
		blame(h, -1, h->when);
		return;
	}
	snprintf(h->when, sizeof(h->when), "no worker made progress for %.1f s (--hang_timeout)",
		 silent_ms / 1000.0);
	snprintf(ask, sizeof(ask), "hang on %s: %s", a->host, h->when);
	h->asked_ms = clock_now_ms();
	if (rdzv_stacks_gather(a->rdzv, ask, 0, on_gathered, a) == 0) {
		log_at(LL_WARN, SUB_AGENT, "%s: asking every node of the job for its ranks' stacks",
		       h->when);
		h->gathering = true;
		return;
	}
	log_at(LL_WARN, SUB_AGENT, "%s: taking every local rank's stack", h->when);
	idx = stacks_on_hang(a, h->when);
	blame(h, idx, h->when);
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
	struct agent_hang *h = arg;
	struct crun_agent *a = h->a;
	uint64_t now = clock_now_ms();
	bool watched = false;

	(void)fd;
	(void)what;
	if (a->state != AS_RUNNING)
		return;
	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		const struct worker *w = &a->wk.workers[i];
		struct hang_rank *r = &h->rank[i];
		struct hang_sample s;

		if (w->state != W_RUNNING || w->stopping)
			continue;
		watched = true;
		sample(h, w, &s);
		if (hang_progressed(&r->last, &s, now - r->last_ms))
			h->progress_ms = now;
		r->last = s;
		r->last_ms = now;
	}
	if (watched && now - h->progress_ms >= a->cfg.hang_timeout_ms)
		declare_hung(h, now - h->progress_ms);
}

int hang_arm(struct crun_agent *a, const char *attempt_dir)
{
	uint32_t t = a->cfg.hang_timeout_ms;
	uint32_t every = MIN(MAX(t / 4, HANG_CHECK_MIN_MS), HANG_CHECK_MAX_MS);
	struct timeval tv = {.tv_sec = every / 1000, .tv_usec = (every % 1000) * 1000};
	struct agent_hang *h;

	if (!t)
		return 0;
	hang_disarm(a);
	h = calloc(1, sizeof(*h));
	if (!h)
		return CRUN_ENOMEM;
	h->a = a;
	h->tick_ms = 1000 / MAX(sysconf(_SC_CLK_TCK), 1);
	h->every_ms = every;
	h->progress_ms = clock_now_ms();
	snprintf(h->attempt_dir, sizeof(h->attempt_dir), "%s", attempt_dir);
	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		if (a->wk.workers[i].state == W_RUNNING)
			sample(h, &a->wk.workers[i], &h->rank[i].last);
		h->rank[i].last_ms = h->progress_ms;
	}
	h->timer = event_new(a->base, -1, EV_PERSIST, on_check, h);
	if (!h->timer || event_add(h->timer, &tv) < 0) {
		if (h->timer)
			event_free(h->timer);
		free(h);
		return CRUN_ENOMEM;
	}
	a->hang = h;
	return 0;
}

void hang_disarm(struct crun_agent *a)
{
	if (!a->hang)
		return;
	event_free(a->hang->timer);
	free(a->hang);
	a->hang = NULL;
}
