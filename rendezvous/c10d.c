/* c10d.c: the elastic c10d rendezvous (DESIGN.md "Rendezvous: O(N) per
 * round, O(1) per failure"), written against coord.h.
 *
 * Keys (under "crun-c10d/<run_id>/"):
 *   conf              "MIN:MAX" of the first agent; others must match
 *   closed            "done <round>" or "failed: <why>": the run id is spent
 *   round             the current round number (decimal counter)
 *   r<n>/joined       ticket counter of round n
 *   r<n>/node/<t>     ticket t's record: prev_grank nproc is_host wport addr host
 *   r<n>/closed       N, written once by COMPARE_SET (first writer wins)
 *   r<n>/assign/<t>   ticket t's result, written by ticket 1
 *   r<n>/change       why round n is over ("restart ...", "join ...",
 *                     "dead ...", "failed"); every member watches it
 *   r<n>/lease/<g>/hb keep-alive counter of group rank g (see coord.h)
 *   r<n>/exit, departed, departed_all, failed_ack, failed_acked: barriers
 *
 * Threads: a round, the exit barrier and the close-as-failed step each run
 * on a helper thread with their own connection (one at a time); a monitor
 * thread per completed round keeps this agent's lease alive, watches its
 * ring neighbour's lease and blocks on r<n>/change. Both post back to the
 * loop through pipes; the loop (which may serve the rendezvous store
 * in-process) never blocks.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "rendezvous/c10d.h"
#include "rendezvous/coord.h"
#include "rendezvous/etcd_int.h"
#include "store/auth.h"
#include "store/store.h"
#include "store/tls.h"

#define C10D_PROGRESS_MS  3000
#define C10D_SPARE_MAX_MS (7u * 24 * 3600 * 1000) /* a spare waits at most a week */
#define C10D_DEPART_MS	  10000
#define C10D_GRACE_MS	  100 /* host: after the last hang-up */

enum job_kind { JOB_ROUND, JOB_BARRIER, JOB_FAIL, JOB_MONITOR };

/* Results of a round job. */
enum round_outcome { RO_OK, RO_SPARE_DONE };

/* State shared with one helper thread; two references (see static.c). */
struct job {
	atomic_int refs;
	atomic_int stop; /* monitor: the loop no longer wants it */
	enum job_kind kind;
	char host[RDZV_HOST_MAX];
	uint16_t port;
	char prefix[320];
	struct c10d_conf conf;
	int min, max, nproc, is_host;
	int prev_round, prev_grank;
	uint16_t wport;
	char addr[RDZV_HOST_MAX];
	char hostname[RDZV_HOST_MAX];
	char why[512]; /* JOB_FAIL: root cause, "" when a peer closed the job */
	/* the round (input to BARRIER/FAIL/MONITOR, output of ROUND) */
	int round, nnodes, host_member;
	char nbr_host[RDZV_HOST_MAX];
	int notify_fd;
	/* results, read by the loop only after the notify byte */
	int result;
	enum round_outcome outcome;
	struct rdzv_info info;
	enum rdzv_change change;
	/* ROUND -> MONITOR: the connection holding this agent's lease, taken
	 * before the round is reported complete (no unguarded window) */
	struct coord *mon_c;
	uint64_t lease;
	bool hb, take_lease;
	struct etcd_conf *etcd; /* owned copy; NULL: the crun store */
	char *peers; /* ROUND, group rank 0: the nodes' addresses (c10d_peers.c) */
	char err[512];
};

struct c10d {
	struct rdzv_params p;
	struct c10d_conf conf;
	char run_id[256];
	char ep_host[RDZV_HOST_MAX];
	uint16_t ep_port;
	char hostname[RDZV_HOST_MAX];
	char addr[RDZV_HOST_MAX];	 /* advertised as MASTER_ADDR */
	struct store_server *rdzv_store; /* served in-process, or NULL */
	struct store_auth_keys *auth;	 /* its secret (auth_secret_file), or NULL */
	struct store_tls *tls;		 /* its TLS (tls_cert), or NULL */
	char *peers;			 /* the last round's node addresses, or NULL */
	bool tls_ca_set;		 /* rendezvous connections use TLS */
	uint16_t wport;			 /* this agent's worker store */
	bool have_info;
	struct rdzv_info info;
	int round, nnodes, host_member, prev_grank;
	char nbr_host[RDZV_HOST_MAX];
	enum rdzv_change change;
	struct job *job, *mon;
	pthread_t job_thr, mon_thr;
	int job_rd, mon_rd;
	struct event *job_ev, *mon_ev;
	struct coord *pend_c; /* lease connection handed from the round job */
	uint64_t pend_lease;
	bool pend_hb;
	struct etcd_conf *etcd; /* backend "etcd": the cluster; NULL: c10d */
	char prefix[320];	/* the run's keys */
	struct event *linger;	/* host: waits for the other agents to hang up */
	uint64_t linger_until;
	bool lingered;
	char err[512];
};

/* ---- pure parts ------------------------------------------------------------ */

static int conf_secs(const char *k, const char *v, uint32_t *ret, char *err, size_t cap)
{
	uint64_t ms;

	if (parse_seconds_ms(v, &ms) < 0 || ms == 0 || ms > UINT32_MAX) {
		snprintf(err, cap, "argument --rdzv_conf: %s=%s is not a number of seconds", k, v);
		return CRUN_EINVAL;
	}
	*ret = (uint32_t)ms;
	return 0;
}

/* The file-path keys of rdzv_conf (each a char[512] of the conf), or NULL. */
static char *conf_path(struct c10d_conf *c, const char *key)
{
	static const struct {
		const char *key;
		size_t off;
	} paths[] = {
	    {"auth_secret_file", offsetof(struct c10d_conf, auth_file)},
	    {"tls_cert", offsetof(struct c10d_conf, tls_cert)},
	    {"tls_key", offsetof(struct c10d_conf, tls_key)},
	    {"tls_ca", offsetof(struct c10d_conf, tls_ca)},
	};

	for (size_t i = 0; i < ARRAY_SIZE(paths); i++)
		if (strcmp(key, paths[i].key) == 0)
			return (char *)c + paths[i].off;
	return NULL;
}

