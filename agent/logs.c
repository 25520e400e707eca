/* logs.c: where worker output goes, as torchrun lays it out (torch-compat
 * §4.4, torch/distributed/elastic/multiprocessing/api.py DefaultLogsSpecs).
 *   - a stream neither redirected nor teed gets the caller's own fd (a
 *     terminal stays a terminal: isatty, \r progress, colours);
 *   - a rank left out by --local-ranks-filter and not redirected: /dev/null;
 *   - redirected: the worker writes <attempt>/<rank>/std{out,err}.log itself,
 *     so the file is whole and never waits for the agent;
 *   - teed: the worker writes a pipe; the agent appends what it reads to that
 *     same file at once (the file is whole and current: the failure summary
 *     reads it back), and tails the file to its console with the line prefix
 *     at the start of each line only, and, with --duplicate-std*-filters,
 *     matching lines to <attempt>/filtered_*.log. Tailing the file, not the
 *     pipe, lets a slow console lag without holding the worker. When the file
 *     cannot grow (a full or read-only file system: the worker writing it
 *     itself lost the console copy with the file, 0 of 64,528 lines shown),
 *     the agent says so once, naming the file, and copies the pipe straight
 *     to the console from then on.
 * Console copies go through console.c and never block the loop.
 */
#define _XOPEN_SOURCE_EXTENDED 1
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/console.h"
#include "agent/outputs.h"
#include "common/common.h"
#include "crun/agent.h" /* CRUN_STD_OUT, CRUN_STD_ERR */

/* Where one worker stream goes (the torchrun rules above). */
enum stream_mode {
	SM_DIRECT, /* the caller's own fd */
	SM_NULL,   /* /dev/null (--local-ranks-filter) */
	SM_FILE,   /* <attempt>/<rank>/std{out,err}.log, written by the worker */
	SM_TEE,	   /* a pipe the agent copies to that file, tailed to its console */
};

struct out_worker;

/* One of a worker's two output streams. */
struct agent_stream {
	struct agent_outputs *o; /* borrowed: the owner */
	struct out_worker *w;	 /* borrowed: the worker it is one of */
	int which;		 /* CRUN_STD_OUT or CRUN_STD_ERR */
	enum stream_mode mode;
	int child_fd; /* the worker's fd until spawned; owned when > 2 */
	int tail_fd;  /* SM_TEE: read side of the log file, or -1 */
	int pipe_fd;  /* SM_TEE: read end of the worker's pipe (nonblocking), or -1 */
	int file_fd;  /* SM_TEE: the log file the agent appends to, or -1 (failed) */
	struct event *pipe_ev;
	bool direct;	 /* the file failed: the console copy comes from the pipe */
	char *path;	 /* SM_TEE: the file tailed (malloc'd), or NULL */
	bool console;	 /* SM_TEE: copied to the agent's console */
	bool line_start; /* the next console byte starts a line */
	char *fline;	 /* duplicate filter: the current line (AGENT_LINE_MAX) */
	size_t flen;
	int fmatch; /* -1 undecided; else whether the rest of the line matches */
};

/* What one local rank's output holds for the current attempt. */
struct out_worker {
	int local_rank, global_rank;
	char prefix[128];
	struct agent_stream out, err;
};

struct agent_outputs {
	struct outputs_config cfg;  /* its pointers borrowed */
	struct out_worker *workers; /* cfg.nworkers */
	char attempt_dir[PATH_MAX]; /* "": no files */
	int group_rank;		    /* of the current attempt */
	struct agent_console *console;
	struct event *tail_more; /* a timer: the console was slow */
	bool log_write_warned;	 /* a log file could not be written: told once */
	char *filters[2];	 /* duplicate filters, stdout/stderr, or NULL */
	int nfilters[2];
	int filt_fd[2]; /* <attempt>/filtered_std{out,err}.log, or -1 */
};

