/* test_status.c: the status page's pure parts: the bare page's bodies and
 * which job a rendezvous store key belongs to (crun-rdzvd's GET /jobs), and
 * torchrun's expiry-timer request lines, the console event lines as JSON
 * whatever the role holds, and the job as its public events tell the page. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "unit/check_main.h"
#include "agent/agent.h"
#include "agent/event_print.h"
#include "agent/status.h"
#include "agent/timerfile.h"
#include "rendezvous/progress_int.h"
#include "rendezvous/rdzv.h"
#include "service/service.h"

static int id_of(const char *key, char *id, size_t cap)
{
	return rdzv_run_id_of_key((const uint8_t *)key, strlen(key), id, cap);
}

START_TEST(run_id_of_key)
{
	char id[8];

	ck_assert_int_eq(id_of("crun-c10d/job42/round", id, sizeof(id)), 1);
	ck_assert_str_eq(id, "job42");
	ck_assert_int_eq(id_of("/crun-c10d/j/r0/node/1", id, sizeof(id)), 1); /* v2 '/' */
	ck_assert_str_eq(id, "j");
	ck_assert_int_eq(id_of("crun-c10d/a-very-long-id/x", id, sizeof(id)), 1);
	ck_assert_str_eq(id, "a-very-"); /* cut to the buffer */
	ck_assert_int_eq(id_of("crun-c10d//x", id, sizeof(id)), 0);
	ck_assert_int_eq(id_of("crun-c10d/noslash", id, sizeof(id)), 0);
	ck_assert_int_eq(id_of("crun-c10d/", id, sizeof(id)), 0);
	ck_assert_int_eq(id_of("other/job/x", id, sizeof(id)), 0);
	ck_assert_int_eq(id_of("", id, sizeof(id)), 0);
	ck_assert_int_eq(id_of("crun-c10d/j/x", id, 0), 0);
}
END_TEST

START_TEST(bare_page_bodies)
{
	char *s = agent_status_json(NULL, NULL);

	ck_assert_str_eq(s, "{\"ok\":true}");
	free(s);
	s = agent_status_jobs_json(NULL, NULL);
	ck_assert_str_eq(s, "{\"jobs\":[]}");
	free(s);
	s = agent_status_metrics(NULL, NULL, NULL, 1500);
	ck_assert_ptr_nonnull(strstr(s, "# TYPE crun_agent_up gauge\ncrun_agent_up 1\n"));
	ck_assert_ptr_nonnull(strstr(s, "crun_agent_uptime_seconds 1.500\n"));
	ck_assert_ptr_null(strstr(s, "crun_store_")); /* no store attached */
	free(s);
}
END_TEST

/* torch's FileTimerClient request lines (timerfile.c). */
START_TEST(timer_requests)
{
	struct agent_timer_req q;

	ck_assert_int_eq(agent_timers_parse("{\"version\": 1, \"pid\": 42, \"scope_id\": "
					    "\"s\", \"expiration_time\": 12.5, \"signal\": 9}",
					    &q),
			 0);
	ck_assert_int_eq(q.pid, 42);
	ck_assert_str_eq(q.scope, "s");
	ck_assert(q.expires == 12.5);
	ck_assert_int_eq(q.sig, 9);
	ck_assert_int_eq(agent_timers_parse("{\"pid\": 42, \"scope_id\": \"s\", "
					    "\"expiration_time\": -1, \"signal\": 0}",
					    &q),
			 0);
	ck_assert(q.expires < 0);
	ck_assert_int_eq(q.sig, 0);
	ck_assert_int_eq(agent_timers_parse("{\"pid\": 0, \"scope_id\": \"s\", "
					    "\"expiration_time\": 1}",
					    &q),
			 CRUN_EPROTO);
	ck_assert_int_eq(agent_timers_parse("{\"pid\": 1, \"expiration_time\": 1}", &q),
			 CRUN_EPROTO);
	ck_assert_int_eq(agent_timers_parse("not json", &q), CRUN_EPROTO);
}
END_TEST

/* The round's progress record and its line: waiting (before and after MIN,
 * with the previous round's hosts awaited), completed, and the counters. */
