/* c10d_peers.c: the addresses of a round's nodes, for the worker store's
 * allowlist (store_server_set_allowlist): group rank 0's agent serves the
 * store every worker of the round reaches, so it reads the members' node
 * records once and resolves them - on the round's helper thread, where
 * blocking is fine - to numeric addresses.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/common.h"
#include "rendezvous/c10d.h"
#include "rendezvous/coord.h"
#include "rendezvous/round_int.h"

int c10d_record_addr(const char *rec, char *out, size_t cap)
{
	struct round_node n;

	if (round_record_parse(rec, 1, &n) < 0)
		return CRUN_EPROTO;
	return str_printf(out, cap, "%s", n.addr) < 0 ? CRUN_ETOOBIG : 0;
}

/* Appends every address `name` resolves to ("a b ..."), bounded by cap. */
static int append_resolved(const char *name, char *buf, size_t cap, size_t *len)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
	struct addrinfo *res, *ai;
	int r = 0;

	if (getaddrinfo(name, NULL, &hints, &res) != 0)
		return CRUN_ERESOLVE;
	for (ai = res; ai && r == 0; ai = ai->ai_next) {
		char num[NI_MAXHOST];
		int w;

		if (getnameinfo(ai->ai_addr, ai->ai_addrlen, num, sizeof(num), NULL, 0,
				NI_NUMERICHOST) != 0)
			continue;
		w = snprintf(buf + *len, cap - *len, "%s%s", *len ? " " : "", num);
		if (w < 0 || (size_t)w >= cap - *len)
			r = CRUN_ETOOBIG;
		else
			*len += (size_t)w;
	}
	freeaddrinfo(res);
	return r;
}

int c10d_read_peer_addrs(struct coord *c, int rd, const struct round_closed *rc, uint32_t read_ms,
			 char **ret)
{
	int n = rc->n;
	size_t cap = (size_t)n * 2 * (NI_MAXHOST + 1) + 1, len = 0;
	char **keys = calloc((size_t)n, sizeof(char *));
	char **vals = calloc((size_t)n, sizeof(char *));
	char *buf = malloc(cap);
	int r = CRUN_ENOMEM;

	if (!keys || !vals || !buf)
		goto out;
	buf[0] = '\0';
	for (int i = 0; i < n; i++) {
		keys[i] = malloc(64);
		if (!keys[i])
			goto out;
		snprintf(keys[i], 64, "r%d/node/%d", rd, rc->m[i].ticket);
	}
	r = coord_multi_get(c, (const char *const *)keys, (size_t)n, read_ms, vals);
	for (int i = 0; r == 0 && i < n; i++) {
		char addr[256];

		r = c10d_record_addr(vals[i], addr, sizeof(addr));
		if (r == 0)
			r = append_resolved(addr, buf, cap, &len);
	}
	if (r == 0) {
		*ret = buf;
		buf = NULL;
	}
out:
	for (int i = 0; keys && i < n; i++) {
		free(keys[i]);
		if (vals)
			crun_free(vals[i]);
	}
	free(keys);
	free(vals);
	free(buf);
	return r;
}
