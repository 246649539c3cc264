/*
 * outfile.c - reserving, syncing and committing the files dtrain writes
 * (see outfile.h).
 *
 * Why reserve: HDF5 1.10 cannot recover from a write that fails half way
 * (serially the file is left half-closed; with MPI-IO the ranks hang in
 * H5Fclose or crash in MPI_Finalize, and may even report lost writes as
 * done), and its serial driver reports a short write as a long line of
 * its own. Blocks reserved past the end of the empty file (the size stays
 * 0, so HDF5 sees the file it expects) move the failure to one system call
 * whose errno is known. File systems without fallocate get a free-space
 * check instead; a file-size limit is compared before, because
 * fallocate(KEEP_SIZE) does not enforce it.
 */
#define _GNU_SOURCE
#include "outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/files.h"
#include "core/text.h"

#define HDF5_HEADER_BYTES 8192 /* superblock, root group, heaps */
#define HDF5_OBJECT_BYTES 1024 /* one object header, its links, a chunk index entry */
#define OUT_PATH 4352          /* a directory (PATH_MAX) plus a file name */
#define TMP_INFIX ".tmp."      /* "<final>.tmp.<host>.<pid>" */
#define HOST_LEN 256
#define PID_DIGITS 10 /* a pid_t in decimal */

uint64_t dt_outfile_hdf5_estimate(uint64_t data_bytes, uint64_t objects, uint64_t attr_bytes)
{
    return HDF5_HEADER_BYTES + HDF5_OBJECT_BYTES * objects + attr_bytes + data_bytes;
}

/* The directory holding path ("." for a bare name). */
static void dir_of(const char *path, char *buf, size_t len)
{
    char tmp[OUT_PATH];
    snprintf(tmp, sizeof tmp, "%s", path);
    snprintf(buf, len, "%s", dirname(tmp));
}

void dt_outfile_free_text(const char *path, char *buf, size_t len)
{
    char dir[OUT_PATH], size[32];
    struct statvfs v;
    if (len) buf[0] = '\0';
    dir_of(path, dir, sizeof dir);
    if (statvfs(dir, &v) != 0)
        return;
    dt_format_bytes((uint64_t)v.f_bavail * v.f_frsize, size, sizeof size);
    snprintf(buf, len, "; %s free on its file system", size);
}

/* The process's file-size limit in bytes, or 0 when there is none. */
static uint64_t fsize_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
    return (uint64_t)rl.rlim_cur;
}

void dt_outfile_reason(int err, const char *path, char *buf, size_t len)
{
    char limit[96] = "", free_[96], size[32];
    uint64_t lim = fsize_limit();
    if (err == EFBIG && lim) {
        dt_format_bytes(lim, size, sizeof size);
        snprintf(limit, sizeof limit, " (the file-size limit, ulimit -f, is %s)", size);
    }
    dt_outfile_free_text(path, free_, sizeof free_);
    snprintf(buf, len, "%s%s%s", strerror(err), limit, free_);
}

dt_status dt_outfile_check_limit(const char *what, const char *path, uint64_t bytes)
{
    char reason[256], size[32];
    uint64_t lim = fsize_limit();
    if (!lim || lim >= bytes)
        return DT_OK;
    dt_format_bytes(bytes, size, sizeof size);
    dt_outfile_reason(EFBIG, path, reason, sizeof reason);
    return dt_set_error(DT_ERR_IO, "%s %s: needs about %s: %s", what, path, size, reason);
}

dt_status dt_outfile_reserve(const char *what, const char *path, uint64_t bytes)
{
    char reason[256], size[32];
    struct statvfs v;
    dt_status st = dt_outfile_check_limit(what, path, bytes);
    if (st != DT_OK) return st;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    int rc = fd < 0 ? -1 : fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes);
    int err = errno;
    if (rc != 0 && fd >= 0 && (err == EOPNOTSUPP || err == ENOSYS)) {
        rc = statvfs(path, &v) != 0 || (uint64_t)v.f_bavail * v.f_frsize >= bytes ? 0 : -1;
        err = ENOSPC;
    }
    if (rc != 0 && fd >= 0) /* give back what a failed fallocate kept */
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes);
    if (fd >= 0)
        close(fd);
    if (rc == 0)
        return DT_OK;
    dt_format_bytes(bytes, size, sizeof size);
    dt_outfile_reason(err, path, reason, sizeof reason);
    return dt_set_error(DT_ERR_IO, "%s %s: cannot reserve %s for it: %s", what, path, size, reason);
}

void dt_outfile_release(const char *path, uint64_t bytes)
{
    struct stat sb;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_size < bytes)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, sb.st_size,
                  (off_t)bytes - sb.st_size);
    if (fd >= 0) close(fd);
}

/* fsync of path (a directory when is_dir); messages name `file`, the file
 * being written, and path when that is its directory. */