START_TEST(round_progress_line)
{
	struct rdzv_prog *p = rdzv_prog_new(2, 4);
	struct rdzv_progress *g = malloc(sizeof(*g));
	const char joined[3][RDZV_HOST_MAX] = {"node-1", "node-2", "node-7"};
	struct rdzv_progress_node m[3] = {
	    {"node-2", "10.0.0.2", 0}, {"node-1", "10.0.0.1", 1}, {"node-7", "10.0.0.7", 2}};
	char line[512];

	ck_assert_ptr_nonnull(p);
	rdzv_prog_copy(p, g);
	ck_assert_int_eq(g->round, -1);
	rdzv_prog_joining(p);
	rdzv_prog_waiting(p, 0, 1, -1, 590000, joined, 1);
	rdzv_prog_copy(p, g);
	rdzv_progress_line(g, "job42", line, sizeof(line));
	ck_assert_str_eq(line,
			 "rendezvous 'job42' round 0: 1/4 nodes joined (min 2, max 4), 1 more "
			 "needed within 590 s; joined: node-1");
	rdzv_prog_completed(p, 0, 3, m, 3, 0, 0);
	rdzv_prog_copy(p, g);
	rdzv_progress_line(g, "job42", line, sizeof(line));
	ck_assert_str_eq(line,
			 "rendezvous 'job42' round 0 complete: 3 nodes: node-2 at 10.0.0.2 "
			 "(rank 0), node-1 at 10.0.0.1 (rank 1), node-7 at 10.0.0.7 (rank 2)");
	/* round 2 (1 abandoned): node-7 has not come back */
	rdzv_prog_abandoned(p);
	rdzv_prog_waiting(p, 2, 2, 11200, 500000, joined, 2);
	rdzv_prog_copy(p, g);
	rdzv_progress_line(g, "job42", line, sizeof(line));
	ck_assert_str_eq(line, "rendezvous 'job42' round 2: 2/4 nodes joined (min 2, max 4), last "
			       "call in 12 s; waiting for: node-7; joined: node-1, node-2");
	ck_assert_int_eq(g->nawait, 1);
	/* more joined than read: who is awaited is not known */
	rdzv_prog_waiting(p, 2, 3, 5000, 500000, joined, 2);
	rdzv_prog_copy(p, g);
	ck_assert_int_eq(g->nawait, -1);
	rdzv_prog_completed(p, 2, 2, m, 2, 2, 3);
	rdzv_prog_copy(p, g);
	ck_assert_uint_eq(g->counters[RDZV_C_rounds_completed], 2);
	ck_assert_uint_eq(g->counters[RDZV_C_rounds_abandoned], 1);
	ck_assert_uint_eq(g->counters[RDZV_C_nodes_joined], 3);
	ck_assert_uint_eq(g->counters[RDZV_C_nodes_lost], 1);
	ck_assert_str_eq(rdzv_counter_name(RDZV_C_nodes_lost), "nodes_lost");
	ck_assert_str_eq(rdzv_counter_name(RDZV_C__MAX), "?");
	/* a cut line stays terminated */
	rdzv_progress_line(g, "job42", line, 20);
	ck_assert_uint_eq(strlen(line), 19);
	rdzv_prog_unref(p);
	free(g);
}
END_TEST

/* Fuzz-style: roles of every byte but NUL (quotes, backslashes, control
 * characters, high bytes), seeded by the loop index; every line must parse
 * and give the role back. */
START_TEST(event_lines_are_json_whatever_the_role)
{
	unsigned seed = (unsigned)_i * 2654435761u + 1;
	char role[64];
	size_t n;
	char *line;
	cJSON *o, *md;

	n = 1 + (size_t)(_i % (int)(sizeof(role) - 1));
	for (size_t k = 0; k < n; k++) {
		seed = seed * 1103515245u + 12345u;
		role[k] = (char)(1 + (seed >> 16) % 255);
	}
	role[n] = '\0';
	if (_i < 4) /* the ones an operator types first */
		snprintf(role, sizeof(role), "%s",
			 (const char *[]){"tr\"ain", "a\\b", "x\ny\t\x01", "\"}\\"}[_i]);
	line = agent_event_json((crun_agent_state_t)(_i % 5), _i, role, 1700000000.0);
	ck_assert_ptr_nonnull(line);
	ck_assert_ptr_null(strchr(line, '\n'));
	o = cJSON_Parse(line);
	ck_assert_msg(o != NULL, "not JSON: %s", line);
	md = cJSON_GetObjectItem(o, "metadata");
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(md, "role")), role);
	ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(md, "agent_restarts")), _i);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(o, "source")), "AGENT");
	ck_assert_int_eq((int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "timestamp")),
			 1700000000);
	cJSON_Delete(o);
	free(line);
}
END_TEST

