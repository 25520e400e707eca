/* auth.c: the HMAC-SHA256 challenge/response of auth.h - frames, MACs,
 * the server's table of secrets and secret files. No sockets here: the
 * server glue is server/server_auth.c, the blocking client side auth_io.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "common/common.h"
#include "store/auth.h"

static const uint8_t MAGIC[4] = {'C', 'R', 'A', '1'};
/* The role labels of each domain (enum store_auth_domain). A MAC made under
 * one label is worthless under any other: a client's answer is no server's
 * proof (reflection), and a mesh rank's answer is no store client's (a
 * relay through a rank that dials an address from the worker store). All
 * the same length: mac() sizes its buffer by the first. */
static const char *const LABELS[STORE_AUTH_DOMAIN__MAX][2] = {
    [STORE_AUTH_STORE] = {"crun-auth-v1 client", "crun-auth-v1 server"},
    [STORE_AUTH_MESH] = {"crun-mesh-v1 client", "crun-mesh-v1 server"},
};
#define LABEL_BYTES sizeof("crun-auth-v1 client") /* with its NUL */
enum { ROLE_CLIENT, ROLE_SERVER };

struct auth_entry {
	char job[STORE_AUTH_JOB_MAX + 1];
	struct store_auth_secret secret;
};

struct store_auth_keys {
	struct auth_entry *e;
	size_t n, cap;
};

/* ---- secret files ----------------------------------------------------------- */

/* Who may own a secret or the directory it is in: this user, or root (as
 * ssh and sshd's StrictModes: anyone else could change or swap it). */
static bool owner_ok(uid_t uid)
{
	return uid == geteuid() || uid == 0;
}

/* A directory others can add files to or rename ours in is no place for a
 * secret: refused unless it is sticky (only a file's owner can remove or
 * rename it, as in /tmp), and it must be ours or root's either way. `what`
 * and `path` name it in err. */
static int dir_check(const struct stat *st, const char *what, const char *path, char *err,
		     size_t cap)
{
	if (!owner_ok(st->st_uid)) {
		snprintf(err, cap, "%s '%s' is owned by uid %u, not by this user (uid %u) or root",
			 what, path, (unsigned)st->st_uid, (unsigned)geteuid());
		return CRUN_EACCES;
	}
	if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
		snprintf(err, cap,
			 "%s '%s' is writable by group or others (mode %04o): they could replace "
			 "the secret; chmod go-w it",
			 what, path, (unsigned)(st->st_mode & 07777));
		return CRUN_EACCES;
	}
	return 0;
}

/* The directory `path` is in, checked with dir_check. */
static int parent_check(const char *path, char *err, size_t cap)
{
	const char *slash = strrchr(path, '/');
	char dir[4096];
	struct stat st;
	int r;

	if (!slash)
		r = str_printf(dir, sizeof(dir), ".");
	else
		r = str_printf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path),
			       path);
	if (r < 0) {
		snprintf(err, cap, "auth secret file '%s': path too long", path);
		return CRUN_EINVAL;
	}
	if (stat(dir, &st) < 0) {
		r = -errno;
		snprintf(err, cap, "directory of auth secret file '%s': %s", path, strerror(errno));
		return r;
	}
	return dir_check(&st, "directory of auth secret file", dir, err, cap);
}

/* The checks on an open secret file, before a byte of it is read. */
static int file_check(int fd, const char *path, struct stat *st, char *err, size_t cap)
{
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
		snprintf(err, cap, "auth secret file '%s': not a regular file", path);
		return CRUN_EINVAL;
	}
	if (!owner_ok(st->st_uid)) {
		snprintf(err, cap,
			 "auth secret file '%s' is owned by uid %u, not by this user (uid %u) "
			 "or root",
			 path, (unsigned)st->st_uid, (unsigned)geteuid());
		return CRUN_EACCES;
	}
	/* A secret others can read is no secret: refuse it, as ssh does. */
	if (st->st_mode & 0077) {
		snprintf(err, cap,
			 "auth secret file '%s' is accessible by group or others (mode %04o); "
			 "chmod 600 it",
			 path, (unsigned)(st->st_mode & 07777));
		return CRUN_EACCES;
	}
	if (st->st_size > (off_t)STORE_AUTH_SECRET_MAX) {
		snprintf(err, cap, "auth secret file '%s': longer than %d bytes", path,
			 STORE_AUTH_SECRET_MAX);
		return CRUN_EINVAL;
	}
	return parent_check(path, err, cap);
}