static dt_status sync_one(const char *what, const char *file, const char *path, int is_dir)
{
    char reason[256];
    int fd = open(path, O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    int ok = fd >= 0 && fsync(fd) == 0;
    int err = errno;
    /* some file systems cannot sync a directory; that is no failure */
    if (!ok && fd >= 0 && is_dir && (err == EINVAL || err == EROFS || err == EBADF)) ok = 1;
    if (fd >= 0) close(fd);
    if (ok) return DT_OK;
    dt_outfile_reason(err, path, reason, sizeof reason);
    if (is_dir)
        return dt_set_error(DT_ERR_IO, "%s %s: cannot sync its directory %s: %s", what, file, path,
                            reason);
    return dt_set_error(DT_ERR_IO, "%s %s: cannot sync: %s", what, file, reason);
}

dt_status dt_outfile_sync(const char *what, const char *path)
{
    return sync_one(what, path, path, 0);
}

dt_status dt_outfile_sync_dir(const char *what, const char *path)
{
    char dir[OUT_PATH];
    dir_of(path, dir, sizeof dir);
    return sync_one(what, path, dir, 1);
}

dt_status dt_outfile_commit(const char *what, const char *tmp, const char *final)
{
    char reason[256];
    dt_status st = dt_outfile_sync(what, tmp);
    if (st != DT_OK) return st;
    if (rename(tmp, final) != 0) {
        dt_outfile_reason(errno, final, reason, sizeof reason);
        return dt_set_error(DT_ERR_IO, "%s %s: cannot rename %s into place: %s", what, final, tmp,
                            reason);
    }
    return dt_outfile_sync_dir(what, final);
}

int dt_outfile_rename_new(const char *from, const char *to)
{
    struct stat sb;
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -1;
    if (link(from, to) == 0) { /* a file: a hard link never replaces either */
        unlink(from);
        return 0;
    }
    if (errno == EEXIST) return -1;
    if (lstat(to, &sb) == 0) { /* a directory, on a file system without links */
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}

dt_status dt_outfile_commit_new(const char *what, const char *tmp, const char *final)
{
    char reason[256];
    dt_status st = dt_outfile_sync(what, tmp);
    if (st != DT_OK) return st;
    if (dt_outfile_rename_new(tmp, final) != 0) {
        int err = errno;
        if (err == EEXIST)
            return dt_set_error(DT_ERR_IO,
                                "%s %s: another file of that name appeared while it was "
                                "written; it was left as it is and %s not committed",
                                what, final, tmp);
        dt_outfile_reason(err, final, reason, sizeof reason);
        return dt_set_error(DT_ERR_IO, "%s %s: cannot rename %s into place: %s", what, final, tmp,
                            reason);
    }
    return dt_outfile_sync_dir(what, final);
}

dt_status dt_outfile_write_small(const char *what, const char *tmp, const char *path,
                                 const void *data, size_t len)
{
    char reason[256];
    unlink(tmp); /* stale, and never followed if it is a symlink */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    int ok = fd >= 0 && dt_write_all(fd, data, len);
    int err = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    dt_status st = DT_OK;
    if (!ok) {
        dt_outfile_reason(err, tmp, reason, sizeof reason);
        st = dt_set_error(DT_ERR_IO, "%s %s: cannot write %s: %s", what, path, tmp, reason);
    }
    if (st == DT_OK) st = dt_outfile_commit(what, tmp, path);
    if (st != DT_OK) unlink(tmp);
    return st;
}

/* ---- temporaries of imports ------------------------------------------------ */

/* The pending temporary, for a signal handler: the one piece of mutable
 * global state here, because a handler can be given nothing else. `set`
 * is written after the path and cleared before it changes. */
static char pending_path[DT_OUTFILE_TMP_LEN];
static volatile sig_atomic_t pending_set;

/* This host's name as temporaries carry it; 0 when it is not known (then
 * no temporary is ever taken for one of this host's). */
static int this_host(char *buf, size_t len)
{
    if (gethostname(buf, len) != 0 || !buf[0]) {
        snprintf(buf, len, "unknown");
        return 0;
    }
    buf[len - 1] = '\0';
    for (char *p = buf; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            *p = '_';
    return 1;
}

/* A run of 1 to PID_DIGITS decimal digits filling [p, e) as a pid; 0 if not. */
static long parse_pid(const char *p, const char *e)
{
    long v = 0;
    if (e <= p || e - p > PID_DIGITS) return 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9') return 0;
        v = v * 10 + (*p - '0');
    }
    return v > 0 && v == (long)(pid_t)v ? v : 0;
}

/* Whether pid runs on this host (one of another user counts: EPERM). This
 * process's own pid is not: a temporary by its name is one left by a dead
 * process that had the same pid (a thread of this one writing it holds it
 * locked). */
static int pid_running(long pid)
{
    return pid != (long)getpid() && (kill((pid_t)pid, 0) == 0 || errno != ESRCH);
}

/* Whether someone holds a lock on the file at path (HDF5 holds one on a
 * file it writes, where the file system has locks). Asked only of a file
 * about to be removed, whose writer looks dead: the probe holds a lock
 * for a moment, which a writer taking its own just then would meet. */
static int held_locked(const char *path)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return 0;
    int held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

/* The space the file at path takes, as "<N> <unit>". */
static void size_text(const char *path, char *buf, size_t len)
{
    struct stat sb;
    dt_format_bytes(lstat(path, &sb) == 0 ? (uint64_t)sb.st_blocks * 512 : 0, buf, len);
}

/* One directory entry that may be a temporary of `base`: its host ("" for
 * an older dtrain's "<base>.tmp.<pid>") and pid; 0 when it is not one. */
static int tmp_of(const char *name, const char *base, char *host, size_t hlen, long *pid)
{
    size_t blen = strlen(base), ilen = strlen(TMP_INFIX);
    if (strncmp(name, base, blen) != 0 || strncmp(name + blen, TMP_INFIX, ilen) != 0) return 0;
    const char *rest = name + blen + ilen, *end = rest + strlen(rest);
    const char *dot = strrchr(rest, '.');
    host[0] = '\0';
    if (!dot) return (*pid = parse_pid(rest, end)) != 0;
    if (dot == rest || (size_t)(dot - rest) >= hlen || !(*pid = parse_pid(dot + 1, end))) return 0;
    memcpy(host, rest, (size_t)(dot - rest));
    host[dot - rest] = '\0';
    return 1;
}

dt_status dt_outfile_clear_stale(const char *what, const char *final, FILE *progress)
{
    char dir[OUT_PATH], me[HOST_LEN], host[HOST_LEN], path[OUT_PATH + HOST_LEN], size[32];
    struct dirent *de;
    dt_status st = DT_OK;
    int known = this_host(me, sizeof me);
    const char *slash = strrchr(final, '/'), *base = slash ? slash + 1 : final;
    int dirlen = slash ? (int)(slash - final + 1) : 0; /* paths named as final names them */
    if (!*base) return DT_OK;
    dir_of(final, dir, sizeof dir);
    DIR *d = opendir(dir);
    if (!d) return DT_OK;
    while (st == DT_OK && (de = readdir(d)) != NULL) {
        long pid;
        if (!tmp_of(de->d_name, base, host, sizeof host, &pid)) continue;
        snprintf(path, sizeof path, "%.*s%s", dirlen, final, de->d_name);
        size_text(path, size, sizeof size);
        int mine = known && !strcmp(host, me);
        int running = mine && pid_running(pid), locked = mine && !running && held_locked(path);
        if (running || locked)
            st = dt_set_error(DT_ERR_BUSY,
                              "%s %s is being written by another import (pid %ld on this host, "
                              "into %s%s); wait for it to end or stop it, or choose another "
                              "output path",
                              what, final, pid, path, running ? "" : ", which is held locked");
        else if (mine && unlink(path) == 0) {
            if (progress)
                fprintf(progress,
                        "  removed %s (%s), left by an import that is no longer running (pid "
                        "%ld on this host)\n",
                        path, size, pid);
        } else if (mine && progress)
            fprintf(progress,
                    "  note: cannot remove %s, left by an import that is no longer "
                    "running (pid %ld on this host): %s\n",
                    path, pid, strerror(errno));
        else if (progress && host[0])
            fprintf(progress,
                    "  note: leaving %s (%s), the temporary of an import on host %s (pid %ld): "
                    "whether it still runs cannot be told from here; remove it if it does not\n",
                    path, size, host, pid);
        else if (progress)
            fprintf(progress,
                    "  note: leaving %s (%s), the temporary of an import by an older dtrain "
                    "(its name does not say which host): remove it if no import of %s is "
                    "running\n",
                    path, size, final);
    }
    closedir(d);
    if (progress) fflush(progress);
    return st;
}

dt_status dt_outfile_tmp_begin(const char *what, const char *final, char *tmp, size_t len)
{
    char host[HOST_LEN];
    dt_status st = dt_outfile_clear_stale(what, final, NULL);
    if (st != DT_OK) return st;
    this_host(host, sizeof host);
    int n = snprintf(tmp, len, "%s" TMP_INFIX "%s.%ld", final, host, (long)getpid());
    if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof pending_path)
        return dt_set_error(DT_ERR_USAGE, "%s %s: the path is too long for its temporary name",
                            what, final);
    pending_set = 0;
    atomic_signal_fence(memory_order_seq_cst);
    memcpy(pending_path, tmp, (size_t)n + 1);
    atomic_signal_fence(memory_order_seq_cst);
    pending_set = 1;
    return DT_OK;
}

void dt_outfile_tmp_end(const char *tmp, int committed)
{
    if (!committed && tmp[0]) unlink(tmp); /* after a rename there is nothing left by that name */
    pending_set = 0;
}

void dt_outfile_remove_pending(void)
{
    if (pending_set) unlink(pending_path);
}
