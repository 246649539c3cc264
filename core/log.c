/*
 * log.c - rank-tagged log lines, serialised by one mutex so lines from
 * loader threads never interleave.
 */
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int log_rank;
static int log_all_ranks;
static int log_stderr_only;
static enum dt_log_level log_level = DT_LOG_LEVEL_INFO;
static FILE *log_file;
static int log_file_failed; /* a write to log_file failed (said once) */

void dt_log_set_rank(int rank) { log_rank = rank; }
int dt_log_rank(void) { return log_rank; }
void dt_log_set_level(enum dt_log_level level) { log_level = level; }
enum dt_log_level dt_log_get_level(void) { return log_level; }
void dt_log_set_all_ranks(int on) { log_all_ranks = on; }
void dt_log_set_stderr_only(int on) { log_stderr_only = on; }

void dt_log_set_file(FILE *fp)
{
    pthread_mutex_lock(&log_mu);
    log_file = fp;
    log_file_failed = 0;
    pthread_mutex_unlock(&log_mu);
}

int dt_log_parse_level(const char *s)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int dt_log_init_from_env(void)
{
    const char *env = getenv("DTRAIN_LOG");
    if (!env || !*env)
        return 0;
    int lv = dt_log_parse_level(env);
    if (lv < 0)
        return -1;
    log_level = (enum dt_log_level)lv;
    return 0;
}

/* A line into the log file. A failed write (a full disk) is said once on
 * stderr, and the lines still reach the terminal; writing goes on, so the
 * file picks up again once there is room. */
static void file_line(const char *head, const char *msg)
{
    time_t now = time(NULL);
    struct tm tmv;
    char ts[32];
    localtime_r(&now, &tmv);
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tmv);
    int bad = fprintf(log_file, "%s %s%s\n", ts, head, msg) < 0;
    bad |= fflush(log_file) != 0;
    if (!bad) return;
    int err = errno;
    clearerr(log_file);
    if (!log_file_failed)
        fprintf(stderr,
                "[dtrain r%d] warn: cannot write the log file: %s; the log goes on on the "
                "terminal, and lines are missing from the file\n",
                log_rank, strerror(err));
    log_file_failed = 1;
}

void dt_log_file_only(const char *subsys, const char *fmt, ...)
{
    if (DT_LOG_LEVEL_INFO > log_level || (log_rank != 0 && !log_all_ranks))
        return;
    char msg[4096], head[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(head, sizeof head, "[dtrain r%d] ", log_rank);
    pthread_mutex_lock(&log_mu);
    if (log_file)
        file_line(head, msg);
    pthread_mutex_unlock(&log_mu);
}

void dt_log_write(enum dt_log_level level, const char *subsys, const char *fmt, ...)
{
    static const char *const tags[] = {"error", "warn", "", ""};
    if (level > log_level)
        return;
    if (level >= DT_LOG_LEVEL_INFO && log_rank != 0 && !log_all_ranks)
        return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    FILE *out = level <= DT_LOG_LEVEL_WARN || log_stderr_only ? stderr : stdout;
    char head[96];
    if (level <= DT_LOG_LEVEL_WARN)
        snprintf(head, sizeof head, "[dtrain r%d] %s: ", log_rank, tags[level]);
    else if (level == DT_LOG_LEVEL_DEBUG)
        snprintf(head, sizeof head, "[dtrain r%d] debug %s: ", log_rank, subsys ? subsys : "");
    else
        snprintf(head, sizeof head, "[dtrain r%d] ", log_rank);

    pthread_mutex_lock(&log_mu);
    fprintf(out, "%s%s\n", head, msg);
    fflush(out);
    if (log_file)
        file_line(head, msg);
    pthread_mutex_unlock(&log_mu);
}
