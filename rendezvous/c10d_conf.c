/* c10d_conf.c: torchrun's --rdzv_conf for the c10d backend ("k=v,...",
 * seconds), over crun's defaults: pure, unit-tested. */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/c10d.h"

static int conf_secs(const char *k, const char *v, uint32_t *ret, char *err, size_t cap)
{
	const char *why;

	if (parse_timeout_ms(v, ret, &why) < 0) {
		snprintf(err, cap, "argument --rdzv_conf: %s=%s %s", k, v, why);
		return CRUN_EINVAL;
	}
	return 0;
}

/* A key with two values: *ret_second is whether v is the second. */
static int conf_either(const char *k, const char *v, const char *first, const char *second,
		       bool *ret_second, char *err, size_t cap)
{
	if (strcmp(v, first) && strcmp(v, second)) {
		snprintf(err, cap, "argument --rdzv_conf: %s=%s is not %s or %s", k, v, first,
			 second);
		return CRUN_EINVAL;
	}
	*ret_second = strcmp(v, second) == 0;
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
			TRY(conf_either(item, v, "1.2", "1.3", &b, err, cap));
			c.tls_min = b ? 13 : 12;
		} else if (strcmp(item, "worker_store") == 0) {
			TRY(conf_either(item, v, "direct", "proxy", &c.worker_store_proxy, err,
					cap));
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
				 "tls_cert, tls_key, tls_ca, tls_min_version, worker_store)",
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
