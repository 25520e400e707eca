/* event_print.c: --event_log_handler=console's line: one JSON object per
 * state change, in the shape of torchrun's events, with Python's spacing.
 * A leaf of its own (it calls nothing in agent/) because both the agent's
 * attempts (attempt.c) and the programs that watch an agent (cmd/crun.c,
 * daemon.c) print it: with it in daemon.c, attempt.c called the daemon and
 * pulled it into the agent's call loop (issue 24).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent/event_print.h"
#include "common/common.h"

/* Python's json.dumps separators (", " and ": "), which torchrun's event lines
 * carry and their readers may match byte for byte, on cJSON's compact text:
 * a space after every ',' and ':' outside strings. */
static char *python_json_spacing(const char *compact)
{
	size_t n = strlen(compact), extra = 0;
	bool in_str = false, esc = false;
	char *out, *w;

	for (size_t i = 0; i < n; i++)
		if (compact[i] == ',' || compact[i] == ':')
			extra++;
	out = malloc(n + extra + 1);
	if (!out)
		return NULL;
	w = out;
	for (size_t i = 0; i < n; i++) {
		char c = compact[i];

		*w++ = c;
		if (in_str) {
			if (esc)
				esc = false;
			else if (c == '\\')
				esc = true;
			else if (c == '"')
				in_str = false;
		} else if (c == '"') {
			in_str = true;
		} else if (c == ',' || c == ':') {
			*w++ = ' ';
		}
	}
	*w = '\0';
	return out;
}

char *agent_event_json(crun_agent_state_t st, int restart_count, const char *role,
		       double timestamp_s)
{
	static const char *const names[] = {"RENDEZVOUS", "RUNNING", "STOPPING", "BARRIER", "DONE"};
	const char *name = (unsigned)st < ARRAY_SIZE(names) ? names[st] : "DONE";
	char full[64];
	cJSON *o = cJSON_CreateObject(), *md;
	char *compact = NULL, *s = NULL;

	/* The shape of torchrun's events (name, source, timestamp, metadata);
	 * the names are crun's states, not torchrun's event set. cJSON escapes
	 * what the role may hold (quotes, backslashes, control characters). */
	snprintf(full, sizeof(full), "crun.agent.state.%s", name);
	if (!o || !cJSON_AddStringToObject(o, "name", full) ||
	    !cJSON_AddStringToObject(o, "source", "AGENT") ||
	    !cJSON_AddNumberToObject(o, "timestamp", (double)(int64_t)timestamp_s) ||
	    !(md = cJSON_AddObjectToObject(o, "metadata")) ||
	    !cJSON_AddStringToObject(md, "state", name) ||
	    !cJSON_AddStringToObject(md, "role", role ? role : "default") ||
	    !cJSON_AddNumberToObject(md, "agent_restarts", restart_count))
		goto out;
	compact = cJSON_PrintUnformatted(o);
	if (compact)
		s = python_json_spacing(compact);
out:
	free(compact);
	cJSON_Delete(o);
	return s;
}

void agent_event_print(FILE *f, crun_agent_state_t st, int restart_count, const char *role)
{
	char *s = agent_event_json(st, restart_count, role, clock_wall_s());

	if (s)
		fprintf(f, "%s\n", s);
	free(s);
}