/* torchrun's lines come from json.dumps: ", " and ": " between items, none
 * added inside strings (the role keeps its own ", " and ":"). */
START_TEST(event_line_has_torchruns_separators)
{
	char *line = agent_event_json(CRUN_AGENT_RUNNING, 2, "a,b: \"c\"", 1700000000.0);

	ck_assert_ptr_nonnull(line);
	ck_assert_str_eq(line, "{\"name\": \"crun.agent.state.RUNNING\", \"source\": \"AGENT\", "
			       "\"timestamp\": 1700000000, \"metadata\": {\"state\": \"RUNNING\", "
			       "\"role\": \"a,b: \\\"c\\\"\", \"agent_restarts\": 2}}");
	free(line);
}
END_TEST

static crun_agent_event_t event(crun_agent_event_type_t type, crun_agent_state_t st, int restarts)
{
	return (crun_agent_event_t){.struct_size = sizeof(crun_agent_event_t),
				    .type = type,
				    .state = st,
				    .restart_count = restarts,
				    .group_rank = -1,
				    .base_rank = -1,
				    .pid = -1,
				    .local_rank = -1,
				    .global_rank = -1};
}

static void worker_event(struct status_job *j, crun_agent_event_type_t type, int local_rank,
			 int pid, int exit_code)
{
	crun_agent_event_t ev = event(type, CRUN_AGENT_RUNNING, 0);

	ev.local_rank = local_rank;
	ev.global_rank = 2 + local_rank;
	ev.pid = pid;
	ev.exit_code = exit_code;
	status_job_apply(j, &ev);
}

static cJSON *job_tree(const struct status_job *j)
{
	cJSON *root = cJSON_CreateObject();

	status_job_json(j, root);
	return root;
}

static char *job_metrics(const struct status_job *j)
{
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);

	status_job_metrics(j, f);
	fclose(f);
	return s;
}

/* What the page shows of the job comes from the events an embedder gets
 * (on_event): the round while an attempt runs in it, each worker's pid and
 * exit code, and the exit codes of the attempts that ended. */
