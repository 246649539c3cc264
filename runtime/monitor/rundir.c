/*
 * rundir.c - claiming a run directory: the marker that says it is
 * dtrain's, and the lock that keeps a second run out (see rundir.h).
 */
#define _GNU_SOURCE
#include "rundir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/files.h"

#define DT_RUNDIR_PATH (4096 + 64)
#define MARKER_TEXT "dtrain run directory\n"
#define HELD_BY "held by "
#define MARKER_READ 1024
#define HOLDER_POLLS 40 /* waits for the holder's line: 40 x 25 ms */
#define HOLDER_POLL_NS 25000000L
#define LEGACY_FILE "metrics.jsonl"
#define LEGACY_HEAD 512

struct dt_rundir {
    int fd;
};

/* Whether dir has any entry besides . and .. (-1: cannot be read). */
static int has_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int any = 0;
    if (!d)
        return -1;
    while (!any && (de = readdir(d)) != NULL)
        any = strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return any;
}

/* A run directory written before the marker existed: its metrics.jsonl
 * opens with dtrain's start record. */
static int legacy_run(const char *dir)
{
    char path[DT_RUNDIR_PATH], head[LEGACY_HEAD + 1];
    int fd;
    snprintf(path, sizeof path, "%s/%s", dir, LEGACY_FILE);
    if (dt_input_open(path, "metrics", &fd, NULL) != DT_OK) {
        dt_clear_error(); /* no such file: not a legacy run directory */
        return 0;
    }
    ssize_t n = read(fd, head, LEGACY_HEAD);
    close(fd);
    if (n <= 0)
        return 0;
    head[n] = '\0';
    head[strcspn(head, "\n")] = '\0';
    return strncmp(head, "{\"time\":", 8) == 0 && strstr(head, "\"type\":\"start\"") != NULL &&
           strstr(head, "\"version\":") != NULL;
}

/* The "pid P on host H since T" the holder wrote, or a placeholder. A
 * holder that has just taken the lock writes it a moment later, so the
 * line is waited for a little. */
static void holder_of(int fd, char *out, size_t len)
{
    char text[MARKER_READ + 1];
    const struct timespec nap = {0, HOLDER_POLL_NS};
    snprintf(out, len, "its PID and host are not recorded");
    for (int tries = 0; tries < HOLDER_POLLS; tries++, nanosleep(&nap, NULL)) {
        ssize_t n = pread(fd, text, MARKER_READ, 0);
        if (n <= 0)
            continue;
        text[n] = '\0';
        char *p = strstr(text, HELD_BY);
        if (!p || !strchr(p, '\n'))
            continue;
        p += strlen(HELD_BY);
        p[strcspn(p, "\n")] = '\0';
        snprintf(out, len, "%s", p);
        return;
    }
}

/* Rewrites the marker: what it is, and who holds it now. */
static dt_status write_holder(int fd, const char *marker)
{
    char host[256] = "unknown", when[64] = "", text[512];
    time_t now = time(NULL);
    struct tm tm;
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    if (localtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S%z", &tm);
    int n =
        snprintf(text, sizeof text, MARKER_TEXT HELD_BY "pid %ld on host %s since %s (dtrain %s)\n",
                 (long)getpid(), host, when, DT_VERSION);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        return dt_set_error(DT_ERR_IO, "cannot write the run directory marker %s: %s", marker,
                            strerror(errno));
    return DT_OK;
}

/* A write lock on the whole marker, held by this open file description. */
static int lock_marker(int fd)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    int r = fcntl(fd, F_OFD_SETLK, &fl);
    if (r != 0 && errno == EINVAL) /* a kernel without OFD locks */
        r = fcntl(fd, F_SETLK, &fl);
    return r;
}

/* The directory is dtrain's, or may become so. */
static dt_status check_owner(const char *dir, const char *marker, int adopt)
{
    struct stat sb;
    if (lstat(marker, &sb) == 0 || errno != ENOENT)
        return DT_OK; /* marked (anything odd about it shows when it is opened) */
    int any = has_entries(dir);
    if (any < 0)
        return dt_set_error(DT_ERR_IO, "output.dir %s: cannot list it: %s", dir, strerror(errno));
    if (!any || adopt || legacy_run(dir))
        return DT_OK;
    /* a run starting beside this one may have made its marker since the
     * first look: then the entries are its, and the lock decides */
    if (lstat(marker, &sb) == 0 || errno != ENOENT)
        return DT_OK;
    return dt_set_error(DT_ERR_USAGE,
                        "output.dir %s already exists, is not empty and is not a dtrain run "
                        "directory (it has no %s): a run would overwrite files of the same names "
                        "there (config.yaml, train.log, metrics.jsonl, model.h5, checkpoints/). "
                        "Choose another output.dir, or set output.adopt: true to use it anyway",
                        dir, DT_RUNDIR_MARKER);
}

dt_status dt_rundir_claim(const char *dir, int adopt, dt_rundir_t **out)
{
    char marker[DT_RUNDIR_PATH], holder[MARKER_READ];
    struct stat sb;
    dt_status st;
    *out = NULL;
    if (strlen(dir) + sizeof DT_RUNDIR_MARKER + 1 >= sizeof marker)
        return dt_set_error(DT_ERR_USAGE, "output.dir is too long (%zu bytes)", strlen(dir));
    snprintf(marker, sizeof marker, "%s/%s", dir, DT_RUNDIR_MARKER);
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return dt_set_error(DT_ERR_USAGE, "output.dir %s exists and is not a directory", dir);
    if ((st = dt_mkdir_p(dir)) != DT_OK)
        return dt_error_context(st, "output.dir");
    if ((st = check_owner(dir, marker, adopt)) != DT_OK)
        return st;
    int fd = open(marker, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return dt_set_error(DT_ERR_IO, "cannot open the run directory marker %s: %s", marker,
                            strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_set_error(DT_ERR_USAGE, "the run directory marker %s is not a regular file",
                            marker);
    }
    if (lock_marker(fd) != 0) {
        int e = errno;
        if (e == EAGAIN || e == EACCES) {
            holder_of(fd, holder, sizeof holder);
            close(fd);
            return dt_set_error(DT_ERR_BUSY,
                                "output.dir %s is in use by another dtrain run (%s); wait for it "
                                "to end or stop it, or choose another output.dir",
                                dir, holder);
        }
        DT_LOG_WARN("train",
                    "cannot lock the run directory %s on its file system (%s): nothing "
                    "keeps a second run out of it while this one runs",
                    dir, strerror(e));
    }
    if ((st = write_holder(fd, marker)) != DT_OK) {
        close(fd);
        return st;
    }
    struct dt_rundir *rd = malloc(sizeof *rd);
    if (!rd) {
        close(fd);
        return dt_set_error(DT_ERR_NOMEM, "out of memory claiming %s", dir);
    }
    rd->fd = fd;
    *out = rd;
    return DT_OK;
}

void dt_rundir_release(dt_rundir_t *rd)
{
    if (!rd)
        return;
    close(rd->fd);
    free(rd);
}
