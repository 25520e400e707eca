/* fuzz_auth.c: libFuzzer target for the auth frames (store/auth.c), what a
 * stranger controls before it is trusted. Arbitrary bytes go to the
 * server's answer check (against a table with a daemon-wide and a per-job
 * secret), the client's challenge and proof parsers, and the job-scope key
 * check. Invariants: no read past the input (ASan), an accepted answer is a
 * prefix of the input and every strict prefix of it asks for more, and a
 * random answer is never accepted (it is refused as malformed, as a wrong
 * MAC or as an unknown run id). A real answer built from the input's
 * first bytes as nonce is checked to verify, so the accept path is reached.
 * Build: make fuzz; run: ./build-fuzz/fuzz_auth -max_total_time=30
 */
#include <stdlib.h>
#include <string.h>

#include "store/auth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_ok(int ok)
{
	if (!ok)
		abort();
}

static struct store_auth_keys *table(void)
{
	static struct store_auth_keys *k;
	static const struct store_auth_secret a = {.bytes = "fuzz-secret-daemon-wide", .len = 23};
	static const struct store_auth_secret b = {.bytes = "fuzz-secret-of-job-J-01", .len = 23};

	if (!k) {
		check_ok(store_auth_keys_new(&k) == 0);
		check_ok(store_auth_keys_add(k, "", &a) == 0);
		check_ok(store_auth_keys_add(k, "J", &b) == 0);
	}
	return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct store_auth_secret a = {.bytes = "fuzz-secret-daemon-wide", .len = 23};
	uint8_t nonce[STORE_AUTH_NONCE_BYTES] = {0}, nc[STORE_AUTH_NONCE_BYTES];
	uint8_t ans[STORE_AUTH_ANSWER_MAX];
	struct store_auth_grant g;
	size_t used, len;
	uint8_t *copy = malloc(size ? size : 1);
	int r;

	if (!copy)
		return 0;
	memcpy(copy, data, size); /* exact-size heap copy: ASan sees overreads */
	memcpy(nonce, data, size < sizeof(nonce) ? size : sizeof(nonce));

	r = store_auth_verify(STORE_AUTH_STORE, table(), nonce, copy, size, &used, &g);
	/* ENOENT: a run id that no table entry can match (a NUL or '/' in it). */
	check_ok(r == 0 || r == CRUN_EAGAIN || r == CRUN_EPROTO || r == CRUN_EACCES ||
		 r == CRUN_ENOENT);
	/* Random bytes never carry a valid MAC. */
	check_ok(r != 0);
	(void)store_auth_decode_challenge(copy, size, nonce);
	(void)store_auth_check_proof(STORE_AUTH_STORE, &a, "J", nonce, nonce, copy, size);
	(void)store_auth_key_allowed(&(struct store_auth_grant){.job = "J", .scoped = true}, copy,
				     size);

	/* A genuine answer to this nonce verifies, and its prefixes ask for more. */
	if (store_auth_answer(STORE_AUTH_STORE, &a, size > 3 ? "J2" : "", nonce, ans, &len, nc) ==
	    0) {
		check_ok(store_auth_verify(STORE_AUTH_STORE, table(), nonce, ans, len, &used, &g) ==
			     0 &&
			 used == len);
		for (size_t i = 0; i < len; i += 7)
			check_ok(store_auth_verify(STORE_AUTH_STORE, table(), nonce, ans, i, &used,
						   &g) == CRUN_EAGAIN);
	}
	free(copy);
	return 0;
}