int logs_render_prefix(const char *tmpl, const char *role, const char *host, int rank,
		       int local_rank, int group_rank, char *buf, size_t cap)
{
	static const char *const names[] = {"role_name",  "rank",      "local_rank",
					    "group_rank", "node_rank", "hostname"};
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
		else if (which == 3 || which == 4)
			snprintf(val, sizeof(val), "%d", group_rank);
		else if (which == 5) /* torchrun: socket.gethostname(), short */
			snprintf(val, sizeof(val), "%s", host);
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

/* ---- the failure summary's stderr lines ---------------------------------------- */

char *outputs_stderr_tail(const struct agent_outputs *o, int local_rank, const char *errfile)
{
	enum { TAIL_BYTES = AGENT_RING_LINES * AGENT_RING_LINE };
	char path[PATH_MAX], *buf, *start;
	const char *slash = strrchr(errfile, '/');
	const struct agent_stream *err;
	struct stat st;
	ssize_t n;
	int fd, lines = 0;

	if (!o || local_rank < 0 || local_rank >= o->cfg.nworkers)
		return NULL;
	err = &o->workers[local_rank].err;
	/* Only a stream the worker wrote to a file can be read back; one that
	 * went to the caller's terminal is already on the user's screen. */
	if (!slash || !(err->mode == SM_FILE || err->mode == SM_TEE))
		return NULL;
	if (str_printf(path, sizeof(path), "%.*s/stderr.log", (int)(slash - errfile), errfile) < 0)
		return NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	buf = malloc(TAIL_BYTES + 1);
	if (!buf || fstat(fd, &st) < 0)
		goto fail;
	n = pread(fd, buf, TAIL_BYTES, st.st_size > TAIL_BYTES ? st.st_size - TAIL_BYTES : 0);
	if (n <= 0)
		goto fail;
	while (n > 0 && buf[n - 1] == '\n')
		n--;
	buf[n] = '\0';
	start = buf + n;
	while (start > buf && lines < AGENT_RING_LINES)
		if (*--start == '\n' && ++lines == AGENT_RING_LINES)
			start++;
	if (n == 0)
		goto fail;
	memmove(buf, start, strlen(start) + 1);
	fd_close(fd);
	return buf;
fail:
	free(buf);
	fd_close(fd);
	return NULL;
}

/* ---- tailing teed files ----------------------------------------------------------- */

enum { TAIL_CHUNK = 65536, TAIL_ROUNDS = 16 };

/* Duplicate filters: torchrun's "a,b" list where ",," is a literal comma,
 * kept as '\0'-separated needles; *ret_n counts them. */
static char *parse_filters(const char *spec, int *ret_n)
{
	size_t len = strlen(spec), o = 0;
	char *out = calloc(len + 1, 1);
	int n = 1;

	if (!out)
		return NULL;
	for (const char *p = spec; *p; p++) {
		if (p[0] == ',' && p[1] == ',') {
			out[o++] = ',';
			p++;
		} else if (*p == ',') {
			out[o++] = '\0';
			n++;
		} else {
			out[o++] = *p;
		}
	}
	*ret_n = n;
	return out;
}

/* torchrun's any(needle in line for needle in filters). */
static bool filter_match(const char *needles, int n, const char *line, size_t len)
{
	for (const char *p = needles; n-- > 0; p += strlen(p) + 1)
		if (memmem(line, len, p, strlen(p)))
			return true;
	return false;
}

static const char *const filt_names[2] = {"filtered_stdout.log", "filtered_stderr.log"};

/* A log file the agent writes failed (ENOSPC, EROFS, EDQUOT, ...): said once
 * per agent, naming the file; the caller stops writing that file. */
static void write_failed(struct agent_outputs *o, const char *path, int r)
{
	if (o->log_write_warned)
		return;
	o->log_write_warned = true;
	log_at(LL_WARN, SUB_AGENT,
	       "cannot write '%s': %s; log files stop growing here, teed output still "
	       "goes to the console",
	       path, strerror(-r));
}

static void filter_write(struct agent_stream *s, const char *p, size_t n)
{
	int *fd = &s->o->filt_fd[s->which == CRUN_STD_ERR];
	int r;

	if (*fd < 0)
		return;
	r = fd_write_all(*fd, p, n);
	if (r < 0) {
		write_failed(s->o, filt_names[s->which == CRUN_STD_ERR], r);
		fd_close(*fd);
		*fd = -1;
	}
}

/* Feeds bytes to the duplicate filter: a line is decided when complete, or
 * on its first AGENT_LINE_MAX bytes when longer; a matching line is written
 * whole, prefixed, whatever its length. */
static void filter_feed(struct agent_stream *s, const char *p, size_t n, bool eof)
{
	const char *needles = s->o->filters[s->which == CRUN_STD_ERR];
	int nn = s->o->nfilters[s->which == CRUN_STD_ERR];

	if (!needles || !s->fline)
		return;
	while (n || (eof && s->flen)) {
		const char *nl = n ? memchr(p, '\n', n) : NULL;
		size_t take = nl ? (size_t)(nl - p) + 1 : n;

		if (s->fmatch < 0) {
			size_t room = AGENT_LINE_MAX - s->flen;
			size_t c = MIN(take, room);

			if (c) /* p is NULL at EOF */
				memcpy(s->fline + s->flen, p, c);
			s->flen += c;
			if (nl && c == take) { /* a whole line: decide, emit, reset */
				if (filter_match(needles, nn, s->fline, s->flen)) {
					filter_write(s, s->w->prefix, strlen(s->w->prefix));
					filter_write(s, s->fline, s->flen);
				}
				s->flen = 0;
			} else if (s->flen == AGENT_LINE_MAX || (eof && n == c)) {
				s->fmatch = filter_match(needles, nn, s->fline, s->flen);
				if (s->fmatch) {
					filter_write(s, s->w->prefix, strlen(s->w->prefix));
					filter_write(s, s->fline, s->flen);
				}
				s->flen = 0;
				if (eof && n == c)
					s->fmatch = -1;
			}
			p += c;
			n -= c;
			continue;
		}
		if (s->fmatch)
			filter_write(s, p, take);
		if (nl)
			s->fmatch = -1;
		p += take;
		n -= take;
	}
}

/* Copies a chunk to the console, the prefix at each line start only. Puts
 * are cut at line ends, so a full queue drops whole lines. */
static void console_feed(struct agent_stream *s, const char *p, size_t n)
{
	enum { OUT_CAP = TAIL_CHUNK + 4096 };
	struct agent_console *c = s->o->console;
	size_t plen = strlen(s->w->prefix), o = 0;
	bool out_starts = s->line_start;
	char *out;

	if (!s->console || !c)
		return;
	out = malloc(OUT_CAP);
	if (!out)
		return;
	while (n) {
		const char *nl = memchr(p, '\n', n);
		size_t take = nl ? (size_t)(nl - p) + 1 : n;

		if (o && o + plen + take > OUT_CAP) { /* flush what we have first */
			console_put(c, s->which, out, o, out_starts);
			o = 0;
		}
		if (o == 0)
			out_starts = s->line_start;
		if (s->line_start) {
			memcpy(out + o, s->w->prefix, plen);
			o += plen;
		}
		if (o + take > OUT_CAP) { /* a line longer than the buffer: as is */
			console_put(c, s->which, out, o, out_starts);
			console_put(c, s->which, p, take, false);
			o = 0;
		} else {
			memcpy(out + o, p, take);
			o += take;
		}
		s->line_start = nl != NULL;
		p += take;
		n -= take;
	}
	if (o)
		console_put(c, s->which, out, o, out_starts);
	free(out);
}

enum pump_mode {
	PUMP_LIVE,  /* the loop: retry later while a reader is slow, not stalled */
	PUMP_FORCE, /* a full queue drops (counted); 64 MiB of reads at most */
	PUMP_BLOCK, /* the end: wait for a reader that progresses, to a deadline */
};

/* Whether the console of `which` took no byte for AGENT_CONSOLE_STALL_MS
 * while it had some queued: then lines are dropped, not waited for. */
static bool console_stalled(struct agent_outputs *o, int which)
{
	uint64_t stalled_ms = 0;

	(void)console_room(o->console, which, &stalled_ms);
	return stalled_ms >= AGENT_CONSOLE_STALL_MS;
}

/* Reads up to `rounds` chunks of a teed file; true when more may be left
 * (*ret_waiting: because the console is slow). */
static bool tail_pump(struct agent_stream *s, int rounds, enum pump_mode mode, uint64_t until_ms,
		      bool *ret_waiting)
{
	enum { NEED = TAIL_CHUNK + 8192 }; /* a chunk with its prefixes */
	const bool at_end = mode == PUMP_BLOCK;
	bool more = false;
	int forced = 0;
	char *buf;

	if (s->tail_fd < 0)
		return false;
	buf = malloc(TAIL_CHUNK);
	if (!buf)
		return false;
	for (int i = 0; i < rounds; i++) {
		ssize_t n;

		/* Wait while the reader makes progress; a stalled one (or the
		 * deadline) turns waiting into dropping. */
		while (mode == PUMP_BLOCK && s->console &&
		       console_room(s->o->console, s->which, NULL) < NEED) {
			if (console_stalled(s->o, s->which) || clock_now_ms() >= until_ms)
				mode = PUMP_FORCE;
			else
				(void)console_wait_room(s->o->console, s->which, NEED,
							MIN(until_ms, clock_now_ms() + 100));
		}
		if (mode == PUMP_LIVE && s->console &&
		    console_room(s->o->console, s->which, NULL) < NEED &&
		    !console_stalled(s->o, s->which)) {
			*ret_waiting = more = true;
			break;
		}
		if (mode == PUMP_FORCE && ++forced > 1024) { /* 64 MiB: enough */
			more = true;
			break;
		}
		n = read(s->tail_fd, buf, TAIL_CHUNK);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		console_feed(s, buf, (size_t)n);
		filter_feed(s, buf, (size_t)n, false);
		more = i == rounds - 1;
	}
	if (!more && at_end)
		filter_feed(s, NULL, 0, true);
	free(buf);
	if (more && at_end && s->console && s->path) {
		char note[PATH_MAX + 64];
		int n = snprintf(note, sizeof(note), "%s[crun: the rest is in %s]\n",
				 s->line_start ? "" : "\n", s->path);

		/* Closing with more than the bound left: say where it is. */
		console_put(s->o->console, s->which, note, (size_t)MIN(n, (int)sizeof(note) - 1),
			    false);
	}
	return more;
}

static void pump_all(struct agent_outputs *o)
{
	bool more = false, waiting = false;

	for (int i = 0; i < o->cfg.nworkers; i++) {
		more |= tail_pump(&o->workers[i].out, TAIL_ROUNDS, PUMP_LIVE, 0, &waiting);
		more |= tail_pump(&o->workers[i].err, TAIL_ROUNDS, PUMP_LIVE, 0, &waiting);
	}
	/* Bounded work per callback: come back on the next loop iteration, or
	 * a little later when a slow console is what holds us. */
	if (more) {
		struct timeval tv = {0, waiting ? 20 * 1000 : 0};

		evtimer_add(o->tail_more, &tv);
	}
}

static void on_tail_more(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	pump_all(arg);
}

/* Appends p to the stream's log file; returns how many bytes of it the file
 * did not take (it failed, and is closed: told once). */
static size_t file_put(struct agent_stream *s, const char *p, size_t n)
{
	while (n && s->file_fd >= 0) {
		ssize_t w = write(s->file_fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			write_failed(s->o, s->path, w < 0 ? -errno : CRUN_ENOSPC);
			fd_close(s->file_fd);
			s->file_fd = -1;
			break;
		}
		p += w;
		n -= (size_t)w;
	}
	return n;
}

/* Moves up to `rounds` chunks of what the worker wrote from its pipe to the
 * file (the console copy follows through the file's tail); once the file
 * failed, straight to the console. True when more may be left. */
static bool pipe_pump(struct agent_stream *s, int rounds)
{
	bool more = false, waiting = false;
	char *buf;

	if (s->pipe_fd < 0)
		return false;
	buf = malloc(TAIL_CHUNK);
	if (!buf)
		return false;
	for (int i = 0; i < rounds; i++) {
		ssize_t n = read(s->pipe_fd, buf, TAIL_CHUNK);
		size_t left;

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 && s->pipe_ev) /* EOF stays readable: stop looking */
			event_del(s->pipe_ev);
		if (n <= 0)
			break;
		left = file_put(s, buf, (size_t)n);
		if (left && !s->direct) {
			/* What the file took goes to the console first, in order. */
			(void)tail_pump(s, INT_MAX, PUMP_FORCE, 0, &waiting);
			s->direct = true;
		}
		if (s->direct) {
			console_feed(s, buf + n - left, left);
			filter_feed(s, buf + n - left, left, false);
		}
		more = i == rounds - 1;
	}
	free(buf);
	return more;
}

