/* log.c: levelled, subsystem-masked logging to stderr or a host's handler.
 * Lines look like "crun[1234] W store: dropping client ...". The level and mask
 * are set once at start-up; log_at checks them before formatting anything.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

int log_max_level = LL_WARN;
unsigned log_subsys_mask = SUB_ALL;

/* Set once before threads start (crun_set_log_handler / log_init). */
static crun_log_fn log_handler;
static void *log_handler_arg;
static char log_prog[32] = "crun";
/* Set by log_init when stderr is the journal (JOURNAL_STREAM matches it):
 * lines then start with a syslog "<N>" priority and carry no pid. */
static bool log_journal;

static const char *const level_letter = "EWIDT";

static int level_from_name(const char *s, int fallback)
{
	static const char *const names[] = {"error", "warn", "info", "debug", "trace"};

	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (!strcasecmp(s, names[i]))
			return (int)i;
	if (!strcasecmp(s, "warning"))
		return LL_WARN;
	return fallback;
}

static unsigned subsys_from_list(const char *s)
{
	static const struct {
		const char *name;
		unsigned bit;
	} map[] = {{"agent", SUB_AGENT}, {"rdzv", SUB_RDZV}, {"store", SUB_STORE}, {"pg", SUB_PG},
		   {"cuda", SUB_CUDA},	 {"cmd", SUB_CMD},   {"all", SUB_ALL}};
	unsigned mask = 0;
	const char *p = s;

	while (*p) {
		size_t n = strcspn(p, ",");

		for (size_t i = 0; i < ARRAY_SIZE(map); i++)
			if (strlen(map[i].name) == n && !strncasecmp(p, map[i].name, n))
				mask |= map[i].bit;
		p += n;
		if (*p == ',')
			p++;
	}
	return mask ? mask : SUB_ALL;
}

void log_init(const char *prog, int default_level)
{
	const char *lvl = getenv("CRUN_LOG_LEVEL");
	const char *sub = getenv("CRUN_LOG_SUBSYS");

	if (prog)
		snprintf(log_prog, sizeof(log_prog), "%s", prog);
	log_max_level = lvl ? level_from_name(lvl, default_level) : default_level;
	log_subsys_mask = sub ? subsys_from_list(sub) : SUB_ALL;
	log_journal = log_stderr_is_journal(getenv("JOURNAL_STREAM"));
}

bool log_stderr_is_journal(const char *journal_stream)
{
	unsigned long long dev, ino;
	struct stat st;

	/* systemd.exec(5): "<device>:<inode>" of the stream it connected; a child
	 * whose stderr was redirected elsewhere inherits the variable, so compare. */
	if (!journal_stream || sscanf(journal_stream, "%llu:%llu", &dev, &ino) != 2)
		return false;
	return fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
	       (unsigned long long)st.st_ino == ino;
}

CRUN_API void crun_set_log_handler(crun_log_fn fn, void *arg)
{
	log_handler = fn;
	log_handler_arg = arg;
}

CRUN_API void crun_set_log_level(crun_log_level_t level)
{
	log_max_level = (int)level;
}

void log_emit(int level, unsigned sub, const char *file, int line, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	int n;

	(void)sub;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (log_handler) {
		log_handler((crun_log_level_t)level, msg, log_handler_arg);
		return;
	}
	if (log_journal) /* syslog priorities: err 3, warning 4, info 6, debug 7 */
		n = fprintf(stderr, "<%d>%s: %s\n",
			    level <= LL_ERROR  ? 3
			    : level == LL_WARN ? 4
			    : level == LL_INFO ? 6
					       : 7,
			    log_prog, msg);
	else if (level >= LL_DEBUG)
		n = fprintf(stderr, "%s[%d] %c %s:%d: %s\n", log_prog, (int)getpid(),
			    level_letter[level < 5 ? level : 4], file, line, msg);
	else
		n = fprintf(stderr, "%s[%d] %c %s\n", log_prog, (int)getpid(),
			    level_letter[level < 5 ? level : 4], msg);
	(void)n;
}
