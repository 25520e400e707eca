/* errfile.c: worker failures the way torchrun reports them (torch-compat
 * §4.5): the error file JSON written by @record, the root cause (smallest
 * timestamp), the ChildFailedError summary text, and the copy of the root
 * cause's error file (with "errorCode") into the agent's own error file.
 * crun adds two things torchrun lacks: exec failures and a SIGKILL crun did
 * not send (likely the OOM killer) are named, and without an error file the
 * last lines of the worker's stderr are shown.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "agent/failures.h"
#include "agent/outputs.h"
#include "agent/workers.h"
#include "common/common.h"
#include "crun/agent.h" /* CRUN_AGENT_MAX_LOCAL */

#define ERRFILE_MAX  (4u << 20)
#define NO_TRACEBACK "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"

static char *read_small_file(const char *path)
{
	struct stat st;
	char *buf;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;
	size_t got = 0;

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || st.st_size > (off_t)ERRFILE_MAX) {
		fd_close(fd);
		return NULL;
	}
	buf = malloc((size_t)st.st_size + 1);
	while (buf && got < (size_t)st.st_size) {
		n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	fd_close(fd);
	if (buf)
		buf[got] = '\0';
	return buf;
}

/* Fills message, traceback and timestamp from an error file; both the
 * nested form and the legacy flat {"message": str, "timestamp": ...}. */
static int parse_errfile(const char *text, struct agent_failure *f)
{
	cJSON *root = cJSON_Parse(text);
	cJSON *msg, *ts = NULL;
	int r = CRUN_EPROTO;

	if (!root)
		return CRUN_EPROTO;
	msg = cJSON_GetObjectItemCaseSensitive(root, "message");
	if (cJSON_IsObject(msg)) {
		cJSON *m = cJSON_GetObjectItemCaseSensitive(msg, "message");
		cJSON *extra = cJSON_GetObjectItemCaseSensitive(msg, "extraInfo");
		cJSON *cs = cJSON_GetObjectItemCaseSensitive(extra, "py_callstack");

		ts = cJSON_GetObjectItemCaseSensitive(extra, "timestamp");
		f->message = str_dup(cJSON_IsString(m) ? m->valuestring : "<N/A>");
		if (cJSON_IsString(cs))
			f->traceback = str_dup(cs->valuestring);
		r = 0;
	} else if (cJSON_IsString(msg)) {
		ts = cJSON_GetObjectItemCaseSensitive(root, "timestamp");
		f->message = str_dup(msg->valuestring);
		r = 0;
	}
	if (cJSON_IsString(ts)) {
		char *end;
		double t = strtod(ts->valuestring, &end);

		if (end != ts->valuestring && t > 0)
			f->timestamp = t;
	} else if (cJSON_IsNumber(ts) && ts->valuedouble > 0) {
		f->timestamp = ts->valuedouble;
	}
	cJSON_Delete(root);
	return r;
}

int errfile_record_failure(const struct worker *w, const struct failures_ctx *ctx,
			   struct agent_failure *ret)
{
	struct agent_failure f = {0};
	char buf[512];
	char *text = NULL;

	f.global_rank = w->global_rank;
	f.local_rank = w->local_rank;
	f.pid = w->pid;
	f.exec_err = w->exec_err;
	f.exitcode = w->term_sig ? -w->term_sig : w->exit_code;
	f.maybe_oom = w->term_sig == SIGKILL && !w->sigkilled_by_us;
	f.timestamp = w->exit_time;
	if (w->errfile[0] && (text = read_small_file(w->errfile)) && parse_errfile(text, &f) == 0)
		snprintf(f.errfile, sizeof(f.errfile), "%s", w->errfile);
	free(text);
	if (!f.message) {
		if (w->exec_err)
			snprintf(buf, sizeof(buf), "exec %s failed: %s", ctx->argv0,
				 strerror(w->exec_err));
		else if (w->term_sig == SIGKILL && f.maybe_oom)
			snprintf(buf, sizeof(buf),
				 "Signal %d (SIGKILL) received by PID %d (crun did not send it: "
				 "the kernel OOM killer may have killed it)",
				 w->term_sig, (int)w->pid);
		else if (w->term_sig)
			snprintf(buf, sizeof(buf), "Signal %d (%s) received by PID %d", w->term_sig,
				 supervise_signame(w->term_sig), (int)w->pid);
		else
			snprintf(buf, sizeof(buf), "%s", NO_TRACEBACK);
		f.message = str_dup(buf);
		f.stderr_tail = outputs_stderr_tail(ctx->out, w->local_rank, w->errfile);
	}
	if (!f.message) {
		errfile_failure_free(&f);
		return CRUN_ENOMEM;
	}
	*ret = f;
	return 0;
}

