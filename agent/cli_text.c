/* cli_text.c: what the option table prints: --help, shell completion scripts
 * (bash, zsh, tcsh, as torchrun's --print-completion) and the JSON schema of
 * crun-agent's config. Everything is derived from cli_opts[], so a new row
 * shows up in all of them at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent/agent.h"
#include "agent/cli_int.h"
#include "common/common.h"
#include "store/server.h"

static bool shown(const struct cli_opt *o, enum cli_prog prog)
{
	return o->name && (!(o->flags & CF_AGENT) || prog == CLI_AGENT);
}

/* "--nproc-per-node, --nproc_per_node" (one spelling when they agree). */
static void spellings(const struct cli_opt *o, char *buf, size_t cap)
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
		spellings(o, head, sizeof(head));
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

static void help_section(FILE *f, enum cli_prog prog, const char *title,
			 bool (*pick)(const struct cli_opt *o, enum cli_prog prog))
{
	fprintf(f, "\n%s\n", title);
	for (int k = 0; k < OPT__MAX; k++)
		if (pick(&cli_opts[k], prog) && !(cli_opts[k].flags & CF_HIDDEN))
			cli_help_row(f, &cli_opts[k]);
}

static bool pick_torchrun(const struct cli_opt *o, enum cli_prog prog)
{
	return shown(o, prog) && (o->flags & CF_TORCHRUN);
}

static bool pick_crun(const struct cli_opt *o, enum cli_prog prog)
{
	return shown(o, prog) && !(o->flags & CF_TORCHRUN);
}

static bool pick_rdzv_key(const struct cli_opt *o, enum cli_prog prog)
{
	return o->flags & CF_RDZVKEY;
}

static bool pick_job(const struct cli_opt *o, enum cli_prog prog)
{
	return prog == CLI_AGENT && !o->name && !(o->flags & CF_RDZVKEY);
}

/* How programs are run, and what crun rejects by name: --help and the man page. */
#define PROGRAMS_TEXT                                                                         \
	"Programs: *.py and -m run with -u under $PYTHON_EXEC, else the python3 beside this " \
	"program (a venv's bin/), else python3 on PATH ($PYTHON is not read); ELF binaries "  \
	"and non-Python scripts run directly. Not supported (rejected by name): "             \
	"--logs_specs other than default."

/* rdzv_conf store_<limit>=N: one per limit of the store's own table (the
 * names of crun-rdzvd's limit flags), so the list cannot drift from it. */
static void store_keys_text(FILE *f, bool man)
{
	const struct store_server_limit *l;
	char text[2048];
	size_t n, len;

	len = (size_t)snprintf(text, sizeof(text),
			       "c10d: store_<limit>=N sets a limit of the store this agent "
			       "serves (crun-rdzvd(8) explains each):");
	l = store_server_limits(&n);
	for (size_t i = 0; i < n && len < sizeof(text); i++) {
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s store_", i ? "," : "");
		for (const char *p = l[i].name; *p && len + 1 < sizeof(text); p++)
			text[len++] = *p == '-' ? '_' : *p;
		text[len] = '\0';
	}
	if (man) {
		fputs(".PP\n", f);
		cli_roff(f, text);
		fputc('\n', f);
	} else {
		cli_wrap(f, text, 2);
	}
}

