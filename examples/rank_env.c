/* rank_env: a small C worker for crun. It prints the rank environment crun
 * gave it, then uses the worker store (the agent's, at MASTER_ADDR:
 * MASTER_PORT) through the public client: every rank publishes a key, waits
 * for every other rank's key and checks it. Keys live under the attempt
 * prefix PyTorch 1.13 workers use ("/worker/attempt_<n>"), so attempts never
 * see each other's keys.
 *
 *     crun --standalone --nproc_per_node=4 build/examples/rank_env
 * Exit: 0 when every check passed, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <crun/store.h>

static const char *const vars[] = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
};

static long env_long(const char *name)
{
	const char *v = getenv(name);
	char *end;
	long n;

	if (!v || !*v)
		return -1;
	n = strtol(v, &end, 10);
	return *end ? -1 : n;
}

int main(void)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *base = NULL, *s = NULL;
	long rank = env_long("RANK"), world = env_long("WORLD_SIZE");
	long port = env_long("MASTER_PORT"), attempt = env_long("TORCHELASTIC_RESTART_COUNT");
	char prefix[64], key[64], val[64];
	int bad = 0, r;

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);

		printf("rank %ld: %s=%s\n", rank, vars[i], v ? v : "<unset>");
	}
	fflush(stdout);
	if (rank < 0 || world < 1 || rank >= world || port < 1 || port > 65535 || attempt < 0 ||
	    !getenv("MASTER_ADDR")) {
		fprintf(stderr, "rank_env: not started by crun/torchrun (rank env missing)\n");
		return 1;
	}
	o.host = getenv("MASTER_ADDR");
	o.port = (uint16_t)port;
	o.timeout_ms = 60000;
	r = crun_store_open(&o, &base);
	if (r < 0) {
		fprintf(stderr, "rank_env: cannot reach the worker store %s:%ld: %s\n", o.host,
			port, crun_strerror(r));
		return 1;
	}
	snprintf(prefix, sizeof(prefix), "/worker/attempt_%ld", attempt);
	r = crun_store_view_new(base, prefix, &s);
	if (r < 0)
		goto fail;
	snprintf(key, sizeof(key), "rank_env/%ld", rank);
	snprintf(val, sizeof(val), "hello from rank %ld", rank);
	r = crun_store_set(s, key, val, strlen(val));
	if (r < 0)
		goto fail;
	for (long peer = 0; peer < world; peer++) {
		char want[64];
		void *got = NULL;
		size_t len = 0;

		snprintf(key, sizeof(key), "rank_env/%ld", peer);
		snprintf(want, sizeof(want), "hello from rank %ld", peer);
		r = crun_store_get(s, key, 60000, &got, &len);
		if (r < 0)
			goto fail;
		if (len != strlen(want) || memcmp(got, want, len) != 0) {
			fprintf(stderr, "rank_env: rank %ld read a wrong value for rank %ld\n",
				rank, peer);
			bad = 1;
		}
		crun_free(got);
	}
	/* Everyone is done reading before anyone leaves: ADD and wait. */
	{
		int64_t n = 0;

		r = crun_store_add(s, "rank_env/done", 1, &n);
		if (r < 0)
			goto fail;
		if (n == world)
			r = crun_store_set(s, "rank_env/all_done", "1", 1);
		if (r < 0)
			goto fail;
		r = crun_store_wait(s, (const char *const[]){"rank_env/all_done"}, 1, 60000);
		if (r < 0)
			goto fail;
	}
	printf("rank %ld: store check %s: read %ld keys under %s\n", rank, bad ? "FAILED" : "ok",
	       world, prefix);
	crun_store_close(s);
	crun_store_close(base);
	return bad;
fail:
	fprintf(stderr, "rank_env: rank %ld: store: %s (%s)\n", rank, crun_strerror(r),
		crun_store_last_error(s ? s : base));
	crun_store_close(s);
	crun_store_close(base);
	return 1;
}
