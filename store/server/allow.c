/* allow.c: the store server's peer allowlist (store_server_set_allowlist).
 * The worker store PyTorch workers reach cannot authenticate them, so the
 * agent narrows who may connect at all: loopback, plus the addresses of the
 * nodes in the current round. Checked at accept, before a byte is read.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/server/server_int.h"

#define ALLOW_MAX 65536 /* addresses in one list */

/* An IPv4 address is kept as its v4-mapped IPv6 form: one comparison for
 * both the dual-stack and the IPv4 listener. */
void store_addr_v6(const struct sockaddr *sa, struct in6_addr *ret)
{
	if (sa->sa_family == AF_INET6) {
		*ret = ((const struct sockaddr_in6 *)sa)->sin6_addr;
		return;
	}
	memset(ret, 0, sizeof(*ret));
	ret->s6_addr[10] = ret->s6_addr[11] = 0xff;
	memcpy(&ret->s6_addr[12], &((const struct sockaddr_in *)sa)->sin_addr, 4);
}

static int parse_one(const char *s, size_t len, struct in6_addr *ret)
{
	char buf[INET6_ADDRSTRLEN];
	struct in_addr a4;

	if (len == 0 || len >= sizeof(buf))
		return CRUN_EINVAL;
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (inet_pton(AF_INET6, buf, ret) == 1)
		return 0;
	if (inet_pton(AF_INET, buf, &a4) != 1)
		return CRUN_EINVAL;
	memset(ret, 0, sizeof(*ret));
	ret->s6_addr[10] = ret->s6_addr[11] = 0xff;
	memcpy(&ret->s6_addr[12], &a4, 4);
	return 0;
}

int store_server_set_allowlist(struct store_server *srv, const char *addrs)
{
	struct in6_addr *list = NULL;
	size_t n = 0, cap = 0;

	if (!addrs) {
		free(srv->allow);
		srv->allow = NULL;
		srv->n_allow = 0;
		srv->allow_on = false;
		return 0;
	}
	for (const char *p = addrs; *p;) {
		size_t len = strcspn(p, " ,");

		if (len) {
			struct in6_addr a;

			if (parse_one(p, len, &a) < 0 || n == ALLOW_MAX) {
				free(list);
				return CRUN_EINVAL;
			}
			if (n == cap) {
				size_t ncap = cap ? cap * 2 : 8;
				struct in6_addr *nl = realloc(list, ncap * sizeof(*nl));

				if (!nl) {
					free(list);
					return CRUN_ENOMEM;
				}
				list = nl;
				cap = ncap;
			}
			list[n++] = a;
		}
		p += len;
		p += *p != '\0';
	}
	free(srv->allow);
	srv->allow = list;
	srv->n_allow = n;
	srv->allow_on = true;
	return 0;
}

bool store_server_peer_allowed(const struct store_server *srv, const struct sockaddr *sa)
{
	struct in6_addr a;

	if (!srv->allow_on)
		return true;
	if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)
		return false;
	store_addr_v6(sa, &a);
	/* Loopback: ::1 and 127/8 (v4-mapped). */
	if (IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127))
		return true;
	for (size_t i = 0; i < srv->n_allow; i++)
		if (memcmp(&srv->allow[i], &a, sizeof(a)) == 0)
			return true;
	return false;
}
