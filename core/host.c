/*
 * host.c - CPU counts, a rank's threads, and whether stdout is a
 * terminal (see host.h); asked of the system each time, never kept.
 */
#define _GNU_SOURCE
#include "host.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dt_cpu_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* A path /proc shows for a terminal: a pseudo-terminal or a console. */
static int is_terminal_path(const char *p)
{
    return strncmp(p, "/dev/pts/", 9) == 0 || strncmp(p, "/dev/tty", 8) == 0 ||
           strncmp(p, "/dev/console", 12) == 0;
}

int dt_stdout_is_terminal(void)
{
    if (!isatty(STDOUT_FILENO))
        return 0;
    if (!getenv("OMPI_COMM_WORLD_SIZE"))
        return 1;
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/%ld/fd/1", (long)getppid());
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0)
        return 0;
    target[n] = '\0';
    return is_terminal_path(target);
}

/* SLURM_CPUS_PER_TASK, or 0 when it is unset or not a positive count. */
static int slurm_cpus_per_task(void)
{
    const char *v = getenv("SLURM_CPUS_PER_TASK");
    char *end;
    if (!v || !*v)
        return 0;
    long n = strtol(v, &end, 10);
    return *end == '\0' && n > 0 && n <= INT_MAX ? (int)n : 0;
}

int dt_rank_threads(long job_threads, int local_size)
{
    if (job_threads > 0)
        return job_threads < INT_MAX ? (int)job_threads : INT_MAX;
    int aff = dt_cpu_count();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0 && aff < online)
        return aff;
    int slurm = slurm_cpus_per_task();
    if (slurm > 0)
        return slurm < aff ? slurm : aff;
    int per = aff / (local_size > 0 ? local_size : 1);
    return per > 0 ? per : 1;
}
