/* round_json.c: the JSON values of a leaderless round (round_int.h): the
 * closed value, the head and what a closer writes (the plan). The decisions
 * (order, ranks, close times) are round.c's, which depends on nothing but
 * libc; this file only encodes and decodes them.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "common/common.h"
#include "rendezvous/round_int.h"

/* The per-member integers of a closed value: one JSON array each. */
static const struct {
	const char *name;
	size_t off;
	int lo, hi;
} closed_ints[] = {
    {"t", offsetof(struct round_member, ticket), 1, 1 << 30},
    {"n", offsetof(struct round_member, nproc), 1, 1 << 20},
    {"pr", offsetof(struct round_member, prev_round), -1, 1 << 30},
    {"pg", offsetof(struct round_member, prev_grank), -1, 1 << 30},
};

#define FIELD(node, i) (*(int *)((char *)(node) + closed_ints[i].off))

/* The closed value of members m[0..n) whose group ranks are grank[] (NULL
 * when n is 0). The worker store is group rank 0's: its address travels
 * once, not every member's. */
static int closed_format_ordered(int attempt, const struct round_node *m, int n, const int *grank,
				 char **ret)
{
	cJSON *root = cJSON_CreateObject();
	const char *maddr = "", *shost = "";
	unsigned mport = 0;
	int r = CRUN_ENOMEM;

	if (!root)
		return CRUN_ENOMEM;
	for (int i = 0; i < n; i++) {
		if (grank[i] == 0) {
			maddr = m[i].addr;
			mport = m[i].wport;
		}
		if (m[i].is_host && !*shost)
			shost = m[i].host;
	}
	if (!cJSON_AddNumberToObject(root, "attempt", attempt) ||
	    !cJSON_AddStringToObject(root, "ma", maddr) ||
	    !cJSON_AddNumberToObject(root, "mp", mport) ||
	    !cJSON_AddStringToObject(root, "sh", shost))
		goto out;
	for (size_t f = 0; f < ARRAY_SIZE(closed_ints); f++) {
		cJSON *arr = cJSON_AddArrayToObject(root, closed_ints[f].name);

		for (int i = 0; arr && i < n; i++) {
			struct round_member mm = round_member_of(&m[i]);
			cJSON *x = cJSON_CreateNumber(FIELD(&mm, f));

			if (!x || !cJSON_AddItemToArray(arr, x)) {
				cJSON_Delete(x);
				arr = NULL;
			}
		}
		if (!arr)
			goto out;
	}
	*ret = cJSON_PrintUnformatted(root);
	r = *ret ? 0 : CRUN_ENOMEM;
out:
	cJSON_Delete(root);
	return r;
}

int round_closed_format(int attempt, const struct round_node *m, int n, char **ret)
{
	int *grank = n > 0 ? calloc((size_t)n, sizeof(int)) : NULL;
	struct round_member *mm = n > 0 ? calloc((size_t)n, sizeof(*mm)) : NULL;
	int r = CRUN_ENOMEM;

	if (n > 0 && (!grank || !mm))
		goto out;
	for (int i = 0; i < n; i++)
		mm[i] = round_member_of(&m[i]);
	r = n > 0 ? round_order(mm, n, grank) : 0;
	if (r == 0)
		r = closed_format_ordered(attempt, m, n, grank, ret);
out:
	free(grank);
	free(mm);
	return r;
}

/* A string field of at most cap-1 bytes, no spaces (records split on them). */
static bool copy_word(const cJSON *s, char *buf, size_t cap)
{
	if (!cJSON_IsString(s) || strlen(s->valuestring) >= cap || strchr(s->valuestring, ' '))
		return false;
	snprintf(buf, cap, "%s", s->valuestring);
	return true;
}

int round_closed_parse(const char *s, int max_members, struct round_closed *ret)
{
	cJSON *root = s ? cJSON_Parse(s) : NULL;
	cJSON *a, *mp;
	struct round_closed rc = {0};
	int n = -1, r = CRUN_EPROTO;

	if (!root)
		return CRUN_EPROTO;
	a = cJSON_GetObjectItem(root, "attempt");
	mp = cJSON_GetObjectItem(root, "mp");
	if (!cJSON_IsNumber(a) || a->valuedouble < 0 || a->valuedouble > 1e9 ||
	    !cJSON_IsNumber(mp) || mp->valuedouble < 0 || mp->valuedouble > 65535 ||
	    !copy_word(cJSON_GetObjectItem(root, "ma"), rc.master_addr, sizeof(rc.master_addr)) ||
	    !copy_word(cJSON_GetObjectItem(root, "sh"), rc.store_host, sizeof(rc.store_host)))
		goto out;
	rc.attempt = a->valueint;
	rc.master_port = (unsigned)mp->valueint;
	for (size_t f = 0; f < ARRAY_SIZE(closed_ints); f++) {
		cJSON *arr = cJSON_GetObjectItem(root, closed_ints[f].name);

		if (!cJSON_IsArray(arr) || (n >= 0 && cJSON_GetArraySize(arr) != n))
			goto out;
		if (n < 0) {
			n = cJSON_GetArraySize(arr);
			if (n > max_members)
				goto out;
			if (n > 0 && !(rc.m = calloc((size_t)n, sizeof(*rc.m)))) {
				r = CRUN_ENOMEM;
				goto out;
			}
		}
		/* Walk the list: cJSON_GetArrayItem(arr, i) starts from the head
		 * each time, O(n^2) per field (91% of a 2,048-agent simulation's
		 * CPU, every agent parsing the closed round). */
		cJSON *x = arr->child;

		for (int i = 0; i < n; i++, x = x->next) {
			if (!cJSON_IsNumber(x) || x->valuedouble < closed_ints[f].lo ||
			    x->valuedouble > closed_ints[f].hi)
				goto out;
			FIELD(&rc.m[i], f) = x->valueint;
		}
	}
	for (int i = 0; i < n; i++) {
		if (i > 0 && rc.m[i].ticket <= rc.m[i - 1].ticket)
			goto out; /* members are in ticket order */
		if (rc.m[i].prev_round < 0 || rc.m[i].prev_grank < 0)
			rc.m[i].prev_round = rc.m[i].prev_grank = -1;
	}
	if (n > 0 && (!rc.master_addr[0] || rc.master_port == 0))
		goto out; /* group rank 0 has no worker store */
	rc.n = n;
	*ret = rc;
	rc.m = NULL;
	r = 0;
out:
	free(rc.m);
	cJSON_Delete(root);
	return r;
}

