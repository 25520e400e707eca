/* event_print.h: --event_log_handler=console's JSON lines (event_print.c). */
#ifndef CRUN_AGENT_EVENT_PRINT_H
#define CRUN_AGENT_EVENT_PRINT_H

#include <stdio.h>

#include "crun/agent.h"
/* --event_log_handler=console: one JSON line for a state change, in the
 * shape of torchrun's events (name, source, timestamp, metadata). */
void agent_event_print(FILE *f, crun_agent_state_t st, int restart_count, const char *role);
/* That line's JSON (no newline), malloc'd; NULL on OOM. role NULL: "default". */
char *agent_event_json(crun_agent_state_t st, int restart_count, const char *role,
		       double timestamp_s);

#endif /* CRUN_AGENT_EVENT_PRINT_H */
