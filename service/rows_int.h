/* rows_int.h: crun-rdzvd's and crunctl's rows (cli_rows.c) for the code that
 * prints them (cli_doc.c); inside service/ only.
 */
#ifndef CRUN_SERVICE_ROWS_INT_H
#define CRUN_SERVICE_ROWS_INT_H

#include <stddef.h>

#include "service/service.h"

/* crun-rdzvd's rows (its own, then one per store limit, whose default and
 * JSON path texts go to buf) or crunctl's, into out (cap rows); returns the
 * count, row id = index. A program's text (usage line, description, man
 * page sections) comes with them in *ret_doc. */
#define CLI_DAEMON_ROWS_MAX 64
struct cli_daemon_buf {
	char def[CLI_DAEMON_ROWS_MAX][32];
	char json[CLI_DAEMON_ROWS_MAX][80];
};
struct cli_doc {
	int man_section;
	const char *what;	 /* NAME's line */
	const char *usage;	 /* --help's first line, after "usage: " */
	const char *synopsis;	 /* roff */
	const char *description; /* plain text, wrapped */
	const char *help_tail;	 /* plain text after the options */
	const char *man_tail;	 /* roff: EXIT STATUS ... EXAMPLES */
};
size_t cli_daemon_rows(enum cli_prog prog, struct cli_opt *out, size_t cap,
		       struct cli_daemon_buf *buf, const struct cli_doc **ret_doc);

#endif
