/* logs.c: worker output. Each worker's stdout and stderr come through their own
 * nonblocking pipe, read on the loop and cut into whole lines, so lines of
 * different workers never interleave mid-line. A line goes to the worker's
 * log file when redirected or teed (torchrun's layout, torch-compat §4.4), to
 * the agent's own stdout/stderr unless redirected-only or filtered out, with
 * the tee prefix ("[default0]:") when teed. The last stderr lines of every
 * worker are kept for the failure summary.
 */
#define _XOPEN_SOURCE_EXTENDED 1
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "common/common.h"

int logs_render_prefix(const char *tmpl, const char *role, int rank, int local_rank, int group_rank,
		       char *buf, size_t cap)
{
	static const char *const names[] = {"role_name", "rank", "local_rank", "group_rank",
					    "node_rank"};
	size_t o = 0;

	if (cap == 0)
		return CRUN_ENOSPC;
	for (const char *p = tmpl; *p;) {
		char val[64];
		size_t vlen;
		int which = -1;
		size_t skip = 0;

		if (p[0] == '$' && p[1] == '$') {
			val[0] = '$';
			val[1] = '\0';
			skip = 2;
		} else if (p[0] == '$') {
			bool braced = p[1] == '{';
			const char *n = p + 1 + braced;
			size_t best = 0;

			/* Longest identifier match, as string.Template reads one. */
			for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
				size_t l = strlen(names[i]);

				if (strncmp(n, names[i], l) == 0 && l > best &&
				    (braced ? n[l] == '}'
					    : !(n[l] == '_' || (n[l] >= 'a' && n[l] <= 'z') ||
						(n[l] >= 'A' && n[l] <= 'Z') ||
						(n[l] >= '0' && n[l] <= '9')))) {
					best = l;
					which = (int)i;
				}
			}
			if (which >= 0)
				skip = 1 + braced + best + braced;
		}
		if (which == 0)
			snprintf(val, sizeof(val), "%s", role);
		else if (which == 1)
			snprintf(val, sizeof(val), "%d", rank);
		else if (which == 2)
			snprintf(val, sizeof(val), "%d", local_rank);
		else if (which >= 3)
			snprintf(val, sizeof(val), "%d", group_rank);
		if (!skip) { /* a plain character (or an unknown $name, kept as is) */
			val[0] = *p;
			val[1] = '\0';
			skip = 1;
		}
		vlen = strlen(val);
		if (o + vlen >= cap)
			return CRUN_ETOOBIG;
		memcpy(buf + o, val, vlen);
		o += vlen;
		p += skip;
	}
	buf[o] = '\0';
	return 0;
}

static void ring_push(struct worker *w, const char *line, size_t len)
{
	char *slot = w->ring[w->ring_head];

	if (len >= AGENT_RING_LINE)
		len = AGENT_RING_LINE - 1;
	memcpy(slot, line, len);
	slot[len] = '\0';
	w->ring_head = (w->ring_head + 1) % AGENT_RING_LINES;
	if (w->ring_n < AGENT_RING_LINES)
		w->ring_n++;
}

char *logs_stderr_tail(const struct worker *w)
{
	size_t cap = (size_t)AGENT_RING_LINES * (AGENT_RING_LINE + 1) + 1, o = 0;
	char *out;

	if (w->ring_n == 0)
		return NULL;
	out = malloc(cap);
	if (!out)
		return NULL;
	for (int i = 0; i < w->ring_n; i++) {
		int idx = (w->ring_head - w->ring_n + i + AGENT_RING_LINES) % AGENT_RING_LINES;
		size_t l = strlen(w->ring[idx]);

		if (i)
			out[o++] = '\n';
		memcpy(out + o, w->ring[idx], l);
		o += l;
	}
	out[o] = '\0';
	return out;
}

static void emit_line(struct agent_stream *s, const char *line, size_t len)
{
	if (s->file_fd >= 0) {
		if (fd_write_all(s->file_fd, line, len) < 0 ||
		    fd_write_all(s->file_fd, "\n", 1) < 0)
			log_at(LL_WARN, SUB_AGENT, "worker log file: %s", strerror(errno));
	}
	if (s->which == CRUN_STD_ERR)
		ring_push(s->w, line, len);
	if (s->console) {
		static char out[sizeof(((struct worker *)0)->prefix) + AGENT_LINE_MAX + 1];
		size_t o = 0;

		if (s->prefixed) {
			size_t pl = strlen(s->w->prefix);

			memcpy(out, s->w->prefix, pl);
			o = pl;
		}
		memcpy(out + o, line, len);
		o += len;
		out[o++] = '\n';
		/* One write per line keeps lines whole on the agent's stream. */
		if (fd_write_all(s->which == CRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO, out, o) <
		    0)
			return;
	}
}

