/* nodecheck.c: --node_check and --max_node_failures (nodecheck_int.h). The
 * check itself runs in a child, crun-nodecheck: the GEMM and the all_reduce
 * use the worker SDK, which the agent does not link into its own loop, and a
 * child leaves the loop free (the rendezvous monitor keeps running) and
 * shares the node's CPU limits with the workers that would follow. The
 * agent reads the child's table from a pipe; EOF means it exited.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "agent/agent.h"
#include "agent/nodecheck_int.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"

#define NC_PROGRAM    "crun-nodecheck"
#define NC_OUT_MAX    (1u << 20) /* the child's table: 4096 lines at most */
#define NC_TIMEOUT_MS 120000	 /* the child's own bound on every wait */
#define NC_GUARD_MS   15000	 /* then the agent kills it */
#define NC_GEMM_MS    500	 /* how long the GEMM is timed */
#define NC_NS_BASE    1000000	 /* the SDK's "crun/a<ns>/": no attempt reaches it */

struct agent_nodecheck {
	pid_t pid; /* the running child, or 0 */
	int fd;	   /* read end of its stdout, or -1 */
	struct event *rd, *guard;
	char *out;
	size_t len;
	uint64_t started_ms;
	int counted_attempt; /* the attempt whose failure was counted, or -1 */
	/* the last table */
	struct nc_row *rows;
	int n;
	int round;
	bool complete;
	int child_status; /* waitpid status of the last child */
	double med_gf, med_bw;
	uint64_t duration_ms;
	uint64_t runs, excluded_total;
};

/* ---- pure ------------------------------------------------------------------ */

int nodecheck_parse_line(const char *line, struct nc_row *ret)
{
	struct nc_row r = {0};
	char st[16], host[NC_HOST_MAX];
	int pinned = 0;

	if (sscanf(line, "node %d %lf %lf %d %d %15s %255s", &r.rank, &r.gflops, &r.gbps,
		   &r.failures, &pinned, st, host) != 7 ||
	    r.rank < 0 || r.rank >= NC_NODES_MAX || r.gflops < 0 || r.gbps < 0 || r.failures < 0)
		return CRUN_EINVAL;
	if (strcmp(st, "ok") == 0)
		r.st = NC_OK;
	else if (strcmp(st, "failed") == 0)
		r.st = NC_FAILED;
	else if (strcmp(st, "missing") == 0)
		r.st = NC_MISSING;
	else
		return CRUN_EINVAL;
	r.pinned = pinned != 0;
	snprintf(r.host, sizeof(r.host), "%s", host);
	*ret = r;
	return 0;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return (a > b) - (a < b);
}

/* Median of the positive values of the rows that passed (gbps: which), 0
 * when there is none. */
static double median(const struct nc_row *rows, int n, bool gbps)
{
	double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double)), m = 0;
	int k = 0;

	if (!v)
		return 0;
	for (int i = 0; i < n; i++) {
		double x = gbps ? rows[i].gbps : rows[i].gflops;

		if (rows[i].st == NC_OK && x > 0)
			v[k++] = x;
	}
	qsort(v, (size_t)k, sizeof(double), cmp_double);
	if (k)
		m = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
	free(v);
	return m;
}

int nodecheck_decide(struct nc_row *rows, int n, const struct nc_policy *p, double *ret_med_gf,
		     double *ret_med_bw)
{
	double mg = median(rows, n, false), mb = median(rows, n, true);
	double f = p->threshold_pct / 100.0;
	int cand = 0;

	for (int i = 0; i < n; i++) {
		struct nc_row *r = &rows[i];

		r->why = 0;
		r->kept = NC_KEPT_NO;
		r->excluded = false;
		if (r->st != NC_OK)
			r->why |= NC_WHY_FAILED;
		else if (p->threshold_pct > 0) {
			if (mg > 0 && r->gflops < f * mg)
				r->why |= NC_WHY_GFLOPS;
			if (mb > 0 && r->gbps < f * mb)
				r->why |= NC_WHY_GBPS;
		}
		if (p->max_failures > 0 && r->failures >= p->max_failures)
			r->why |= NC_WHY_FAILURES;
		if (r->why && r->pinned)
			r->kept = NC_KEPT_PINNED;
		else if (r->why)
			cand++;
	}
	for (int i = 0; i < n; i++) {
		if (!rows[i].why || rows[i].kept != NC_KEPT_NO)
			continue;
		if (n - cand < p->min_nodes)
			rows[i].kept = NC_KEPT_MIN;
		else
			rows[i].excluded = true;
	}
	if (ret_med_gf)
		*ret_med_gf = mg;
	if (ret_med_bw)
		*ret_med_bw = mb;
	return n - cand < p->min_nodes ? 0 : cand;
}

