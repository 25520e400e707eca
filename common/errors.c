/* errors.c: crun_strerror and friends, generated from CRUN_ERR_MAP, plus the
 * static checks that errno-backed codes really equal -errno on this platform.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define CHECK_ERRNO(code, e) _Static_assert((code) == -(e), #code " must equal -" #e)
CHECK_ERRNO(CRUN_EPERM, EPERM);
CHECK_ERRNO(CRUN_ENOENT, ENOENT);
CHECK_ERRNO(CRUN_EINTR, EINTR);
CHECK_ERRNO(CRUN_EIO, EIO);
CHECK_ERRNO(CRUN_EBADF, EBADF);
CHECK_ERRNO(CRUN_ECHILD, ECHILD);
CHECK_ERRNO(CRUN_EAGAIN, EAGAIN);
CHECK_ERRNO(CRUN_ENOMEM, ENOMEM);
CHECK_ERRNO(CRUN_EACCES, EACCES);
CHECK_ERRNO(CRUN_EBUSY, EBUSY);
CHECK_ERRNO(CRUN_EEXIST, EEXIST);
CHECK_ERRNO(CRUN_EINVAL, EINVAL);
CHECK_ERRNO(CRUN_EMFILE, EMFILE);
CHECK_ERRNO(CRUN_ENOSPC, ENOSPC);
CHECK_ERRNO(CRUN_EPIPE, EPIPE);
CHECK_ERRNO(CRUN_ERANGE, ERANGE);
CHECK_ERRNO(CRUN_ENOTSUP, EOPNOTSUPP);
CHECK_ERRNO(CRUN_EADDRINUSE, EADDRINUSE);
CHECK_ERRNO(CRUN_ENETUNREACH, ENETUNREACH);
CHECK_ERRNO(CRUN_ECONNABORTED, ECONNABORTED);
CHECK_ERRNO(CRUN_ECONNRESET, ECONNRESET);
CHECK_ERRNO(CRUN_ENOTCONN, ENOTCONN);
CHECK_ERRNO(CRUN_ETIMEDOUT, ETIMEDOUT);
CHECK_ERRNO(CRUN_ECONNREFUSED, ECONNREFUSED);
CHECK_ERRNO(CRUN_EHOSTUNREACH, EHOSTUNREACH);
CHECK_ERRNO(CRUN_EALREADY, EALREADY);
CHECK_ERRNO(CRUN_ECANCELED, ECANCELED);

CRUN_API unsigned crun_version(void)
{
	return CRUN_VERSION_HEX;
}

CRUN_API const char *crun_version_string(void)
{
	return CRUN_VERSION_STRING;
}

CRUN_API const char *crun_strerror(int err)
{
	switch (err) {
#define CRUN_X_(name, value, text) \
	case value:                \
		return text;
		CRUN_ERR_MAP(CRUN_X_)
#undef CRUN_X_
	}
	/* An errno crun has no name for: strerror's text is static for
	 * valid errnos in glibc, and "Unknown error" otherwise. */
	if (err < 0 && err > -4096)
		return strerror(-err);
	return "unknown error";
}

CRUN_API const char *crun_err_name(int err)
{
	switch (err) {
#define CRUN_X_(name, value, text) \
	case value:                \
		return #name;
		CRUN_ERR_MAP(CRUN_X_)
#undef CRUN_X_
	}
	return "CRUN_E?";
}

CRUN_API void crun_free(void *p)
{
	free(p);
}