char *cli_help_new(enum cli_prog prog)
{
	bool agent = prog == CLI_AGENT;
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);

	if (!f)
		return NULL;
	fprintf(f, "usage: %s [options] %s [training_script_args ...]%s\n\n",
		agent ? "crun-agent [--config FILE.json]" : "crun",
		agent ? "[training_script" : "training_script", agent ? "]" : "");
	cli_wrap(f,
		 agent ? "crun's node agent as a service: one job from a JSON config and/or "
			 "crun's flags, with systemd's notify protocol and a status page."
		       : "torchrun-compatible launcher.",
		 0);
	cli_wrap(f,
		 "Every option takes both spellings (--nproc-per-node, --nproc_per_node); "
		 "torchrun's may be abbreviated to a unique prefix. A flag wins over the JSON "
		 "config (crun-agent --config), which wins over the environment (the first "
		 "variable named that is set), which wins over the default in [].",
		 0);
	help_section(f, prog, "torchrun's options:", pick_torchrun);
	help_section(f, prog, "crun's own options (exact names only):", pick_crun);
	help_section(f, prog,
		     "c10d rendezvous keys (--rdzv_conf KEY=VALUE,... or rendezvous.KEY in the "
		     "JSON config):",
		     pick_rdzv_key);
	store_keys_text(f, false);
	if (agent)
		help_section(f, prog, "the job in the JSON config:", pick_job);
	fputc('\n', f);
	cli_wrap(f, PROGRAMS_TEXT, 0);
	if (fclose(f) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

/* ---- man page ------------------------------------------------------------------ */

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
		spellings(o, head, sizeof(head));
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

static void man_section(FILE *f, enum cli_prog prog, const char *title,
			bool (*pick)(const struct cli_opt *o, enum cli_prog prog))
{
	fprintf(f, ".SS ");
	cli_roff(f, title);
	fputc('\n', f);
	for (int k = 0; k < OPT__MAX; k++)
		if (pick(&cli_opts[k], prog) && !(cli_opts[k].flags & CF_HIDDEN))
			cli_man_row(f, &cli_opts[k]);
}

/* crun-agent's codes are what systemd acts on (crun-agent@.service). */
#define AGENT_EXIT_STATUS                                                                         \
	".SH EXIT STATUS\n0: every worker succeeded; 1: the job failed (a restart may help); 2: " \
	"the agent can never succeed as configured: a bad command line, config or secret file, "  \
	"a run id already used by a job that ended on the rendezvous store, a port taken "        \
	"(crun\\-agent@.service: RestartPreventExitStatus=2). On SIGTERM or SIGINT the agent "    \
	"stops its workers and dies by that signal, a clean stop for systemd "                    \
	"(SuccessExitStatus=SIGTERM SIGINT).\n"
#define CRUN_EXIT_STATUS                                                                         \
	".SH EXIT STATUS\n0: every worker succeeded; 1: the job failed; 2: bad command line or " \
	"configuration (nothing was started).\n"

/* ENVIRONMENT: every variable of the option table, then crun's own. */
static void man_environment(FILE *f, enum cli_prog prog)
{
	fputs(".SH ENVIRONMENT\nAn option's variables (the first one set wins) apply when "
	      "neither a flag nor the JSON config sets it.\n",
	      f);
	for (int k = 0; k < OPT__MAX; k++) {
		const struct cli_opt *o = &cli_opts[k];
		char head[160];

		if (!o->env || !o->name || (o->flags & CF_HIDDEN) ||
		    (prog != CLI_AGENT && (o->flags & CF_AGENT)))
			continue;
		spellings(o, head, sizeof(head));
		fputs(".TP\n.B ", f);
		cli_roff(f, o->env);
		fputs("\n", f);
		cli_roff(f, head);
		fputc('\n', f);
	}
	fputs(".TP\n.B CRUN_LOG_LEVEL\\fR, \\fBCRUN_LOG_SUBSYS\n"
	      "log level (error, warn, info, debug, trace) and subsystems (agent, rdzv, store, "
	      "pg, cuda) of crun's own log lines\n"
	      ".TP\n.B CRUN_AUTH_SECRET_FILE\nthe shared secret when no option names one\n"
	      ".TP\n.B PYTHON_EXEC\nthe interpreter of Python programs\n",
	      f);
}

/* Sections after EXIT STATUS that say what no table holds. */
#define CRUN_MAN_TAIL                                                                       \
	".SH SIGNALS\nSIGTERM, SIGINT: stop the workers (SIGTERM to each worker's process " \
	"group, SIGKILL after \\fB\\-\\-shutdown_timeout\\fR) and exit.\n"                  \
	".SH FILES\n.TP\n.I $TMPDIR/torchelastic_*\nlogs and error files when no "          \
	"\\fB\\-\\-log_dir\\fR is given\n"                                                  \
	".SH EXAMPLES\nFour workers on one node:\n.PP\n.nf\n"                               \
	"crun \\-\\-standalone \\-\\-nproc_per_node=4 train.py \\-\\-epochs 10\n.fi\n"      \
	".PP\nTwo to four nodes against crun\\-rdzvd, on every node:\n.PP\n.nf\n"           \
	"crun \\-\\-nnodes=2:4 \\-\\-nproc_per_node=gpu \\-\\-rdzv_backend=c10d \\\\\n"     \
	"     \\-\\-rdzv_endpoint=rdzv.example:29400 \\-\\-rdzv_id=job42 \\\\\n"            \
	"     \\-\\-auth_secret_file=/etc/crun/job42.secret train.py\n.fi\n" CLI_MAN_SEE_ALSO
#define AGENT_MAN_TAIL                                                                          \
	".SH SIGNALS\n.TP\n.B SIGTERM\\fR, \\fBSIGINT\nstop the workers and die by the signal " \
	"(systemctl stop)\n.TP\n.B SIGHUP\nread the config again; the settings that apply "     \
	"live (the log level) change at once (systemctl reload)\n"                              \
	".SH FILES\n.TP\n.I /etc/crun/agents/JOB.json\nthe config of "                          \
	"crun\\-agent@JOB.service (schema: /usr/share/crun/crun\\-agent.schema.json)\n"         \
	".TP\n.I /etc/crun/*.secret\nshared secrets, mode 0600, owned by the crun user "        \
	"(tmpfiles.d/crun.conf)\n.TP\n.I /var/lib/crun/JOB\nthe unit's working and state "      \
	"directory\n"                                                                           \
	".SH EXAMPLES\nRun job42 from its config under systemd:\n.PP\n.nf\n"                    \
	"systemctl enable \\-\\-now crun\\-agent@job42\n"                                       \
	"crun\\-agent \\-\\-config /etc/crun/agents/job42.json \\-\\-print\\-config\n"          \
	"crunctl status \\-\\-endpoint 127.0.0.1:29510\n.fi\n" CLI_MAN_SEE_ALSO

char *cli_man_new(enum cli_prog prog)
{
	bool agent = prog == CLI_AGENT;
	const char *name = agent ? "crun-agent" : "crun";
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);

	if (!f)
		return NULL;
	fprintf(f, ".\\\" generated by %s --print-man from crun's option table\n", name);
	/* A daemon's page goes to section 8, as systemd's and sshd's do. */
	fprintf(f, ".TH %s %d \"\" \"crun %s\" \"%s\"\n.SH NAME\n", agent ? "CRUN\\-AGENT" : "CRUN",
		agent ? 8 : 1, crun_version_string(),
		agent ? "System Administration" : "User Commands");
	cli_roff(f, name);
	fputs(agent ? " \\- crun's node agent as a systemd service\n"
		    : " \\- torchrun\\-compatible elastic launcher\n",
	      f);
	fprintf(f, ".SH SYNOPSIS\n\\fB%s\\fR %s[\\fIoptions\\fR] %s\n",
		agent ? "crun\\-agent" : "crun",
		agent ? "[\\fB\\-\\-config\\fR \\fIFILE.json\\fR] " : "",
		agent ? "[\\fItraining_script\\fR [\\fIargs\\fR ...]]"
		      : "\\fItraining_script\\fR [\\fIargs\\fR ...]");
	fputs(".SH DESCRIPTION\nEvery option takes both spellings; torchrun's may be abbreviated "
	      "to a "
	      "unique prefix. A flag wins over the JSON config, which wins over the environment, "
	      "which wins over the default in brackets.\n.PP\n",
	      f);
	cli_roff(f, PROGRAMS_TEXT);
	fputs("\n.SH OPTIONS\n", f);
	man_section(f, prog, "torchrun's options", pick_torchrun);
	man_section(f, prog, "crun's own options", pick_crun);
	man_section(f, prog, "c10d rendezvous keys (--rdzv_conf KEY=VALUE or rendezvous.KEY)",
		    pick_rdzv_key);
	store_keys_text(f, true);
	if (agent)
		man_section(f, prog, "the job in the JSON config", pick_job);
	fputs(agent ? AGENT_EXIT_STATUS : CRUN_EXIT_STATUS, f);
	man_environment(f, prog);
	fputs(agent ? AGENT_MAN_TAIL : CRUN_MAN_TAIL, f);
	if (fclose(f) != 0) {
		free(s);
		return NULL;
	}
	return s;
}