/* Everything the worker wrote so far, into the file: bounded (a grandchild
 * may hold the pipe and keep writing), 64 MiB at most. */
static void pipe_drain(struct agent_stream *s)
{
	for (int i = 0; i < 64 && pipe_pump(s, TAIL_ROUNDS); i++)
		;
}

static void on_pipe(evutil_socket_t fd, short what, void *arg)
{
	struct agent_stream *s = arg;

	(void)fd;
	(void)what;
	/* Level-triggered: what is left comes on the next loop iteration. */
	(void)pipe_pump(s, TAIL_ROUNDS);
	pump_all(s->o);
}

/* ---- per worker stream ---------------------------------------------------------- */

/* A stream holding nothing (closed or never opened). */
static void stream_reset(struct agent_stream *s)
{
	memset(s, 0, sizeof(*s));
	s->child_fd = s->tail_fd = s->pipe_fd = s->file_fd = -1;
	s->mode = SM_DIRECT;
}

/* A teed stream: the worker's pipe, read on the loop into s->file_fd
 * (open), and the file's tail for the console. */
static int open_tee(struct agent_outputs *o, struct agent_stream *s, const char *path)
{
	int p[2];

	s->path = str_dup(path);
	if (!s->path)
		return CRUN_ENOMEM;
	s->tail_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (s->tail_fd < 0)
		return -errno;
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	s->pipe_fd = p[0];
	s->child_fd = p[1];
	/* A bigger pipe: a chatty worker waits less while the loop is busy. */
	(void)fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
	TRY(fd_set_nonblock(p[0], true));
	s->pipe_ev = event_new(o->cfg.base, p[0], EV_READ | EV_PERSIST, on_pipe, s);
	if (!s->pipe_ev || event_add(s->pipe_ev, NULL) < 0)
		return CRUN_ENOMEM;
	if (o->filters[s->which == CRUN_STD_ERR]) {
		s->fline = malloc(AGENT_LINE_MAX);
		if (!s->fline)
			return CRUN_ENOMEM;
	}
	return 0;
}