void nodecheck_why_text(const struct nc_row *r, const struct nc_policy *p, double med_gf,
			double med_bw, char *buf, size_t cap)
{
	size_t o = 0;

	buf[0] = '\0';
#define NC_ADD(...)                                                                   \
	do {                                                                          \
		if (o < cap)                                                          \
			o += (size_t)snprintf(buf + o, cap - o, "%s", o ? "; " : ""); \
		if (o < cap)                                                          \
			o += (size_t)snprintf(buf + o, cap - o, __VA_ARGS__);         \
	} while (0)
	if (r->why & NC_WHY_FAILED)
		NC_ADD("its node check %s", r->st == NC_MISSING ? "never reported" : "failed");
	if (r->why & NC_WHY_GFLOPS)
		NC_ADD("GEMM at %.2f GFLOP/s is below %d%% of the median %.2f", r->gflops,
		       p->threshold_pct, med_gf);
	if (r->why & NC_WHY_GBPS)
		NC_ADD("all_reduce at %.3f GB/s is below %d%% of the median %.3f", r->gbps,
		       p->threshold_pct, med_bw);
	if (r->why & NC_WHY_FAILURES)
		NC_ADD("its workers failed in %d attempts (--max_node_failures=%d)", r->failures,
		       p->max_failures);
#undef NC_ADD
}

/* ---- the child ----------------------------------------------------------------- */

static struct agent_nodecheck *nc_get(struct crun_agent *a)
{
	if (!a->nc) {
		a->nc = calloc(1, sizeof(*a->nc));
		if (!a->nc)
			return NULL;
		a->nc->fd = -1;
		a->nc->counted_attempt = -1;
		a->nc->round = -1;
	}
	return a->nc;
}

bool nodecheck_wanted(const struct crun_agent *a)
{
	return a->cfg.node_check || a->cfg.max_node_failures > 0;
}

void nodecheck_count_failure(struct crun_agent *a)
{
	struct agent_nodecheck *nc = nc_get(a);

	if (nc && nc->counted_attempt == a->restart_count)
		return;
	if (nc)
		nc->counted_attempt = a->restart_count;
	a->node_failures++;
}

/* The program next to this one (build/bin, $PREFIX/bin), else on $PATH. */
static char *program_path(void)
{
	char self[PATH_MAX], *slash, *p;
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash && (size_t)(slash - self) + sizeof("/" NC_PROGRAM) <= sizeof(self)) {
			memcpy(slash + 1, NC_PROGRAM, sizeof(NC_PROGRAM));
			if (access(self, X_OK) == 0 && (p = strdup(self)))
				return p;
		}
	}
	return spawn_resolve(NC_PROGRAM);
}

static void reap_child(struct agent_nodecheck *nc)
{
	int st = 0;

	if (nc->pid <= 0)
		return;
	while (waitpid(nc->pid, &st, 0) < 0 && errno == EINTR)
		;
	nc->child_status = st;
	nc->pid = 0;
}

static void close_pipe(struct agent_nodecheck *nc)
{
	if (nc->rd)
		event_free(nc->rd);
	if (nc->guard)
		event_free(nc->guard);
	nc->rd = nc->guard = NULL;
	if (nc->fd >= 0)
		close(nc->fd);
	nc->fd = -1;
}

/* The child's output into the table (rows by group rank; complete when
 * "end" came and every rank is there once). */
