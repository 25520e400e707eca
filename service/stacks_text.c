/* stacks_text.c: the pure texts of worker stacks, shared by the agent
 * (agent/stacks.c captures them, agent/hang.c names a straggler) and the
 * status page's GET /stacks, crun-rdzvd's too (status_stacks.c): a stack's
 * innermost frame, the ranks that differ from the majority, the digest
 * line, and the job-wide digest and text over every node's answer to a job
 * board ask (rdzv.h). No I/O, no clock.
 *
 * An answer: {"node": G, "host": H, "ranks": [{"rank": R, "local_rank": L,
 * "pid": P, "frame": "func (file:line)", "stack": "..."}]}, at most
 * RDZV_BOARD_ANSWER_MAX bytes: each rank's stack text is cut to its share.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "service/service.h"

/* ---- pure: parsing and the digest -------------------------------------------- */

static const char *base_name(const char *p, const char *end)
{
	const char *b = p;

	for (const char *q = p; q < end; q++)
		if (*q == '/')
			b = q + 1;
	return b;
}

/* "  func (some/dir/file.py:41)" -> "func (file.py:41)" */
static int pyspy_frame(const char *line, const char *end, char *buf, size_t cap)
{
	const char *open = memchr(line, '(', (size_t)(end - line));
	const char *close;

	if (!open || open == line || end[-1] != ')')
		return CRUN_ENOENT;
	close = end - 1;
	const char *file = base_name(open + 1, close);

	snprintf(buf, cap, "%.*s (%.*s)", (int)(open - line - 1), line, (int)(close - file), file);
	return 0;
}

/* "#0  0x00007f in func (a=1) at ../x/f.c:12" or "#0  func () at f.c:3" */
static int gdb_frame(const char *line, const char *end, char *buf, size_t cap)
{
	const char *p = line + 2, *name, *at;
	int len;

	while (p < end && *p == ' ')
		p++;
	name = p;
	for (const char *q = p; q + 4 <= end; q++)
		if (memcmp(q, " in ", 4) == 0) {
			name = q + 4;
			break;
		}
	len = (int)strcspn(name, " (\n");
	if (len <= 0)
		return CRUN_ENOENT;
	at = NULL;
	for (const char *q = name; q + 4 <= end; q++)
		if (memcmp(q, " at ", 4) == 0)
			at = q + 4;
	if (at) {
		const char *file = base_name(at, end);

		snprintf(buf, cap, "%.*s (%.*s)", len, name, (int)(end - file), file);
	} else {
		snprintf(buf, cap, "%.*s", len, name);
	}
	return 0;
}

int stacks_top_frame(const char *text, char *buf, size_t cap)
{
	bool in_thread = false;

	for (const char *line = text; line && *line;) {
		const char *nl = strchr(line, '\n');
		const char *end = nl ? nl : line + strlen(line);

		while (end > line && (end[-1] == ' ' || end[-1] == '\r'))
			end--;
		if (strncmp(line, "Thread ", 7) == 0) {
			in_thread = true; /* py-spy: frames follow, indented */
		} else if (in_thread && line[0] == ' ') {
			const char *p = line;

			while (p < end && *p == ' ')
				p++;
			if (p < end && pyspy_frame(p, end, buf, cap) == 0)
				return 0;
		} else if (strncmp(line, "#0 ", 3) == 0) {
			return gdb_frame(line, end, buf, cap);
		} else if (strncmp(line, "wchan: ", 7) == 0 && end > line + 7) {
			snprintf(buf, cap, "%.*s (kernel)", (int)(end - line - 7), line + 7);
			return 0;
		}
		line = nl ? nl + 1 : NULL;
	}
	return CRUN_ENOENT;
}

