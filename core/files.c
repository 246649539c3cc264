/*
 * files.c - opening inputs and outputs safely, writing all of a buffer,
 * keeping files of lines whole, checking path lengths, making directories
 * (see files.h). Nothing here keeps state.
 */
#define _GNU_SOURCE
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
