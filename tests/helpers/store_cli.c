/* store_cli: a line-driven shell over the public store client API, used by
 * the interop and differential tests (tests/integration/) to drive crun's
 * client against PyTorch's server and crun-rdzvd alike.
 *
 *   store_cli --host H --port P [--dialect 1|2] [--prefix P] [--timeout-ms N]
 *             [--connect-timeout-ms N]
 *
 * Prints "CONNECTED" (or "ERR <name>" and exits 1), then reads one command a
 * line from stdin and prints exactly one line per command, flushed:
 *   set k v | append k v | mset k v [k v...] | qpush k v        -> OK
 *   get k | cas k expected desired | qpop k [block]              -> VAL "<v>"
 *   add k n | addraw k n | numkeys | qlen k                      -> INT <n>
 *   check k... -> READY 0|1    delete k -> DELETED 0|1   wait k... -> OK
 *   mget k...  -> VALS "<v>"...    listkeys -> KEYS "<k>"... (sorted)
 *   ping | barrier k n -> OK       optimeout N (timeout_ms for get/wait/...)
 *   view P (later commands use a view with prefix P; "view -" = the base)
 *   sleep MS -> OK                 lasterr -> the handle's last error text
 * Any failure prints "ERR <CRUN_...>" (the detail goes to stderr).
 * Tokens are separated by spaces; "" is the empty string and \xHH, \s
 * (space), \\ escape bytes. Output strings escape \\, " and every byte
 * outside 0x20..0x7e as \xHH, so binary values compare exactly.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "crun/store.h"

#define MAX_TOKENS 256
#define MAX_LINE   (1 << 20)

struct tok {
	char *p; /* NUL-terminated after unescaping (may hold NULs inside) */
	size_t len;
};

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/* Splits line in place into unescaped tokens; returns the count or -1. */
static int tokenize(char *line, struct tok *t, int max)
{
	int n = 0;
	char *p = line;

	for (;;) {
		char *out;

		while (*p == ' ' || *p == '\t')
			p++;
		if (!*p || *p == '\n')
			return n;
		if (n == max)
			return -1;
		t[n].p = out = p;
		if (p[0] == '"' && p[1] == '"' && (p[2] == ' ' || !p[2] || p[2] == '\n')) {
			p += 2;
		} else {
			while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
				if (*p != '\\') {
					*out++ = *p++;
					continue;
				}
				if (p[1] == 'x' && hexval(p[2]) >= 0 && hexval(p[3]) >= 0) {
					*out++ = (char)(hexval(p[2]) * 16 + hexval(p[3]));
					p += 4;
				} else if (p[1] == 's') {
					*out++ = ' ';
					p += 2;
				} else if (p[1] == '\\') {
					*out++ = '\\';
					p += 2;
				} else {
					return -1;
				}
			}
		}
		t[n].len = (size_t)(out - t[n].p);
		if (*p)
			p++;
		*out = '\0';
		n++;
	}
}

