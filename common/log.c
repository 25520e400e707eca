/* log.c: levelled, subsystem-masked logging to stderr or a host's handler.
 * Lines look like "crun[1234] W dropping client ..." (E W N I D T: error, warn,
 * notice, info, debug, trace). The level and mask
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

/* One row per level: its letter, its syslog priority (journald), the
 * public level a host's handler sees, and the names that select it. */
static const struct level_row {
	char letter;
	int priority;
	crun_log_level_t pub;
	const char *names[3];
} levels[LL__MAX] = {
    [LL_ERROR] = {'E', 3, CRUN_LOG_ERROR, {"error", "critical", "fatal"}},
    [LL_WARN] = {'W', 4, CRUN_LOG_WARN, {"warning", "warn"}},
    [LL_NOTICE] = {'N', 5, CRUN_LOG_INFO, {"notice"}},
    [LL_INFO] = {'I', 6, CRUN_LOG_INFO, {"info"}},
    [LL_DEBUG] = {'D', 7, CRUN_LOG_DEBUG, {"debug"}},
    [LL_TRACE] = {'T', 7, CRUN_LOG_TRACE, {"trace"}},
};

int log_level_from_name(const char *s)
{
	for (int l = 0; l < LL__MAX; l++)
		for (size_t i = 0; i < ARRAY_SIZE(levels[l].names) && levels[l].names[i]; i++)
			if (!strcasecmp(s, levels[l].names[i]))
				return l;
	return -1;
}

static int clamp_level(int level)
{
	return level < LL_ERROR ? LL_ERROR : level >= LL__MAX ? LL_TRACE : level;
}

void log_set_level(int level)
{
	log_max_level = clamp_level(level);
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
	log_max_level =
	    lvl && log_level_from_name(lvl) >= 0 ? log_level_from_name(lvl) : default_level;
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
	/* The most verbose internal level a public one covers: INFO takes NOTICE. */
	for (int l = LL__MAX - 1; l >= 0; l--)
		if (levels[l].pub <= level) {
			log_max_level = l;
			return;
		}
	log_max_level = LL_ERROR;
}

void log_emit(int level, unsigned sub, const char *file, int line, const char *fmt, ...)
{
	const struct level_row *lv;
	char msg[2048];
	va_list ap;
	int n;

	(void)sub;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	lv = &levels[clamp_level(level)];
	if (log_handler) {
		log_handler(lv->pub, msg, log_handler_arg);
		return;
	}
	if (log_journal)
		n = fprintf(stderr, "<%d>%s: %s\n", lv->priority, log_prog, msg);
	else if (level >= LL_DEBUG)
		n = fprintf(stderr, "%s[%d] %c %s:%d: %s\n", log_prog, (int)getpid(), lv->letter,
			    file, line, msg);
	else
		n = fprintf(stderr, "%s[%d] %c %s\n", log_prog, (int)getpid(), lv->letter, msg);
	(void)n;
}