/* ---- completion ----------------------------------------------------------------- */

static void each_spelling(const struct cli_opt *o, void (*fn)(FILE *, const char *, void *),
			  FILE *f, void *arg)
{
	char dash[64], und[64];

	snprintf(und, sizeof(und), "--%s", o->name);
	snprintf(dash, sizeof(dash), "%s", und);
	for (char *s = dash + 2; *s; s++)
		if (*s == '_')
			*s = '-';
	fn(f, dash, arg);
	if (strcmp(dash, und) != 0)
		fn(f, und, arg);
	if (o->short_name) {
		char sh[3] = {'-', o->short_name, '\0'};

		fn(f, sh, arg);
	}
}

static void put_word(FILE *f, const char *w, void *arg)
{
	fprintf(f, "%s%s", *(bool *)arg ? " " : "", w);
	*(bool *)arg = true;
}

static void put_bash_case(FILE *f, const char *w, void *arg)
{
	fprintf(f, "%s%s", *(bool *)arg ? "|" : "\t\t", w);
	*(bool *)arg = true;
}

static bool is_dir(const struct cli_opt *o)
{
	return o->metavar && strcmp(o->metavar, "DIR") == 0;
}

static bool is_file(const struct cli_opt *o)
{
	return o->metavar && strncmp(o->metavar, "FILE", 4) == 0;
}

