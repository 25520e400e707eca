/* stacks_job.c: stacks of the whole job, through the rendezvous store's job
 * board (rdzv.h): this node's answer to an ask (its ranks' stacks as JSON),
 * the job-wide digest over every node's answer (pure: stacks_merge), the
 * text a status page prints, and a hang's conclusion from the answers.
 *
 * An answer: {"node": G, "host": H, "ranks": [{"rank": R, "local_rank": L,
 * "pid": P, "frame": "func (file:line)", "stack": "..."}]}, at most
 * RDZV_BOARD_ANSWER_MAX bytes: each rank's stack text is cut to its share.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "agent/stacks_int.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"

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

/* ---- this node's answer --------------------------------------------------------- */

/* The answer with each rank's stack cut to stack_cap bytes. */
static char *answer_json(struct crun_agent *a, int group_rank, size_t stack_cap)
{
	cJSON *root = cJSON_CreateObject(), *ranks = cJSON_AddArrayToObject(root, "ranks");
	char *out = NULL;

	if (!ranks || !cJSON_AddNumberToObject(root, "node", group_rank) ||
	    !cJSON_AddStringToObject(root, "host", a->host))
		goto out;
	for (int i = 0; a->stk && i < a->nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		const struct worker *w = &a->workers[i];
		cJSON *e;
		char path[PATH_MAX], *text = NULL;

		if (!a->stk->taken[i])
			continue;
		if (str_printf(path, sizeof(path), "%s/attempt_%d/%d/stack.txt", a->run_dir,
			       a->restart_count, i) >= 0)
			text = stacks_read_text(path);
		if (text && strlen(text) > stack_cap)
			text[stack_cap] = '\0';
		e = cJSON_CreateObject();
		if (!e || !cJSON_AddItemToArray(ranks, e) ||
		    !cJSON_AddNumberToObject(e, "rank", w->global_rank) ||
		    !cJSON_AddNumberToObject(e, "local_rank", i) ||
		    !cJSON_AddNumberToObject(e, "pid", (double)w->pid) ||
		    !cJSON_AddStringToObject(e, "frame", a->stk->frame[i]) ||
		    !cJSON_AddStringToObject(e, "stack", text ? text : "")) {
			free(text);
			goto out;
		}
		free(text);
	}
	out = cJSON_PrintUnformatted(root);
out:
	cJSON_Delete(root);
	return out;
}

char *stacks_board_answer(int64_t ask, void *arg)
{
	struct crun_agent *a = arg;
	const struct rdzv_info *ri = rdzv_info(a->rdzv);
	uint64_t now = clock_now_ms();
	size_t stack_cap;
	char *out = NULL;

	if (stacks_ensure(a) < 0)
		return NULL;
	if (a->stk->answer && now - a->stk->answer_ms < STACKS_ANSWER_REUSE_MS) {
		log_at(LL_INFO, SUB_AGENT,
		       "answering ask %lld of the job board with the stacks "
		       "taken %llu ms ago",
		       (long long)ask, (unsigned long long)(now - a->stk->answer_ms));
		return str_dup(a->stk->answer);
	}
	for (int i = 0; i < CRUN_AGENT_MAX_LOCAL; i++)
		a->stk->taken[i] = false;
	if (a->state == AS_RUNNING)
		(void)stacks_capture(a);
	/* JSON escapes can double the text: halve the share until it fits. */
	stack_cap = RDZV_BOARD_ANSWER_MAX / (size_t)MAX(a->nworkers, 1);
	for (; stack_cap >= 64; stack_cap /= 2) {
		out = answer_json(a, ri ? ri->group_rank : 0, stack_cap);
		if (!out || strlen(out) <= RDZV_BOARD_ANSWER_MAX)
			break;
		free(out);
		out = NULL;
	}
	/* The capture is nobody's stop's, unless a hang holds it. */
	for (int i = 0; !a->stk->held && i < CRUN_AGENT_MAX_LOCAL; i++)
		a->stk->taken[i] = false;
	free(a->stk->answer);
	a->stk->answer = out ? str_dup(out) : NULL;
	a->stk->answer_ms = clock_now_ms();
	log_at(LL_INFO, SUB_AGENT, "answered ask %lld of the job board (%zu bytes)", (long long)ask,
	       out ? strlen(out) : 0);
	return out;
}

/* ---- a hang's conclusion ----------------------------------------------------------- */

/* Every rank's stack of the job into <attempt>/job_stacks.txt. */
static void write_job_file(struct crun_agent *a, int64_t ask, char *const *answers, int n,
			   char *path, size_t cap)
{
	char *text = stacks_job_text(a->run_id, ask, answers, n);
	int fd;

	path[0] = '\0';
	if (!text ||
	    str_printf(path, cap, "%s/attempt_%d/job_stacks.txt", a->run_dir, a->restart_count) < 0)
		goto out;
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || fd_write_all(fd, text, strlen(text)) < 0) {
		log_at(LL_WARN, SUB_AGENT, "cannot write '%s', ignoring", path);
		path[0] = '\0';
	}
	if (fd >= 0)
		fd_close(fd);
out:
	free(text);
}

int stacks_on_hang_job(struct crun_agent *a, const char *when, int64_t ask, char *const *answers,
		       int n, uint64_t t0_ms, bool *ret_remote)
{
	struct stacks_merged mg;
	char path[PATH_MAX];
	int blame = -1;

	*ret_remote = false;
	if (stacks_merge(answers, n, when, &mg) < 0 || stacks_ensure(a) < 0)
		return stacks_on_hang(a, when); /* nobody answered: this node's own */
	write_job_file(a, ask, answers, n, path, sizeof(path));
	log_at(LL_WARN, SUB_AGENT,
	       "job-wide stacks: %d ranks on %d of %d nodes (ask %lld) in %llu ms after the hang "
	       "was declared%s%s",
	       mg.nranks, mg.nodes, n, (long long)ask, (unsigned long long)(clock_now_ms() - t0_ms),
	       path[0] ? "; every stack in " : "", path);
	snprintf(a->stk->digest, sizeof(a->stk->digest), "%s", mg.digest);
	a->stk->held = true;
	for (int i = 0; i < a->nworkers && i < CRUN_AGENT_MAX_LOCAL; i++)
		if (mg.blame_rank >= 0 && a->workers[i].global_rank == mg.blame_rank)
			blame = i;
	*ret_remote = mg.blame_rank >= 0 && blame < 0;
	if (blame < 0 && !*ret_remote)
		for (int i = 0; i < a->nworkers && i < CRUN_AGENT_MAX_LOCAL && blame < 0; i++)
			if (a->workers[i].state == W_RUNNING)
				blame = i;
	return blame;
}