static int open_stream(struct agent_outputs *o, struct out_worker *w, struct agent_stream *s,
		       int which)
{
	const char *attempt_dir = o->attempt_dir;
	int r_mask = o->cfg.redirects ? o->cfg.redirects[w->local_rank] : 0;
	int t_mask = o->cfg.tee ? o->cfg.tee[w->local_rank] : 0;
	bool shown = !o->cfg.console_ranks || o->cfg.console_ranks[w->local_rank];
	char path[PATH_MAX];

	s->o = o;
	s->w = w;
	s->which = which;
	s->line_start = true;
	s->fmatch = -1;
	s->flen = 0;
	/* torchrun: a tee implies the redirect; --log_dir=/dev/null has no
	 * files at all, so everything stays on the console. */
	if (!attempt_dir[0] || !((r_mask | t_mask) & which)) {
		s->mode = shown ? SM_DIRECT : SM_NULL;
		if (shown) {
			s->child_fd = which == CRUN_STD_OUT ? STDOUT_FILENO : STDERR_FILENO;
			return 0;
		}
		s->child_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
		return s->child_fd < 0 ? -errno : 0;
	}
	TRY(str_printf(path, sizeof(path), "%s/%d/%s", attempt_dir, w->local_rank,
		       which == CRUN_STD_OUT ? "stdout.log" : "stderr.log"));
	s->file_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
	if (s->file_fd < 0)
		return -errno;
	s->mode = SM_FILE;
	if (t_mask & which) {
		s->mode = SM_TEE;
		s->console = shown;
	}
	/* Redirected only, or a teed rank left out by the filter with no
	 * duplicate filter: file only, written by the worker (torchrun). */
	if (!(t_mask & which) || (!shown && !o->filters[which == CRUN_STD_ERR])) {
		s->child_fd = s->file_fd;
		s->file_fd = -1;
		return 0;
	}
	return open_tee(o, s, path);
}