static void choices_words(FILE *f, const char *choices)
{
	for (const char *p = choices; *p; p++)
		fputc(*p == '|' ? ' ' : *p, f);
}

/* The shell function's name: the command with '_' for '-'. */
static void fn_name(char *buf, size_t cap, const char *cmd)
{
	snprintf(buf, cap, "%s", cmd);
	for (char *p = buf; *p; p++)
		if (*p == '-')
			*p = '_';
}

static void bash(FILE *f, const struct cli_rowset *set)
{
	const char *cmd = set->cmd;
	char fn[64];
	bool any;

	fn_name(fn, sizeof(fn), cmd);
	fprintf(f,
		"# bash completion for %s (generated by %s --print-completion bash)\n"
		"_%s_complete() {\n"
		"\tlocal cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
		"\tcase \"$prev\" in\n",
		cmd, cmd, fn);
	for (const struct cli_opt *o = set->rows; o < set->rows + set->n; o++) {
		if (!shown(o, set->prog) || !(o->choices || is_dir(o) || is_file(o)))
			continue;
		any = false;
		each_spelling(o, put_bash_case, f, &any);
		if (o->choices) {
			fputs(") COMPREPLY=($(compgen -W \"", f);
			choices_words(f, o->choices);
			fputs("\" -- \"$cur\")); return ;;\n", f);
		} else {
			fprintf(f, ") COMPREPLY=($(compgen -%c -- \"$cur\")); return ;;\n",
				is_dir(o) ? 'd' : 'f');
		}
	}
	fputs("\tesac\n\tif [[ \"$cur\" == -* ]]; then\n\t\tCOMPREPLY=($(compgen -W \"", f);
	any = false;
	for (const struct cli_opt *o = set->rows; o < set->rows + set->n; o++)
		if (shown(o, set->prog))
			each_spelling(o, put_word, f, &any);
	fprintf(f,
		"\" -- \"$cur\"))\n\t\treturn\n\tfi\n"
		"\tCOMPREPLY=($(compgen -f -- \"$cur\"))\n}\n"
		"complete -o filenames -F _%s_complete %s\n",
		fn, cmd);
}

/* zsh's _arguments specs: [, ], : and ' are syntax inside them. */
static void zsh_text(FILE *f, const char *s)
{
	for (; *s; s++)
		fputc(*s == '[' ? '(' : *s == ']' ? ')' : (*s == ':' || *s == '\'') ? ' ' : *s, f);
}

static void put_zsh(FILE *f, const char *w, void *arg)
{
	const struct cli_opt *o = arg;
	bool val = o->type != CT_FLAG && !(o->type == CT_ACTION && !o->metavar);

	fprintf(f, " \\\n\t'%s%s[", w, val && w[1] == '-' ? "=" : "");
	zsh_text(f, o->help);
	fputs("]", f);
	if (val) {
		fputc(':', f);
		zsh_text(f, o->metavar);
		fputc(':', f);
		if (o->choices) {
			fputc('(', f);
			choices_words(f, o->choices);
			fputc(')', f);
		} else if (is_dir(o)) {
			fputs("_files -/", f);
		} else if (is_file(o)) {
			fputs("_files", f);
		} else {
			fputc(' ', f);
		}
	}
	fputc('\'', f);
}

static void zsh(FILE *f, const struct cli_rowset *set)
{
	fprintf(f,
		"#compdef %s\n# zsh completion for %s (generated by %s --print-completion zsh)\n"
		"_arguments -S",
		set->cmd, set->cmd, set->cmd);
	for (const struct cli_opt *o = set->rows; o < set->rows + set->n; o++)
		if (shown(o, set->prog))
			each_spelling(o, put_zsh, f, (void *)o);
	fprintf(f, "%s\n", set->zsh_tail);
}