int c10d_parse_conf(const char *s, struct c10d_conf *ret, char *err, size_t cap)
{
	struct c10d_conf c = {
	    .join_ms = 600000,
	    .last_call_ms = 30000,
	    .close_ms = 30000,
	    .read_ms = 60000,
	    .hb_ms = 1000,
	    .ttl_ms = 3000,
	    .is_host = -1,
	    .store = STORE_SERVER_CONFIG_DEFAULT,
	};

	for (const char *p = s ? s : ""; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char item[256], *eq, *v;
		uint32_t *dst = NULL;
		bool b;

		if (len >= sizeof(item)) {
			snprintf(err, cap, "argument --rdzv_conf: item too long");
			return CRUN_EINVAL;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		eq = strchr(item, '=');
		if (!eq || eq == item || !eq[1]) {
			snprintf(err, cap,
				 "argument --rdzv_conf: '%s' is not key=value with a non-empty key "
				 "and value",
				 item);
			return CRUN_EINVAL;
		}
		*eq = '\0';
		v = eq + 1;
		if (strcmp(item, "join_timeout") == 0 || strcmp(item, "timeout") == 0)
			dst = &c.join_ms;
		else if (strcmp(item, "last_call_timeout") == 0)
			dst = &c.last_call_ms;
		else if (strcmp(item, "close_timeout") == 0)
			dst = &c.close_ms;
		else if (strcmp(item, "read_timeout") == 0)
			dst = &c.read_ms;
		else if (strcmp(item, "heartbeat_interval") == 0)
			dst = &c.hb_ms;
		else if (strcmp(item, "lease_ttl") == 0)
			dst = &c.ttl_ms;
		if (dst) {
			TRY(conf_secs(item, v, dst, err, cap));
		} else if (conf_path(&c, item)) {
			if (str_printf(conf_path(&c, item), sizeof(c.auth_file), "%s", v) < 0) {
				snprintf(err, cap, "argument --rdzv_conf: %s too long", item);
				return CRUN_EINVAL;
			}
		} else if (strcmp(item, "tls_min_version") == 0) {
			if (strcmp(v, "1.2") && strcmp(v, "1.3")) {
				snprintf(
				    err, cap,
				    "argument --rdzv_conf: tls_min_version=%s is not 1.2 or 1.3",
				    v);
				return CRUN_EINVAL;
			}
			c.tls_min = v[2] == '2' ? 12 : 13;
		} else if (strcmp(item, "is_host") == 0) {
			if (parse_bool(v, &b) < 0) {
				snprintf(err, cap,
					 "argument --rdzv_conf: is_host=%s is not a boolean", v);
				return CRUN_EINVAL;
			}
			c.is_host = b;
		} else if (strncmp(item, "store_", 6) == 0) {
			char why[200];
			int r = store_server_config_set(&c.store, item + 6, v, why, sizeof(why));

			/* why starts with the tunable's name, which is as
			 * long as ours: print it under our spelling. */
			if (r < 0) {
				snprintf(err, cap, "argument --rdzv_conf: %s%s", item,
					 r == CRUN_ENOTFOUND ? " is not a store limit (see "
							       "crun-rdzvd --help)"
							     : why + strlen(item + 6));
				return CRUN_EINVAL;
			}
		} else {
			snprintf(err, cap,
				 "argument --rdzv_conf: unknown key '%s' (expected join_timeout, "
				 "last_call_timeout, close_timeout, read_timeout, is_host, "
				 "heartbeat_interval, lease_ttl, store_<limit>, auth_secret_file, "
				 "tls_cert, tls_key, tls_ca, tls_min_version)",
				 item);
			return CRUN_EINVAL;
		}
		if (!end)
			break;
		p = end + 1;
	}
	if (c.ttl_ms < c.hb_ms) {
		snprintf(err, cap,
			 "argument --rdzv_conf: lease_ttl must not be below "
			 "heartbeat_interval");
		return CRUN_EINVAL;
	}
	*ret = c;
	return 0;
}

int c10d_order(const int *prev_grank, int n, int *ret_grank)
{
	int next = 0;

	if (!prev_grank || n < 1)
		return CRUN_EINVAL;
	/* Survivors first, by their old group rank (O(n^2) worst case would be
	 * too slow for thousands of nodes: old ranks are < n_old, so bucket
	 * them by a counting pass over the ranks seen). */
	{
		int maxp = -1;
		int *slot;

		for (int i = 0; i < n; i++)
			if (prev_grank[i] > maxp)
				maxp = prev_grank[i];
		slot = malloc(sizeof(int) * (size_t)(maxp + 2));
		if (!slot)
			return CRUN_ENOMEM;
		for (int g = 0; g <= maxp; g++)
			slot[g] = -1;
		for (int i = 0; i < n; i++) {
			if (prev_grank[i] < 0)
				continue;
			if (slot[prev_grank[i]] >= 0) {
				free(slot);
				return CRUN_EINVAL; /* two nodes claim one old rank */
			}
			slot[prev_grank[i]] = i;
		}
		for (int g = 0; g <= maxp; g++)
			if (slot[g] >= 0)
				ret_grank[slot[g]] = next++;
		free(slot);
	}
	for (int i = 0; i < n; i++)
		if (prev_grank[i] < 0)
			ret_grank[i] = next++;
	return 0;
}

/* ---- helper threads ---------------------------------------------------------- */

static void job_put(struct job *j)
{
	if (atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	fd_close(j->notify_fd);
	coord_close(j->mon_c);
	free(j->etcd);
	free(j->peers);
	free(j);
}

static int jfail(struct job *j, struct coord *c, int r, const char *what)
{
	snprintf(j->err, sizeof(j->err), "%s: %s%s%s", what, crun_strerror(r), c ? " - " : "",
		 c ? coord_last_error(c) : "");
	return r;
}

#define KEY(buf, ...) TRY(str_printf(buf, sizeof(buf), __VA_ARGS__))

static int get_int(struct coord *c, const char *key, uint32_t timeout_ms, int64_t *ret)
{
	char *v = NULL;
	int64_t x;
	int r = coord_get(c, key, timeout_ms, &v);

	if (r < 0)
		return r;
	r = sscanf(v, "%" SCNd64, &x) == 1 ? 0 : CRUN_EPROTO;
	crun_free(v);
	if (r == 0)
		*ret = x;
	return r;
}

/* Configuration checks before joining: the same MIN:MAX for every agent,
 * and no joining a run id that already ended. */
static int check_job(struct job *j, struct coord *c)
{
	char want[64], *cur = NULL, *closed = NULL;
	int r;

	KEY(want, "%d:%d", j->min, j->max);
	r = coord_compare_set(c, "conf", "", want, &cur);
	if (r < 0)
		return jfail(j, c, r, "reading the job configuration");
	if (strcmp(cur, want) != 0) {
		snprintf(
		    j->err, sizeof(j->err),
		    "conflicting settings: this agent has --nnodes=%s but run '%s' was started "
		    "with --nnodes=%s",
		    want, j->prefix, cur);
		crun_free(cur);
		return CRUN_ECONFIG;
	}
	crun_free(cur);
	r = coord_try_get(c, "closed", &closed);
	if (r == 0) {
		snprintf(j->err, sizeof(j->err),
			 "run id already used: the rendezvous '%s' was closed (%s); use a new "
			 "--rdzv_id",
			 j->prefix, closed);
		crun_free(closed);
		return CRUN_ECONFIG;
	}
	return r == CRUN_ENOTFOUND ? 0 : jfail(j, c, r, "reading the job state");
}

static void progress(struct job *j, struct coord *c, int rd, int64_t joined, uint64_t left_ms)
{
	char hosts[512] = "", key[128];
	size_t o = 0;

	for (int64_t t = 1; t <= joined && t <= 8 && o + 64 < sizeof(hosts); t++) {
		char *v = NULL, h[RDZV_HOST_MAX];

		if (str_printf(key, sizeof(key), "r%d/node/%" PRId64, rd, t) < 0 ||
		    coord_try_get(c, key, &v) < 0)
			continue;
		if (sscanf(v, "%*d %*d %*d %*u %*s %255s", h) == 1)
			o += (size_t)snprintf(hosts + o, sizeof(hosts) - o, "%s%s", o ? ", " : "",
					      h);
		crun_free(v);
	}
	log_at(LL_WARN, SUB_RDZV,
	       "rendezvous '%s' round %d: %" PRId64 " of %d/%d nodes joined (hosts: %s%s), "
	       "%" PRIu64 " s left",
	       j->prefix, rd, joined, j->min, j->max, hosts, joined > 8 ? ", ..." : "",
	       left_ms / 1000);
}

/* Ticket 1's part: read the N records, order them, write N assignments. */
static int assign_round(struct job *j, struct coord *c, int rd, int n)
{
	char **keys = calloc((size_t)n, sizeof(char *));
	char **vals = calloc((size_t)n, sizeof(char *));
	int *prev = calloc((size_t)n, sizeof(int)), *nproc = calloc((size_t)n, sizeof(int));
	int *grank = calloc((size_t)n, sizeof(int)), *isho = calloc((size_t)n, sizeof(int));
	int *by_rank = calloc((size_t)n, sizeof(int));
	unsigned *wport = calloc((size_t)n, sizeof(unsigned));
	char(*addr)[RDZV_HOST_MAX] = calloc((size_t)n, RDZV_HOST_MAX);
	char(*host)[RDZV_HOST_MAX] = calloc((size_t)n, RDZV_HOST_MAX);
	int r = CRUN_ENOMEM, host_member = 0;
	int64_t base = 0;

	if (!keys || !vals || !prev || !nproc || !grank || !isho || !by_rank || !wport || !addr ||
	    !host)
		goto out;
	for (int i = 0; i < n; i++) {
		keys[i] = malloc(64);
		if (!keys[i])
			goto out;
		snprintf(keys[i], 64, "r%d/node/%d", rd, i + 1);
	}
	r = coord_multi_get(c, (const char *const *)keys, (size_t)n, j->conf.read_ms, vals);
	if (r < 0) {
		jfail(j, c, r, "reading the node records");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (sscanf(vals[i], "%d %d %d %u %255s %255s", &prev[i], &nproc[i], &isho[i],
			   &wport[i], addr[i], host[i]) != 6 ||
		    nproc[i] < 1 || prev[i] >= j->max) { /* c10d_order sizes by prev */
			r = jfail(j, NULL, CRUN_EPROTO, "bad node record");
			goto out;
		}
		host_member |= isho[i];
	}
	r = c10d_order(prev, n, grank);
	if (r < 0) {
		jfail(j, NULL, r, "ordering the nodes");
		goto out;
	}
	for (int i = 0; i < n; i++)
		by_rank[grank[i]] = i;
	for (int g = 0; g < n; g++) {
		int i = by_rank[g], nb = by_rank[(g + 1) % n], m = by_rank[0];
		char key[64], val[1024];
		int64_t total = 0;

		for (int k = 0; k < n; k++)
			total += nproc[k];
		r = str_printf(key, sizeof(key), "r%d/assign/%d", rd, i + 1);
		if (r >= 0)
			r = str_printf(val, sizeof(val),
				       "%d %d %" PRId64 " %" PRId64 " %u %s %s %d", g, n, base,
				       total, wport[m], addr[m], host[nb], host_member);
		if (r >= 0)
			r = coord_set(c, key, val);
		if (r < 0) {
			jfail(j, c, r, "writing an assignment");
			goto out;
		}
		base += nproc[i];
	}
	r = 0;
out:
	for (int i = 0; keys && vals && i < n; i++) {
		free(keys[i]);
		crun_free(vals[i]);
	}
	free(keys);
	free(vals);
	free(prev);
	free(nproc);
	free(grank);
	free(isho);
	free(by_rank);
	free(wport);
	free(addr);
	free(host);
	return r;
}

/* Waits for round rd+1 to open (a late joiner or a spare). RO_SPARE_DONE when
 * the job ended instead. */
static int wait_next_round(struct job *j, struct coord *c, int rd, bool spare, uint64_t deadline)
{
	char key[64];
	uint64_t last_log = clock_now_ms();

	KEY(key, "r%d/joined", rd + 1);
	for (int i = 0; i < 1 << 30; i++) {
		uint64_t now = clock_now_ms();
		int r;

		if (now >= deadline) {
			snprintf(j->err, sizeof(j->err),
				 "timed out waiting for the next round of rendezvous '%s'",
				 j->prefix);
			return CRUN_ETIMEDOUT;
		}
		r = coord_wait(c, key, (uint32_t)MIN(1000, deadline - now));
		if (r == 0)
			return 0;
		if (r != CRUN_ETIMEDOUT)
			return jfail(j, c, r, "waiting for the next round");
		r = coord_exists(c, "closed");
		if (r < 0)
			return jfail(j, c, r, "reading the job state");
		if (r == 1) {
			j->outcome = RO_SPARE_DONE;
			return 0;
		}
		if (clock_now_ms() - last_log >= C10D_PROGRESS_MS * 2) {
			last_log = clock_now_ms();
			log_at(LL_WARN, SUB_RDZV,
			       "rendezvous '%s': round %d is full (%d/%d nodes); waiting %s",
			       j->prefix, rd, j->nnodes, j->max,
			       spare ? "as a spare" : "for the next round");
		}
	}
	return CRUN_ETIMEDOUT;
}

static int mon_open(struct job *j, struct coord **ret);

/* Takes this agent's lease for round rd as soon as it holds a ticket, on the
 * connection the monitor will keep: from then on its death (connection
 * closed, or silence for a TTL) sets r<rd>/change, even before the round
 * completes. A store without leases: heartbeats (monitor) instead. */
static int lease_for(struct job *j, int64_t rd, int64_t t)
{
	char chk[64], why[512];
	int r = 0;

	if (!j->take_lease || j->hb)
		return 0;
	KEY(chk, "r%" PRId64 "/change", rd);
	KEY(why, "dead %s (ticket %" PRId64 ": lease expired or connection lost)", j->hostname, t);
	if (j->mon_c && j->lease)
		(void)coord_lease_revoke(j->mon_c, j->lease);
	j->lease = 0;
	if (!j->mon_c)
		r = mon_open(j, &j->mon_c);
	if (r < 0)
		return jfail(j, NULL, r, "connecting the lease monitor");
	r = coord_lease_grant(j->mon_c, j->conf.ttl_ms, chk, why, &j->lease);
	if (r == CRUN_ENOTSUP) {
		log_at(LL_WARN, SUB_RDZV,
		       "the rendezvous store has no leases; falling back to heartbeats");
		coord_close(j->mon_c);
		j->mon_c = NULL;
		j->hb = true;
		r = mon_open(j, &j->mon_c);
	}
	return r < 0 ? jfail(j, j->mon_c, r, "taking the lease") : 0;
}

/* Joins rounds until one that counts this agent in completes. */
static int job_round(struct job *j, struct coord *c)
{
	uint64_t deadline = clock_now_ms() + j->conf.join_ms;
	char key[128], val[1024], *v = NULL;
	int64_t rd, t, n, joined;
	int r;

	TRY(check_job(j, c));
	if (j->prev_round >= 0) {
		/* Whoever comes back first moves the job to the next round; the
		 * round's change key says why, if nobody said it yet. */
		KEY(key, "r%d/change", j->prev_round);
		KEY(val, "restart %s", j->hostname);
		r = coord_compare_set(c, key, "", val, NULL);
		if (r == 0) {
			char cur[32], nxt[32];

			KEY(cur, "%d", j->prev_round);
			KEY(nxt, "%d", j->prev_round + 1);
			r = coord_compare_set(c, "round", cur, nxt, NULL);
		}
		if (r < 0)
			return jfail(j, c, r, "opening the next round");
	}
	for (int attempt = 0; attempt < 1 << 20; attempt++) {
		uint64_t min_seen = 0, last_log = clock_now_ms();

		r = coord_add(c, "round", 0, &rd);
		if (r < 0)
			return jfail(j, c, r, "reading the round");
		KEY(key, "r%" PRId64 "/joined", rd);
		r = coord_add(c, key, 1, &t);
		if (r < 0)
			return jfail(j, c, r, "joining");
		TRY(lease_for(j, rd, t));
		KEY(key, "r%" PRId64 "/node/%" PRId64, rd, t);
		KEY(val, "%d %d %d %u %s %s", j->prev_grank, j->nproc, j->is_host, j->wport,
		    j->addr, j->hostname);
		r = coord_set(c, key, val);
		if (r < 0)
			return jfail(j, c, r, "writing the node record");
		/* Close the round: at MAX at once (the MAX-th ticket closes), else
		 * ticket 1 closes it after MIN plus the last call; the others only
		 * wait on the closed key (no polling). */
		KEY(key, "r%" PRId64 "/closed", rd);
		if (t == j->max) {
			KEY(val, "%d", j->max);
			r = coord_compare_set(c, key, "", val, NULL);
			if (r < 0)
				return jfail(j, c, r, "closing the round");
		}
		for (int i = 0; i < 1 << 30; i++) {
			uint64_t now = clock_now_ms();
			char jk[64], cnt[32];

			if (now >= deadline) {
				snprintf(j->err, sizeof(j->err),
					 "timed out after %u s waiting for %d nodes to join "
					 "rendezvous '%s' round %" PRId64,
					 j->conf.join_ms / 1000, j->min, j->prefix, rd);
				return CRUN_ETIMEDOUT;
			}
			joined = -1;
			KEY(jk, "r%" PRId64 "/joined", rd);
			if (t == 1) {
				r = coord_add(c, jk, 0, &joined);
				if (r < 0)
					return jfail(j, c, r, "counting the nodes");
				if (joined >= j->min && !min_seen)
					min_seen = now;
				if (joined >= j->max ||
				    (min_seen && now - min_seen >= j->conf.last_call_ms)) {
					KEY(cnt, "%" PRId64, MIN(joined, (int64_t)j->max));
					r = coord_compare_set(c, key, "", cnt, NULL);
					if (r < 0)
						return jfail(j, c, r, "closing the round");
				}
			}
			r = coord_wait(c, key, (uint32_t)MIN(t == 1 ? 100 : 1000, deadline - now));
			if (r == 0)
				break;
			if (r != CRUN_ETIMEDOUT)
				return jfail(j, c, r, "waiting for the round to close");
			if (clock_now_ms() - last_log >= C10D_PROGRESS_MS) {
				last_log = clock_now_ms();
				if (joined < 0 && coord_add(c, jk, 0, &joined) < 0)
					joined = t;
				progress(j, c, (int)rd, joined, deadline - clock_now_ms());
			}
		}
		r = get_int(c, key, j->conf.read_ms, &n);
		if (r < 0)
			return jfail(j, c, r, "reading the round size");
		j->nnodes = (int)n;
		if (t > n) {
			bool spare = n >= j->max;

			if (spare && j->lease) {
				/* A spare's death must not disturb the running job. */
				(void)coord_lease_revoke(j->mon_c, j->lease);
				j->lease = 0;
			}
			if (!spare) {
				/* Scale up: ask the running round to make room. */
				KEY(key, "r%" PRId64 "/change", rd);
				KEY(val, "join %s", j->hostname);
				r = coord_compare_set(c, key, "", val, NULL);
				if (r < 0)
					return jfail(j, c, r, "asking for a new round");
			}
			log_at(LL_WARN, SUB_RDZV,
			       "rendezvous '%s': round %" PRId64 " closed with %" PRId64
			       " nodes; %s",
			       j->prefix, rd, n,
			       spare ? "waiting as a spare" : "a new round will include this node");
			r = wait_next_round(j, c, (int)rd, spare,
					    spare ? clock_now_ms() + C10D_SPARE_MAX_MS : deadline);
			if (r < 0 || j->outcome == RO_SPARE_DONE)
				return r;
			if (spare)
				deadline = clock_now_ms() + j->conf.join_ms;
			continue;
		}
		log_at(LL_DEBUG, SUB_RDZV,
		       "round %" PRId64 " closed with %" PRId64 ", ticket %" PRId64, rd, n, t);
		if (t == 1)
			TRY(assign_round(j, c, (int)rd, (int)n));
		KEY(key, "r%" PRId64 "/assign/%" PRId64, rd, t);
		r = coord_get(c, key, j->conf.read_ms, &v);
		if (r < 0)
			return jfail(j, c, r, "waiting for the rank assignment");
		{
			struct rdzv_info *in = &j->info;
			unsigned mport;

			if (sscanf(v, "%d %d %d %d %u %255s %255s %d", &in->group_rank,
				   &in->group_world_size, &in->base_rank, &in->world_size, &mport,
				   in->master_addr, j->nbr_host, &j->host_member) != 8 ||
			    mport == 0 || mport > 65535) {
				crun_free(v);
				return jfail(j, NULL, CRUN_EPROTO, "bad rank assignment");
			}
			in->master_port = (uint16_t)mport;
			in->role_base_rank = in->base_rank;
			in->role_world_size = in->world_size;
		}
		crun_free(v);
		j->round = (int)rd;
		/* Group rank 0 serves the round's worker store: learn who may reach it. */
		if (j->info.group_rank == 0 &&
		    c10d_read_peer_addrs(c, (int)rd, (int)n, j->conf.read_ms, &j->peers) < 0)
			log_at(LL_WARN, SUB_RDZV,
			       "cannot read the round's node addresses: the worker store "
			       "allows loopback only");
		return 0;
	}
	return CRUN_ETIMEDOUT;
}

/* Counts key up by one; the caller that reaches `target` sets done_key. */
static int count_in(struct coord *c, const char *rkey, const char *done_key, int64_t target)
{
	int64_t n;

	TRY(coord_add(c, rkey, 1, &n));
	if (n == target)
		TRY(coord_set(c, done_key, "1"));
	return 0;
}

static int job_barrier(struct job *j, struct coord *c)
{
	char k1[64], k2[64], val[64];
	int64_t n;
	int r;

	KEY(k1, "r%d/exit", j->round);
	r = coord_add(c, k1, 1, &n);
	if (r < 0)
		return jfail(j, c, r, "exit barrier");
	if (n == j->nnodes) {
		KEY(val, "done %d", j->round);
		r = coord_compare_set(c, "closed", "", val, NULL);
		if (r < 0)
			return jfail(j, c, r, "exit barrier");
	}
	r = coord_wait(c, "closed", j->conf.join_ms);
	if (r < 0)
		return jfail(j, c, r, "exit barrier");
	KEY(k1, "r%d/departed", j->round);
	KEY(k2, "r%d/departed_all", j->round);
	if (!j->is_host)
		return count_in(c, k1, k2, j->nnodes - j->host_member);
	if (j->nnodes - j->host_member > 0) {
		r = coord_wait(c, k2, C10D_DEPART_MS);
		if (r < 0)
			log_at(LL_WARN, SUB_RDZV,
			       "not every agent left within %u s; leaving anyway",
			       C10D_DEPART_MS / 1000);
	}
	return 0;
}

static int job_fail(struct job *j, struct coord *c)
{
	char key[64], val[600];
	int r;

	if (j->why[0]) {
		KEY(val, "failed: %s", j->why);
		r = coord_compare_set(c, "closed", "", val, NULL);
		if (r == 0) {
			/* Overwrites any earlier reason: members still watching
			 * must learn that this is the end. */
			KEY(key, "r%d/change", j->round);
			r = coord_set(c, key, "failed");
		}
		if (r < 0)
			return jfail(j, c, r, "closing the rendezvous as failed");
	}
	/* The agent serving the store waits for the others to have read it. */
	if (j->is_host && j->nnodes > 1) {
		KEY(key, "r%d/failed_acked", j->round);
		r = coord_wait(c, key, j->conf.close_ms);
		if (r < 0)
			log_at(LL_WARN, SUB_RDZV, "not every agent saw the failure within %u s",
			       j->conf.close_ms / 1000);
	}
	return 0;
}

static void monitor_post(struct job *j, enum rdzv_change ch)
{
	char one = 1;
	ssize_t n;

	j->change = ch;
	do
		n = write(j->notify_fd, &one, 1);
	while (n < 0 && errno == EINTR);
}

/* Authentication of a connection to the rendezvous store: the job's secret
 * and its run id (the prefix is "crun-c10d/<run_id>", STORE_AUTH_JOB_ROOT). */
static void auth_opts(struct coord_opts *o, const struct c10d_conf *conf, const char *prefix)
{
	o->auth_secret_file = conf->auth_file[0] ? conf->auth_file : NULL;
	o->auth_job = prefix + sizeof(STORE_AUTH_JOB_ROOT) - 2;
	o->tls_ca = conf->tls_ca[0] ? conf->tls_ca : NULL;
	o->tls_cert = conf->tls_cert[0] ? conf->tls_cert : NULL;
	o->tls_key = conf->tls_key[0] ? conf->tls_key : NULL;
	o->tls_min_version = conf->tls_min;
}

/* Opens the monitor's connection (the lease lives and dies with it). */
static int mon_open(struct job *j, struct coord **ret)
{
	struct coord_opts o = {0};

	o.host = j->host;
	o.port = j->port;
	o.prefix = j->prefix;
	o.connect_timeout_ms = j->conf.read_ms;
	o.timeout_ms = j->conf.read_ms;
	o.etcd = j->etcd;
	auth_opts(&o, &j->conf, j->prefix);
	return coord_open(&o, ret);
}

/* Holds this agent's lease on the round (its expiry, or our connection
 * closing, sets the round's change key on the server) and blocks on the
 * change key; posts one change and ends. Against a store without leases it
 * falls back to heartbeats, watching its ring neighbour's. On stop (the
 * agent moved on) the lease is revoked, so leaving is not a failure. */
static int job_monitor(struct job *j, struct coord **cp)
{
	char me[64], nbr[64], chk[64], k1[64], k2[64], why[512], *v = NULL;
	int64_t cnt, last = -1;
	uint64_t last_move = clock_now_ms(), lease = 0;
	bool hb = false;
	int r;

	KEY(me, "r%d/lease/%d", j->round, j->info.group_rank);
	KEY(nbr, "r%d/lease/%d", j->round, (j->info.group_rank + 1) % j->nnodes);
	KEY(chk, "r%d/change", j->round);
	lease = j->lease;
	hb = j->hb || !lease;
	r = 0;
	for (int i = 0; r == 0 && i < 1 << 30 && !atomic_load(&j->stop); i++) {
		r = hb ? coord_heartbeat(*cp, me) : coord_lease_keepalive(*cp, lease);
		if (r == CRUN_ENOTFOUND)
			r = 0; /* our lease lapsed: the change key is set already */
		if (r == 0)
			r = coord_watch(*cp, chk, j->conf.hb_ms);
		if (r == 0)
			break;
		if (r != CRUN_ETIMEDOUT)
			break;
		r = 0;
		if (!hb || j->nnodes < 2 || coord_heartbeat_peek(*cp, nbr, &cnt) < 0)
			continue;
		if (cnt != last) {
			last = cnt;
			last_move = clock_now_ms();
		} else if (clock_now_ms() - last_move > j->conf.ttl_ms) {
			KEY(why, "dead %s (group rank %d: no heartbeat for %u ms)", j->nbr_host,
			    (j->info.group_rank + 1) % j->nnodes, j->conf.ttl_ms);
			(void)coord_expire(*cp, chk, why);
		}
	}
	if (atomic_load(&j->stop)) {
		if (lease && *cp)
			(void)coord_lease_revoke(*cp, lease);
		return 0;
	}
	if (r < 0) {
		snprintf(j->err, sizeof(j->err), "lost the rendezvous store at %s:%u: %s", j->host,
			 j->port, *cp ? coord_last_error(*cp) : crun_strerror(r));
		monitor_post(j, RDZV_CHANGE_FAILED);
		return r;
	}
	r = coord_get(*cp, chk, j->conf.read_ms, &v);
	if (r < 0) {
		snprintf(j->err, sizeof(j->err), "lost the rendezvous store at %s:%u: %s", j->host,
			 j->port, coord_last_error(*cp));
		monitor_post(j, RDZV_CHANGE_FAILED);
		return r;
	}
	snprintf(j->err, sizeof(j->err), "%s", v);
	if (strncmp(v, "failed", 6) == 0) {
		char *why2 = NULL;

		if (coord_get(*cp, "closed", j->conf.read_ms, &why2) == 0) {
			snprintf(j->err, sizeof(j->err), "%s", why2);
			crun_free(why2);
		}
		KEY(k1, "r%d/failed_ack", j->round);
		KEY(k2, "r%d/failed_acked", j->round);
		/* Everyone but the failing agent acknowledges. */
		(void)count_in(*cp, k1, k2, j->nnodes - 1);
		monitor_post(j, RDZV_CHANGE_FAILED);
	} else {
		monitor_post(j, strncmp(v, "restart", 7) == 0 ? RDZV_CHANGE_RESTART
							      : RDZV_CHANGE_MEMBERSHIP);
	}
	crun_free(v);
	/* Stay connected (lease held) until the agent moves on: closing now
	 * would look like a failure of this node to the others. */
	for (int i = 0; i < 1 << 30 && !atomic_load(&j->stop); i++) {
		if (lease && coord_lease_keepalive(*cp, lease) < 0)
			break;
		usleep(j->conf.hb_ms * 1000u < 1000000u ? j->conf.hb_ms * 1000u : 999999u);
	}
	if (lease && atomic_load(&j->stop))
		(void)coord_lease_revoke(*cp, lease);
	return 0;
}

static void *job_main(void *arg)
{
	struct job *j = arg;
	struct coord_opts o = {0};
	struct coord *c = NULL;
	char one = 1;
	ssize_t n;
	int r;

	o.host = j->host;
	o.port = j->port;
	o.prefix = j->prefix;
	o.connect_timeout_ms = j->kind == JOB_ROUND ? j->conf.join_ms : j->conf.read_ms;
	o.timeout_ms = j->conf.read_ms;
	o.etcd = j->etcd;
	auth_opts(&o, &j->conf, j->prefix);
	if (j->kind == JOB_MONITOR && j->mon_c) {
		c = j->mon_c; /* the round's lease connection */
		j->mon_c = NULL;
		r = 0;
	} else {
		r = coord_open(&o, &c);
	}
	if (r < 0) {
		snprintf(j->err, sizeof(j->err), "cannot reach the rendezvous store at %s:%u: %s",
			 j->host, j->port, crun_strerror(r));
		if (j->kind == JOB_MONITOR) {
			monitor_post(j, RDZV_CHANGE_FAILED);
			job_put(j);
			return NULL;
		}
	} else {
		switch (j->kind) {
		case JOB_ROUND:
			j->take_lease = true;
			r = job_round(j, c);
			break;
		case JOB_BARRIER:
			r = job_barrier(j, c);
			break;
		case JOB_FAIL:
			r = job_fail(j, c);
			break;
		case JOB_MONITOR:
			r = job_monitor(j, &c);
			coord_close(c);
			job_put(j);
			return NULL; /* it posted (or was told to stop) */
		}
		coord_close(c);
	}
	j->result = r;
	/* The write is the release point for the results above. */
	do
		n = write(j->notify_fd, &one, 1);
	while (n < 0 && errno == EINTR);
	job_put(j);
	return NULL;
}

static struct job *join_job(const struct c10d_join_args *a)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->kind = JOB_ROUND;
	snprintf(j->host, sizeof(j->host), "%s", a->host ? a->host : "");
	j->port = a->port;
	if (a->etcd && etcd_prefix(a->etcd, a->run_id, j->prefix, sizeof(j->prefix)) < 0) {
		free(j);
		return NULL;
	}
	if (!a->etcd)
		snprintf(j->prefix, sizeof(j->prefix), "crun-c10d/%s", a->run_id);
	j->conf = a->conf;
	j->min = a->min;
	j->max = a->max;
	j->nproc = a->nproc;
	j->prev_round = a->prev_round;
	j->prev_grank = a->prev_grank;
	j->wport = a->wport;
	snprintf(j->addr, sizeof(j->addr), "%s", a->addr);
	snprintf(j->hostname, sizeof(j->hostname), "%s", a->hostname);
	return j;
}

int c10d_join_on(struct coord *c, const struct c10d_join_args *a, struct rdzv_info *ret_info,
		 int *ret_round, char *err, size_t cap)
{
	struct job *j = join_job(a);
	int r;

	if (!j)
		return CRUN_ENOMEM;
	r = job_round(j, c);
	if (r < 0) {
		snprintf(err, cap, "%s", j->err);
	} else if (j->outcome == RO_SPARE_DONE) {
		snprintf(err, cap, "the job ended while this node waited as a spare");
		r = CRUN_ERDZVCLOSED;
	} else {
		*ret_info = j->info;
		*ret_round = j->round;
	}
	free(j);
	return r;
}

int c10d_join_blocking(const struct c10d_join_args *a, struct rdzv_info *ret_info, int *ret_round,
		       char *err, size_t cap)
{
	struct coord_opts o = {0};
	struct coord *c = NULL;
	char prefix[320];
	int r;

	if (a->etcd)
		TRY(etcd_prefix(a->etcd, a->run_id, prefix, sizeof(prefix)));
	else
		TRY(str_printf(prefix, sizeof(prefix), "crun-c10d/%s", a->run_id));
	o.etcd = a->etcd;
	o.host = a->host;
	o.port = a->port;
	o.prefix = prefix;
	o.connect_timeout_ms = a->conf.join_ms;
	o.timeout_ms = a->conf.read_ms;
	auth_opts(&o, &a->conf, prefix);
	r = coord_open(&o, &c);
	if (r < 0) {
		snprintf(err, cap, "cannot reach the rendezvous store: %s", crun_strerror(r));
		return r;
	}
	r = c10d_join_on(c, a, ret_info, ret_round, err, cap);
	coord_close(c);
	return r;
}

/* ---- the loop side ----------------------------------------------------------- */

static void drop_monitor(struct c10d *c)
{
	if (!c->mon)
		return;
	atomic_store(&c->mon->stop, 1);
	pthread_detach(c->mon_thr);
	job_put(c->mon);
	c->mon = NULL;
	if (c->mon_ev)
		event_free(c->mon_ev);
	c->mon_ev = NULL;
	fd_close(c->mon_rd);
	c->mon_rd = -1;
}

static void on_job(evutil_socket_t fd, short what, void *arg);
static void on_mon(evutil_socket_t fd, short what, void *arg);

static int start(struct c10d *c, enum job_kind kind, const char *why)
{
	struct job *j;
	struct event **evp = kind == JOB_MONITOR ? &c->mon_ev : &c->job_ev;
	int *rdp = kind == JOB_MONITOR ? &c->mon_rd : &c->job_rd;
	pthread_t *thr = kind == JOB_MONITOR ? &c->mon_thr : &c->job_thr;
	sigset_t all, saved;
	int pfd[2], err;

	if (kind != JOB_MONITOR && c->job)
		return CRUN_EBUSY;
	j = calloc(1, sizeof(*j));
	if (!j)
		return CRUN_ENOMEM;
	if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
		err = -errno;
		free(j);
		return err;
	}
	atomic_init(&j->refs, 2);
	atomic_init(&j->stop, 0);
	j->kind = kind;
	snprintf(j->host, sizeof(j->host), "%s", c->ep_host);
	j->port = c->ep_port;
	snprintf(j->prefix, sizeof(j->prefix), "%s", c->prefix);
	if (c->etcd && !(j->etcd = mem_dup(c->etcd, sizeof(*c->etcd)))) {
		fd_close(pfd[0]);
		fd_close(pfd[1]);
		free(j);
		return CRUN_ENOMEM;
	}
	j->conf = c->conf;
	j->min = c->p.min_nodes;
	j->max = c->p.max_nodes;
	j->nproc = c->p.nproc;
	j->is_host = c->rdzv_store != NULL;
	j->prev_round = c->have_info ? c->round : -1;
	j->prev_grank = c->prev_grank;
	j->wport = c->wport;
	snprintf(j->addr, sizeof(j->addr), "%s", c->addr);
	snprintf(j->hostname, sizeof(j->hostname), "%s", c->hostname);
	snprintf(j->why, sizeof(j->why), "%s", why ? why : "");
	j->round = c->round;
	j->nnodes = c->nnodes;
	j->host_member = c->host_member;
	j->info = c->info;
	snprintf(j->nbr_host, sizeof(j->nbr_host), "%s", c->nbr_host);
	j->notify_fd = pfd[1];
	if (kind == JOB_MONITOR) {
		j->mon_c = c->pend_c;
		j->lease = c->pend_lease;
		j->hb = c->pend_hb;
		c->pend_c = NULL;
	}
	if (*evp)
		event_free(*evp);
	fd_close(*rdp); /* also when a failed start left no event */
	*rdp = pfd[0];
	*evp = event_new(c->p.base, pfd[0], EV_READ | EV_PERSIST,
			 kind == JOB_MONITOR ? on_mon : on_job, c);
	if (!*evp || event_add(*evp, NULL) < 0) {
		job_put(j);
		job_put(j);
		return CRUN_ENOMEM;
	}
	if (kind == JOB_MONITOR)
		c->mon = j;
	else
		c->job = j;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	err = pthread_create(thr, NULL, job_main, j);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	if (err) {
		if (kind == JOB_MONITOR)
			c->mon = NULL;
		else
			c->job = NULL;
		job_put(j);
		job_put(j);
		return -err;
	}
	return 0;
}

