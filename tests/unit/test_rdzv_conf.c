/* test_rdzv_conf.c: the rendezvous settings as rows (rendezvous/c10d.h):
 * every row's default and every key (and alias) reach their typed field
 * through the one text parser (agent/cli_rdzv.c), each backend reads only
 * its scope, the rules between keys hold on the typed struct, the JSON rows
 * are the c10d rows; and the front door (rendezvous/rdzv.c) picks backends
 * by name and answers for what a backend leaves out.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "agent/cli_int.h"
#include "agent/cli_rdzv_int.h"
#include "common/common.h"
#include "rendezvous/c10d.h"
#include "rendezvous/rdzv.h"
#include "unit/check_main.h"

static const struct {
	const char *name, *alias, *def, *choices;
	enum rdzv_key_kind kind;
	enum rdzv_key_scope scope;
	size_t off, size;
} rows[] = {
#define ROW_(id, nm, al, kd, sc, field, df, mv, ch, hp)                                          \
	{#nm, al, df, ch, kd, sc, offsetof(struct c10d_conf, field),                             \
	 sizeof(((struct c10d_conf *)0)->field)},
    RDZV_CONF_KEYS(ROW_)
#undef ROW_
};

#define NROWS ((int)ARRAY_SIZE(rows))

/* A value of the row's kind that no default has. */
static const char *sample(int i)
{
	switch (rows[i].kind) {
	case RK_SECS:
		return "7";
	case RK_BOOL:
		return "false";
	case RK_PICK:
	case RK_TLS:
		return strchr(rows[i].choices, '|') + 1;
	case RK_STR:
		return "/p";
	default:
		return "/dev/null";
	}
}

/* The key some rows need beside them (the rules between keys). */
static const char *partner(const char *name)
{
	if (strcmp(name, "username") == 0)
		return ",password_file=/dev/null";
	if (strcmp(name, "cert") == 0)
		return ",key=/dev/null";
	if (strcmp(name, "key") == 0)
		return ",cert=/dev/null";
	if (strcmp(name, "heartbeat_interval") == 0)
		return ",lease_ttl=60";
	return "";
}

START_TEST(defaults_come_from_the_rows)
{
	struct c10d_conf c;

	cli_rdzv_conf_init(&c);
	for (int i = 0; i < NROWS; i++) {
		uint32_t ms;
		const char *why;

		if (rows[i].kind != RK_SECS || !rows[i].def)
			continue;
		ck_assert_int_eq(parse_timeout_ms(rows[i].def, &ms, &why), 0);
		ck_assert_uint_eq(*(uint32_t *)((char *)&c + rows[i].off), ms);
	}
	ck_assert_uint_eq(c.join_ms, 600000);
	ck_assert_uint_eq(c.read_ms, 60000);
	ck_assert_int_eq(c.is_host, -1);
	ck_assert_int_eq(c.etcd_https, -1); /* unset: the endpoints' scheme decides */
	ck_assert_int_eq(c.tls_min, 0);
	ck_assert_uint_eq(c.store.max_keys, 1u << 20);
}
END_TEST

/* _i: a row; 0 and 1: its name and its alias. */
START_TEST(every_key_and_alias_sets_its_field)
{
	for (int spell = 0; spell < 2; spell++) {
		const char *k = spell ? rows[_i].alias : rows[_i].name;
		struct c10d_conf def, c;
		char text[256], err[512];

		if (!k)
			continue;
		cli_rdzv_conf_init(&def);
		c = def;
		snprintf(text, sizeof(text), "%s=%s%s", k, sample(_i), partner(rows[_i].name));
		ck_assert_msg(cli_rdzv_conf_set(&c, "etcd", text, err, sizeof(err)) == 0, "%s: %s",
			      text, err);
		ck_assert_msg(memcmp((char *)&c + rows[_i].off, (char *)&def + rows[_i].off,
				     rows[_i].size) != 0,
			      "%s left its field at the default", text);
		/* c10d reads every row but etcd's, and names the key it refuses. */
		c = def;
		if (rows[_i].scope == RS_ETCD) {
			ck_assert_int_eq(cli_rdzv_conf_set(&c, "c10d", text, err, sizeof(err)),
					 CRUN_EINVAL);
			ck_assert_msg(strstr(err, "unknown key"), "%s", err);
		} else {
			ck_assert_int_eq(cli_rdzv_conf_set(&c, "c10d", text, err, sizeof(err)), 0);
		}
	}
}
END_TEST

