/*
 * log.h - rank-tagged logging.
 *
 * Every line carries the rank ("[dtrain r0] ..."). By default only rank 0
 * prints INFO and DEBUG; WARN and ERROR print on every rank. Errors and
 * warnings go to stderr, INFO to stdout. The level comes from the job file
 * (runtime.log_level) or DTRAIN_LOG (error|warn|info|debug), the
 * environment winning. Log settings are process-global by design; a run
 * may also tee every line into a log file in its run directory.
 * Thread-safe.
 */
#ifndef DT_LOG_H
#define DT_LOG_H

#include <stdio.h>

enum dt_log_level { DT_LOG_LEVEL_ERROR = 0, DT_LOG_LEVEL_WARN, DT_LOG_LEVEL_INFO, DT_LOG_LEVEL_DEBUG };

/* Sets the rank used for tags and for the rank-0-only rule. */
void dt_log_set_rank(int rank);
int dt_log_rank(void);
void dt_log_set_level(enum dt_log_level level);
enum dt_log_level dt_log_get_level(void);
/* Every rank prints INFO when on (default off: rank 0 only). */
void dt_log_set_all_ranks(int on);
/* Every level goes to stderr when on (default off): for a command whose
 * stdout is its result alone. */
void dt_log_set_stderr_only(int on);
/* Parses "error|warn|info|debug"; returns -1 if unknown. */
int dt_log_parse_level(const char *s);
/* Applies DTRAIN_LOG if set; returns -1 if its value is unknown. */
int dt_log_init_from_env(void);
/* Also appends every printed line (all levels this rank prints) to fp; NULL stops. */
void dt_log_set_file(FILE *fp);

/* Writes an INFO line to the log file only (not the terminal), e.g. the
 * periodic progress that a terminal sees as a live bar. */
void dt_log_file_only(const char *subsys, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void dt_log_write(enum dt_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define DT_LOG_ERROR(subsys, ...) dt_log_write(DT_LOG_LEVEL_ERROR, subsys, __VA_ARGS__)
#define DT_LOG_WARN(subsys, ...) dt_log_write(DT_LOG_LEVEL_WARN, subsys, __VA_ARGS__)
#define DT_LOG_INFO(subsys, ...) dt_log_write(DT_LOG_LEVEL_INFO, subsys, __VA_ARGS__)
#define DT_LOG_DEBUG(subsys, ...) dt_log_write(DT_LOG_LEVEL_DEBUG, subsys, __VA_ARGS__)

#endif