START_TEST(job_view_follows_the_public_events)
{
	struct status_job *j;
	crun_agent_event_t ev;
	cJSON *t, *ws;
	char *m;

	ck_assert_int_eq(status_job_new(&j), 0);
	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_RENDEZVOUS, 0);
	status_job_apply(j, &ev);
	ev = event(CRUN_AGENT_EV_RENDEZVOUS, CRUN_AGENT_RENDEZVOUS, 0);
	ev.group_rank = 1;
	ev.group_world_size = 2;
	ev.world_size = 4;
	ev.base_rank = 2;
	ev.local_world_size = 2;
	ev.master_addr = "10.0.0.1";
	ev.master_port = 29500;
	status_job_apply(j, &ev);
	t = job_tree(j); /* a round, but no attempt running in it yet */
	ck_assert_ptr_null(cJSON_GetObjectItem(t, "world_size"));
	ws = cJSON_GetObjectItem(t, "workers");
	ck_assert_int_eq(cJSON_GetArraySize(ws), 2);
	ck_assert_str_eq(
	    cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 1), "state")), "init");
	ck_assert_int_eq((int)cJSON_GetNumberValue(
			     cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 1), "global_rank")),
			 3);
	cJSON_Delete(t);

	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_RUNNING, 0);
	status_job_apply(j, &ev);
	worker_event(j, CRUN_AGENT_EV_WORKER_START, 0, 100, 0);
	worker_event(j, CRUN_AGENT_EV_WORKER_START, 1, 101, 0);
	worker_event(j, CRUN_AGENT_EV_WORKER_EXIT, 1, 101, 3);
	t = job_tree(j);
	ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(t, "world_size")), 4);
	ck_assert_str_eq(cJSON_GetStringValue(cJSON_GetObjectItem(t, "master_addr")), "10.0.0.1");
	ws = cJSON_GetObjectItem(t, "workers");
	ck_assert_int_eq(
	    (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 0), "pid")), 100);
	ck_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 0), "exit_code")));
	ck_assert_int_eq(
	    (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 1), "exit_code")),
	    3);
	cJSON_Delete(t);
	m = job_metrics(j); /* no attempt has ended: only code 0's zero */
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_workers{state=\"running\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_worker_exit_code{local_rank=\"1\"} 3\n"));
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_worker_exits_total{code=\"0\"} 0\n"));
	ck_assert_ptr_null(strstr(m, "crun_agent_worker_exits_total{code=\"3\"}"));
	free(m);

	/* The survivor is stopped by SIGTERM; the attempt ends in a new round. */
	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_STOPPING, 0);
	status_job_apply(j, &ev);
	worker_event(j, CRUN_AGENT_EV_WORKER_EXIT, 0, 100, 143);
	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_RENDEZVOUS, 1);
	status_job_apply(j, &ev);
	t = job_tree(j); /* between attempts: no round, the old workers' ends */
	ck_assert_ptr_null(cJSON_GetObjectItem(t, "world_size"));
	ck_assert_int_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItem(t, "restart_count")), 1);
	ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(t, "workers")), 2);
	cJSON_Delete(t);
	m = job_metrics(j);
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_restarts_total 1\n"));
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_worker_exits_total{code=\"3\"} 1\n"));
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_worker_exits_total{code=\"143\"} 1\n"));
	free(m);
	/* A second state event in the same state counts nothing twice. */
	status_job_apply(j, &ev);
	m = job_metrics(j);
	ck_assert_ptr_nonnull(strstr(m, "crun_agent_worker_exits_total{code=\"3\"} 1\n"));
	free(m);
	/* The next round's attempt: fresh workers, none started. */
	ev = event(CRUN_AGENT_EV_RENDEZVOUS, CRUN_AGENT_RENDEZVOUS, 1);
	ev.base_rank = 0;
	ev.local_world_size = 1;
	status_job_apply(j, &ev);
	t = job_tree(j);
	ws = cJSON_GetObjectItem(t, "workers");
	ck_assert_int_eq(cJSON_GetArraySize(ws), 1);
	ck_assert_int_eq(
	    (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 0), "pid")), 0);
	cJSON_Delete(t);
	/* The job ends in the exit barrier of that round: its final page keeps
	 * the round it ended in. */
	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_RUNNING, 1);
	status_job_apply(j, &ev);
	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_BARRIER, 1);
	status_job_apply(j, &ev);
	ev = event(CRUN_AGENT_EV_STATE, CRUN_AGENT_DONE, 1);
	status_job_apply(j, &ev);
	t = job_tree(j);
	ck_assert_ptr_nonnull(cJSON_GetObjectItem(t, "world_size"));
	cJSON_Delete(t);
	/* A worker the round does not have is ignored, not written past the table. */
	worker_event(j, CRUN_AGENT_EV_WORKER_START, 5, 200, 0);
	worker_event(j, CRUN_AGENT_EV_WORKER_EXIT, -1, 200, 1);
	status_job_free(j);
}
END_TEST

static Suite *status_suite(void)
{
	Suite *s = suite_create("status");
	TCase *tc = tcase_create("pure");

	tcase_add_test(tc, run_id_of_key);
	tcase_add_test(tc, bare_page_bodies);
	tcase_add_test(tc, timer_requests);
	tcase_add_test(tc, round_progress_line);
	tcase_add_loop_test(tc, event_lines_are_json_whatever_the_role, 0, 500);
	tcase_add_test(tc, event_line_has_torchruns_separators);
	tcase_add_test(tc, job_view_follows_the_public_events);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(status_suite)
