/* limits.c: the store server's tunables, once (limit_rows): crun-rdzvd's
 * flags and help, rdzv_conf's store_* keys and the README table come from
 * it; reading and setting a config field by row, and filling a config's
 * zeros with the defaults and max_conns "auto" from the fd limit. Split out
 * of server.c: plain data and arithmetic, no connection or event in it.
 */
#include <dirent.h>
#include <stddef.h>
#include <string.h>
#include <sys/resource.h>

#include "common/common.h"
#include "store/server/server_int.h"

/* ---- configuration ------------------------------------------------------- */

#define CFG_FIELD(f) \
	offsetof(struct store_server_config, f), sizeof(((struct store_server_config *)0)->f)
#define BIG ((uint64_t)1 << 40) /* 1 TiB: keeps size arithmetic safe */

/* Every tunable, once: crun-rdzvd's flags and help, rdzv_conf's store_* keys
 * and the README table are generated from it. */
static const struct store_server_limit limit_rows[] = {
    {"max-conns", "count",
     "open client connections (with TLS or a secret: authenticated ones); auto: min(65536, the fd "
     "limit less the fds open at start, 64 and the pre-auth budget)",
     1, UINT32_MAX, "auto", CFG_FIELD(max_conns)},
    {"max-key-bytes", "bytes", "longest key accepted", 1, BIG, NULL,
     CFG_FIELD(limits.max_key_bytes)},
    {"max-value-bytes", "bytes", "longest value accepted", 1, BIG, NULL,
     CFG_FIELD(limits.max_value_bytes)},
    {"max-keys-per-request", "count",
     "keys per CHECK/WAIT/MULTI_*; also one connection's waits, watches and leases", 1, BIG, NULL,
     CFG_FIELD(limits.max_items)},
    {"max-keys", "count", "keys in the store, waited-for ones included", 1, BIG, NULL,
     CFG_FIELD(max_keys)},
    {"max-total-key-bytes", "bytes", "bytes of all those keys together", 1, BIG * 64, NULL,
     CFG_FIELD(max_total_key_bytes)},
    {"max-total-value-bytes", "bytes", "all values and queued items together", 1, BIG * 64, NULL,
     CFG_FIELD(max_total_value_bytes)},
    {"max-waiters", "count", "WAIT/BARRIER/WATCH_KEY registrations, all clients", 1, BIG, NULL,
     CFG_FIELD(max_waiters)},
    {"max-conn-buffer-bytes", "bytes",
     "unprocessed input per connection, so a frame must fit; auto: the largest frame the key and "
     "value limits allow",
     64, BIG, "auto", CFG_FIELD(max_conn_buffered_bytes)},
    {"max-total-input-bytes", "bytes",
     "unprocessed input, all connections; over it the largest holder is closed", 4096, BIG * 64,
     NULL, CFG_FIELD(max_total_input_bytes)},
    {"max-conn-output-bytes", "bytes", "unsent replies past which a connection is not read", 64,
     BIG, NULL, CFG_FIELD(max_conn_output_bytes)},
    {"max-total-output-bytes", "bytes",
     "unsent replies, all connections; past it large replies wait", 4096, BIG * 64, NULL,
     CFG_FIELD(max_total_output_bytes)},
    {"keepalive", "seconds", "TCP keepalive idle time; a vanished peer goes after ~5/3 of it", 0,
     32767, "off", CFG_FIELD(keepalive_s)},
    {"stall-timeout", "seconds",
     "close a connection whose partial frame or unread output makes no progress", 0, 86400, "off",
     CFG_FIELD(stall_timeout_s)},
    {"idle-timeout", "seconds",
     "close a connection silent this long (torch 1.13 keeps an idle one per store)", 0, UINT32_MAX,
     "off", CFG_FIELD(idle_timeout_s)},
    {"preauth-timeout", "seconds",
     "with TLS or a secret: time from accept to authenticated, however the bytes trickle", 1, 86400,
     NULL, CFG_FIELD(preauth_timeout_s)},
    {"max-preauth-conns", "count",
     "with TLS or a secret: connections not authenticated yet, all addresses (not in max-conns)", 1,
     UINT32_MAX, NULL, CFG_FIELD(max_preauth_conns)},
    {"max-preauth-per-addr", "count",
     "with TLS or a secret: connections not authenticated yet from one source address", 1,
     UINT32_MAX, NULL, CFG_FIELD(max_preauth_per_addr)},
    {"job-share", "percent",
     "one job (run id) may hold this much of each of max-keys, max-total-key-bytes, "
     "max-total-value-bytes and max-waiters",
     1, 100, NULL, CFG_FIELD(job_share_pct)},
    {"conn-share", "percent", "one connection may add this much of each of those budgets", 1, 100,
     NULL, CFG_FIELD(conn_share_pct)},
    {"reserve", "percent",
     "the last part of each of those budgets that only crun's rendezvous keys (/crun-c10d/) may "
     "use",
     0, 99, "off", CFG_FIELD(reserve_pct)},
};