int round_head_format(const struct round_head *h, char **ret)
{
	cJSON *root = cJSON_CreateObject();
	int r = CRUN_ENOMEM;

	if (root && cJSON_AddNumberToObject(root, "attempt", h->attempt) &&
	    cJSON_AddNumberToObject(root, "by", h->by) &&
	    cJSON_AddNumberToObject(root, "nodes", h->nodes) &&
	    cJSON_AddStringToObject(root, "ma", h->master_addr) &&
	    cJSON_AddNumberToObject(root, "mp", h->master_port) &&
	    cJSON_AddStringToObject(root, "sh", h->store_host)) {
		*ret = cJSON_PrintUnformatted(root);
		r = *ret ? 0 : CRUN_ENOMEM;
	}
	cJSON_Delete(root);
	return r;
}

/* A JSON integer member within [lo, hi]. */
static bool int_in(const cJSON *root, const char *name, int lo, int hi, int *ret)
{
	const cJSON *x = cJSON_GetObjectItem(root, name);

	if (!cJSON_IsNumber(x) || x->valuedouble < lo || x->valuedouble > hi ||
	    x->valuedouble != (double)x->valueint)
		return false;
	*ret = x->valueint;
	return true;
}

int round_head_parse(const char *s, struct round_head *ret)
{
	cJSON *root = s ? cJSON_Parse(s) : NULL;
	struct round_head h = {0};
	int mp = 0;
	bool ok;

	if (!root)
		return CRUN_EPROTO;
	ok = int_in(root, "attempt", 0, 1000000000, &h.attempt) &&
	     int_in(root, "by", 0, 1 << 30, &h.by) && int_in(root, "nodes", 0, 1 << 30, &h.nodes) &&
	     int_in(root, "mp", 0, 65535, &mp) &&
	     copy_word(cJSON_GetObjectItem(root, "ma"), h.master_addr, sizeof(h.master_addr)) &&
	     copy_word(cJSON_GetObjectItem(root, "sh"), h.store_host, sizeof(h.store_host));
	cJSON_Delete(root);
	h.master_port = (unsigned)mp;
	/* Members need a closer and a worker store; an abandoned round has
	 * neither. */
	if (!ok || (h.nodes > 0 && (h.by < 1 || !h.master_addr[0] || h.master_port == 0)) ||
	    (h.nodes == 0 && h.by != 0))
		return CRUN_EPROTO;
	*ret = h;
	return 0;
}

void round_plan_free(struct round_plan *p)
{
	if (!p)
		return;
	free(p->ticket);
	free(p->val);
	crun_free(p->members);
	memset(p, 0, sizeof(*p));
}

int round_plan_make(int attempt, int by, const struct round_node *m, int n, struct round_plan *ret)
{
	struct round_plan p = {.n = n};
	struct round_member *mm = NULL;
	int *grank = NULL, *base = NULL;
	int world = 0;
	int r = CRUN_EINVAL;

	if (!m || n < 1 || by < 1)
		return CRUN_EINVAL;
	mm = calloc((size_t)n, sizeof(*mm));
	grank = calloc((size_t)n, sizeof(int));
	base = calloc((size_t)n, sizeof(int));
	p.ticket = calloc((size_t)n, sizeof(int));
	p.val = calloc((size_t)n, sizeof(*p.val));
	if (!mm || !grank || !base || !p.ticket || !p.val) {
		r = CRUN_ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (m[i].nproc < 1 || (i > 0 && m[i].ticket <= m[i - 1].ticket))
			goto out; /* ticket order, as the closed value says */
		mm[i] = round_member_of(&m[i]);
		p.ticket[i] = m[i].ticket;
	}
	/* One order and one pass of prefix sums serve every member's value,
	 * the head and the member list. */
	r = round_ranks(mm, n, grank, base, &world);
	if (r < 0)
		goto out;
	p.head = (struct round_head){.attempt = attempt, .by = by, .nodes = n};
	for (int i = 0; i < n; i++) {
		snprintf(p.val[i], sizeof(p.val[i]), "%d %d %d", grank[i], base[grank[i]], world);
		if (grank[i] == 0) {
			snprintf(p.head.master_addr, sizeof(p.head.master_addr), "%s", m[i].addr);
			p.head.master_port = m[i].wport;
		}
		if (m[i].is_host && !p.head.store_host[0])
			snprintf(p.head.store_host, sizeof(p.head.store_host), "%s", m[i].host);
	}
	r = closed_format_ordered(attempt, m, n, grank, &p.members);
out:
	free(mm);
	free(grank);
	free(base);
	if (r < 0)
		round_plan_free(&p);
	else
		*ret = p;
	return r;
}
