/* common.h: the leaf module every other module builds on: error helpers,
 * levelled logging, checked number parsing, the monotonic clock and small fd
 * helpers. It includes nothing else from crun but the public crun.h.
 */
#ifndef CRUN_COMMON_H
#define CRUN_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "crun/crun.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b)     ((a) < (b) ? (a) : (b))
#define MAX(a, b)     ((a) > (b) ? (a) : (b))
#define WARN_UNUSED   __attribute__((warn_unused_result))

/* ---- logging ------------------------------------------------------------ */

enum log_subsys {
	SUB_AGENT = 1u << 0,
	SUB_RDZV = 1u << 1,
	SUB_STORE = 1u << 2,
	SUB_PG = 1u << 3,
	SUB_CUDA = 1u << 4,
	SUB_CMD = 1u << 5,
	SUB_ALL = 0xffu,
};

#define LL_ERROR CRUN_LOG_ERROR
#define LL_WARN	 CRUN_LOG_WARN
#define LL_INFO	 CRUN_LOG_INFO
#define LL_DEBUG CRUN_LOG_DEBUG
#define LL_TRACE CRUN_LOG_TRACE

/* The log level and subsystem mask are the one piece of process-wide mutable
 * state outside cmd/: they are set once at start-up (log_init reads
 * CRUN_LOG_LEVEL and CRUN_LOG_SUBSYS) and only read afterwards. */
extern int log_max_level;
extern unsigned log_subsys_mask;

/* Reads CRUN_LOG_LEVEL (error|warn|info|debug|trace) and CRUN_LOG_SUBSYS
 * (comma list of agent,rdzv,store,pg,cuda,cmd or all). `prog` prefixes lines.
 * When $JOURNAL_STREAM names stderr (systemd), lines carry "<N>" priorities. */