static void put_tcsh_next(FILE *f, const char *w, void *arg)
{
	const struct cli_opt *o = arg;

	if (o->choices) {
		fprintf(f, " \\\n\t'n/%s/(", w);
		choices_words(f, o->choices);
		fputs(")/'", f);
	} else {
		fprintf(f, " \\\n\t'n/%s/%c/'", w, is_dir(o) ? 'd' : 'f');
	}
}

static void put_tcsh_word(FILE *f, const char *w, void *arg)
{
	if (w[1] == '-')
		put_word(f, w + 2, arg);
}

static void tcsh(FILE *f, const struct cli_rowset *set)
{
	bool any = false;

	fprintf(f,
		"# tcsh completion for %s (generated by %s --print-completion tcsh)\n"
		"complete %s 'c/--/(",
		set->cmd, set->cmd, set->cmd);
	for (const struct cli_opt *o = set->rows; o < set->rows + set->n; o++)
		if (shown(o, set->prog))
			each_spelling(o, put_tcsh_word, f, &any);
	fputs(")/'", f);
	for (const struct cli_opt *o = set->rows; o < set->rows + set->n; o++)
		if (shown(o, set->prog) && (o->choices || is_dir(o) || is_file(o)))
			each_spelling(o, put_tcsh_next, f, (void *)o);
	fputs(" \\\n\t'p/*/f/'\n", f);
}

/* crun's and crun-agent's rows: the option table. */
static struct cli_rowset table_rows(enum cli_prog prog)
{
	return (struct cli_rowset){
	    .prog = prog,
	    .cmd = prog == CLI_AGENT ? "crun-agent" : "crun",
	    .rows = cli_opts,
	    .n = OPT__MAX,
	    .zsh_tail = " \\\n\t'1:training script:_files' \\\n"
			"\t'*::training script arguments:_normal'",
	};
}

char *cli_completion_new(enum cli_prog prog, const char *shell)
{
	struct cli_rowset set = table_rows(prog);

	return cli_rows_completion_new(&set, shell);
}

char *cli_rows_completion_new(const struct cli_rowset *set, const char *shell)
{
	static const struct {
		const char *name;
		void (*fn)(FILE *f, const struct cli_rowset *set);
	} shells[] = {{"bash", bash}, {"zsh", zsh}, {"tcsh", tcsh}};
	char *s = NULL;
	size_t len = 0;
	FILE *f;

	for (size_t i = 0; i < ARRAY_SIZE(shells); i++) {
		if (strcmp(shell, shells[i].name) != 0)
			continue;
		f = open_memstream(&s, &len);
		if (!f)
			return NULL;
		shells[i].fn(f, set);
		if (fclose(f) != 0) {
			free(s);
			return NULL;
		}
		return s;
	}
	return NULL;
}

/* ---- JSON schema ------------------------------------------------------------------ */

static cJSON *leaf_schema(const struct cli_opt *o)
{
	cJSON *s = cJSON_CreateObject(), *t;

	if (!s)
		return NULL;
	switch (o->type) {
	case CT_FLAG:
		cJSON_AddStringToObject(s, "type", "boolean");
		break;
	case CT_INT:
		cJSON_AddStringToObject(s, "type", "integer");
		cJSON_AddNumberToObject(s, "minimum", (double)o->min);
		cJSON_AddNumberToObject(s, "maximum", (double)o->max);
		break;
	case CT_SECS:
		cJSON_AddStringToObject(s, "type", "number");
		cJSON_AddNumberToObject(s, "minimum", 0);
		break;
	case CT_LIST:
		t = cJSON_AddArrayToObject(s, "type");
		cJSON_AddItemToArray(t, cJSON_CreateString("string"));
		cJSON_AddItemToArray(t, cJSON_CreateString("array"));
		cJSON_AddItemToObject(s, "items", cJSON_Parse("{\"type\": \"string\"}"));
		break;
	case CT_ARGV:
		cJSON_AddStringToObject(s, "type", "array");
		cJSON_AddItemToObject(s, "items", cJSON_Parse("{\"type\": \"string\"}"));
		break;
	case CT_ENV:
		cJSON_AddStringToObject(s, "type", "object");
		cJSON_AddItemToObject(s, "additionalProperties",
				      cJSON_Parse("{\"type\": \"string\"}"));
		break;
	default:
		if (o->flags & CF_NUMOK) {
			t = cJSON_AddArrayToObject(s, "type");
			cJSON_AddItemToArray(t, cJSON_CreateString("string"));
			cJSON_AddItemToArray(t, cJSON_CreateString("integer"));
		} else {
			cJSON_AddStringToObject(s, "type", "string");
		}
		break;
	}
	if (o->choices) {
		t = cJSON_AddArrayToObject(s, "enum");
		for (const char *p = o->choices; *p;) {
			size_t n = strcspn(p, "|");
			char w[64];

			snprintf(w, sizeof(w), "%.*s", (int)n, p);
			cJSON_AddItemToArray(t, cJSON_CreateString(w));
			p += n;
			if (*p == '|')
				p++;
		}
	}
	cJSON_AddStringToObject(s, "description", o->help);
	if (o->name) {
		char flag[72];

		snprintf(flag, sizeof(flag), "--%s", o->name);
		cJSON_AddStringToObject(s, "x-crun-flag", flag);
	}
	if (o->def)
		cJSON_AddStringToObject(s, "x-crun-default", o->def);
	return s;
}

