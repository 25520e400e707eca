/* stacks_job.c: stacks of the whole job, through the rendezvous store's job
 * board (rdzv.h): this node's answer to an ask (its ranks' stacks as JSON,
 * in the shape service/stacks_text.c describes, which also merges the
 * answers into the job-wide digest and text) and a hang's conclusion from
 * the answers.
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

/* ---- this node's answer --------------------------------------------------------- */

/* The answer with each rank's stack cut to stack_cap bytes. */
static char *answer_json(struct crun_agent *a, int group_rank, size_t stack_cap)
{
	cJSON *root = cJSON_CreateObject(), *ranks = cJSON_AddArrayToObject(root, "ranks");
	char *out = NULL;

	if (!ranks || !cJSON_AddNumberToObject(root, "node", group_rank) ||
	    !cJSON_AddStringToObject(root, "host", a->host))
		goto out;
	for (int i = 0; a->stk && i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++) {
		const struct worker *w = &a->wk.workers[i];
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
	stack_cap = RDZV_BOARD_ANSWER_MAX / (size_t)MAX(a->wk.nworkers, 1);
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
	for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL; i++)
		if (mg.blame_rank >= 0 && a->wk.workers[i].global_rank == mg.blame_rank)
			blame = i;
	*ret_remote = mg.blame_rank >= 0 && blame < 0;
	if (blame < 0 && !*ret_remote)
		for (int i = 0; i < a->wk.nworkers && i < CRUN_AGENT_MAX_LOCAL && blame < 0; i++)
			if (a->wk.workers[i].state == W_RUNNING)
				blame = i;
	return blame;
}