static void parse_output(struct agent_nodecheck *nc, int world)
{
	char *save = NULL, *line;
	int seen = 0;

	free(nc->rows);
	nc->rows = calloc((size_t)(world > 0 ? world : 1), sizeof(*nc->rows));
	nc->n = 0;
	nc->complete = false;
	if (!nc->rows || !nc->out)
		return;
	for (line = strtok_r(nc->out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		struct nc_row r;

		if (strcmp(line, "end") == 0) {
			nc->complete = seen == world;
			break;
		}
		if (nodecheck_parse_line(line, &r) < 0 || r.rank >= world ||
		    nc->rows[r.rank].host[0])
			continue;
		nc->rows[r.rank] = r;
		seen++;
	}
	nc->n = world;
}

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
	struct agent_nodecheck *nc = arg;

	(void)fd;
	(void)what;
	log_at(LL_WARN, SUB_AGENT, "the node check (pid %d) ran past %u ms, killing it",
	       (int)nc->pid, NC_TIMEOUT_MS + NC_GUARD_MS);
	if (nc->pid > 0)
		(void)kill(nc->pid, SIGKILL);
}

/* Reads what the child wrote; 1 at EOF (it exited: it holds its stdout to
 * the end), 0 when nothing more is there for now. */
static int drain(struct agent_nodecheck *nc)
{
	char buf[4096];

	for (int i = 0; i < (int)(NC_OUT_MAX / sizeof(buf)) + 2; i++) {
		ssize_t n = read(nc->fd, buf, sizeof(buf));
		char *p;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return 0;
		if (n <= 0)
			return 1;
		if (nc->len + (size_t)n >= NC_OUT_MAX)
			continue; /* more than any table: dropped, so it parses incomplete */
		p = realloc(nc->out, nc->len + (size_t)n + 1);
		if (!p)
			continue;
		memcpy(p + nc->len, buf, (size_t)n);
		nc->len += (size_t)n;
		p[nc->len] = '\0';
		nc->out = p;
	}
	return 0;
}

/* The child is gone (or killed): its table becomes the last one. */
static void conclude(struct crun_agent *a)
{
	struct agent_nodecheck *nc = a->nc;
	const struct rdzv_info *ri = rdzv_info(a->rdzv);

	close_pipe(nc);
	reap_child(nc);
	nc->duration_ms = clock_now_ms() - nc->started_ms;
	log_at(LL_DEBUG, SUB_AGENT, "node check output: %s", nc->out ? nc->out : "(none)");
	parse_output(nc, ri ? ri->group_world_size : 0);
	free(nc->out);
	nc->out = NULL;
	nc->len = 0;
	nc->runs++;
}

static void on_output(evutil_socket_t fd, short what, void *arg)
{
	struct crun_agent *a = arg;

	(void)fd;
	(void)what;
	if (drain(a->nc) == 0)
		return;
	conclude(a);
	agent_fire(a, AE_CHECK_DONE);
}

bool nodecheck_take_table(struct crun_agent *a)
{
	struct agent_nodecheck *nc = a->nc;

	if (!nc || nc->fd < 0)
		return false;
	(void)drain(nc);
	if (!nc->out || !(strncmp(nc->out, "end\n", 4) == 0 || strstr(nc->out, "\nend\n")))
		return false;
	if (nc->pid > 0)
		(void)kill(nc->pid, SIGKILL);
	conclude(a);
	return nc->complete;
}

