/* auth.h: crun's HMAC-SHA256 challenge/response in front of the store wire
 * protocol (issue "Security"), private to store/ and the modules above it
 * that open crun-to-crun connections (rendezvous, worker_sdk).
 *
 * The exchange, run before any TCPStore byte (the server sends its challenge
 * at accept; the client sends the head of its answer, "CRA1" job_len job,
 * without waiting for it, and the rest once the challenge is in):
 *
 *   server -> client  CHALLENGE "CRA1" u8 0         nonce_s[32]
 *   client -> server  ANSWER    "CRA1" u8 job_len job[job_len] nonce_c[32] mac_c[32]
 *   server -> client  PROOF     "CRA1" mac_s[32]
 *
 *   mac_c = HMAC-SHA256(secret, "crun-auth-v1 client\0" nonce_s nonce_c job_len job)
 *   mac_s = HMAC-SHA256(secret, "crun-auth-v1 server\0" nonce_s nonce_c job_len job)
 *
 * (the worker SDK's mesh: "crun-mesh-v1 ..." instead, enum store_auth_domain)
 *
 * Both nonces come from RAND_bytes, fresh per connection, so an answer
 * recorded on one connection is worthless on the next (replay); the role
 * label keeps a client's MAC from being reflected back as a server's proof;
 * `job` (the run id the client speaks for) is inside both MACs, so it cannot
 * be swapped in flight. The server checks with CRYPTO_memcmp and closes the
 * connection on any failure without a reply; the client checks the proof the
 * same way, so neither side talks to an impostor (mutual).
 *
 * Secrets and job scopes. A server holds a table of secrets (struct
 * store_auth_keys): an entry with job "" is a daemon-wide secret, valid for
 * any job and every key; an entry for job J (crun-rdzvd --auth-secrets-dir:
 * one file per run id) admits only clients that name J, and those may touch
 * only keys under STORE_AUTH_JOB_ROOT "J/" - where crun's c10d rendezvous
 * keeps everything of run id J. A per-job entry wins over the wildcard.
 *
 * Everything here is pure apart from RAND_bytes and reading secret files.
 */
#ifndef CRUN_STORE_AUTH_H
#define CRUN_STORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crun/crun.h" /* the CRUN_E* codes these functions return */

#define STORE_AUTH_NONCE_BYTES 32
#define STORE_AUTH_MAC_BYTES   32
#define STORE_AUTH_JOB_MAX     200 /* a run id longer than this cannot authenticate */
#define STORE_AUTH_SECRET_MIN  16
#define STORE_AUTH_SECRET_MAX  4096
#define STORE_AUTH_MAX_JOBS    4096 /* entries of one table */
/* Where crun's c10d rendezvous keeps the keys of run id J: "/crun-c10d/J/". */
#define STORE_AUTH_JOB_ROOT "/crun-c10d/"

/* Which exchange a MAC belongs to. The store's (client: a crun store client,
 * server: a store server) and the worker SDK's data mesh (client: the rank
 * that dials, server: the rank that listens) use the same frames and the
 * same secret but different labels ("crun-mesh-v1 client"/"server" for the
 * mesh), so an answer made in one is refused in the other: a mesh rank dials
 * addresses read from the unauthenticated worker store, and could otherwise
 * be made to answer a daemon's relayed challenge. */
enum store_auth_domain {
	STORE_AUTH_STORE,
	STORE_AUTH_MESH,
	STORE_AUTH_DOMAIN__MAX,
};

#define STORE_AUTH_CHALLENGE_BYTES (4 + 1 + STORE_AUTH_NONCE_BYTES)
#define STORE_AUTH_ANSWER_MAX \
	(4 + 1 + STORE_AUTH_JOB_MAX + STORE_AUTH_NONCE_BYTES + STORE_AUTH_MAC_BYTES)
#define STORE_AUTH_PROOF_BYTES (4 + STORE_AUTH_MAC_BYTES)
/* A client sends its answer's head ("CRA1" job_len job) before the
 * challenge arrives (a TLS server then speaks up, see store/tls.h). A crun
 * server without secrets answers that head with "CRA1" and this byte where
 * a challenge has 0, and closes: the client says the server has no secret
 * at once instead of waiting for a challenge. */
#define STORE_AUTH_NO_SECRETS 0xff

/* One secret; bytes exactly as in the file, a trailing newline removed. */
struct store_auth_secret {
	uint8_t bytes[STORE_AUTH_SECRET_MAX];
	size_t len;
};

/* Reads a secret file. As ssh and sshd's StrictModes: the file must be a
 * regular file (not a link: not followed; a FIFO or device is refused
 * without waiting on it), owned by the effective user or root, not
 * accessible to group or others, in a directory owned by the effective user
 * or root that group and others cannot write to (unless it is sticky, as
 * /tmp), and hold 16..4096 bytes. Returns 0, or CRUN_EACCES / CRUN_EINVAL /
 * -errno (-ELOOP for a link) with a message naming `path` (or its directory)
 * and the reason in err. */
int store_auth_secret_read(const char *path, struct store_auth_secret *ret, char *err, size_t cap);

/* ---- the server's table of secrets --------------------------------------- */

struct store_auth_keys; /* opaque */

/* An empty table. 0 or CRUN_ENOMEM. Free with store_auth_keys_free (NULL ok). */
int store_auth_keys_new(struct store_auth_keys **ret);
void store_auth_keys_free(struct store_auth_keys *k);
/* Adds (or replaces) the secret of `job` ("" = any job, unscoped). 0,
 * CRUN_EINVAL (job too long or holding '/'), CRUN_ETOOBIG or CRUN_ENOMEM. */
