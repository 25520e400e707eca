/* crun.h: the base of libcrun's public API: version, error codes, memory and
 * log hooks. Every other public header (store.h, worker.h, agent.h) includes
 * this one. C99, no GNU extensions; it also compiles as C++.
 */
#ifndef CRUN_CRUN_H
#define CRUN_CRUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CRUN_API __attribute__((visibility("default")))
#else
#define CRUN_API
#endif

#define CRUN_VERSION_MAJOR 0
#define CRUN_VERSION_MINOR 1
#define CRUN_VERSION_PATCH 0
#define CRUN_VERSION_HEX \
	((CRUN_VERSION_MAJOR << 16) | (CRUN_VERSION_MINOR << 8) | CRUN_VERSION_PATCH)
#define CRUN_VERSION_STRING "0.1.0"

/* X(name, value, text). 0 is success; errno-backed codes equal -errno on
 * Linux (static asserts in common/errors.c); crun's own codes start at -1000.
 * A number is never renumbered or reused. */
#define CRUN_ERR_MAP(X)                                                \
	X(CRUN_OK, 0, "success")                                       \
	X(CRUN_EPERM, -1, "operation not permitted")                   \
	X(CRUN_ENOENT, -2, "no such file, directory or key")           \
	X(CRUN_EINTR, -4, "interrupted")                               \
	X(CRUN_EIO, -5, "input/output error")                          \
	X(CRUN_EBADF, -9, "bad file descriptor")                       \
	X(CRUN_ECHILD, -10, "no child process")                        \
	X(CRUN_EAGAIN, -11, "try again")                               \
	X(CRUN_ENOMEM, -12, "out of memory")                           \
	X(CRUN_EACCES, -13, "permission denied")                       \
	X(CRUN_EBUSY, -16, "resource busy")                            \
	X(CRUN_EEXIST, -17, "already exists")                          \
	X(CRUN_EINVAL, -22, "invalid argument")                        \
	X(CRUN_EMFILE, -24, "too many open files")                     \
	X(CRUN_ENOSPC, -28, "no space left")                           \
	X(CRUN_EPIPE, -32, "broken pipe")                              \
	X(CRUN_ERANGE, -34, "value out of range")                      \
	X(CRUN_ENOTSUP, -95, "not supported")                          \
	X(CRUN_EADDRINUSE, -98, "address already in use")              \
	X(CRUN_ENETUNREACH, -101, "network unreachable")               \
	X(CRUN_ECONNABORTED, -103, "connection aborted")               \
	X(CRUN_ECONNRESET, -104, "connection reset by peer")           \
	X(CRUN_ENOTCONN, -107, "not connected")                        \
	X(CRUN_ETIMEDOUT, -110, "timed out")                           \
	X(CRUN_ECONNREFUSED, -111, "connection refused")               \
	X(CRUN_EHOSTUNREACH, -113, "host unreachable")                 \
	X(CRUN_EALREADY, -114, "operation already in progress")        \
	X(CRUN_ECANCELED, -125, "canceled by abort")                   \
	X(CRUN_EPROTO, -1000, "protocol error")                        \
	X(CRUN_ERDZVCLOSED, -1001, "rendezvous is closed")             \
	X(CRUN_EPEER, -1002, "a peer failed or left")                  \
	X(CRUN_ETOOBIG, -1003, "over a configured limit")              \
	X(CRUN_EDIALECT, -1004, "operation not in this store dialect") \
	X(CRUN_ERESOLVE, -1005, "cannot resolve host name")            \
	X(CRUN_ECONFIG, -1006, "invalid configuration")                \
	X(CRUN_ECLOSED, -1007, "connection closed by peer")            \
	X(CRUN_ENOTFOUND, -1008, "key not found")

typedef enum crun_err {
#define CRUN_X_(name, value, text) name = (value),
	CRUN_ERR_MAP(CRUN_X_)
#undef CRUN_X_
} crun_err_t;

/* Version of the library actually linked, as CRUN_VERSION_HEX. */
CRUN_API unsigned crun_version(void);
CRUN_API const char *crun_version_string(void);

/* Text for a crun code (or any negative errno); static, never NULL. */
CRUN_API const char *crun_strerror(int err);
/* The code's symbolic name ("CRUN_ETIMEDOUT"); static, never NULL. */
CRUN_API const char *crun_err_name(int err);

/* Frees memory that libcrun returned through a ret_* parameter. NULL: no-op. */
CRUN_API void crun_free(void *p);

/* Log levels, lowest number most severe. */
typedef enum crun_log_level {
	CRUN_LOG_ERROR = 0,
	CRUN_LOG_WARN = 1,
	CRUN_LOG_INFO = 2,
	CRUN_LOG_DEBUG = 3,
	CRUN_LOG_TRACE = 4,
} crun_log_level_t;

/* A host program may take libcrun's log lines (already formatted, without a
 * newline). `line` is valid only during the call. NULL restores the default
 * (stderr). Not thread-safe against concurrent logging: set it at start-up. */
typedef void (*crun_log_fn)(crun_log_level_t level, const char *line, void *arg);
CRUN_API void crun_set_log_handler(crun_log_fn fn, void *arg);
CRUN_API void crun_set_log_level(crun_log_level_t level);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_CRUN_H */
