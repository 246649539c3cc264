/*
 * util.c - helpers with no better home; none keeps state.
 */
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

double dt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

dt_status dt_mkdir_p(const char *path)
{
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf)
        return dt_set_error(DT_ERR_INVALID_ARG, "directory path '%s' is empty or too long", path);
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return dt_set_error(DT_ERR_IO, "cannot create directory '%s': %s", buf,
                                strerror(errno));
        buf[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_set_error(DT_ERR_IO, "'%s' exists and is not a directory", path);
    return DT_OK;
}

dt_status dt_malloc(size_t bytes, const char *what, void **out)
{
    *out = malloc(bytes ? bytes : 1);
    if (!*out)
        return dt_set_error(DT_ERR_NOMEM, "out of host memory allocating %zu bytes for %s", bytes,
                            what);
    return DT_OK;
}

dt_status dt_calloc(size_t n, size_t size, const char *what, void **out)
{
    *out = calloc(n ? n : 1, size ? size : 1);
    if (!*out)
        return dt_set_error(DT_ERR_NOMEM, "out of host memory allocating %zu x %zu bytes for %s",
                            n, size, what);
    return DT_OK;
}

int dt_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (lb > 255)
        lb = 255;
    int row[256];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

void dt_format_duration(double s, char *buf, size_t len)
{
    if (s < 0 || s != s)
        s = 0;
    if (s < 60) {
        snprintf(buf, len, "%.1fs", s);
        return;
    }
    long t = (long)(s + 0.5);
    if (t < 3600)
        snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, len, "%ldh%02ldm%02lds", t / 3600, (t / 60) % 60, t % 60);
}