int outputs_open_worker(struct agent_outputs *o, int local_rank, int global_rank, int *ret_out_fd,
			int *ret_err_fd)
{
	const char *tmpl = o->cfg.line_prefix_template;
	struct out_worker *w = &o->workers[local_rank];

	if (!tmpl || !*tmpl)
		tmpl = "[${role_name}${local_rank}]:";
	w->local_rank = local_rank;
	w->global_rank = global_rank;
	if (logs_render_prefix(tmpl, o->cfg.role, o->cfg.host, global_rank, local_rank,
			       o->group_rank, w->prefix, sizeof(w->prefix)) < 0)
		w->prefix[0] = '\0';
	stream_reset(&w->out);
	stream_reset(&w->err);
	TRY(open_stream(o, w, &w->out, CRUN_STD_OUT));
	TRY(open_stream(o, w, &w->err, CRUN_STD_ERR));
	*ret_out_fd = w->out.child_fd;
	*ret_err_fd = w->err.child_fd;
	return 0;
}

static void drop_child_fd(struct agent_stream *s)
{
	if (s->child_fd > STDERR_FILENO)
		fd_close(s->child_fd);
	s->child_fd = -1;
}

void outputs_after_spawn(struct agent_outputs *o, int local_rank)
{
	drop_child_fd(&o->workers[local_rank].out);
	drop_child_fd(&o->workers[local_rank].err);
}

