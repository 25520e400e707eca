/* status_drop.c: POST /drop?job=J on crun-rdzvd's status page (crunctl
 * drop --job J): an operator's way out after a flood, behind a bearer token
 * (crun-rdzvd --admin-token-file); off (403) without one.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/common.h"
#include "service/status_int.h"
#include "store/auth.h"
#include "store/server.h"

/* Whether req carries "Authorization: Bearer <token>"; constant time in
 * the token's bytes, so the answer's timing does not leak a prefix. */
static bool bearer_ok(const struct status_drop *d, struct evhttp_request *req)
{
	const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	unsigned char diff = 0;
	size_t n;

	if (!h || strncmp(h, "Bearer ", 7) != 0)
		return false;
	h += 7;
	n = strlen(h);
	if (n != d->token_len)
		return false;
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)(h[i] ^ d->token[i]);
	return diff == 0;
}

/* {"job": J, "dropped_keys": n}, malloc'd; NULL on OOM. */
static char *drop_body(const char *job, uint64_t n)
{
	cJSON *o = cJSON_CreateObject();
	char *out = NULL;

	if (o && cJSON_AddStringToObject(o, "job", job) &&
	    cJSON_AddNumberToObject(o, "dropped_keys", (double)n))
		out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return out;
}

/* POST /drop?job=J (crunctl drop --job J): an operator's way out after a
 * flood - job J's keys go, as DELETE_KEY would delete them. Off (403)
 * unless crun-rdzvd was given --admin-token-file; a request without that
 * token is refused (401) and logged. */
void status_drop_post(const struct status_drop *d, struct evhttp_request *req, const char *query)
{
	struct evkeyvalq q = {0};
	const char *job = NULL;
	uint64_t n = 0;
	int r;

	if (!d->store) {
		evhttp_send_error(req, 403,
				  "drop is off: crun-rdzvd --admin-token-file turns it on");
		return;
	}
	if (!bearer_ok(d, req)) {
		log_at(LL_WARN, SUB_AGENT, "refusing a drop from %s: no or wrong admin token",
		       evhttp_request_get_host(req) ? evhttp_request_get_host(req) : "?");
		evhttp_send_error(req, 401, "the admin token is missing or wrong");
		return;
	}
	if (query && evhttp_parse_query_str(query, &q) == 0)
		job = evhttp_find_header(&q, "job");
	if (!job) {
		evhttp_clear_headers(&q);
		evhttp_send_error(req, HTTP_BADREQUEST, "drop needs ?job=RUN_ID");
		return;
	}
	r = store_server_drop_job(d->store, job, &n);
	if (r == CRUN_ENOTFOUND) {
		evhttp_clear_headers(&q);
		evhttp_send_error(req, HTTP_NOTFOUND, "the job holds no keys");
		return;
	}
	if (r == 0)
		log_at(LL_WARN, SUB_AGENT,
		       "dropped %" PRIu64 " keys of job '%s' (an operator's drop)", n, job);
	if (r < 0)
		evhttp_send_error(req, HTTP_INTERNAL, crun_strerror(r));
	else
		status_reply(req, 200, "application/json", drop_body(job, n));
	evhttp_clear_headers(&q); /* job points into it */
}

int status_drop_allow(struct status_drop *d, struct store_server *srv,
		      const struct store_auth_secret *token)
{
	char *t;

	/* It travels in a header: no NUL, CR, LF or other control byte. */
	for (size_t i = 0; i < token->len; i++)
		if (token->bytes[i] < 0x20 || token->bytes[i] == 0x7f)
			return CRUN_EINVAL;
	t = malloc(token->len + 1);
	if (!t)
		return CRUN_ENOMEM;
	memcpy(t, token->bytes, token->len);
	t[token->len] = '\0';
	free(d->token);
	d->token = t;
	d->token_len = token->len;
	d->store = srv;
	return 0;
}

void status_drop_clear(struct status_drop *d)
{
	free(d->token);
	memset(d, 0, sizeof(*d));
}
