/* c10d_conf.c: the rules between the typed --rdzv_conf keys of the elastic
 * backends (c10d.h's rows). Parsing the text is the CLI's (agent/cli_rdzv.c);
 * this is what must hold whoever filled the struct. Pure, unit-tested.
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/c10d.h"

int c10d_conf_check(const struct c10d_conf *c, char *err, size_t cap)
{
	const char *why = NULL;
	size_t plen = strlen(c->etcd_prefix);

	if (plen && (c->etcd_prefix[0] != '/' || c->etcd_prefix[plen - 1] == '/')) {
		if (err)
			snprintf(err, cap,
				 "argument --rdzv_conf: key_prefix=%s must start with '/' and not "
				 "end with one",
				 c->etcd_prefix);
		return CRUN_EINVAL;
	}
	if (c->ttl_ms < c->hb_ms)
		why = "lease_ttl must not be below heartbeat_interval";
	else if ((c->etcd_cert[0] != 0) != (c->etcd_key[0] != 0))
		why = "cert and key go together";
	else if (c->etcd_username[0] && !c->etcd_password_file[0])
		why = "username needs password_file";
	if (!why)
		return 0;
	if (err)
		snprintf(err, cap, "argument --rdzv_conf: %s", why);
	return CRUN_EINVAL;
}
