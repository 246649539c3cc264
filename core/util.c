/*
 * util.c - helpers with no better home; none keeps state.
 */
#define _GNU_SOURCE
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

int dt_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0)
        return 0;
    return !__builtin_mul_overflow(a, b, out);
}

int dt_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }

/* " (it is a directory)" and the like, for a path that is not a regular file */
static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return " (it is a directory)";
    if (S_ISFIFO(m))
        return " (it is a FIFO)";
    if (S_ISSOCK(m))
        return " (it is a socket)";
    if (S_ISCHR(m) || S_ISBLK(m))
        return " (it is a device)";
    return "";
}

dt_status dt_input_open(const char *path, const char *what, int *fd, int64_t *size)
{
    struct stat sb;
    *fd = -1;
    if (!path || !path[0])
        return dt_set_error(DT_ERR_NOT_FOUND, "%s: no file given (an empty path)", what);
    /* O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            return dt_set_error(DT_ERR_NOT_FOUND, "%s %s: no such file", what, path);
        if (e == EACCES || e == EPERM)
            return dt_set_error(DT_ERR_NOT_FOUND, "%s %s: cannot read it: %s", what, path,
                                strerror(e));
        /* the path cannot lead to a file (a symbolic link loop, a name too
         * long, a device that is not there): cannot be opened, as above */
        if (e == ELOOP || e == ENAMETOOLONG || e == ENXIO || e == ENODEV || e == EOVERFLOW)
            return dt_set_error(DT_ERR_NOT_FOUND, "%s %s: cannot open it: %s", what, path,
                                strerror(e));
        return dt_set_error(DT_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(e));
    }
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return dt_set_error(DT_ERR_IO, "%s %s: cannot stat: %s", what, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return dt_set_error(DT_ERR_NOT_FOUND, "%s %s: not a regular file%s", what, path,
                            file_kind(sb.st_mode));
    }
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0)
        fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    if (size)
        *size = (int64_t)sb.st_size;
    return DT_OK;
}

dt_status dt_input_check(const char *path, const char *what, int64_t *size)
{
    int fd;
    struct stat sb;
    dt_status st = dt_input_open(path, what, &fd, size);
    if (st == DT_OK)
        close(fd);
    /* HDF5 resolves a symbolic link to its full path before it opens it */
    if (st == DT_OK && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode))
        st = dt_path_fits(path, 0, what);
    return st;
}

dt_status dt_output_open(const char *path, const char *what, int append, FILE **out)
{
    struct stat sb;
    *out = NULL;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return dt_set_error(DT_ERR_IO, "cannot write %s '%s': not a regular file%s", what, path,
                            file_kind(sb.st_mode));
    int fd =
        open(path,
             O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (append ? O_APPEND : O_TRUNC),
             0666);
    if (fd < 0)
        return dt_set_error(DT_ERR_IO, "cannot open %s '%s': %s", what, path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_set_error(DT_ERR_IO, "cannot write %s '%s': not a regular file%s", what, path,
                            file_kind(sb.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *out = fdopen(fd, append ? "a" : "w");
    if (!*out) {
        int e = errno;
        close(fd);
        return dt_set_error(DT_ERR_IO, "cannot open %s '%s': %s", what, path, strerror(e));
    }
    return DT_OK;
}

int dt_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = ENOSPC;
            return 0;
        }
        p += n;
        len -= (size_t)n;
    }
    return 1;
}

/* path opened again for reading, when it is still the file open on fd
 * (opened for writing only); -1 otherwise. */
