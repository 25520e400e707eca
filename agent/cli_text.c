/* cli_text.c: what the option table prints: --help, the man page, shell
 * completion scripts (bash, zsh, tcsh, as torchrun's --print-completion) and
 * the JSON schema of crun-agent's config. Everything is derived from
 * cli_opts[], so a new row shows up in all of them at once; the row printers
 * are service/'s (cli_print.c ...), which crun-rdzvd's and crunctl's rows
 * share. What is crun's own stays here: the sections, the environment and
 * the texts no row holds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent/cli.h"
#include "agent/cli_int.h"
#include "common/common.h"
#include "store/server.h"

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
	return cli_row_shown(o, prog) && (o->flags & CF_TORCHRUN);
}

static bool pick_crun(const struct cli_opt *o, enum cli_prog prog)
{
	return cli_row_shown(o, prog) && !(o->flags & CF_TORCHRUN);
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
		cli_spellings(o, head, sizeof(head));
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

/* ---- JSON schema ------------------------------------------------------------------ */

char *cli_schema_new(void)
{
	struct cli_rowset set = table_rows(CLI_AGENT);

	return cli_rows_schema_new(&set);
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
