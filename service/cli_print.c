/* cli_print.c: one option row as --help and man page text, and the text
 * helpers both pages use: the printers of every program's rows (agent/'s
 * option table, crun-rdzvd's and crunctl's rows), so the pages cannot drift
 * apart.
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "service/service.h"

bool cli_row_shown(const struct cli_opt *o, enum cli_prog prog)
{
	return o->name && (!(o->flags & CF_AGENT) || prog == CLI_AGENT);
}

/* "--nproc-per-node, --nproc_per_node" (one spelling when they agree). */
void cli_spellings(const struct cli_opt *o, char *buf, size_t cap)
{
	char dash[64];
	size_t n = 0;

	snprintf(dash, sizeof(dash), "%s", o->name);
	for (char *s = dash; *s; s++)
		if (*s == '_')
			*s = '-';
	if (o->short_name)
		n = (size_t)snprintf(buf, cap, "-%c, ", o->short_name);
	if (strcmp(dash, o->name) != 0)
		snprintf(buf + n, cap - n, "--%s, --%s", dash, o->name);
	else
		snprintf(buf + n, cap - n, "--%s", o->name);
}

/* Words of text, wrapped at 78 columns with `indent` spaces. */
void cli_wrap(FILE *f, const char *text, int indent)
{
	int col = indent;

	fprintf(f, "%*s", indent, "");
	for (const char *p = text; *p;) {
		size_t w = strcspn(p, " ");

		if (col > indent && col + 1 + (int)w > 78) {
			fprintf(f, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', f);
			col++;
		}
		fprintf(f, "%.*s", (int)w, p);
		col += (int)w;
		p += w;
		while (*p == ' ')
			p++;
	}
	fputc('\n', f);
}

void cli_help_row(FILE *f, const struct cli_opt *o)
{
	char head[160], text[512];
	size_t n;

	if (o->name)
		cli_spellings(o, head, sizeof(head));
	else
		snprintf(head, sizeof(head), "%s", o->json);
	fprintf(f, "  %s%s%s\n", head, o->metavar ? " " : "", o->metavar ? o->metavar : "");
	n = (size_t)snprintf(text, sizeof(text), "%s", o->help);
	if (o->def && n < sizeof(text))
		n += (size_t)snprintf(text + n, sizeof(text) - n, " [%s]", o->def);
	if (o->name && (o->env || o->json) && n < sizeof(text))
		snprintf(text + n, sizeof(text) - n, " (%s%s%s%s)", o->env ? "env " : "",
			 o->env ? o->env : "", o->env && o->json ? "; " : "",
			 o->json ? o->json : "");
	cli_wrap(f, text, 8);
}

/* roff text: a leading '.' or '\'' would be a request, '\' an escape, '-' a
 * hyphen (options want the minus sign \-). */
void cli_roff(FILE *f, const char *s)
{
	if (*s == '.' || *s == '\'')
		fputs("\\&", f);
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\e", f);
		else if (*s == '-')
			fputs("\\-", f);
		else
			fputc(*s, f);
	}
}

/* One option as a tagged paragraph: its spellings and placeholder, its help
 * with the default, and where else it may be set. */
void cli_man_row(FILE *f, const struct cli_opt *o)
{
	char head[160];

	if (o->name)
		cli_spellings(o, head, sizeof(head));
	else
		snprintf(head, sizeof(head), "%s", o->json);
	fputs(".TP\n\\fB", f);
	cli_roff(f, head);
	fputs("\\fR", f);
	if (o->metavar) {
		fputs(" \\fI", f);
		cli_roff(f, o->metavar);
		fputs("\\fR", f);
	}
	fputc('\n', f);
	cli_roff(f, o->help);
	if (o->def) {
		fputs(" [", f);
		cli_roff(f, o->def);
		fputc(']', f);
	}
	fputc('\n', f);
	if (o->name && (o->env || o->json)) {
		fputs(".br\n", f);
		if (o->env) {
			fputs("Environment: ", f);
			cli_roff(f, o->env);
			fputs(". ", f);
		}
		if (o->json) {
			fputs("JSON: ", f);
			cli_roff(f, o->json);
			fputc('.', f);
		}
		fputc('\n', f);
	}
}