void log_init(const char *prog, int default_level);
/* True when journal_stream ("dev:ino") is the stream stderr is connected to. */
bool log_stderr_is_journal(const char *journal_stream);
void log_emit(int level, unsigned sub, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Level and mask are checked before any argument is formatted. */
#define log_at(lvl, sub, ...)                                          \
	((int)(lvl) <= log_max_level && ((sub)&log_subsys_mask)        \
	     ? log_emit((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__) \
	     : (void)0)

/* Log at ERROR with the code's text appended, then yield the code:
 *     return log_fail(SUB_STORE, r, "cannot listen on port %u", port);  */
#define log_fail(sub, r, fmt, ...) \
	(log_at(LL_ERROR, (sub), fmt ": %s", ##__VA_ARGS__, crun_strerror(r)), (r))

/* The only control-flow macro: use it where there is nothing to clean up. */
#define TRY(expr)                                                                  \
	do {                                                                       \
		int try_r_ = (expr);                                               \
		if (try_r_ < 0) {                                                  \
			log_at(LL_TRACE, SUB_ALL, "-> %s", crun_err_name(try_r_)); \
			return try_r_;                                             \
		}                                                                  \
	} while (0)

/* ---- number parsing (nothing else in crun parses integers) --------------- */

/* Whole-string decimal parse; no sign for unsigned, no junk, no overflow.
 * Returns 0 or CRUN_EINVAL / CRUN_ERANGE; *ret written only on success. */
int parse_u64(const char *s, uint64_t *ret) WARN_UNUSED;
int parse_i64(const char *s, int64_t *ret) WARN_UNUSED;
/* parse_u64 bounded to [min, max]. */
int parse_uint_range(const char *s, uint64_t min, uint64_t max, uint64_t *ret) WARN_UNUSED;
/* Decimal seconds with an optional fraction ("0.1", "30") into milliseconds. */
int parse_seconds_ms(const char *s, uint64_t *ret_ms) WARN_UNUSED;
/* A timeout in seconds as above: positive (torchrun refuses 0 too) and at
 * most UINT32_MAX ms. 0, or CRUN_EINVAL with *why saying what is wrong
 * ("is not a number of seconds", "must be positive ...", "is too long"). */
int parse_timeout_ms(const char *s, uint32_t *ret_ms, const char **why) WARN_UNUSED;
/* Booleans as torchrun reads them: 1/true/t/yes/y and 0/false/f/no/n, any case. */
int parse_bool(const char *s, bool *ret) WARN_UNUSED;
/* "host:port", "[v6]:port" or "host" (then *ret_port = default_port). The host
 * is copied into host_buf (NUL-terminated). */
int parse_host_port(const char *s, uint16_t default_port, char *host_buf, size_t host_cap,
		    uint16_t *ret_port) WARN_UNUSED;

/* ---- time ---------------------------------------------------------------- */

/* Milliseconds from CLOCK_MONOTONIC; all crun durations use this clock. */
uint64_t clock_now_ms(void);
uint64_t clock_now_us(void);
/* Wall-clock seconds (CLOCK_REALTIME) with a fraction, for error files. */
double clock_wall_s(void);
/* The CLOCK_MONOTONIC instant timeout_ms from now: the deadline for
 * pthread_cond_timedwait on a condition made by clock_cond_init. */
struct timespec clock_monotonic_in(uint32_t timeout_ms);
/* pthread_cond_init on CLOCK_MONOTONIC: a timed wait on the default
 * (CLOCK_REALTIME) condition ends at once after a +1 h wall-clock step and
 * lasts an hour more after a -1 h one. 0 or a negative errno. */
int clock_cond_init(pthread_cond_t *cv) WARN_UNUSED;

/* ---- fds ------------------------------------------------------------------ */

int fd_set_nonblock(int fd, bool on) WARN_UNUSED;
/* Write all of buf, retrying on EINTR and short writes; blocking fds only. */
int fd_write_all(int fd, const void *buf, size_t len) WARN_UNUSED;
/* close() that keeps errno and ignores EINTR, for cleanup paths. */
void fd_close(int fd);
/* Waits until fd is ready for `events` (POLLIN/POLLOUT) or the CLOCK_MONOTONIC
 * deadline (ms, clock_now_ms) passes: 0, CRUN_ETIMEDOUT or -errno. */
int fd_wait_until(int fd, short events, uint64_t deadline_ms);
/* One plain TCP connect to host:port's first address, closed at once, to tell
 * an operator why a peer is not there: 0 (it accepted), CRUN_ERESOLVE, or
 * what the connect met within timeout_ms (-ECONNREFUSED, CRUN_ETIMEDOUT, ...).
 * With buf, writes the numeric address it tried there (CRUN_ERESOLVE when
 * that cannot be had). */
int tcp_probe(const char *host, uint16_t port, uint32_t timeout_ms, char *buf, size_t cap);

/* ---- service manager notification (notify.c) ------------------------------ */

/* systemd's notify protocol, no libsystemd. notify_open(getenv("NOTIFY_SOCKET"))
 * gives *ret = NULL when path is NULL or empty (every send is then a no-op);
 * CRUN_EINVAL for a path that is neither absolute nor '@abstract'. */
struct notify;
int notify_open(const char *path, struct notify **ret) WARN_UNUSED;
/* One datagram ("READY=1", "STATUS=...", "WATCHDOG=1", newline-joined lines);
 * never blocks. 0 or -errno (the message is dropped). */
int notify_send(struct notify *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Watchdog ping period in ms (half of $WATCHDOG_USEC), 0 when off or when
 * $WATCHDOG_PID names another process. */
uint64_t notify_watchdog_ms(const char *usec, const char *pid);
void notify_close(struct notify *n); /* NULL: no-op */

/* ---- strings -------------------------------------------------------------- */

/* snprintf that reports truncation as CRUN_ETOOBIG instead of silently cutting. */
int str_printf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4))) WARN_UNUSED;
/* strdup / memdup returning NULL only on allocation failure. */
char *str_dup(const char *s);
void *mem_dup(const void *p, size_t len);

/* Last, after every system header, as git does. */
#include "banned.h"

#endif /* CRUN_COMMON_H */