const struct store_server_limit *store_server_limits(size_t *ret_n)
{
	*ret_n = ARRAY_SIZE(limit_rows);
	return limit_rows;
}

uint64_t store_server_limit_get(const struct store_server_config *cfg, size_t i)
{
	const struct store_server_limit *l = &limit_rows[i];
	const char *p = (const char *)cfg + l->offset;
	uint64_t v64;
	uint32_t v32;

	if (l->size == sizeof(v32)) {
		memcpy(&v32, p, sizeof(v32));
		return v32;
	}
	memcpy(&v64, p, sizeof(v64));
	return v64;
}

void store_server_limit_put(struct store_server_config *cfg, size_t i, uint64_t v)
{
	const struct store_server_limit *l = &limit_rows[i];
	char *p = (char *)cfg + l->offset;
	uint32_t v32 = (uint32_t)v;

	if (l->size == sizeof(v32))
		memcpy(p, &v32, sizeof(v32));
	else
		memcpy(p, &v, sizeof(v));
}

int store_server_config_set(struct store_server_config *cfg, const char *name, const char *text,
			    char *err, size_t cap)
{
	for (size_t i = 0; i < ARRAY_SIZE(limit_rows); i++) {
		const struct store_server_limit *l = &limit_rows[i];
		size_t k = 0;
		uint64_t v;

		while (l->name[k] &&
		       (name[k] == l->name[k] || (name[k] == '_' && l->name[k] == '-')))
			k++;
		if (l->name[k] || name[k])
			continue;
		if (parse_uint_range(text, l->min, l->max, &v) < 0) {
			if (str_printf(err, cap,
				       "%s: expected an integer (%s) in [%llu, %llu], got '%s'",
				       l->name, l->unit, (unsigned long long)l->min,
				       (unsigned long long)l->max, text) < 0 &&
			    cap)
				err[0] = '\0';
			return CRUN_EINVAL;
		}
		store_server_limit_put(cfg, i, v);
		return 0;
	}
	return CRUN_ENOTFOUND;
}

/* The largest frame `lim` allows: COMPARE_SET's key and two values. */
static size_t largest_frame(const struct store_limits *lim)
{
	return 1 + 8 + lim->max_key_bytes + 2 * (8 + lim->max_value_bytes);
}

/* Descriptors this process has open now (its /proc/self/fd entries, less
 * the one reading them); -1 when that cannot be read. */
static long open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	long n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

/* max_conns 0: what the fd limit leaves after what the process holds when
 * the server starts and AUTO_FD_MARGIN more for what it opens later (the
 * agent serving its worker store holds about 13 whatever its worker count,
 * crun-rdzvd fewer), at most 65536. A fixed reserve, not a share of the
 * limit: an eighth of 20,000 kept 2,500 descriptors idle and refused a job's
 * ranks past 17,500. Without /proc, an eighth as before. `preauth`: the
 * pre-auth budget of a gated server, whose descriptors come on top. */
#define AUTO_FD_MARGIN 64
uint32_t store_server_auto_conns(uint64_t preauth)
{
	struct rlimit rl;
	uint64_t lim = 1024, reserve;
	long held = open_fds();

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		lim = rl.rlim_cur == RLIM_INFINITY ? 65536 + 8192 : rl.rlim_cur;
	reserve = held >= 0 ? (uint64_t)held + AUTO_FD_MARGIN : MAX(AUTO_FD_MARGIN, lim / 8);
	reserve += preauth;
	return lim > reserve + 1 ? (uint32_t)MIN(65536, lim - reserve) : 1;
}

/* auto_conns: what max_conns 0 means, computed once when the server starts
 * (a reload would count the descriptors opened since and move it). */
void store_server_cfg_fill(struct store_server_config *dst, const struct store_server_config *src,
			   uint32_t auto_conns)
{
	const struct store_server_config def = STORE_SERVER_CONFIG_DEFAULT;

	*dst = *src;
	dst->host = NULL; /* borrowed; only used while binding */
	/* 0 means "the default" for every size and count, and for the times
	 * that cannot be off; for the others (zero "off") it means off. */
	for (size_t i = 0; i < ARRAY_SIZE(limit_rows); i++)
		if (!(limit_rows[i].zero && !strcmp(limit_rows[i].zero, "off")) &&
		    !store_server_limit_get(dst, i))
			store_server_limit_put(dst, i, store_server_limit_get(&def, i));
	if (!dst->max_conns)
		dst->max_conns = auto_conns;
	if (!dst->max_conn_buffered_bytes)
		dst->max_conn_buffered_bytes = largest_frame(&dst->limits);
}