int store_auth_secret_read(const char *path, struct store_auth_secret *ret, char *err, size_t cap)
{
	struct store_auth_secret s = {0};
	struct stat st;
	ssize_t n;
	int fd, r;

	/* O_NONBLOCK: a FIFO (or a device) in its place opens at once and is
	 * refused below, where a plain open() would wait for a writer forever.
	 * O_NOFOLLOW: the file itself, not what a link points to. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
	if (fd < 0) {
		r = -errno;
		if (errno == ELOOP)
			snprintf(err, cap,
				 "auth secret file '%s' is a symbolic link: name the file itself",
				 path);
		else
			snprintf(err, cap, "auth secret file '%s': %s", path, strerror(errno));
		return r;
	}
	r = file_check(fd, path, &st, err, cap);
	if (r < 0)
		goto out_close;
	do
		n = read(fd, s.bytes, sizeof(s.bytes));
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		r = -errno;
		snprintf(err, cap, "auth secret file '%s': %s", path, strerror(errno));
		goto out_close;
	}
	s.len = (size_t)n;
	while (s.len && (s.bytes[s.len - 1] == '\n' || s.bytes[s.len - 1] == '\r'))
		s.len--;
	if (s.len < STORE_AUTH_SECRET_MIN) {
		snprintf(err, cap, "auth secret file '%s': shorter than %d bytes", path,
			 STORE_AUTH_SECRET_MIN);
		r = CRUN_EINVAL;
		goto out_close;
	}
	*ret = s;
	r = 0;
out_close:
	fd_close(fd);
	OPENSSL_cleanse(&s, sizeof(s));
	return r;
}

/* ---- the table -------------------------------------------------------------- */

int store_auth_keys_new(struct store_auth_keys **ret)
{
	struct store_auth_keys *k = calloc(1, sizeof(*k));

	if (!k)
		return CRUN_ENOMEM;
	*ret = k;
	return 0;
}

void store_auth_keys_free(struct store_auth_keys *k)
{
	if (!k)
		return;
	if (k->e)
		OPENSSL_cleanse(k->e, k->cap * sizeof(*k->e));
	free(k->e);
	free(k);
}

size_t store_auth_keys_count(const struct store_auth_keys *k)
{
	return k ? k->n : 0;
}

static struct auth_entry *find(const struct store_auth_keys *k, const char *job, size_t len)
{
	for (size_t i = 0; i < k->n; i++)
		if (strlen(k->e[i].job) == len && memcmp(k->e[i].job, job, len) == 0)
			return &k->e[i];
	return NULL;
}

int store_auth_keys_add(struct store_auth_keys *k, const char *job,
			const struct store_auth_secret *s)
{
	size_t len = strlen(job);
	struct auth_entry *e;

	/* A '/' would let job "a" reach into "a/b"'s keys through the scope. */
	if (len > STORE_AUTH_JOB_MAX || strchr(job, '/') || s->len < STORE_AUTH_SECRET_MIN ||
	    s->len > STORE_AUTH_SECRET_MAX)
		return CRUN_EINVAL;
	e = find(k, job, len);
	if (!e) {
		if (k->n == STORE_AUTH_MAX_JOBS)
			return CRUN_ETOOBIG;
		if (k->n == k->cap) {
			size_t ncap = k->cap ? k->cap * 2 : 4;
			struct auth_entry *ne = realloc(k->e, ncap * sizeof(*ne));

			if (!ne)
				return CRUN_ENOMEM;
			k->e = ne;
			k->cap = ncap;
		}
		e = &k->e[k->n++];
	}
	memcpy(e->job, job, len + 1);
	e->secret = *s;
	return 0;
}

int store_auth_keys_load_dir(struct store_auth_keys *k, const char *dir, char *err, size_t cap)
{
	struct store_auth_secret s;
	struct stat st;
	struct dirent *de;
	char path[4096];
	int added = 0, r = 0;
	DIR *d = opendir(dir);

	if (!d) {
		r = -errno;
		snprintf(err, cap, "auth secrets directory '%s': %s", dir, strerror(errno));
		return r;
	}
	if (fstat(dirfd(d), &st) < 0) {
		r = -errno;
		snprintf(err, cap, "auth secrets directory '%s': %s", dir, strerror(errno));
		goto out_closedir;
	}
	r = dir_check(&st, "auth secrets directory", dir, err, cap);
	if (r < 0)
		goto out_closedir;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		r = str_printf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (r < 0) {
			snprintf(err, cap, "auth secrets directory '%s': path too long", dir);
			break;
		}
		r = store_auth_secret_read(path, &s, err, cap);
		if (r < 0)
			break;
		r = store_auth_keys_add(k, de->d_name, &s);
		OPENSSL_cleanse(&s, sizeof(s));
		if (r < 0) {
			snprintf(err, cap,
				 "auth secrets directory '%s': cannot add run id '%s': %s", dir,
				 de->d_name, crun_strerror(r));
			break;
		}
		added++;
	}
out_closedir:
	closedir(d);
	if (r < 0)
		return r;
	if (!added) {
		snprintf(err, cap, "auth secrets directory '%s' holds no secret file", dir);
		return CRUN_EINVAL;
	}
	return added;
}