static void on_linger(evutil_socket_t fd, short what, void *arg)
{
	struct c10d *c = arg;
	struct store_server_stats st;
	struct timeval tv = {0, 10000};

	(void)fd;
	(void)what;
	store_server_get_stats(c->rdzv_store, &st);
	if (st.conns > 0 && clock_now_ms() < c->linger_until && c->linger &&
	    evtimer_add(c->linger, &tv) == 0)
		return;
	/* The others hung up as their processes exited; give those exits a
	 * moment to finish so this node is really the last one up. */
	if (!c->lingered && c->linger) {
		struct timeval grace = {0, C10D_GRACE_MS * 1000};

		c->lingered = true;
		if (evtimer_add(c->linger, &grace) == 0)
			return;
	}
	c->p.on_event(RDZV_EV_BARRIER_DONE, c->p.arg);
}

static void on_job(evutil_socket_t fd, short what, void *arg)
{
	struct c10d *c = arg;
	struct job *j = c->job;
	enum rdzv_event ev;
	char buf[8];

	(void)what;
	if (read(fd, buf, sizeof(buf)) <= 0 || !j)
		return;
	pthread_join(c->job_thr, NULL);
	c->job = NULL;
	/* The write end closes with the job's last reference: stop watching
	 * the pipe, or its EOF would wake the loop until the next job. */
	event_del(c->job_ev);
	if (j->kind == JOB_BARRIER || j->kind == JOB_FAIL) {
		if (j->result < 0)
			log_at(LL_WARN, SUB_RDZV, "%s", j->err);
		job_put(j);
		/* An agent that is not the host keeps its monitor connection (and
		 * lease) until it exits, so the host, which waits for every
		 * connection to close, leaves after the others' processes. */
		if (c->rdzv_store)
			drop_monitor(c);
		if (c->rdzv_store) {
			/* The store leaves last: wait for every other agent to
			 * hang up (bounded), then report the barrier done. */
			c->linger_until = clock_now_ms() + C10D_DEPART_MS;
			on_linger(-1, 0, c);
			return;
		}
		c->p.on_event(RDZV_EV_BARRIER_DONE, c->p.arg);
		return;
	} else if (j->result < 0) {
		snprintf(c->err, sizeof(c->err), "%s", j->err);
		ev = RDZV_EV_FAILED;
	} else if (j->outcome == RO_SPARE_DONE) {
		ev = RDZV_EV_SPARE_DONE;
	} else {
		c->info = j->info;
		free(c->peers);
		c->peers = j->peers; /* taken */
		j->peers = NULL;
		c->round = j->round;
		c->nnodes = j->nnodes;
		c->host_member = j->host_member;
		c->prev_grank = j->info.group_rank;
		snprintf(c->nbr_host, sizeof(c->nbr_host), "%s", j->nbr_host);
		c->have_info = true;
		c->change = RDZV_CHANGE_NONE;
		coord_close(c->pend_c);
		c->pend_c = j->mon_c;
		c->pend_lease = j->lease;
		c->pend_hb = j->hb;
		j->mon_c = NULL;
		ev = RDZV_EV_COMPLETE;
		log_at(LL_WARN, SUB_RDZV,
		       "rendezvous '%s' round %d complete: %d nodes, group_rank=%d world_size=%d "
		       "master=%s:%u",
		       c->run_id, c->round, c->nnodes, c->info.group_rank, c->info.world_size,
		       c->info.master_addr, c->info.master_port);
		if (start(c, JOB_MONITOR, NULL) < 0)
			log_at(LL_ERROR, SUB_RDZV, "cannot start the lease monitor");
	}
	job_put(j);
	c->p.on_event(ev, c->p.arg);
}