static int fmt_args(struct crun_agent *a, const struct rdzv_info *ri, char (*v)[320])
{
	struct rdzv_progress pr;
	const char *addr = a->cfg.local_addr ? a->cfg.local_addr : "";
	int round, ns;

	rdzv_get_progress(a->rdzv, &pr);
	if (pr.round >= 0 && ri->group_rank < pr.nnodes && pr.nodes[ri->group_rank].addr[0])
		addr = pr.nodes[ri->group_rank].addr;
	round = pr.round >= 0 ? pr.round : 0;
	/* Unique per round and attempt, the same on every node. */
	ns = NC_NS_BASE + (round % 1000000) * 1000 + (ri->attempt > 0 ? ri->attempt % 1000 : 0);
	a->nc->round = pr.round;
	TRY(str_printf(v[0], sizeof(v[0]), "%s:%u", ri->master_addr, ri->master_port));
	TRY(str_printf(v[1], sizeof(v[1]), "%d", ri->group_rank));
	TRY(str_printf(v[2], sizeof(v[2]), "%d", ri->group_world_size));
	TRY(str_printf(v[3], sizeof(v[3]), "%d", ns));
	/* Nodes on one host (loopback tests, containers) differ by address. */
	TRY(str_printf(v[4], sizeof(v[4]), "%.200s%s%.100s", a->host, *addr ? "@" : "", addr));
	TRY(str_printf(v[5], sizeof(v[5]), "%s", addr));
	TRY(str_printf(v[6], sizeof(v[6]), "%d", a->node_failures));
	TRY(str_printf(v[7], sizeof(v[7]), "%d", rdzv_served_store(a->rdzv) != NULL));
	TRY(str_printf(v[8], sizeof(v[8]), "%u", NC_GEMM_MS));
	TRY(str_printf(v[9], sizeof(v[9]), "%u", NC_TIMEOUT_MS));
	return 0;
}

static int spawn_child(struct crun_agent *a, const char *path, char (*v)[320])
{
	struct agent_nodecheck *nc = a->nc;
	char *argv[] = {(char *)NC_PROGRAM,
			"--store",
			v[0],
			"--rank",
			v[1],
			"--world",
			v[2],
			"--ns",
			v[3],
			"--node",
			v[4],
			"--addr",
			v[5],
			"--failures",
			v[6],
			"--pinned",
			v[7],
			"--gemm-ms",
			v[8],
			"--timeout-ms",
			v[9],
			a->cfg.node_check ? NULL : "--no-measure",
			NULL};
	struct spawn_req req = {.path = path,
				.argv = argv,
				.envp = a->envp_base,
				.stdout_fd = -1,
				.stderr_fd = STDERR_FILENO,
				.deathsig = SIGKILL};
	struct timeval tv = {(NC_TIMEOUT_MS + NC_GUARD_MS) / 1000, 0};
	int p[2], r;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	req.stdout_fd = p[1];
	r = spawn_worker(&req, &a->orig_mask, &nc->pid);
	close(p[1]);
	if (r < 0) {
		close(p[0]);
		return r;
	}
	nc->fd = p[0];
	/* The read end only: the child's stdout stays blocking. */
	if (fcntl(nc->fd, F_SETFL, fcntl(nc->fd, F_GETFL) | O_NONBLOCK) < 0) {
		nodecheck_stop(a);
		return -errno;
	}
	nc->rd = event_new(a->base, nc->fd, EV_READ | EV_PERSIST, on_output, a);
	nc->guard = evtimer_new(a->base, on_guard, nc);
	if (!nc->rd || !nc->guard || event_add(nc->rd, NULL) < 0 ||
	    evtimer_add(nc->guard, &tv) < 0) {
		nodecheck_stop(a);
		return CRUN_ENOMEM;
	}
	return 0;
}

int nodecheck_start(struct crun_agent *a)
{
	const struct rdzv_info *ri = rdzv_info(a->rdzv);
	char v[10][320];
	char *path;
	int r;

	if (!ri || !nc_get(a))
		return ri ? CRUN_ENOMEM : CRUN_EINVAL;
	nodecheck_stop(a);
	/* A node new to this round (a spare) must reach the store now. */
	agent_allow_round_peers(a);
	TRY(fmt_args(a, ri, v));
	path = program_path();
	if (!path) {
		r = -errno;
		snprintf(a->err, sizeof(a->err), "cannot find '%s' for the node check: %s",
			 NC_PROGRAM, crun_strerror(r));
		return r;
	}
	a->nc->started_ms = clock_now_ms();
	r = spawn_child(a, path, v);
	if (r < 0)
		snprintf(a->err, sizeof(a->err), "cannot start the node check '%s': %s", path,
			 crun_strerror(r));
	else
		log_at(LL_INFO, SUB_AGENT, "node check started (pid %d): group_rank=%d of %d",
		       (int)a->nc->pid, ri->group_rank, ri->group_world_size);
	free(path);
	return r;
}