void errfile_failure_free(struct agent_failure *f)
{
	free(f->message);
	free(f->traceback);
	free(f->stderr_tail);
	f->message = f->traceback = f->stderr_tail = NULL;
}

int errfile_root_cause(const struct agent_failure *f, int n)
{
	int best = -1;

	for (int i = 0; i < n; i++)
		if (best < 0 || f[i].timestamp < f[best].timestamp)
			best = i;
	return best;
}

/* A growable text buffer for the summary. */
struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = MAX(b->cap * 2, b->len + n + 256);
		char *p = realloc(b->p, cap);

		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

/* Appends s with every "\n" turned into "\n  " (torchrun's indent). */
static void sb_indented(struct sbuf *b, const char *s)
{
	for (const char *p = s; *p; p++) {
		if (*p == '\n')
			sb_str(b, "\n  ");
		else
			sb_add(b, p, 1);
	}
}

static size_t widest_line(const char *s)
{
	size_t best = 0, cur = 0;

	for (const char *p = s; *p; p++) {
		if (*p == '\n') {
			best = MAX(best, cur);
			cur = 0;
		} else {
			cur++;
		}
	}
	return MAX(best, cur);
}

static void format_one(struct sbuf *b, int idx, const char *host, const struct agent_failure *f)
{
	char line[PATH_MAX + 64];
	char when[64] = "";
	time_t t = (time_t)f->timestamp;
	struct tm tm;

	if (localtime_r(&t, &tm))
		strftime(when, sizeof(when), "%Y-%m-%d_%H:%M:%S", &tm);
	snprintf(line, sizeof(line),
		 "[%d]:\n  time      : %s\n  host      : %s\n  rank      : %d (local_rank: %d)\n"
		 "  exitcode  : %d (pid: %d)\n  error_file: %s\n  traceback : ",
		 idx, when, host, f->global_rank, f->local_rank, f->exitcode, (int)f->pid,
		 f->errfile[0] ? f->errfile : "<N/A>");
	sb_str(b, line);
	sb_indented(b, f->traceback ? f->traceback : f->message);
	if (f->stderr_tail) {
		sb_str(b, "\n  stderr    : ");
		sb_indented(b, f->stderr_tail);
	}
}

char *errfile_format_summary(const char *entrypoint, const char *host,
			     const struct agent_failure *f, int n)
{
	struct sbuf root = {0}, others = {0}, out = {0};
	int ridx = errfile_root_cause(f, n);
	char title[512];
	size_t width;
	char rule[61];

	snprintf(title, sizeof(title), "%s FAILED", entrypoint);
	width = strlen(title);
	/* Failures are numbered in local-rank order, like torchrun's dict. */
	for (int lr = 0, idx = 0; lr <= CRUN_AGENT_MAX_LOCAL && idx < n; lr++) {
		for (int i = 0; i < n; i++) {
			struct sbuf one = {0};

			if (f[i].local_rank != lr)
				continue;
			format_one(&one, idx++, host, &f[i]);
			if (!one.p)
				continue;
			width = MAX(width, widest_line(one.p));
			if (i == ridx) {
				sb_str(&root, one.p);
			} else {
				if (others.len)
					sb_str(&others, "\n");
				sb_str(&others, one.p);
			}
			free(one.p);
		}
	}
	width = MIN(width, 60);
	memset(rule, '=', width);
	rule[width] = '\0';
	sb_str(&out, rule);
	sb_str(&out, "\n");
	sb_str(&out, title);
	sb_str(&out, "\n");
	memset(rule, '-', width);
	sb_str(&out, rule);
	sb_str(&out, "\nFailures:\n");
	sb_str(&out, others.len ? others.p : "  <NO_OTHER_FAILURES>");
	sb_str(&out, "\n");
	sb_str(&out, rule);
	sb_str(&out, "\nRoot Cause (first observed failure):\n");
	sb_str(&out, root.p ? root.p : "");
	sb_str(&out, "\n");
	memset(rule, '=', width);
	sb_str(&out, rule);
	sb_str(&out, "\n");
	free(root.p);
	free(others.p);
	if (out.oom) {
		free(out.p);
		return NULL;
	}
	return out.p;
}