static void on_mon(evutil_socket_t fd, short what, void *arg)
{
	struct c10d *c = arg;
	struct job *j = c->mon;
	char buf[8];

	(void)what;
	if (read(fd, buf, sizeof(buf)) <= 0 || !j)
		return;
	c->change = j->change;
	snprintf(c->err, sizeof(c->err), "%s", j->err);
	log_at(LL_WARN, SUB_RDZV, "rendezvous '%s' round %d is over: %s", c->run_id, c->round,
	       j->err);
	c->p.on_event(RDZV_EV_PEER_CHANGED, c->p.arg);
}

/* The local address this host uses to reach host:port (a UDP connect sends
 * nothing): what the other nodes can reach this one at, even where the host
 * name does not resolve to it (network namespaces, several interfaces). */
static int route_addr(const char *host, uint16_t port, char *buf, size_t cap)
{
	struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char ps[8];
	int fd, r = CRUN_ERESOLVE;

	if (str_printf(ps, sizeof(ps), "%u", port) < 0 || getaddrinfo(host, ps, &hints, &res))
		return CRUN_ERESOLVE;
	fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
	    getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
	    getnameinfo((struct sockaddr *)&ss, sl, buf, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) ==
		0)
		r = 0;
	if (fd >= 0)
		fd_close(fd);
	freeaddrinfo(res);
	return r;
}

