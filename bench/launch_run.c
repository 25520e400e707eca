/* launch_run.c: runs one launcher (crun or torchrun) for bench/launch_bench.py
 * and prints one line "wall_ns=.. status=.. hwm_kb=.. helpers_hwm_kb=.. helpers=..
 * maxrss_kb=..".
 *
 * Wall time is taken here in C, from just before fork() to the launcher's
 * reaping, so the bench's own (Python) spawn cost stays out of crun's few
 * milliseconds. With --trace the launcher is ptraced with PTRACE_O_TRACEEXIT
 * only: it stops once, at its exit, before the kernel releases its memory,
 * and hwm_kb is VmHWM of /proc/PID/status read at that instant. That is the
 * peak RSS of the launcher's own post-exec image, and nothing else: unlike
 * wait4()'s ru_maxrss (printed as maxrss_kb for comparison) it neither
 * includes the reaped workers (RUSAGE_BOTH folds children in) nor the image
 * before exec (the kernel keeps the larger of the two). Helpers the launcher
 * forks without exec (crun's guard) are agent memory too: while it runs they
 * are sampled every POLL_US and their peaks summed into helpers_hwm_kb.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define KILL_GRACE_S 5	 /* SIGTERM at the deadline, SIGKILL this much later */
#define POLL_US	     500 /* traced runs: helper sampling period */

static volatile sig_atomic_t alarm_fired;

static void on_alarm(int sig)
{
	(void)sig;
	alarm_fired = 1;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	(void)clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* VmHWM in kB of a live (or exit-stopped) process, -1 if unreadable. */
static long read_hwm_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	(void)snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmHWM:", 6) == 0) {
			char *end;

			kb = strtol(line + 6, &end, 10);
			break;
		}
	}
	fclose(f);
	return kb;
}

/* Reads a small /proc file into buf (NUL-terminated, NULs of cmdline kept as
 * they are); returns its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

#define HELPERS_MAX 16

/* Peak RSS of the launcher's exit stop and of its helper processes. */
struct mem {
	long hwm_kb; /* the launcher's VmHWM at its exit stop, -1 unknown */
	int n;	     /* helpers seen */
	pid_t pid[HELPERS_MAX];
	long hwm[HELPERS_MAX]; /* the largest VmHWM sampled for each */
};

/* Process group of pid from /proc/PID/stat, -1 if unreadable. */
static long read_pgid(pid_t pid)
{
	char path[64], buf[1024];
	long ppid, pgid;
	char state, *p;

	(void)snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	if (read_small(path, buf, sizeof(buf)) <= 0)
		return -1;
	p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
	if (!p || sscanf(p + 1, " %c %ld %ld", &state, &ppid, &pgid) != 3)
		return -1;
	return pgid;
}

/* Samples the launcher's helper processes: children forked without exec (same
 * command line as the launcher) in its process group, such as crun's guard.
 * They belong to the agent's footprint, unlike workers, and may exit before
 * the launcher does, so they are sampled while it runs. A worker between fork
 * and exec looks just like one, so a sample counts only while all `workers`
 * workers run exec'd (bench/launch_worker hold keeps them alive together). */