void nodecheck_stop(struct crun_agent *a)
{
	struct agent_nodecheck *nc = a->nc;

	if (!nc)
		return;
	if (nc->pid > 0)
		(void)kill(nc->pid, SIGKILL);
	close_pipe(nc);
	reap_child(nc);
	free(nc->out);
	nc->out = NULL;
	nc->len = 0;
}

void nodecheck_free(struct crun_agent *a)
{
	if (!a->nc)
		return;
	nodecheck_stop(a);
	free(a->nc->rows);
	free(a->nc);
	a->nc = NULL;
}

/* ---- verdict and reports ------------------------------------------------------ */

static struct nc_policy policy_of(const struct crun_agent *a)
{
	/* 0: a config filled without CRUN_AGENT_CONFIG_INIT (the default). */
	int pct = a->cfg.node_check_threshold > 0 ? a->cfg.node_check_threshold : 50;
	struct nc_policy p = {
	    .threshold_pct = a->cfg.node_check ? pct : 0,
	    .max_failures = a->cfg.max_node_failures,
	    .min_nodes = a->cfg.min_nnodes > 0 ? a->cfg.min_nnodes : a->cfg.nnodes,
	};

	return p;
}

static const char *const status_text[] = {
    [NC_OK] = "ok", [NC_FAILED] = "failed", [NC_MISSING] = "missing"};
static const char *const kept_text[] = {
    [NC_KEPT_NO] = "",
    [NC_KEPT_PINNED] = " (kept: it serves the rendezvous store)",
    [NC_KEPT_MIN] = " (kept: fewer than MIN nodes would remain)"};

/* At WARN (shown by default) with --node_check or when a node is named;
 * the failure counts alone (--max_node_failures) at INFO. */
static void log_table(const struct crun_agent *a, const struct nc_policy *p)
{
	const struct agent_nodecheck *nc = a->nc;
	int lvl = a->cfg.node_check ? LL_WARN : LL_INFO;

	for (int i = 0; i < nc->n; i++)
		if (nc->rows[i].why)
			lvl = LL_WARN;

	log_at(lvl, SUB_AGENT,
	       "node check of round %d: %d nodes in %" PRIu64 " ms, median %.2f GFLOP/s, %.3f GB/s",
	       nc->round, nc->n, nc->duration_ms, nc->med_gf, nc->med_bw);
	log_at(lvl, SUB_AGENT, "node check: %-5s %-40s %10s %9s %8s %s", "rank", "node", "GFLOP/s",
	       "GB/s", "failures", "status");
	for (int i = 0; i < nc->n; i++) {
		const struct nc_row *r = &nc->rows[i];
		char why[512];

		nodecheck_why_text(r, p, nc->med_gf, nc->med_bw, why, sizeof(why));
		log_at(lvl, SUB_AGENT, "node check: %-5d %-40s %10.2f %9.3f %8d %s%s%s%s%s", i,
		       r->host[0] ? r->host : "?", r->gflops, r->gbps, r->failures,
		       status_text[r->st],
		       r->excluded ? " EXCLUDED: "
		       : *why	   ? " named: "
				   : "",
		       why, kept_text[r->kept], i == a->group_rank ? " (this node)" : "");
	}
}

enum nc_verdict nodecheck_verdict(struct crun_agent *a, char *why, size_t cap)
{
	struct agent_nodecheck *nc = a->nc;
	const struct rdzv_info *ri = rdzv_info(a->rdzv);
	struct nc_policy p = policy_of(a);
	char names[768] = "";
	size_t o = 0;
	int nex;

	why[0] = '\0';
	if (!nc || !ri || !nc->complete || ri->group_rank >= nc->n) {
		log_at(LL_WARN, SUB_AGENT,
		       "the node check did not complete on this node (status %d); starting the "
		       "workers",
		       nc ? nc->child_status : -1);
		return NC_START;
	}
	a->group_rank = ri->group_rank;
	nex = nodecheck_decide(nc->rows, nc->n, &p, &nc->med_gf, &nc->med_bw);
	log_table(a, &p);
	nc->excluded_total += (uint64_t)nex;
	if (nc->rows[ri->group_rank].excluded) {
		char t[512];

		nodecheck_why_text(&nc->rows[ri->group_rank], &p, nc->med_gf, nc->med_bw, t,
				   sizeof(t));
		snprintf(why, cap, "this node ('%s') leaves the job: %s",
			 nc->rows[ri->group_rank].host, t);
		return NC_LEAVE;
	}
	if (!nex)
		return NC_START;
	for (int i = 0; i < nc->n && o < sizeof(names); i++)
		if (nc->rows[i].excluded)
			o += (size_t)snprintf(names + o, sizeof(names) - o, "%s'%s'", o ? ", " : "",
					      nc->rows[i].host);
	snprintf(why, cap, "the node check excluded %s; the other nodes form a new round", names);
	return NC_AGAIN;
}