/* Whether host:port can be bound here (a local address, a free port):
 * probing first keeps the store's own "cannot listen" error for real
 * failures. */
static bool endpoint_bindable(const char *host, uint16_t port)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	char ps[8];
	bool ok = false;
	int one = 1;

	if (str_printf(ps, sizeof(ps), "%u", port) < 0 || getaddrinfo(host, ps, &hints, &res))
		return false;
	for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			continue;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		ok = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
		fd_close(fd);
	}
	freeaddrinfo(res);
	return ok;
}

/* Serves the rendezvous store here when the endpoint is ours: is_host=1, or
 * auto and the endpoint address binds (a local address whose port is free). */
static void maybe_serve(struct c10d *c)
{
	struct store_server_config sc = c->conf.store; /* rdzv_conf store_* limits */
	int r;

	if (c->conf.is_host == 0)
		return;
	if (c->conf.is_host < 0 && !endpoint_bindable(c->ep_host, c->ep_port))
		return;
	if (c->tls_ca_set && !c->tls) {
		log_at(LL_INFO, SUB_RDZV,
		       "not serving the rendezvous store: tls_ca without tls_cert");
		return;
	}
	sc.host = c->conf.is_host == 1 ? NULL : c->ep_host;
	sc.port = c->ep_port;
	sc.auth = c->auth;
	sc.tls = c->tls;
	r = store_server_new(c->p.base, &sc, &c->rdzv_store);
	if (r < 0) {
		c->rdzv_store = NULL;
		log_at(LL_INFO, SUB_RDZV, "not serving the rendezvous store on %s:%u (%s)",
		       c->ep_host, c->ep_port, crun_strerror(r));
		return;
	}
	log_at(LL_WARN, SUB_RDZV, "serving the rendezvous store on %s:%u", c->ep_host, c->ep_port);
	/* torchrun compatibility keeps this allowed; say what it means once. */
	if (!c->auth && !c->tls_ca_set && !store_host_is_loopback(sc.host))
		log_at(LL_WARN, SUB_RDZV,
		       "the rendezvous store on %s:%u has no authentication: anyone who reaches "
		       "it can change or end this job (give it a secret: CRUN_AUTH_SECRET_FILE "
		       "or --rdzv_conf auth_secret_file=FILE)",
		       sc.host ? sc.host : "*", c->ep_port);
}