static int reopen_to_read(int fd, const char *path)
{
    struct stat a, b;
    int r = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (r >= 0 &&
        (fstat(fd, &a) != 0 || fstat(r, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
        close(r);
        errno = ESTALE;
        r = -1;
    }
    return r;
}

/* The offset just past the last newline in the first size bytes of the
 * file open on rd (0 when there is none), or -1. */
static int64_t after_last_newline(int rd, int64_t size)
{
    enum { CHUNK = 4096 };
    char buf[CHUNK];
    for (int64_t end = size; end > 0;) {
        int64_t start = end > CHUNK ? end - CHUNK : 0;
        ssize_t got = pread(rd, buf, (size_t)(end - start), (off_t)start);
        if (got != (ssize_t)(end - start)) return -1;
        char *nl = memrchr(buf, '\n', (size_t)got);
        if (nl) return start + (nl - buf) + 1;
        end = start;
    }
    return 0;
}

dt_status dt_output_end_line(FILE *f, const char *path, const char *what, int drop,
                             int64_t *partial)
{
    struct stat sb;
    char c = '\n';
    int fd = fileno(f);
    *partial = 0;
    if (fflush(f) != 0 || fstat(fd, &sb) != 0)
        return dt_set_error(DT_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(errno));
    if (sb.st_size == 0) return DT_OK;
    int rd = reopen_to_read(fd, path);
    int64_t end = rd < 0 || pread(rd, &c, 1, sb.st_size - 1) != 1 ? -1
                  : c == '\n'                                     ? sb.st_size
                  : drop ? after_last_newline(rd, sb.st_size)
                         : sb.st_size;
    int err = errno;
    if (rd >= 0) close(rd);
    if (end < 0)
        return dt_set_error(DT_ERR_IO, "cannot read %s '%s' back: %s", what, path, strerror(err));
    if (c == '\n') return DT_OK;
    if (!drop) {
        if (fputc('\n', f) == EOF || fflush(f) != 0)
            return dt_set_error(DT_ERR_IO, "cannot write %s '%s': %s", what, path, strerror(errno));
        *partial = 1;
        return DT_OK;
    }
    if (ftruncate(fd, (off_t)end) != 0)
        return dt_set_error(DT_ERR_IO, "cannot remove the incomplete last line of %s '%s': %s",
                            what, path, strerror(errno));
    *partial = (int64_t)sb.st_size - end;
    return DT_OK;
}

dt_status dt_path_fits(const char *path, size_t extra, const char *what)
{
    char cwd[PATH_MAX];
    size_t len = strlen(path), base = 0;
    if (path[0] != '/') {
        if (!getcwd(cwd, sizeof cwd)) {
            int e = errno;
            if (e == ERANGE || e == ENAMETOOLONG)
                return dt_set_error(DT_ERR_USAGE,
                                    "%s '%.200s' is relative, but the current directory's path is "
                                    "longer than the system's limit of %d bytes, so the full "
                                    "path that HDF5 and MPI-IO need cannot be made: give an "
                                    "absolute path, or start dtrain in a directory with a "
                                    "shorter path",
                                    what, path, PATH_MAX - 1);
            return dt_set_error(DT_ERR_NOT_FOUND,
                                "%s '%.200s' is relative, but the current directory cannot be "
                                "found (%s): give an absolute path, or start dtrain in a "
                                "directory that exists",
                                what, path, strerror(e));
        }
        base = strlen(cwd) + 1;
    }
    if (base + len + extra < PATH_MAX) return DT_OK;
    if (extra)
        return dt_set_error(DT_ERR_USAGE,
                            "%s '%.200s%s': its full path is %zu bytes and the files dtrain "
                            "writes in it add up to %zu more, beyond the system's limit of %d "
                            "bytes for a path: use a shorter one",
                            what, path, len > 200 ? "..." : "", base + len, extra, PATH_MAX - 1);
    return dt_set_error(DT_ERR_USAGE,
                        "%s '%.200s%s': its full path is %zu bytes, beyond the system's limit "
                        "of %d bytes for a path: use a shorter one",
                        what, path, len > 200 ? "..." : "", base + len, PATH_MAX - 1);
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

void dt_format_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (b == UINT64_MAX) {
        snprintf(buf, len, "more than 16 EiB");
        return;
    }
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    int decimals = u == 0 || v >= 100 ? 0 : v >= 10 ? 1 : 2;
    snprintf(buf, len, "%.*f %s", decimals, v, unit[u]);
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