static void sample_helpers(pid_t pid, int workers, struct mem *mem)
{
	char path[96], kids[4096], me[4096], it[4096];
	pid_t cand[HELPERS_MAX];
	long cand_kb[HELPERS_MAX];
	int ncand = 0, running = 0;
	ssize_t me_len, it_len;
	char *tok, *save;
	long my_pgid;

	(void)snprintf(path, sizeof(path), "/proc/%ld/cmdline", (long)pid);
	me_len = read_small(path, me, sizeof(me));
	(void)snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", (long)pid, (long)pid);
	if (me_len <= 0 || read_small(path, kids, sizeof(kids)) < 0)
		return;
	my_pgid = read_pgid(pid);
	for (tok = strtok_r(kids, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
		uint64_t kid;

		if (parse_u64(tok, &kid) < 0)
			continue;
		(void)snprintf(path, sizeof(path), "/proc/%llu/cmdline", (unsigned long long)kid);
		it_len = read_small(path, it, sizeof(it));
		if (it_len <= 0)
			continue; /* a zombie */
		if (it_len != me_len || memcmp(it, me, (size_t)me_len) != 0) {
			running++;
			continue;
		}
		if (read_pgid((pid_t)kid) != my_pgid || ncand == HELPERS_MAX)
			continue;
		cand[ncand] = (pid_t)kid;
		cand_kb[ncand++] = read_hwm_kb((pid_t)kid);
	}
	if (running != workers)
		return;
	for (int c = 0; c < ncand; c++) {
		int i;

		for (i = 0; i < mem->n && mem->pid[i] != cand[c]; i++)
			;
		if (i == mem->n) {
			if (mem->n == HELPERS_MAX)
				continue;
			mem->pid[mem->n] = cand[c];
			mem->hwm[mem->n++] = -1;
		}
		mem->hwm[i] = MAX(mem->hwm[i], cand_kb[c]);
	}
}

/* Sum of the helpers' peaks; *ret_count of them. */
static long helpers_kb(const struct mem *mem, int *ret_count)
{
	long sum = 0;
	int count = 0;

	for (int i = 0; i < mem->n; i++) {
		if (mem->hwm[i] <= 0)
			continue;
		sum += mem->hwm[i];
		count++;
	}
	*ret_count = count;
	return sum;
}

static void __attribute__((noreturn)) run_child(char **argv, const char *log_path, int trace)
{
	int fd;

	/* The launcher stays in our process group (the bench starts us in a new
	 * session), so one killpg() from the bench reaches both of us. */
	if (log_path) {
		fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
	}
	if (trace && ptrace(PTRACE_TRACEME, 0, NULL, NULL) < 0)
		_exit(125);
	execvp(argv[0], argv);
	_exit(127);
}

/* Waits for the launcher. When traced it polls (every POLL_US, sampling the
 * helpers), passes the launcher's signals on and reads VmHWM at its exit stop.
 * On the deadline: SIGTERM, then SIGKILL after a grace. */
static int wait_launcher(pid_t pid, int trace, int workers, int timeout_s, int *ret_status,
			 struct mem *mem, struct rusage *ru)
{
	const struct timespec poll = {0, POLL_US * 1000};
	int status, escalated = 0;

	alarm((unsigned)timeout_s);
	for (;;) {
		pid_t w = wait4(pid, &status, trace ? WNOHANG : 0, ru);

		if (w == 0) {
			sample_helpers(pid, workers, mem);
			(void)nanosleep(&poll, NULL); /* EINTR by the alarm is fine */
			if (!alarm_fired)
				continue;
			w = -1;
			errno = EINTR;
		}
		if (w < 0 && errno == EINTR && alarm_fired) {
			alarm_fired = 0;
			(void)kill(pid, escalated ? SIGKILL : SIGTERM);
			if (!escalated)
				alarm(KILL_GRACE_S);
			escalated = 1;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (WIFEXITED(status) || WIFSIGNALED(status))
			break;
		if (!WIFSTOPPED(status))
			continue;
		if (status >> 8 == (SIGTRAP | (PTRACE_EVENT_EXIT << 8))) {
			mem->hwm_kb = read_hwm_kb(pid);
			(void)ptrace(PTRACE_CONT, pid, NULL, NULL);
		} else if (WSTOPSIG(status) == SIGTRAP) {
			/* The stop after execve: from now on, stop only at exit. */
			(void)ptrace(PTRACE_SETOPTIONS, pid, NULL,
				     (void *)(long)(PTRACE_O_TRACEEXIT | PTRACE_O_EXITKILL));
			(void)ptrace(PTRACE_CONT, pid, NULL, NULL);
		} else {
			(void)ptrace(PTRACE_CONT, pid, NULL, (void *)(long)WSTOPSIG(status));
		}
	}
	alarm(0);
	*ret_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: launch_run [--trace [--workers N]] [--timeout S] [--log FILE] -- "
			"PROGRAM [ARG...]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *log_path = NULL;
	struct sigaction sa;
	struct rusage ru;
	uint64_t t0, t1, v;
	int trace = 0, timeout_s = 120, workers = 0, status = 0, i, r;
	struct mem mem = {.hwm_kb = -1, .n = 0};
	int helpers = 0;
	long h_kb;
	pid_t pid;

	for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		if (strcmp(argv[i], "--trace") == 0) {
			trace = 1;
		} else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
			if (parse_uint_range(argv[++i], 1, 3600, &v) < 0)
				return usage();
			timeout_s = (int)v;
		} else if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) {
			if (parse_uint_range(argv[++i], 0, 4096, &v) < 0)
				return usage();
			workers = (int)v;
		} else if (strcmp(argv[i], "--log") == 0 && i + 1 < argc) {
			log_path = argv[++i];
		} else {
			return usage();
		}
	}
	if (i + 1 >= argc)
		return usage();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm; /* no SA_RESTART: wait4 must return EINTR */
	sigemptyset(&sa.sa_mask);
	(void)sigaction(SIGALRM, &sa, NULL);

	t0 = mono_ns();
	pid = fork();
	if (pid < 0) {
		perror("launch_run: fork");
		return 1;
	}
	if (pid == 0)
		run_child(argv + i + 1, log_path, trace);
	r = wait_launcher(pid, trace, workers, timeout_s, &status, &mem, &ru);
	t1 = mono_ns();
	if (r < 0) {
		fprintf(stderr, "launch_run: wait: %s\n", strerror(-r));
		return 1;
	}
	h_kb = helpers_kb(&mem, &helpers);
	printf("wall_ns=%llu status=%d hwm_kb=%ld helpers_hwm_kb=%ld helpers=%d maxrss_kb=%ld\n",
	       (unsigned long long)(t1 - t0), status, mem.hwm_kb, trace ? h_kb : -1, helpers,
	       ru.ru_maxrss);
	return 0;
}
