/* status_body.c: the bodies of a status page, built by pure functions of
 * what it shows (a store server, a source's job, or both), so tests can
 * check them without a socket: GET /status and /jobs (JSON) and /metrics
 * (Prometheus text exposition format 0.0.4, crun_ prefix). A source adds
 * what only its job knows through struct status_source (service.h).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "service/status_int.h"
#include "store/server.h"

static const char *const status_store_kind[STATUS_STORE__MAX] = {"rendezvous", "worker"};

/* srv: crun-rdzvd's server (its page has no job); a job's page has its
 * worker store and, when it serves the c10d endpoint, the rendezvous store. */
static const struct store_server *served_store(const struct store_server *srv,
					       const struct status_source *src, enum status_store k)
{
	if (srv)
		return k == STATUS_STORE_RENDEZVOUS ? srv : NULL;
	return src ? src->store(src->arg, k) : NULL;
}

static void store_json(cJSON *o, const struct store_server *srv)
{
	struct store_server_stats st;

	if (!o)
		return;
	store_server_get_stats(srv, &st);
	cJSON_AddNumberToObject(o, "port", store_server_port(srv));
	cJSON_AddNumberToObject(o, "connections", (double)st.conns);
	cJSON_AddNumberToObject(o, "keys", (double)st.keys);
	cJSON_AddNumberToObject(o, "value_bytes", (double)st.value_bytes);
	cJSON_AddNumberToObject(o, "waiters", (double)st.waiters);
	cJSON_AddNumberToObject(o, "requests", (double)st.requests);
	cJSON_AddNumberToObject(o, "dropped_connections", (double)st.dropped_conns);
	cJSON_AddNumberToObject(o, "leases_expired",
				(double)store_server_metric(srv, STORE_M_LEASE_EXPIRED));
	cJSON_AddNumberToObject(o, "leases_released",
				(double)store_server_metric(srv, STORE_M_LEASE_RELEASED));
}

cJSON *status_tree(const struct store_server *srv, const struct status_source *src,
		   const uint64_t *version, int st)
{
	const struct store_server *own = srv ? srv : served_store(NULL, src, STATUS_STORE_WORKER);
	cJSON *root = cJSON_CreateObject(), *stores;

	if (!root)
		return NULL;
	cJSON_AddBoolToObject(root, "ok", 1);
	if (own)
		store_json(cJSON_AddObjectToObject(root, "store"), own);
	/* Every store served here by its role: crun-rdzvd's, an agent's
	 * worker store and, on a self-hosted c10d agent, the rendezvous store
	 * it serves to its peers (their leases live there, not in "store"). */
	stores = NULL;
	for (int k = 0; k < STATUS_STORE__MAX; k++) {
		const struct store_server *ss = served_store(srv, src, (enum status_store)k);

		if (ss && !stores)
			stores = cJSON_AddObjectToObject(root, "stores");
		if (ss && stores)
			store_json(cJSON_AddObjectToObject(stores, status_store_kind[k]), ss);
	}
	/* crun-rdzvd's page: no job of its own, the jobs its store holds (one
	 * of them: ?rdzv_id=ID or /jobs/ID). */
	if (!src && srv) {
		cJSON *jobs = cJSON_AddArrayToObject(root, "jobs");

		if (jobs)
			status_store_jobs(jobs, srv);
	}
	if (src)
		src->status_json(src->arg, root, version, st);
	if (src && src->job)
		status_job_json(src->job, root);
	return root;
}

char *status_json(const struct store_server *srv, const struct status_source *src)
{
	return status_print_tree(status_tree(srv, src, NULL, -1));
}

char *status_jobs_json(const struct store_server *srv, const struct status_source *src)
{
	cJSON *root = cJSON_CreateObject(), *jobs, *entry;
	char *out;

	if (!root)
		return NULL;
	jobs = cJSON_AddArrayToObject(root, "jobs");
	if (!src && srv && jobs)
		status_store_jobs(jobs, srv);
	if (src && jobs && (entry = cJSON_CreateObject())) {
		src->jobs_json(src->arg, entry);
		if (src->job)
			status_job_entry_json(src->job, entry);
		cJSON_AddItemToArray(jobs, entry);
	}
	out = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	return out;
}

/* Prometheus label values escape \, " and newline (exposition format 0.0.4). */
void status_label(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*v, f);
	}
}

void status_gauge(FILE *f, const char *name, const char *help, const char *type)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The store server's gauges and counters (crun-rdzvd's, or the store this
 * agent serves): one row per field of struct store_server_stats. */
static const struct {
	const char *name, *type, *help;
	size_t off;
} store_rows[] = {
#define ROW(name, type, field, help)                                         \
	{                                                                    \
		name, type, help, offsetof(struct store_server_stats, field) \
	}
    ROW("crun_store_connections", "gauge", conns, "client connections open"),
    ROW("crun_store_keys", "gauge", keys, "keys held"),
    ROW("crun_store_value_bytes", "gauge", value_bytes, "bytes of the values held"),
    ROW("crun_store_waiters", "gauge", waiters, "clients blocked in WAIT"),
    ROW("crun_store_requests_total", "counter", requests, "requests served"),
    ROW("crun_store_dropped_connections_total", "counter", dropped_conns,
	"connections refused or closed for bad or over-limit input"),
    ROW("crun_store_entries", "gauge", entries, "keys with a value, a queue or a registration"),
    ROW("crun_store_key_bytes", "gauge", key_bytes, "bytes of those keys"),
    ROW("crun_store_registrations", "gauge", registrations, "waits and watches registered"),
    ROW("crun_store_input_bytes", "gauge", input_bytes, "unprocessed input, all connections"),
    ROW("crun_store_output_bytes", "gauge", output_bytes, "unsent output, all connections"),
#undef ROW
};