int stacks_stragglers(const char *const *frames, int n, bool *odd)
{
	int best = -1, best_count = 0, seen = 0, nodd = 0;
	bool tie = false;

	for (int i = 0; i < n; i++) {
		int c = 0;

		odd[i] = false;
		if (!frames[i] || !frames[i][0])
			continue;
		seen++;
		for (int j = 0; j < n; j++)
			c += frames[j] && strcmp(frames[i], frames[j]) == 0;
		if (c > best_count) {
			best = i;
			best_count = c;
			tie = false;
		} else if (c == best_count && strcmp(frames[i], frames[best]) != 0) {
			tie = true;
		}
	}
	if (best < 0 || tie || best_count * 2 <= seen)
		return 0;
	for (int i = 0; i < n; i++) {
		odd[i] = frames[i] && frames[i][0] && strcmp(frames[i], frames[best]) != 0;
		nodd += odd[i];
	}
	return nodd;
}

void stacks_append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (*len >= cap)
		return;
	va_start(ap, fmt);
	w = vsnprintf(buf + *len, cap - *len, fmt, ap);
	va_end(ap);
	if (w > 0)
		*len = MIN(*len + (size_t)w, cap - 1);
}

/* ", ranks 0,2 are in f" for every rank whose frame equals frames[first]. */
static void majority_part(const int *ranks, const char *const *frames, const bool *odd, int n,
			  char *buf, size_t cap, size_t *len)
{
	int first = -1, count = 0;

	for (int i = 0; i < n; i++)
		if (!odd[i] && frames[i][0] && first < 0)
			first = i;
	if (first < 0)
		return;
	for (int i = 0; i < n; i++)
		count += !odd[i] && strcmp(frames[i], frames[first]) == 0;
	stacks_append(buf, cap, len, " while rank%s ", count > 1 ? "s" : "");
	for (int i = 0, k = 0; i < n; i++)
		if (!odd[i] && strcmp(frames[i], frames[first]) == 0)
			stacks_append(buf, cap, len, "%s%d", k++ ? "," : "", ranks[i]);
	stacks_append(buf, cap, len, " %s in %s", count > 1 ? "are" : "is", frames[first]);
}

void stacks_digest(const int *ranks, const char *const *frames, const bool *odd, int n,
		   const char *when, char *buf, size_t cap)
{
	size_t len = 0;
	int k = 0;

	buf[0] = '\0';
	for (int i = 0; i < n; i++) {
		if (!frames[i][0] || (odd && !odd[i]))
			continue;
		if (k == 8) {
			stacks_append(buf, cap, &len, ", ...");
			break;
		}
		stacks_append(buf, cap, &len, "%srank %d %s in %s", k++ ? ", " : "", ranks[i],
			      odd ? "is" : "was", frames[i]);
	}
	if (odd && k)
		majority_part(ranks, frames, odd, n, buf, cap, &len);
	if (k && when && when[0])
		stacks_append(buf, cap, &len, " when %s", when);
}
/* ---- pure: the job-wide digest ------------------------------------------------ */

struct merge_rank {
	int rank;
	const char *frame; /* borrowed from the parsed answers */
};

static int by_rank(const void *x, const void *y)
{
	const struct merge_rank *a = x, *b = y;

	return (a->rank > b->rank) - (a->rank < b->rank);
}

/* Parses answers into trees[] and their ranks into m (at most max). */
static int collect(char *const *answers, int n, cJSON **trees, struct merge_rank *m, int max,
		   int *ret_nodes)
{
	int k = 0;

	*ret_nodes = 0;
	for (int g = 0; g < n; g++) {
		const cJSON *ranks, *e;

		trees[g] = answers[g] ? cJSON_Parse(answers[g]) : NULL;
		ranks = cJSON_GetObjectItemCaseSensitive(trees[g], "ranks");
		if (!cJSON_IsArray(ranks))
			continue;
		(*ret_nodes)++;
		cJSON_ArrayForEach(e, ranks)
		{
			const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "rank");
			const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "frame");

			if (k >= max || !cJSON_IsNumber(r) || !cJSON_IsString(f))
				continue;
			m[k++] = (struct merge_rank){(int)r->valuedouble, f->valuestring};
		}
	}
	return k;
}