/* TLS of the store served here (tls_cert) and a check of the client side
 * (tls_ca), before any connection: a bad file is one clear error. */
static int load_tls(struct c10d *c)
{
	struct store_tls_opts o = {.cert = c->conf.tls_cert,
				   .key = c->conf.tls_key,
				   .ca = c->conf.tls_ca,
				   .min_version = c->conf.tls_min};
	struct store_tls *probe = NULL;

	if ((c->conf.tls_cert[0] || c->conf.tls_key[0]) && !c->conf.tls_ca[0]) {
		snprintf(c->err, sizeof(c->err),
			 "argument --rdzv_conf: tls_cert needs tls_ca (agents verify the store)");
		return CRUN_EINVAL;
	}
	if (!c->conf.tls_ca[0])
		return 0;
	c->tls_ca_set = true;
	TRY(store_tls_new_client(&o, &probe, c->err, sizeof(c->err)));
	store_tls_free(probe);
	if (!c->conf.tls_cert[0])
		return 0; /* this agent can only join, not serve */
	return store_tls_new_server(&o, &c->tls, c->err, sizeof(c->err));
}

/* The job's secret: rdzv_conf auth_secret_file, else the agent's
 * --auth_secret_file, else $CRUN_AUTH_SECRET_FILE. Checked here, before any
 * connection, so a bad file is one clear error. */