/* ---- frames and MACs ------------------------------------------------------------ */

int store_auth_nonce(uint8_t nonce[STORE_AUTH_NONCE_BYTES])
{
	return RAND_bytes(nonce, STORE_AUTH_NONCE_BYTES) == 1 ? 0 : CRUN_EIO;
}

void store_auth_encode_challenge(const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], uint8_t *out)
{
	memcpy(out, MAGIC, 4);
	out[4] = 0; /* flags: none defined */
	memcpy(out + 5, nonce_s, STORE_AUTH_NONCE_BYTES);
}

int store_auth_decode_challenge(const uint8_t *buf, size_t len,
				uint8_t nonce_s[STORE_AUTH_NONCE_BYTES])
{
	if (memcmp(buf, MAGIC, MIN(len, 4)) != 0)
		return CRUN_EPROTO;
	if (len < STORE_AUTH_CHALLENGE_BYTES)
		return CRUN_EAGAIN;
	if (buf[4] != 0)
		return CRUN_EPROTO;
	memcpy(nonce_s, buf + 5, STORE_AUTH_NONCE_BYTES);
	return 0;
}

/* HMAC-SHA256(secret, label nonce_s nonce_c job_len job), the label that of
 * `role` in domain `dom`. */
static int mac(const struct store_auth_secret *s, enum store_auth_domain dom, int role,
	       const uint8_t *nonce_s, const uint8_t *nonce_c, const char *job, size_t job_len,
	       uint8_t out[STORE_AUTH_MAC_BYTES])
{
	uint8_t msg[LABEL_BYTES + 2 * STORE_AUTH_NONCE_BYTES + 1 + STORE_AUTH_JOB_MAX];
	unsigned out_len = 0;
	size_t n = 0;

	if ((unsigned)dom >= STORE_AUTH_DOMAIN__MAX)
		return CRUN_EINVAL;
	memcpy(msg, LABELS[dom][role], LABEL_BYTES);
	n += LABEL_BYTES;
	memcpy(msg + n, nonce_s, STORE_AUTH_NONCE_BYTES);
	n += STORE_AUTH_NONCE_BYTES;
	memcpy(msg + n, nonce_c, STORE_AUTH_NONCE_BYTES);
	n += STORE_AUTH_NONCE_BYTES;
	msg[n++] = (uint8_t)job_len;
	memcpy(msg + n, job, job_len);
	n += job_len;
	if (!HMAC(EVP_sha256(), s->bytes, (int)s->len, msg, n, out, &out_len) ||
	    out_len != STORE_AUTH_MAC_BYTES)
		return CRUN_EIO;
	return 0;
}