/* torchrun runs --run-path's script in a function wrapped by @record
 * (elastic/multiprocessing/errors): faulthandler on, and an Exception (not
 * SystemExit) is written to $TORCHELASTIC_ERROR_FILE in the format above,
 * then raised again, so the exit status and the printed traceback stay
 * Python's own. A child python is the worker, so this is the same code as
 * source text. */
const char errfile_runpy_src[] =
    "import faulthandler, json, os, runpy, sys, time, traceback\n"
    "faulthandler.enable(all_threads=True)\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except Exception as e:\n"
    "    f = os.environ.get('TORCHELASTIC_ERROR_FILE')\n"
    "    if f:\n"
    "        with open(f, 'w') as fp:\n"
    "            json.dump({'message': {'message': '%s: %s' % (type(e).__name__, e),\n"
    "                       'extraInfo': {'py_callstack': traceback.format_exc(),\n"
    "                                     'timestamp': str(int(time.time()))}}}, fp)\n"
    "    raise\n";

int errfile_copy_root(const struct agent_failure *root, const char *path)
{
	char *text, *out;
	cJSON *j, *msg;
	int fd, r;

	if (!root->errfile[0])
		return 0; /* torchrun copies only an existing child error file */
	text = read_small_file(root->errfile);
	if (!text)
		return -errno;
	j = cJSON_Parse(text);
	free(text);
	if (!j)
		return CRUN_EPROTO;
	msg = cJSON_GetObjectItemCaseSensitive(j, "message");
	if (cJSON_IsObject(msg) && root->exitcode != 0) {
		cJSON_DeleteItemFromObjectCaseSensitive(msg, "errorCode");
		cJSON_AddNumberToObject(msg, "errorCode", root->exitcode);
	}
	out = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!out)
		return CRUN_ENOMEM;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		r = -errno;
		cJSON_free(out);
		return r;
	}
	r = fd_write_all(fd, out, strlen(out));
	fd_close(fd);
	cJSON_free(out);
	return r;
}

/* ---- the attempt's failures ---------------------------------------------------- */

int failures_add(struct agent_failures *fl, const struct worker *w, const struct failures_ctx *ctx)
{
	struct agent_failure *f = realloc(fl->failures, (size_t)(fl->nfailures + 1) * sizeof(*f));

	if (!f)
		return CRUN_ENOMEM;
	fl->failures = f;
	TRY(errfile_record_failure(w, ctx, &f[fl->nfailures]));
	fl->nfailures++;
	log_at(LL_ERROR, SUB_AGENT, "failed (exitcode: %d) local_rank: %d (pid: %d) of binary: %s",
	       f[fl->nfailures - 1].exitcode, w->local_rank, (int)w->pid, ctx->entrypoint);
	return 0;
}

void failures_report(const struct agent_failures *fl, const struct failures_ctx *ctx,
		     const char *own_errfile)
{
	int root = errfile_root_cause(fl->failures, fl->nfailures);
	char *msg;

	if (root < 0)
		return;
	msg = errfile_format_summary(ctx->entrypoint, ctx->host, fl->failures, fl->nfailures);
	/* After the workers' last teed lines, not in the middle of them. The
	 * job is over here; a stuck console holds it 2 s at most. */
	if (ctx->out)
		outputs_flush(ctx->out, 2000);
	if (msg) {
		fputs(msg, stderr);
		fflush(stderr);
		free(msg);
	}
	if (own_errfile && *own_errfile && errfile_copy_root(&fl->failures[root], own_errfile) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot copy the root cause to %s", own_errfile);
}

void failures_root_cause_line(const struct agent_failures *fl, const struct failures_ctx *ctx,
			      char *buf, size_t cap)
{
	int root = errfile_root_cause(fl->failures, fl->nfailures);
	const struct agent_failure *f;

	buf[0] = '\0';
	if (root < 0)
		return;
	f = &fl->failures[root];
	snprintf(buf, cap,
		 "node %s (group_rank %d): rank %d (local_rank %d, pid %d) exitcode %d: %s",
		 ctx->host, ctx->group_rank, f->global_rank, f->local_rank, (int)f->pid,
		 f->exitcode, f->message ? f->message : "");
	for (char *p = buf; *p; p++)
		if (*p == '\n')
			*p = ' ';
}

void failures_clear(struct agent_failures *fl)
{
	for (int i = 0; i < fl->nfailures; i++)
		errfile_failure_free(&fl->failures[i]);
	fl->nfailures = 0;
}

void failures_release(struct agent_failures *fl)
{
	failures_clear(fl);
	free(fl->failures);
	fl->failures = NULL;
}