int stacks_merge(char *const *answers, int n, const char *when, struct stacks_merged *ret)
{
	struct merge_rank *m = calloc(STACKS_MERGE_MAX, sizeof(*m));
	cJSON **trees = calloc((size_t)MAX(n, 1), sizeof(*trees));
	const char **frames = calloc(STACKS_MERGE_MAX, sizeof(*frames));
	int *ranks = calloc(STACKS_MERGE_MAX, sizeof(*ranks));
	bool *odd = calloc(STACKS_MERGE_MAX, sizeof(*odd));
	int k = 0, nodes = 0, r = CRUN_ENOMEM;

	if (!m || !trees || !frames || !ranks || !odd)
		goto out;
	k = collect(answers, n, trees, m, STACKS_MERGE_MAX, &nodes);
	qsort(m, (size_t)k, sizeof(*m), by_rank);
	for (int i = 0; i < k; i++) {
		ranks[i] = m[i].rank;
		frames[i] = m[i].frame;
	}
	*ret = (struct stacks_merged){.nranks = k, .nodes = nodes, .blame_rank = -1};
	ret->nodd = k ? stacks_stragglers(frames, k, odd) : 0;
	stacks_digest(ranks, frames, ret->nodd > 0 ? odd : NULL, k, when, ret->digest,
		      sizeof(ret->digest));
	for (int i = 0; i < k && ret->nodd > 0; i++)
		if (odd[i]) {
			ret->blame_rank = ranks[i];
			snprintf(ret->blame_frame, sizeof(ret->blame_frame), "%s", frames[i]);
			break;
		}
	r = k > 0 ? 0 : CRUN_ENOENT;
out:
	for (int g = 0; trees && g < n; g++)
		cJSON_Delete(trees[g]);
	free(trees);
	free(m);
	free(frames);
	free(ranks);
	free(odd);
	return r;
}

/* ---- pure: the text of every node's ranks ------------------------------------ */

static void node_text(FILE *f, int g, const cJSON *tree)
{
	const cJSON *host = cJSON_GetObjectItemCaseSensitive(tree, "host");
	const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(tree, "ranks"), *e;
	const char *h = cJSON_IsString(host) ? host->valuestring : "?";

	if (!cJSON_IsArray(ranks)) {
		fprintf(f, "=== node %d: no answer within %u ms\n", g, RDZV_BOARD_GATHER_MS);
		return;
	}
	if (cJSON_GetArraySize(ranks) == 0)
		fprintf(f, "=== node %d (%s): no running worker\n", g, h);
	cJSON_ArrayForEach(e, ranks)
	{
		const cJSON *r = cJSON_GetObjectItemCaseSensitive(e, "rank");
		const cJSON *l = cJSON_GetObjectItemCaseSensitive(e, "local_rank");
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "pid");
		const cJSON *fr = cJSON_GetObjectItemCaseSensitive(e, "frame");
		const cJSON *st = cJSON_GetObjectItemCaseSensitive(e, "stack");

		fprintf(f, "=== rank %d (node %d %s, local rank %d, pid %d): %s\n%s\n",
			cJSON_IsNumber(r) ? (int)r->valuedouble : -1, g, h,
			cJSON_IsNumber(l) ? (int)l->valuedouble : -1,
			cJSON_IsNumber(p) ? (int)p->valuedouble : 0,
			cJSON_IsString(fr) && fr->valuestring[0] ? fr->valuestring : "?",
			cJSON_IsString(st) ? st->valuestring : "");
	}
}

char *stacks_job_text(const char *job, int64_t ask, char *const *answers, int n)
{
	struct stacks_merged mg = {0};
	char *body = NULL;
	size_t cap = 0;
	FILE *f = open_memstream(&body, &cap);

	if (!f)
		return NULL;
	(void)stacks_merge(answers, n, NULL, &mg);
	fprintf(f, "job '%s' (ask %lld): %d ranks on %d of %d nodes\n", job, (long long)ask,
		mg.nranks, mg.nodes, n);
	fprintf(f, "digest: %s\n\n",
		mg.nodd	    ? mg.digest
		: mg.nranks ? "every rank is in the same frame"
			    : "no rank");
	for (int g = 0; g < n; g++) {
		cJSON *t = answers[g] ? cJSON_Parse(answers[g]) : NULL;

		node_text(f, g, t);
		cJSON_Delete(t);
	}
	if (fclose(f) != 0) {
		free(body);
		return NULL;
	}
	return body;
}
