/* auth_io.c: the blocking halves of the auth.h exchange on a connected
 * socket, for the store client (client/session.c) and the worker SDK's data
 * mesh (worker_sdk/tcp.c), each in its own domain (auth.h), over the
 * client's transport (tls.h's store_io_*). Every read is exact-sized:
 * nothing past the exchange is consumed, so the caller's own protocol starts
 * on a clean stream.
 */
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/tls.h"

#define CHALLENGE_WAIT_MS 10000

/* Reads exactly len bytes: CRUN_ECLOSED on EOF. *ret_got (NULL: not
 * wanted) counts what arrived, also on failure. */
static int recv_exact_got(int fd, struct store_tls_conn *tls, uint8_t *p, size_t len,
			  uint64_t deadline_ms, size_t *ret_got)
{
	size_t dummy = 0, *got = ret_got ? ret_got : &dummy;

	*got = 0;
	while (len) {
		long n = store_io_recv(fd, tls, p, len, deadline_ms);

		if (n < 0)
			return (int)n;
		p += n;
		len -= (size_t)n;
		*got += (size_t)n;
	}
	return 0;
}

static int recv_exact(int fd, struct store_tls_conn *tls, uint8_t *p, size_t len,
		      uint64_t deadline_ms)
{
	return recv_exact_got(fd, tls, p, len, deadline_ms, NULL);
}

static int client_run(enum store_auth_domain dom, int fd, struct store_tls_conn *tls,
		      const struct store_auth_secret *s, const char *job, uint64_t deadline_ms,
		      char *err, size_t cap)
{
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES], ans[STORE_AUTH_ANSWER_MAX];
	uint8_t proof[STORE_AUTH_PROOF_BYTES];
	uint8_t nonce_s[STORE_AUTH_NONCE_BYTES], nonce_c[STORE_AUTH_NONCE_BYTES];
	size_t alen, jl = strlen(job), head = 5 + jl, got = 0;
	int r;

	if (jl > STORE_AUTH_JOB_MAX) {
		snprintf(err, cap, "run id longer than %d bytes", STORE_AUTH_JOB_MAX);
		return CRUN_EINVAL;
	}
	/* The answer's head ("CRA1", job_len, job) owes nothing to the
	 * challenge: sent now, it makes a TLS server that waits for a
	 * ClientHello speak up (store_tls_tell_plaintext_peer) instead of
	 * both sides waiting for each other; a crun server reads it as the
	 * start of the answer. */
	memcpy(ans, "CRA1", 4);
	ans[4] = (uint8_t)jl;
	memcpy(ans + 5, job, jl);
	r = store_io_send(fd, tls, ans, head, deadline_ms);
	/* A server that authenticates sends its challenge on accept; one that
	 * does not waits for us forever, so this wait has its own bound. */
	if (r == 0)
		r = recv_exact_got(fd, tls, ch, sizeof(ch),
				   MIN(deadline_ms, clock_now_ms() + CHALLENGE_WAIT_MS), &got);
	if (got >= 5 && memcmp(ch, "CRA1", 4) == 0 && ch[4] == STORE_AUTH_NO_SECRETS) {
		snprintf(err, cap,
			 "the server requires no secret: it answered that it has none (remove "
			 "auth_secret_file, or give the server the secret)");
		return CRUN_EPROTO;
	}
	if (!tls && store_tls_record(ch, got)) {
		snprintf(err, cap,
			 "the server speaks TLS: set tls_ca (and tls_cert, tls_key if it wants a "
			 "client certificate)");
		return CRUN_EPROTO;
	}
	if (r == 0)
		r = store_auth_decode_challenge(ch, sizeof(ch), nonce_s);
	if (r < 0) {
		snprintf(err, cap,
			 "no authentication challenge from the server (%s): it does not require "
			 "a secret, or it is not a crun store",
			 crun_strerror(r));
		return r == CRUN_ETIMEDOUT || r == CRUN_EPROTO ? CRUN_EPROTO : r;
	}
	r = store_auth_answer(dom, s, job, nonce_s, ans, &alen, nonce_c);
	if (r < 0) {
		snprintf(err, cap, "cannot build the authentication answer: %s", crun_strerror(r));
		return r;
	}
	r = store_io_send(fd, tls, ans + head, alen - head, deadline_ms);
	if (r == 0)
		r = recv_exact(fd, tls, proof, sizeof(proof), deadline_ms);
	if (r == CRUN_ECLOSED || r == CRUN_ECONNRESET) {
		/* The server hangs up without a word on any refusal (auth.h):
		 * with a daemon-wide secret that is a wrong secret; with per-job
		 * secrets it may also not know the run id. */
		snprintf(err, cap,
			 "wrong secret: the server refused our authentication answer (or it has "
			 "no secret for run id '%s')",
			 job);
		return CRUN_EACCES;
	}
	if (r < 0) {
		snprintf(err, cap, "authentication: %s", crun_strerror(r));
		return r;
	}
	r = store_auth_check_proof(dom, s, job, nonce_s, nonce_c, proof, sizeof(proof));
	if (r < 0) {
		snprintf(err, cap,
			 "the server failed to prove it knows the secret: not talking "
			 "to it");
		return CRUN_EACCES;
	}
	return 0;
}