void outputs_drain_worker(struct agent_outputs *o, int local_rank)
{
	/* The file is whole before the failure summary reads it back. */
	pipe_drain(&o->workers[local_rank].out);
	pipe_drain(&o->workers[local_rank].err);
	pump_all(o); /* what is left follows on the timer until the close */
}

static void close_stream(struct agent_stream *s)
{
	bool waiting = false;

	/* The end of an attempt: what is in the pipe goes to the file; then
	 * wait for a reader that keeps reading, for AGENT_CONSOLE_FLUSH_MS at
	 * most (on the loop too: a stalled reader costs it
	 * AGENT_CONSOLE_STALL_MS once); then drop, 64 MiB of reads at most. */
	pipe_drain(s);
	(void)tail_pump(s, INT_MAX, PUMP_BLOCK, clock_now_ms() + AGENT_CONSOLE_FLUSH_MS, &waiting);
	drop_child_fd(s);
	if (s->pipe_ev)
		event_free(s->pipe_ev);
	s->pipe_ev = NULL;
	fd_close(s->pipe_fd);
	fd_close(s->file_fd);
	fd_close(s->tail_fd);
	s->pipe_fd = s->file_fd = s->tail_fd = -1;
	free(s->fline);
	s->fline = NULL;
	free(s->path);
	s->path = NULL;
}

/* ---- the outputs object --------------------------------------------------------- */