START_TEST(static_reads_only_the_timeouts_last_one_wins)
{
	uint32_t ms = 1;
	char unknown[128], err[256];

	ck_assert_int_eq(cli_rdzv_conf_static("timeout=3,is_host=1,read_timeout=5,x=2", &ms,
					      unknown, sizeof(unknown), err, sizeof(err)),
			 0);
	ck_assert_uint_eq(ms, 5000);
	ck_assert_str_eq(unknown, "'is_host', 'x'");
	ck_assert_int_eq(cli_rdzv_conf_static("join_timeout=0", &ms, unknown, sizeof(unknown), err,
					      sizeof(err)),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "join_timeout=0 must be positive"));
	ck_assert_uint_eq(ms, 5000);
}
END_TEST

START_TEST(rules_between_keys_hold_on_the_typed_struct)
{
	struct c10d_conf c;
	char err[256];

	cli_rdzv_conf_init(&c);
	ck_assert_int_eq(c10d_conf_check(&c, err, sizeof(err)), 0);
	c.ttl_ms = c.hb_ms - 1;
	ck_assert_int_eq(c10d_conf_check(&c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "lease_ttl"));
	cli_rdzv_conf_init(&c);
	snprintf(c.etcd_prefix, sizeof(c.etcd_prefix), "/x/");
	ck_assert_int_eq(c10d_conf_check(&c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "key_prefix=/x/"));
	cli_rdzv_conf_init(&c);
	snprintf(c.etcd_cert, sizeof(c.etcd_cert), "/c");
	ck_assert_int_eq(c10d_conf_check(&c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "cert and key"));
}
END_TEST

/* The JSON keys, --help and schema rows are the c10d rows, one each. */
START_TEST(every_c10d_row_is_a_json_row)
{
	int n = 0;

#define CHECK_(id, nm, al, kd, sc, field, df, mv, ch, hp)                                        \
	ck_assert_str_eq(cli_opts[OPT_RK_##id].json, "rendezvous." #nm);                         \
	ck_assert_str_eq(cli_opts[OPT_RK_##id].help, hp);                                        \
	n++;
	RDZV_C10D_KEYS(CHECK_)
#undef CHECK_
	ck_assert_int_gt(n, 10);
}
END_TEST

static void on_ev(enum rdzv_event ev, void *arg)
{
	(void)ev;
	(void)arg;
}

START_TEST(front_door_picks_backends_by_name)
{
	struct event_base *base = event_base_new();
	struct rdzv_params p = {.backend = "zookeeper",
				.run_id = "j",
				.nnodes = 1,
				.nproc = 2,
				.master_addr = "127.0.0.1",
				.master_port = 29400,
				.min_nodes = 1,
				.max_nodes = 1,
				.base = base,
				.on_event = on_ev};
	struct rdzv_progress prog;
	struct c10d_conf conf;
	struct rdzv *r;

	ck_assert_ptr_nonnull(base);
	ck_assert_int_eq(rdzv_new(&p, &r), CRUN_ENOTSUP);
	p.backend = "c10d"; /* every backend needs its typed settings */
	ck_assert_int_eq(rdzv_new(&p, &r), CRUN_ECONFIG);
	p.backend = "etcd";
	ck_assert_int_eq(rdzv_new(&p, &r), CRUN_ECONFIG);
	p.backend = "static";
	ck_assert_int_eq(rdzv_new(&p, &r), CRUN_ECONFIG);
	cli_rdzv_conf_init(&conf);
	p.conf = &conf;
	ck_assert_int_eq(rdzv_new(&p, &r), 0);
	/* What the static backend leaves out, the front door answers. */
	rdzv_get_progress(r, &prog);
	ck_assert_int_eq(prog.round, -1);
	ck_assert_ptr_null(rdzv_peer_addrs(r));
	ck_assert_ptr_null(rdzv_served_store(r));
	ck_assert(!rdzv_worker_store_proxy(r));
	ck_assert(!rdzv_clears_store(r));
	ck_assert_int_eq(rdzv_failure(r), CRUN_ERDZVCLOSED);
	ck_assert_int_eq(rdzv_next_round(r), 0);
	ck_assert_int_eq(event_base_loop(base, EVLOOP_ONCE), 0);
	ck_assert_ptr_nonnull(rdzv_info(r));
	ck_assert_int_eq(rdzv_info(r)->world_size, 2);
	rdzv_free(r);
	rdzv_free(NULL);
	event_base_free(base);
}
END_TEST

static Suite *rdzv_conf_suite(void)
{
	Suite *s = suite_create("rdzv_conf");
	TCase *tc = tcase_create("rows");

	tcase_add_test(tc, defaults_come_from_the_rows);
	tcase_add_loop_test(tc, every_key_and_alias_sets_its_field, 0, NROWS);
	tcase_add_test(tc, static_reads_only_the_timeouts_last_one_wins);
	tcase_add_test(tc, rules_between_keys_hold_on_the_typed_struct);
	tcase_add_test(tc, every_c10d_row_is_a_json_row);
	tcase_add_test(tc, front_door_picks_backends_by_name);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(rdzv_conf_suite)