int store_auth_client_run(int fd, struct store_tls_conn *tls, const struct store_auth_secret *s,
			  const char *job, uint64_t deadline_ms, char *err, size_t cap)
{
	return client_run(STORE_AUTH_STORE, fd, tls, s, job, deadline_ms, err, cap);
}

int store_auth_mesh_client_run(int fd, const struct store_auth_secret *s, uint64_t deadline_ms,
			       char *err, size_t cap)
{
	return client_run(STORE_AUTH_MESH, fd, NULL, s, "", deadline_ms, err, cap);
}

int store_auth_mesh_server_run(int fd, const struct store_auth_secret *s, uint64_t deadline_ms,
			       char *err, size_t cap)
{
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES], ans[STORE_AUTH_ANSWER_MAX];
	uint8_t nonce_s[STORE_AUTH_NONCE_BYTES];
	struct store_auth_keys *keys = NULL;
	struct store_auth_grant g;
	size_t have = 0, used;
	int r;

	TRY(store_auth_nonce(nonce_s));
	TRY(store_auth_keys_new(&keys));
	r = store_auth_keys_add(keys, "", s);
	if (r < 0)
		goto out;
	store_auth_encode_challenge(nonce_s, ch);
	r = store_io_send(fd, NULL, ch, sizeof(ch), deadline_ms);
	/* The answer's length is in its 5th byte: read the head, then the rest. */
	if (r == 0)
		r = recv_exact(fd, NULL, ans, 5, deadline_ms);
	if (r == 0) {
		have = 5;
		r = store_auth_verify(STORE_AUTH_MESH, keys, nonce_s, ans, have, &used, &g);
	}
	if (r == CRUN_EAGAIN) {
		size_t need = 5 + (size_t)ans[4] + STORE_AUTH_NONCE_BYTES + STORE_AUTH_MAC_BYTES;

		r = need > sizeof(ans) ? CRUN_EPROTO
				       : recv_exact(fd, NULL, ans + 5, need - 5, deadline_ms);
		if (r == 0)
			r = store_auth_verify(STORE_AUTH_MESH, keys, nonce_s, ans, need, &used, &g);
	}
	if (r == 0)
		r = store_io_send(fd, NULL, g.proof, sizeof(g.proof), deadline_ms);
	if (r < 0)
		snprintf(err, cap, "peer failed authentication: %s",
			 r == CRUN_EACCES   ? "wrong secret"
			 : r == CRUN_EPROTO ? "authentication required (it sent no answer)"
					    : crun_strerror(r));
out:
	store_auth_keys_free(keys);
	OPENSSL_cleanse(&g, sizeof(g));
	return r;
}

int store_host_is_loopback(const char *host)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res, *ai;
	int lo = 1;

	/* NULL, "" and the wildcards bind every interface. */
	if (!host || !*host)
		return 0;
	if (getaddrinfo(host, "1", &hints, &res) != 0)
		return 0;
	for (ai = res; ai; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			const struct sockaddr_in *a = (const struct sockaddr_in *)ai->ai_addr;

			lo &= (ntohl(a->sin_addr.s_addr) >> 24) == 127;
		} else if (ai->ai_family == AF_INET6) {
			const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ai->ai_addr;

			lo &= IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) ||
			      (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) &&
			       a->sin6_addr.s6_addr[12] == 127);
		} else {
			lo = 0;
		}
	}
	freeaddrinfo(res);
	return lo;
}