/* Issue 26: what each job holds and how often its writes were refused, by
 * budget; at most STORE_SHARE_MAX_JOBS + 1 jobs, so the series are bounded. */
struct share_rows {
	FILE *f;
	const char *kind;
	bool refused; /* the pass: refusals (jobs with any) or holdings */
};

static void share_row(const struct store_share_info *si, void *arg)
{
	const struct share_rows *sr = arg;
	uint64_t any = 0;

	for (int b = 0; b < STORE_B__MAX; b++)
		any |= si->refused[b];
	if (sr->refused && !any)
		return;
	for (int b = 0; b < STORE_B__MAX; b++) {
		fprintf(sr->f, "%s{store=\"%s\",job=\"",
			sr->refused ? "crun_store_refused_total" : "crun_store_job_used", sr->kind);
		status_label(sr->f, si->job);
		fprintf(sr->f, "\",budget=\"%s\"} %" PRIu64 "\n",
			store_budget_name((enum store_budget)b),
			sr->refused ? si->refused[b] : si->used[b]);
	}
}

/* Both passes (holdings, then refusals) run over every served store (ss[k]
 * NULL: not served here), so each family's HELP/TYPE comes once, before all
 * its samples. */
static void share_metrics(FILE *f, const struct store_server *const *ss)
{
	static const char *const help[2][3] = {
	    {"crun_store_job_used",
	     "what one job (run id; \"\" no known job) holds of each shared budget", "gauge"},
	    {"crun_store_refused_total",
	     "writes refused because a budget or the job's or connection's share was full, by "
	     "job and budget",
	     "counter"},
	};

	for (int pass = 0; pass < 2; pass++) {
		struct share_rows sr = {f, NULL, pass == 1};

		status_gauge(f, help[pass][0], help[pass][1], help[pass][2]);
		for (int k = 0; k < STATUS_STORE__MAX; k++) {
			sr.kind = status_store_kind[k];
			if (ss[k])
				store_server_each_share(ss[k], share_row, &sr);
		}
	}
}

/* Every store served here (served_store), each sample labelled store="..."
 * by its role, so one query does not add the two up; a family's HELP/TYPE
 * comes once, before all its samples (the exposition format wants that). */
static void store_metrics(FILE *f, const struct store_server *srv, const struct status_source *src)
{
	const struct store_server *ss[STATUS_STORE__MAX];
	struct store_server_stats st[STATUS_STORE__MAX];
	int k, n = 0;

	for (k = 0; k < STATUS_STORE__MAX; k++) {
		ss[k] = served_store(srv, src, (enum status_store)k);
		if (!ss[k])
			continue;
		store_server_get_stats(ss[k], &st[k]);
		n++;
	}
	if (!n)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(store_rows); i++) {
		status_gauge(f, store_rows[i].name, store_rows[i].help, store_rows[i].type);
		for (k = 0; k < STATUS_STORE__MAX; k++)
			if (ss[k])
				fprintf(
				    f, "%s{store=\"%s\"} %" PRIu64 "\n", store_rows[i].name,
				    status_store_kind[k],
				    *(const uint64_t *)((const char *)&st[k] + store_rows[i].off));
	}
	status_gauge(f, "crun_store_ops_total", "requests served by operation", "counter");
	for (k = 0; k < STATUS_STORE__MAX; k++)
		for (int op = 0; ss[k] && op < STORE_OP__MAX; op++)
			fprintf(f, "crun_store_ops_total{store=\"%s\",op=\"%s\"} %" PRIu64 "\n",
				status_store_kind[k], store_proto_op_name((enum store_op)op),
				store_server_op_count(ss[k], (enum store_op)op));
	/* The server's own table of refusals and limit hits, one label each. */
	status_gauge(f, "crun_store_events_total",
		     "connections accepted, refused or dropped, backpressure pauses, and leases "
		     "expired or released, by reason",
		     "counter");
	for (k = 0; k < STATUS_STORE__MAX; k++)
		for (int m = 0; ss[k] && m < STORE_M__MAX; m++)
			fprintf(f,
				"crun_store_events_total{store=\"%s\",event=\"%s\"} %" PRIu64 "\n",
				status_store_kind[k], store_metric_name((enum store_metric)m),
				store_server_metric(ss[k], (enum store_metric)m));
	share_metrics(f, ss);
}

char *status_metrics(const struct store_server *srv, const struct status_source *src,
		     uint64_t uptime_ms)
{
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);
	const char *prog;

	if (!f)
		return NULL;
	/* srv: crun-rdzvd's page, which is no agent (sum(crun_agent_up) counts
	 * agents); an agent's page has its own store through src. */
	prog = srv ? "rdzvd" : "agent";
	fprintf(f, "# HELP crun_%s_up 1 while the %s serves this page\n# TYPE crun_%s_up gauge\n",
		prog, prog, prog);
	fprintf(f, "crun_%s_up 1\n", prog);
	fprintf(f,
		"# HELP crun_%s_uptime_seconds seconds since the status page started\n"
		"# TYPE crun_%s_uptime_seconds gauge\ncrun_%s_uptime_seconds %.3f\n",
		prog, prog, prog, (double)uptime_ms / 1000.0);
	if (src)
		src->metrics(src->arg, f);
	if (src && src->job)
		status_job_metrics(src->job, f);
	store_metrics(f, srv, src);
	if (fclose(f) != 0) {
		free(s);
		return NULL;
	}
	return s;
}