static void put_str(const void *v, size_t len)
{
	const unsigned char *b = v;

	putchar('"');
	for (size_t i = 0; i < len; i++) {
		if (b[i] == '"' || b[i] == '\\')
			printf("\\%c", b[i]);
		else if (b[i] >= 0x20 && b[i] < 0x7f)
			putchar(b[i]);
		else
			printf("\\x%02x", b[i]);
	}
	putchar('"');
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int num_arg(const struct tok *t, int64_t *ret)
{
	return parse_i64(t->p, ret);
}

/* Runs one command on `s`; prints its result line on success. */
static int run(crun_store_t *s, crun_store_t **view, crun_store_t *base, struct tok *t, int n,
	       uint32_t *op_timeout)
{
	const char *cmd = t[0].p;
	const char *keys[MAX_TOKENS];
	int64_t num;
	void *val;
	size_t len;
	int r;

	for (int i = 1; i < n; i++)
		keys[i - 1] = t[i].p;
#define NEED(k)                             \
	do {                                \
		if (n != (k) + 1)           \
			return CRUN_EINVAL; \
	} while (0)
	if (!strcmp(cmd, "set") || !strcmp(cmd, "append") || !strcmp(cmd, "qpush")) {
		NEED(2);
		r = !strcmp(cmd, "set")	     ? crun_store_set(s, t[1].p, t[2].p, t[2].len)
		    : !strcmp(cmd, "append") ? crun_store_append(s, t[1].p, t[2].p, t[2].len)
					     : crun_store_queue_push(s, t[1].p, t[2].p, t[2].len);
		TRY(r);
		puts("OK");
	} else if (!strcmp(cmd, "get") || !strcmp(cmd, "qpop")) {
		if (n < 2 || n > 3)
			return CRUN_EINVAL;
		if (!strcmp(cmd, "get"))
			r = n == 2 ? crun_store_get(s, t[1].p, *op_timeout, &val, &len)
				   : CRUN_EINVAL;
		else
			r = crun_store_queue_pop(s, t[1].p, n == 3 && !strcmp(t[2].p, "block"),
						 *op_timeout, &val, &len);
		TRY(r);
		fputs("VAL ", stdout);
		put_str(val, len);
		putchar('\n');
		crun_free(val);
	} else if (!strcmp(cmd, "cas")) {
		NEED(3);
		TRY(crun_store_compare_set(s, t[1].p, t[2].p, t[2].len, t[3].p, t[3].len, &val,
					   &len));
		fputs("VAL ", stdout);
		put_str(val, len);
		putchar('\n');
		crun_free(val);
	} else if (!strcmp(cmd, "add") || !strcmp(cmd, "addraw")) {
		NEED(2);
		TRY(num_arg(&t[2], &num));
		r = !strcmp(cmd, "add") ? crun_store_add(s, t[1].p, num, &num)
					: crun_store_add_raw(s, t[1].p, num, &num);
		TRY(r);
		printf("INT %lld\n", (long long)num);
	} else if (!strcmp(cmd, "numkeys")) {
		NEED(0);
		TRY(crun_store_num_keys(s, &num));
		printf("INT %lld\n", (long long)num);
	} else if (!strcmp(cmd, "qlen")) {
		NEED(1);
		TRY(crun_store_queue_len(s, t[1].p, &num));
		printf("INT %lld\n", (long long)num);
	} else if (!strcmp(cmd, "check")) {
		int ready;

		TRY(crun_store_check(s, keys, (size_t)(n - 1), &ready));
		printf("READY %d\n", ready);
	} else if (!strcmp(cmd, "wait")) {
		TRY(crun_store_wait(s, keys, (size_t)(n - 1), *op_timeout));
		puts("OK");
	} else if (!strcmp(cmd, "delete")) {
		int del;

		NEED(1);
		TRY(crun_store_delete_key(s, t[1].p, &del));
		printf("DELETED %d\n", del);
	} else if (!strcmp(cmd, "mget")) {
		size_t k = (size_t)(n - 1);
		void *vals[MAX_TOKENS];
		size_t lens[MAX_TOKENS];

		TRY(crun_store_multi_get(s, keys, k, *op_timeout, vals, lens));
		fputs("VALS", stdout);
		for (size_t i = 0; i < k; i++) {
			putchar(' ');
			put_str(vals[i], lens[i]);
			crun_free(vals[i]);
		}
		putchar('\n');
	} else if (!strcmp(cmd, "mset")) {
		const char *mk[MAX_TOKENS / 2];
		const void *mv[MAX_TOKENS / 2];
		size_t ml[MAX_TOKENS / 2];
		size_t k = 0;

		if ((n - 1) % 2)
			return CRUN_EINVAL;
		for (int i = 1; i + 1 < n; i += 2, k++) {
			mk[k] = t[i].p;
			mv[k] = t[i + 1].p;
			ml[k] = t[i + 1].len;
		}
		TRY(crun_store_multi_set(s, mk, mv, ml, k));
		puts("OK");
	} else if (!strcmp(cmd, "ping")) {
		NEED(0);
		TRY(crun_store_ping(s, NULL));
		puts("OK");
	} else if (!strcmp(cmd, "listkeys")) {
		char **list;
		size_t k;

		NEED(0);
		TRY(crun_store_list_keys(s, &list, &k));
		qsort(list, k, sizeof(*list), cmp_str);
		fputs("KEYS", stdout);
		for (size_t i = 0; i < k; i++) {
			putchar(' ');
			put_str(list[i], strlen(list[i]));
		}
		putchar('\n');
		crun_store_free_list(list, k);
	} else if (!strcmp(cmd, "barrier")) {
		NEED(2);
		TRY(num_arg(&t[2], &num));
		TRY(crun_store_barrier(s, t[1].p, num, *op_timeout));
		puts("OK");
	} else if (!strcmp(cmd, "optimeout")) {
		NEED(1);
		TRY(num_arg(&t[1], &num));
		if (num < 0 || num > UINT32_MAX)
			return CRUN_ERANGE;
		*op_timeout = (uint32_t)num;
		puts("OK");
	} else if (!strcmp(cmd, "view")) {
		crun_store_t *v = NULL;

		NEED(1);
		if (strcmp(t[1].p, "-"))
			TRY(crun_store_view_new(s, t[1].p, &v));
		if (*view && *view != base)
			crun_store_close(*view);
		*view = v ? v : base;
		puts("OK");
	} else if (!strcmp(cmd, "sleep")) {
		NEED(1);
		TRY(num_arg(&t[1], &num));
		if (num < 0 || num > 60000)
			return CRUN_ERANGE;
		(void)poll(NULL, 0, (int)num);
		puts("OK");
	} else if (!strcmp(cmd, "lasterr")) {
		printf("LASTERR %s\n", crun_store_last_error(s));
	} else {
		return CRUN_EINVAL;
	}
#undef NEED
	return 0;
}

static void usage(void)
{
	fputs("usage: store_cli --host H --port P [--dialect 1|2] [--prefix P]\n"
	      "                 [--timeout-ms N] [--connect-timeout-ms N]\n"
	      "then one command per line on stdin (see the file header)\n",
	      stderr);
}

int main(int argc, char **argv)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *base, *cur;
	uint32_t op_timeout = 0;
	struct tok t[MAX_TOKENS];
	char *line;
	int r;

	log_init("store_cli", LL_WARN);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t u;

		if (!v) {
			usage();
			return 2;
		}
		i++;
		if (!strcmp(a, "--host")) {
			o.host = v;
		} else if (!strcmp(a, "--prefix")) {
			o.prefix = v;
		} else if (!strcmp(a, "--port") && parse_uint_range(v, 0, 65535, &u) == 0) {
			o.port = (uint16_t)u;
		} else if (!strcmp(a, "--dialect") && parse_uint_range(v, 1, 2, &u) == 0) {
			o.dialect = (int)u;
		} else if (!strcmp(a, "--timeout-ms") &&
			   parse_uint_range(v, 0, UINT32_MAX, &u) == 0) {
			o.timeout_ms = (uint32_t)u;
		} else if (!strcmp(a, "--tls-ca")) {
			o.tls_ca = v;
		} else if (!strcmp(a, "--tls-cert")) {
			o.tls_cert = v;
		} else if (!strcmp(a, "--tls-key")) {
			o.tls_key = v;
		} else if (!strcmp(a, "--tls-min-version") &&
			   parse_uint_range(v, 12, 13, &u) == 0) {
			o.tls_min_version = (int)u;
		} else if (!strcmp(a, "--auth-secret-file")) {
			o.auth_secret_file = v;
		} else if (!strcmp(a, "--auth-job")) {
			o.auth_job = v;
		} else if (!strcmp(a, "--connect-timeout-ms") &&
			   parse_uint_range(v, 0, UINT32_MAX, &u) == 0) {
			o.connect_timeout_ms = (uint32_t)u;
		} else {
			fprintf(stderr, "store_cli: bad option %s %s\n", a, v);
			usage();
			return 2;
		}
	}
	r = crun_store_open(&o, &base);
	if (r < 0) {
		printf("ERR %s\n", crun_err_name(r));
		return 1;
	}
	puts("CONNECTED");
	fflush(stdout);
	cur = base;
	line = malloc(MAX_LINE);
	if (!line) {
		crun_store_close(base);
		return 1;
	}
	while (fgets(line, MAX_LINE, stdin)) {
		int n = tokenize(line, t, MAX_TOKENS);

		if (n == 0)
			continue;
		r = n < 0 ? CRUN_EINVAL : run(cur, &cur, base, t, n, &op_timeout);
		if (r < 0) {
			printf("ERR %s\n", crun_err_name(r));
			fprintf(stderr, "store_cli: %s\n", crun_store_last_error(cur));
		}
		fflush(stdout);
	}
	free(line);
	if (cur != base)
		crun_store_close(cur);
	crun_store_close(base);
	return 0;
}