static int load_auth(struct c10d *c, const char *from_agent)
{
	struct store_auth_secret s;
	const char *env = getenv("CRUN_AUTH_SECRET_FILE");
	int r;

	if (!c->conf.auth_file[0] && from_agent && *from_agent)
		TRY(str_printf(c->conf.auth_file, sizeof(c->conf.auth_file), "%s", from_agent));
	if (!c->conf.auth_file[0] && env && *env)
		TRY(str_printf(c->conf.auth_file, sizeof(c->conf.auth_file), "%s", env));
	if (!c->conf.auth_file[0])
		return 0;
	r = store_auth_secret_read(c->conf.auth_file, &s, c->err, sizeof(c->err));
	if (r == 0)
		r = store_auth_keys_new(&c->auth);
	if (r == 0)
		r = store_auth_keys_add(c->auth, "", &s);
	memset(&s, 0, sizeof(s));
	return r;
}

/* Backend "etcd": master_addr is the endpoint list; the etcd keys of
 * rdzv_conf are taken out before the round's own keys are parsed. */
static int etcd_setup(struct c10d *c, const struct rdzv_params *p)
{
	char rest[1024];

	c->etcd = calloc(1, sizeof(*c->etcd));
	if (!c->etcd)
		return CRUN_ENOMEM;
	TRY(etcd_parse_endpoints(p->master_addr, c->etcd, c->err, sizeof(c->err)));
	TRY(etcd_parse_conf(p->conf, c->etcd, rest, sizeof(rest), c->err, sizeof(c->err)));
	TRY(c10d_parse_conf(rest, &c->conf, c->err, sizeof(c->err)));
	TRY(etcd_prefix(c->etcd, c->run_id, c->prefix, sizeof(c->prefix)));
	snprintf(c->ep_host, sizeof(c->ep_host), "%s", c->etcd->ep[0].host);
	c->ep_port = c->etcd->ep[0].port;
	return 0;
}