/* Emits every whole line in the buffer; a line that fills the buffer is
 * emitted in pieces; at EOF the rest is emitted as a last line. */
static void flush_lines(struct agent_stream *s, bool eof)
{
	size_t start = 0;

	for (;;) {
		char *nl = memchr(s->buf + start, '\n', s->len - start);

		if (!nl)
			break;
		emit_line(s, s->buf + start, (size_t)(nl - (s->buf + start)));
		start = (size_t)(nl - s->buf) + 1;
	}
	if (start == 0 && s->len == sizeof(s->buf)) {
		emit_line(s, s->buf, s->len);
		start = s->len;
	}
	if (eof && start < s->len) {
		emit_line(s, s->buf + start, s->len - start);
		start = s->len;
	}
	memmove(s->buf, s->buf + start, s->len - start);
	s->len -= start;
}

static void stream_close_fd(struct agent_stream *s)
{
	if (s->ev) {
		event_free(s->ev);
		s->ev = NULL;
	}
	fd_close(s->fd);
	s->fd = -1;
}

/* Reads until EAGAIN or EOF; bounded so one chatty worker cannot starve the
 * loop (the event fires again while data remains). */
static void stream_read(struct agent_stream *s)
{
	for (int round = 0; round < 64 && s->fd >= 0; round++) {
		ssize_t n = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			flush_lines(s, true);
			stream_close_fd(s);
			return;
		}
		s->len += (size_t)n;
		flush_lines(s, false);
	}
}

static void on_pipe(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	stream_read(arg);
}

static int open_stream(struct crun_agent *a, struct worker *w, struct agent_stream *s, int which,
		       const char *attempt_dir, int *ret_wr)
{
	int r_mask = a->cfg.redirects ? a->cfg.redirects[w->local_rank] : 0;
	int t_mask = a->cfg.tee ? a->cfg.tee[w->local_rank] : 0;
	int p[2];

	s->a = a;
	s->w = w;
	s->which = which;
	s->len = 0;
	s->file_fd = -1;
	if (attempt_dir[0] && ((r_mask | t_mask) & which)) {
		char path[PATH_MAX];

		TRY(str_printf(path, sizeof(path), "%s/%d/%s", attempt_dir, w->local_rank,
			       which == CRUN_STD_OUT ? "stdout.log" : "stderr.log"));
		s->file_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
		if (s->file_fd < 0)
			return -errno;
	}
	s->console = !(r_mask & which) || (t_mask & which);
	if (a->cfg.console_ranks && !a->cfg.console_ranks[w->local_rank])
		s->console = false;
	s->prefixed = (t_mask & which) != 0;
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	s->fd = p[0];
	*ret_wr = p[1];
	if (fd_set_nonblock(s->fd, true) < 0)
		return CRUN_EIO;
	s->ev = event_new(a->base, s->fd, EV_READ | EV_PERSIST, on_pipe, s);
	if (!s->ev || event_add(s->ev, NULL) < 0)
		return CRUN_ENOMEM;
	return 0;
}

int logs_open_worker(struct crun_agent *a, struct worker *w, const char *attempt_dir,
		     int *ret_out_wr, int *ret_err_wr)
{
	const char *tmpl = a->cfg.line_prefix_template;
	int r;

	if (!tmpl || !*tmpl)
		tmpl = "[${role_name}${local_rank}]:";
	if (logs_render_prefix(tmpl, a->role, w->global_rank, w->local_rank, a->group_rank,
			       w->prefix, sizeof(w->prefix)) < 0)
		w->prefix[0] = '\0';
	r = open_stream(a, w, &w->out, CRUN_STD_OUT, attempt_dir, ret_out_wr);
	if (r < 0)
		return r;
	return open_stream(a, w, &w->err, CRUN_STD_ERR, attempt_dir, ret_err_wr);
}

void logs_drain_worker(struct crun_agent *a, struct worker *w)
{
	(void)a;
	if (w->out.fd >= 0)
		stream_read(&w->out);
	if (w->err.fd >= 0)
		stream_read(&w->err);
}

static void close_stream(struct agent_stream *s)
{
	if (s->fd >= 0)
		stream_read(s);
	if (s->len)
		flush_lines(s, true);
	stream_close_fd(s);
	fd_close(s->file_fd);
	s->file_fd = -1;
}

void logs_close_worker(struct crun_agent *a, struct worker *w)
{
	(void)a;
	close_stream(&w->out);
	close_stream(&w->err);
}

int logs_mkdirs(const char *path)
{
	char buf[PATH_MAX];

	TRY(str_printf(buf, sizeof(buf), "%s", path));
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

int logs_rmtree(const char *path)
{
	if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) < 0)
		return errno == ENOENT ? 0 : -errno;
	return 0;
}