int store_auth_keys_add(struct store_auth_keys *k, const char *job,
			const struct store_auth_secret *s);
/* Adds one secret per regular file of `dir`, the file name being the run id
 * (dot files skipped). `dir` must pass the directory checks and every file
 * store_auth_secret_read. Returns
 * the number added (>= 1), or a negative code with err (an empty directory is
 * CRUN_EINVAL: a daemon told to authenticate must have a secret). */
int store_auth_keys_load_dir(struct store_auth_keys *k, const char *dir, char *err, size_t cap);
size_t store_auth_keys_count(const struct store_auth_keys *k);

/* ---- the exchange (pure) ------------------------------------------------- */

/* Fresh random bytes for a nonce: 0 or CRUN_EIO when the RNG fails. */
int store_auth_nonce(uint8_t nonce[STORE_AUTH_NONCE_BYTES]);

/* CHALLENGE frame into out[STORE_AUTH_CHALLENGE_BYTES]. */
void store_auth_encode_challenge(const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], uint8_t *out);
/* Parses a CHALLENGE: 0 with nonce_s, CRUN_EAGAIN on a prefix, CRUN_EPROTO
 * when the bytes are not a challenge (the peer is not an authenticating crun
 * store). */
int store_auth_decode_challenge(const uint8_t *buf, size_t len,
				uint8_t nonce_s[STORE_AUTH_NONCE_BYTES]);

/* Client: builds the ANSWER of domain dom to nonce_s for `job` (may be "")
 * into out (STORE_AUTH_ANSWER_MAX bytes), with a fresh nonce_c kept in
 * ret_nonce_c for checking the proof (dom: the same here, in the two calls
 * below and on both ends). 0, CRUN_EINVAL (job too long, or dom out of
 * range), CRUN_EIO (RNG). */
int store_auth_answer(enum store_auth_domain dom, const struct store_auth_secret *s,
		      const char *job, const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], uint8_t *out,
		      size_t *ret_len, uint8_t ret_nonce_c[STORE_AUTH_NONCE_BYTES]);

/* Server: what a verified answer grants. */
struct store_auth_grant {
	char job[STORE_AUTH_JOB_MAX + 1]; /* the job the client named */
	bool scoped;			  /* keys limited to STORE_AUTH_JOB_ROOT job "/" */
	uint8_t proof[STORE_AUTH_PROOF_BYTES];
};

/* Server: checks an ANSWER to nonce_s against the table. 0 with *used and
 * *ret (send ret->proof), CRUN_EAGAIN on a prefix, CRUN_EPROTO when the bytes
 * are not an answer (a client without a secret), CRUN_ENOENT for a job with
 * no secret here, CRUN_EACCES for a wrong MAC (a wrong secret). */
int store_auth_verify(enum store_auth_domain dom, const struct store_auth_keys *k,
		      const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], const uint8_t *buf, size_t len,
		      size_t *used, struct store_auth_grant *ret);

/* Client: checks the server's PROOF. 0, CRUN_EAGAIN on a prefix, CRUN_EPROTO
 * (not a proof), CRUN_EACCES (wrong MAC: the server lacks the secret). */
int store_auth_check_proof(enum store_auth_domain dom, const struct store_auth_secret *s,
			   const char *job, const uint8_t nonce_s[STORE_AUTH_NONCE_BYTES],
			   const uint8_t nonce_c[STORE_AUTH_NONCE_BYTES], const uint8_t *buf,
			   size_t len);

/* True when a client granted `g` may use wire key `key` (every key when the
 * grant is not scoped). */
bool store_auth_key_allowed(const struct store_auth_grant *g, const uint8_t *key, size_t len);

/* ---- blocking client side (auth_io.c) ------------------------------------- */

struct store_tls_conn;

/* Runs the client half of the store's exchange (STORE_AUTH_STORE) on a
 * connected socket fd (through `tls` when not NULL, store/tls.h) until deadline_ms (clock_now_ms()
 * scale). 0, CRUN_EACCES (the server closed on our answer, or its proof is
 * wrong), CRUN_EPROTO (no challenge within 10 s, or the server answered
 * STORE_AUTH_NO_SECRETS: it does not authenticate; or, without `tls`, it
 * answered a TLS record: it speaks TLS), CRUN_EINVAL (job too long),
 * CRUN_ETIMEDOUT, -errno. err explains. */
int store_auth_client_run(int fd, struct store_tls_conn *tls, const struct store_auth_secret *s,
			  const char *job, uint64_t deadline_ms, char *err, size_t cap);

/* The worker SDK's data mesh, where both ends are peers, in the mesh domain
 * (STORE_AUTH_MESH) and for run id "". The listening rank: sends a challenge,
 * verifies the answer against secret `s`, sends the proof. The dialing rank:
 * store_auth_client_run's half, without TLS. Same returns as that. */
int store_auth_mesh_server_run(int fd, const struct store_auth_secret *s, uint64_t deadline_ms,
			       char *err, size_t cap);
int store_auth_mesh_client_run(int fd, const struct store_auth_secret *s, uint64_t deadline_ms,
			       char *err, size_t cap);

/* 1 when every address `host` resolves to is a loopback one (127/8, ::1),
 * 0 otherwise - also for NULL, "" (every interface) and unresolvable names.
 * Blocking (name resolution): call it before the loop runs. */
int store_host_is_loopback(const char *host);

#endif /* CRUN_STORE_AUTH_H */