void nodecheck_status_json(const struct crun_agent *a, cJSON *root)
{
	const struct agent_nodecheck *nc = a->nc;
	struct nc_policy p = policy_of(a);
	cJSON *o, *arr;

	if (!nodecheck_wanted(a))
		return;
	cJSON_AddNumberToObject(root, "node_failures", a->node_failures);
	o = cJSON_AddObjectToObject(root, "node_check");
	if (!o)
		return;
	cJSON_AddBoolToObject(o, "enabled", a->cfg.node_check);
	cJSON_AddNumberToObject(o, "threshold_pct", p.threshold_pct);
	cJSON_AddNumberToObject(o, "max_node_failures", p.max_failures);
	cJSON_AddBoolToObject(o, "running", nc && nc->pid > 0);
	if (!nc || !nc->rows || !nc->runs)
		return;
	cJSON_AddNumberToObject(o, "round", nc->round);
	cJSON_AddBoolToObject(o, "complete", nc->complete);
	cJSON_AddNumberToObject(o, "duration_ms", (double)nc->duration_ms);
	cJSON_AddNumberToObject(o, "median_gflops", nc->med_gf);
	cJSON_AddNumberToObject(o, "median_gbps", nc->med_bw);
	arr = cJSON_AddArrayToObject(o, "nodes");
	for (int i = 0; arr && i < nc->n; i++) {
		const struct nc_row *r = &nc->rows[i];
		cJSON *n = cJSON_CreateObject();
		char why[512];

		if (!n)
			break;
		nodecheck_why_text(r, &p, nc->med_gf, nc->med_bw, why, sizeof(why));
		cJSON_AddNumberToObject(n, "group_rank", i);
		cJSON_AddStringToObject(n, "node", r->host);
		cJSON_AddNumberToObject(n, "gflops", r->gflops);
		cJSON_AddNumberToObject(n, "gbps", r->gbps);
		cJSON_AddNumberToObject(n, "failures", r->failures);
		cJSON_AddStringToObject(n, "status", status_text[r->st]);
		cJSON_AddBoolToObject(n, "excluded", r->excluded);
		cJSON_AddStringToObject(n, "why", why);
		cJSON_AddItemToArray(arr, n);
	}
}

void nodecheck_metrics(FILE *f, const struct crun_agent *a)
{
	const struct agent_nodecheck *nc = a->nc;

	if (!nodecheck_wanted(a))
		return;
	fprintf(f,
		"# HELP crun_agent_node_failures_total attempts in which this node's workers "
		"failed (--max_node_failures)\n# TYPE crun_agent_node_failures_total counter\n"
		"crun_agent_node_failures_total %d\n",
		a->node_failures);
	fprintf(f,
		"# HELP crun_agent_node_checks_total node checks run\n"
		"# TYPE crun_agent_node_checks_total counter\ncrun_agent_node_checks_total %" PRIu64
		"\n",
		nc ? nc->runs : 0);
	fprintf(f,
		"# HELP crun_agent_nodes_excluded_total nodes the node checks excluded\n"
		"# TYPE crun_agent_nodes_excluded_total counter\n"
		"crun_agent_nodes_excluded_total %" PRIu64 "\n",
		nc ? nc->excluded_total : 0);
	if (!nc || !nc->runs)
		return;
	fprintf(f,
		"# HELP crun_agent_node_check_seconds duration of the last node check\n"
		"# TYPE crun_agent_node_check_seconds gauge\ncrun_agent_node_check_seconds %.3f\n",
		(double)nc->duration_ms / 1000);
}