static void close_filtered(struct agent_outputs *o)
{
	for (int i = 0; i < 2; i++) {
		fd_close(o->filt_fd[i]);
		o->filt_fd[i] = -1;
	}
}

int outputs_open_attempt(struct agent_outputs *o, const char *attempt_dir, int group_rank)
{
	TRY(str_printf(o->attempt_dir, sizeof(o->attempt_dir), "%s", attempt_dir));
	o->group_rank = group_rank;
	for (int i = 0; i < 2; i++) {
		char path[PATH_MAX];

		if (!o->filters[i] || !attempt_dir[0])
			continue;
		TRY(str_printf(path, sizeof(path), "%s/%s", attempt_dir, filt_names[i]));
		o->filt_fd[i] =
		    open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
		if (o->filt_fd[i] < 0)
			return -errno;
	}
	/* Last attempt's streams were closed by outputs_close_attempt. */
	for (int i = 0; i < o->cfg.nworkers; i++) {
		stream_reset(&o->workers[i].out);
		stream_reset(&o->workers[i].err);
	}
	return 0;
}

void outputs_close_attempt(struct agent_outputs *o)
{
	if (!o)
		return;
	for (int i = 0; i < o->cfg.nworkers; i++) {
		close_stream(&o->workers[i].out);
		close_stream(&o->workers[i].err);
	}
	close_filtered(o);
}

int outputs_new(const struct outputs_config *cfg, struct agent_outputs **ret)
{
	const char *spec[2] = {cfg->stdout_filters, cfg->stderr_filters};
	struct agent_outputs *o = calloc(1, sizeof(*o));

	if (!o)
		return CRUN_ENOMEM;
	o->cfg = *cfg;
	o->filt_fd[0] = o->filt_fd[1] = -1;
	o->workers = calloc((size_t)MAX(cfg->nworkers, 1), sizeof(*o->workers));
	if (!o->workers)
		goto fail;
	for (int i = 0; i < cfg->nworkers; i++) {
		stream_reset(&o->workers[i].out);
		stream_reset(&o->workers[i].err);
	}
	for (int i = 0; i < 2; i++)
		if (spec[i] && *spec[i] &&
		    !(o->filters[i] = parse_filters(spec[i], &o->nfilters[i])))
			goto fail;
	o->tail_more = evtimer_new(cfg->base, on_tail_more, o);
	if (!o->tail_more)
		goto fail;
	*ret = o;
	return 0;
fail:
	outputs_free(o);
	return CRUN_ENOMEM;
}

int outputs_start_console(struct agent_outputs *o, bool loop)
{
	return console_new(loop ? o->cfg.base : NULL, STDOUT_FILENO, STDERR_FILENO,
			   AGENT_CONSOLE_BYTES, &o->console);
}

void outputs_flush(struct agent_outputs *o, uint32_t timeout_ms)
{
	uint64_t until = clock_now_ms() + timeout_ms;
	bool waiting = false;

	for (int i = 0; i < o->cfg.nworkers; i++) {
		pipe_drain(&o->workers[i].out);
		pipe_drain(&o->workers[i].err);
		(void)tail_pump(&o->workers[i].out, INT_MAX, PUMP_BLOCK, until, &waiting);
		(void)tail_pump(&o->workers[i].err, INT_MAX, PUMP_BLOCK, until, &waiting);
	}
	(void)console_flush(o->console,
			    (uint32_t)(until > clock_now_ms() ? until - clock_now_ms() : 0));
}

void outputs_free(struct agent_outputs *o)
{
	if (!o)
		return;
	if (o->tail_more)
		event_free(o->tail_more);
	o->tail_more = NULL;
	/* Streams still open (an agent freed mid-attempt) close first: their
	 * rest goes to the console before it is flushed. */
	if (o->workers)
		outputs_close_attempt(o);
	else
		close_filtered(o);
	console_free(o->console, AGENT_CONSOLE_FLUSH_MS);
	for (int i = 0; i < 2; i++)
		free(o->filters[i]);
	free(o->workers);
	free(o);
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