int store_auth_answer(enum store_auth_domain dom, const struct store_auth_secret *s,
		      const char *job, const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], uint8_t *out,
		      size_t *ret_len, uint8_t ret_nonce_c[STORE_AUTH_NONCE_BYTES])
{
	size_t jl = strlen(job), n = 0;
	uint8_t nonce_c[STORE_AUTH_NONCE_BYTES];

	if (jl > STORE_AUTH_JOB_MAX)
		return CRUN_EINVAL;
	TRY(store_auth_nonce(nonce_c));
	memcpy(out, MAGIC, 4);
	n = 4;
	out[n++] = (uint8_t)jl;
	memcpy(out + n, job, jl);
	n += jl;
	memcpy(out + n, nonce_c, STORE_AUTH_NONCE_BYTES);
	n += STORE_AUTH_NONCE_BYTES;
	TRY(mac(s, dom, ROLE_CLIENT, nonce_s, nonce_c, job, jl, out + n));
	n += STORE_AUTH_MAC_BYTES;
	memcpy(ret_nonce_c, nonce_c, STORE_AUTH_NONCE_BYTES);
	*ret_len = n;
	return 0;
}

int store_auth_verify(enum store_auth_domain dom, const struct store_auth_keys *k,
		      const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], const uint8_t *buf, size_t len,
		      size_t *used, struct store_auth_grant *ret)
{
	uint8_t want[STORE_AUTH_MAC_BYTES];
	const uint8_t *nonce_c, *mac_c;
	const struct auth_entry *e;
	size_t jl, need;
	char job[STORE_AUTH_JOB_MAX + 1];

	if (memcmp(buf, MAGIC, MIN(len, 4)) != 0)
		return CRUN_EPROTO;
	if (len < 5)
		return CRUN_EAGAIN;
	jl = buf[4];
	if (jl > STORE_AUTH_JOB_MAX)
		return CRUN_EPROTO;
	need = 5 + jl + STORE_AUTH_NONCE_BYTES + STORE_AUTH_MAC_BYTES;
	if (len < need)
		return CRUN_EAGAIN;
	memcpy(job, buf + 5, jl);
	job[jl] = '\0';
	if (memchr(job, '\0', jl) || memchr(job, '/', jl))
		return CRUN_ENOENT; /* no such job can be in the table */
	nonce_c = buf + 5 + jl;
	mac_c = nonce_c + STORE_AUTH_NONCE_BYTES;
	/* The job's own secret first; the daemon-wide one ("") otherwise. */
	e = find(k, job, jl);
	if (!e)
		e = find(k, "", 0);
	if (!e)
		return CRUN_ENOENT;
	TRY(mac(&e->secret, dom, ROLE_CLIENT, nonce_s, nonce_c, job, jl, want));
	if (CRYPTO_memcmp(want, mac_c, STORE_AUTH_MAC_BYTES) != 0)
		return CRUN_EACCES;
	memcpy(ret->job, job, jl + 1);
	ret->scoped = e->job[0] != '\0';
	memcpy(ret->proof, MAGIC, 4);
	TRY(mac(&e->secret, dom, ROLE_SERVER, nonce_s, nonce_c, job, jl, ret->proof + 4));
	*used = need;
	return 0;
}

int store_auth_check_proof(enum store_auth_domain dom, const struct store_auth_secret *s,
			   const char *job, const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES],
			   const uint8_t nonce_c[STORE_AUTH_NONCE_BYTES], const uint8_t *buf,
			   size_t len)
{
	uint8_t want[STORE_AUTH_MAC_BYTES];

	if (memcmp(buf, MAGIC, MIN(len, 4)) != 0)
		return CRUN_EPROTO;
	if (len < STORE_AUTH_PROOF_BYTES)
		return CRUN_EAGAIN;
	TRY(mac(s, dom, ROLE_SERVER, nonce_s, nonce_c, job, strlen(job), want));
	return CRYPTO_memcmp(want, buf + 4, STORE_AUTH_MAC_BYTES) == 0 ? 0 : CRUN_EACCES;
}

bool store_auth_key_allowed(const struct store_auth_grant *g, const uint8_t *key, size_t len)
{
	size_t rl = sizeof(STORE_AUTH_JOB_ROOT) - 1, jl;

	if (!g->scoped)
		return true;
	jl = strlen(g->job);
	return len > rl + jl && memcmp(key, STORE_AUTH_JOB_ROOT, rl) == 0 &&
	       memcmp(key + rl, g->job, jl) == 0 && key[rl + jl] == '/';
}