static cJSON *new_object_schema(void)
{
	cJSON *s = cJSON_CreateObject();

	cJSON_AddStringToObject(s, "type", "object");
	cJSON_AddBoolToObject(s, "additionalProperties", 0);
	/* "$comment" keys (ignored by crun-agent) let JSON configs carry comments. */
	cJSON_AddItemToObject(cJSON_AddObjectToObject(s, "properties"), "$comment",
			      cJSON_Parse("{\"type\": \"string\"}"));
	return s;
}

char *cli_schema_new(void)
{
	struct cli_rowset set = table_rows(CLI_AGENT);

	return cli_rows_schema_new(&set);
}

char *cli_rows_schema_new(const struct cli_rowset *set)
{
	cJSON *root = cJSON_CreateObject(), *body = new_object_schema();
	char id[128], title[128];
	char *out;

	if (!root || !body) {
		cJSON_Delete(root);
		cJSON_Delete(body);
		return NULL;
	}
	cJSON_AddStringToObject(root, "$schema", "https://json-schema.org/draft/2020-12/schema");
	snprintf(id, sizeof(id), "https://crun.invalid/%s.schema.json", set->cmd);
	snprintf(title, sizeof(title), "%s --config (generated by %s --print-schema)", set->cmd,
		 set->cmd);
	cJSON_AddStringToObject(root, "$id", id);
	cJSON_AddStringToObject(root, "title", title);
	for (cJSON *it = body->child; it;) { /* keep $schema first, then the body */
		cJSON *next = it->next;

		cJSON_AddItemToObject(root, it->string, cJSON_DetachItemViaPointer(body, it));
		it = next;
	}
	cJSON_Delete(body);
	for (const struct cli_opt *o = set->rows; o < set->rows + set->n; o++) {
		cJSON *obj = root;
		char path[128], *part, *save = NULL, *next;

		if (!o->json)
			continue;
		snprintf(path, sizeof(path), "%s", o->json);
		for (part = strtok_r(path, ".", &save); part; part = next) {
			cJSON *props = cJSON_GetObjectItemCaseSensitive(obj, "properties");
			cJSON *child = cJSON_GetObjectItemCaseSensitive(props, part);

			next = strtok_r(NULL, ".", &save);
			if (!next) {
				cJSON_AddItemToObject(props, part, leaf_schema(o));
				break;
			}
			if (!child) {
				child = new_object_schema();
				cJSON_AddItemToObject(props, part, child);
			}
			obj = child;
		}
	}
	out = cJSON_Print(root);
	cJSON_Delete(root);
	return out;
}

char *cli_resolved_json(const struct cli *c)
{
	cJSON *root = cJSON_CreateObject(), *argv;
	char *out;

	if (!root)
		return NULL;
	for (int k = 0; c->resolved && k < OPT__MAX; k++) {
		const struct cli_opt *o = &cli_opts[k];

		if (c->resolved[k] && o->type != CT_ACTION && o->type != CT_ARGV &&
		    o->type != CT_ENV)
			cJSON_AddStringToObject(root, o->json ? o->json : o->name, c->resolved[k]);
	}
	argv = cJSON_AddArrayToObject(root, "argv");
	for (int i = 0; argv && c->argv && c->argv[i]; i++)
		cJSON_AddItemToArray(argv, cJSON_CreateString(c->argv[i]));
	out = cJSON_Print(root);
	cJSON_Delete(root);
	return out;
}