int c10d_new(const struct rdzv_params *p, struct c10d **ret)
{
	struct c10d *c;
	int r;

	if (p->min_nodes < 1 || p->max_nodes < p->min_nodes || !p->master_addr || !p->master_port)
		return CRUN_ECONFIG;
	c = calloc(1, sizeof(*c));
	if (!c)
		return CRUN_ENOMEM;
	c->p = *p;
	c->job_rd = c->mon_rd = -1;
	c->prev_grank = -1;
	snprintf(c->run_id, sizeof(c->run_id), "%s", p->run_id ? p->run_id : "none");
	c->p.run_id = c->run_id;
	snprintf(c->ep_host, sizeof(c->ep_host), "%s", p->master_addr);
	c->ep_port = p->master_port;
	snprintf(c->prefix, sizeof(c->prefix), "crun-c10d/%s", c->run_id);
	/* "etcd": the same rounds, on an etcd cluster */
	r = strcmp(p->backend, "etcd") == 0
		? etcd_setup(c, p)
		: c10d_parse_conf(p->conf, &c->conf, c->err, sizeof(c->err));
	if (r < 0) {
		log_at(LL_ERROR, SUB_RDZV, "%s", c->err);
		free(c->etcd);
		free(c);
		return CRUN_ECONFIG;
	}
	snprintf(c->hostname, sizeof(c->hostname), "%s",
		 p->hostname && *p->hostname ? p->hostname : "localhost");
	/* MASTER_ADDR of this node: --local_addr, else the endpoint address
	 * when it is a loopback one (every node on this host), else the name. */
	if (p->local_addr && *p->local_addr)
		snprintf(c->addr, sizeof(c->addr), "%s", p->local_addr);
	else if (strncmp(c->ep_host, "127.", 4) == 0 || strcmp(c->ep_host, "localhost") == 0 ||
		 strcmp(c->ep_host, "::1") == 0)
		snprintf(c->addr, sizeof(c->addr), "%s", c->ep_host);
	else if (route_addr(c->ep_host, c->ep_port, c->addr, sizeof(c->addr)) < 0)
		snprintf(c->addr, sizeof(c->addr), "%s", c->hostname);
	for (char *s = c->hostname; *s; s++)
		if (*s == ' ')
			*s = '_';
	c->linger = evtimer_new(p->base, on_linger, c);
	if (!c->linger) {
		free(c);
		return CRUN_ENOMEM;
	}
	r = load_auth(c, p->auth_secret_file);
	if (r == 0)
		r = load_tls(c);
	if (r < 0) {
		log_at(LL_ERROR, SUB_RDZV, "%s", c->err[0] ? c->err : crun_strerror(r));
		c10d_free(c);
		return CRUN_ECONFIG;
	}
	if (!c->etcd)
		maybe_serve(c);
	*ret = c;
	return 0;
}

void c10d_free(struct c10d *c)
{
	if (!c)
		return;
	drop_monitor(c);
	coord_close(c->pend_c);
	if (c->job) {
		pthread_detach(c->job_thr);
		job_put(c->job);
	}
	if (c->job_ev)
		event_free(c->job_ev);
	fd_close(c->job_rd);
	if (c->mon_ev) /* left by a monitor that failed to start */
		event_free(c->mon_ev);
	fd_close(c->mon_rd);
	if (c->linger)
		event_free(c->linger);
	store_server_free(c->rdzv_store);
	free(c->etcd);
	store_auth_keys_free(c->auth);
	store_tls_free(c->tls);
	free(c->peers);
	free(c);
}

int c10d_store_to_serve(const struct c10d *c, const char **ret_host, uint16_t *ret_port)
{
	unsigned char ip[16];

	/* Every agent serves a worker store on an ephemeral port; the round's
	 * group rank 0 publishes its own as MASTER_ADDR:MASTER_PORT. It listens
	 * on that advertised address only, when it is a local IP address (a
	 * NAT'd --local_addr or a host name: every interface, as before). */
	*ret_host =
	    (inet_pton(AF_INET, c->addr, ip) == 1 || inet_pton(AF_INET6, c->addr, ip) == 1) &&
		    endpoint_bindable(c->addr, 0)
		? c->addr
		: NULL;
	*ret_port = 0;
	return 1;
}

void c10d_set_served_port(struct c10d *c, uint16_t port)
{
	c->wport = port;
}

int c10d_next_round(struct c10d *c)
{
	drop_monitor(c);
	return start(c, JOB_ROUND, NULL);
}

const struct rdzv_info *c10d_info(const struct c10d *c)
{
	return c->have_info ? &c->info : NULL;
}

const char *c10d_peer_addrs(const struct c10d *c)
{
	if (!c->have_info)
		return NULL;
	/* Only group rank 0's worker store is published: the others' take
	 * loopback alone (also when the addresses could not be read). */
	return c->info.group_rank == 0 && c->peers ? c->peers : "";
}

int c10d_exit_barrier(struct c10d *c)
{
	if (!c->have_info)
		return CRUN_EINVAL;
	return start(c, JOB_BARRIER, NULL);
}

int c10d_close_failed(struct c10d *c, const char *why)
{
	if (!c->have_info)
		return CRUN_EINVAL;
	return start(c, JOB_FAIL, why && *why ? why : NULL);
}

enum rdzv_change c10d_change_kind(const struct c10d *c)
{
	return c->change;
}

const char *c10d_last_error(const struct c10d *c)
{
	return c->err;
}
