/*
 * snapshot.c - in-memory snapshot files (snapshot.h): a fixed header and
 * the rank's state as raw bytes, written with plain system calls to a
 * file system in memory (no HDF5, no MPI-IO: one process writes each file,
 * and it is read back only on the same node by the same kind of machine).
 */
#define _GNU_SOURCE
#include "snapshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "outfile.h"

#define SNAP_MAGIC "DTSNAP1"
#define SNAP_VERSION 1
#define SNAP_IO_CHUNK ((size_t)1 << 26) /* bytes a read or write call moves at most */

struct snap_header {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint64_t run_key, layout_key;
    int32_t owner, world;
    int64_t step;
    struct dt_ckpt_meta meta;
    uint64_t data_bytes;
    uint64_t data_sum;
    uint64_t header_sum; /* of everything above */
};

static const char *const kind_ext[] = {"own", "peer"};

uint64_t dt_snap_checksum(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x94D049BB133111EBULL;
    return h ^ (h >> 29);
}

static uint64_t header_sum(const struct snap_header *h)
{
    return dt_snap_checksum(h, offsetof(struct snap_header, header_sum));
}

void dt_snap_dir(const char *base, uint64_t run_key, int node, char *buf, size_t len)
{
    snprintf(buf, len, "%s/dtrain-%016" PRIx64 "/node%d", base, run_key, node);
}

void dt_snap_path(const char *dir, enum dt_snap_kind kind, int owner, int64_t step, char *buf,
                  size_t len)
{
    snprintf(buf, len, "%s/r%d-s%010lld.%s", dir, owner, (long long)step, kind_ext[kind]);
}

/* mkdir -p with mode 700 for the parts it creates. */
static dt_status make_dirs(const char *dir)
{
    char p[DT_SNAP_PATH];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        int end = *s == '\0';
        if (*s != '/' && !end) continue;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return dt_set_error(DT_ERR_IO, "in-memory snapshot directory %s: cannot create it: %s",
                                p, strerror(errno));
        if (end) break;
        *s = '/';
    }
    return DT_OK;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n < SNAP_IO_CHUNK ? n : SNAP_IO_CHUNK);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n < SNAP_IO_CHUNK ? n : SNAP_IO_CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

dt_status dt_snap_write(const char *dir, enum dt_snap_kind kind, const struct dt_snap_id *id,
                        int64_t step, const struct dt_ckpt_meta *meta, const void *data,
                        uint64_t bytes)
{
    char path[DT_SNAP_PATH], tmp[DT_SNAP_PATH + 32], why[256];
    struct snap_header h;
    dt_status st = make_dirs(dir);
    if (st != DT_OK) return st;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, SNAP_MAGIC, sizeof SNAP_MAGIC);
    h.version = SNAP_VERSION;
    h.header_bytes = (uint32_t)sizeof h;
    h.run_key = id->run_key;
    h.layout_key = id->layout_key;
    h.owner = id->owner;
    h.world = id->world;
    h.step = step;
    h.meta = *meta;
    h.data_bytes = bytes;
    h.data_sum = dt_snap_checksum(data, (size_t)bytes);
    h.header_sum = header_sum(&h);
    dt_snap_path(dir, kind, id->owner, step, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    unlink(tmp); /* a leftover of a write that was cut off */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0 && (write_all(fd, &h, sizeof h) != 0 || write_all(fd, data, (size_t)bytes) != 0))
        err = errno ? errno : EIO;
    if (fd >= 0 && close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (!err) return DT_OK;
    unlink(tmp);
    dt_outfile_reason(err, tmp, why, sizeof why);
    return dt_set_error(DT_ERR_IO, "in-memory snapshot %s: cannot write it: %s", path, why);
}

/* owner and step of a name r<owner>-s<step>.<ext of kind>; 0 if not one. */
static int parse_name(const char *name, enum dt_snap_kind kind, int *owner, int64_t *step)
{
    int o = -1, n = 0;
    long long s = -1;
    char ext[8] = "";
    if (sscanf(name, "r%d-s%lld.%7[a-z]%n", &o, &s, ext, &n) != 3 || name[n] != '\0') return 0;
    if (strcmp(ext, kind_ext[kind]) != 0 || o < 0 || s < 0) return 0;
    *owner = o;
    *step = s;
    return 1;
}

/* parse_name of a directory entry that may be a temporary file (the name
 * and ".tmp"), which *tmp says; kind < 0 takes either kind. */
static int parse_file(const char *entry, int kind, int *owner, int64_t *step, int *tmp)
{
    size_t len = strlen(entry);
    char name[300];
    *tmp = len > 4 && strcmp(entry + len - 4, ".tmp") == 0;
    snprintf(name, sizeof name, "%.*s", (int)(*tmp ? len - 4 : len), entry);
    if (kind >= 0) return parse_name(name, (enum dt_snap_kind)kind, owner, step);
    return parse_name(name, DT_SNAP_OWN, owner, step) || parse_name(name, DT_SNAP_PEER, owner, step);
}

int dt_snap_list(const char *dir, enum dt_snap_kind kind, int owner, int64_t *steps, int max)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int o;
        int64_t s;
        if (!parse_name(e->d_name, kind, &o, &s) || o != owner) continue;
        int at; /* insert, newest first, keeping the max newest */
        if (max <= 0)
            continue;
        if (n < max)
            at = n++;
        else if (steps[max - 1] >= s)
            continue;
        else
            at = max - 1;
        while (at > 0 && steps[at - 1] < s) {
            steps[at] = steps[at - 1];
            at--;
        }
        steps[at] = s;
    }
    closedir(d);
    return n;
}

dt_status dt_snap_read(const char *path, const struct dt_snap_id *id, int64_t step, void *data,
                       uint64_t bytes, struct dt_ckpt_meta *meta)
{
    struct snap_header h;
    struct stat sb;
    dt_status st = DT_OK;
    void *scratch = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return dt_set_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                            "in-memory snapshot %s: cannot open it: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (uint64_t)sb.st_size != sizeof h + bytes) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "in-memory snapshot %s holds %lld bytes, not the %llu this run's state "
                          "takes (cut short, or of another layout)",
                          path, (long long)sb.st_size, (unsigned long long)(sizeof h + bytes));
        goto out;
    }
    if (read_all(fd, &h, sizeof h) != 0 || memcmp(h.magic, SNAP_MAGIC, sizeof SNAP_MAGIC) != 0 ||
        h.version != SNAP_VERSION || h.header_bytes != sizeof h || h.header_sum != header_sum(&h)) {
        st = dt_set_error(DT_ERR_BAD_DATA, "in-memory snapshot %s: its header is damaged", path);
        goto out;
    }
    if (h.run_key != id->run_key || h.owner != id->owner || h.world != id->world ||
        h.layout_key != id->layout_key || h.step != step || h.data_bytes != bytes) {
        st = dt_set_error(DT_ERR_BAD_DATA,
                          "in-memory snapshot %s is of another run, rank, world size or layout "
                          "(rank %d of %d, step %lld)",
                          path, (int)h.owner, (int)h.world, (long long)h.step);
        goto out;
    }
    if (!data && (scratch = malloc(bytes ? bytes : 1)) == NULL) {
        st = dt_set_error(DT_ERR_NOMEM, "out of memory checking %s", path);
        goto out;
    }
    void *into = data ? data : scratch;
    if (read_all(fd, into, (size_t)bytes) != 0) {
        st = dt_set_error(DT_ERR_BAD_DATA, "in-memory snapshot %s: cannot read its data", path);
        goto out;
    }
    if (dt_snap_checksum(into, (size_t)bytes) != h.data_sum) {
        st = dt_set_error(DT_ERR_BAD_DATA, "in-memory snapshot %s: its data fails its checksum",
                          path);
        goto out;
    }
    if (meta) *meta = h.meta;
out:
    free(scratch);
    close(fd);
    return st;
}

void dt_snap_prune(const char *dir, enum dt_snap_kind kind, int owner, int64_t keep_from)
{
    DIR *d = opendir(dir);
    char p[DT_SNAP_PATH + 300];
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int o, tmp;
        int64_t s;
        if (!parse_file(e->d_name, (int)kind, &o, &s, &tmp) || o != owner || (!tmp && s >= keep_from))
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

/* Calls fn on every snapshot file (temporary ones too) of the run under
 * base, with its path and size; then on each node directory (size -1). */
static void each_file(const char *base, uint64_t run_key,
                      void (*fn)(const char *path, int64_t size, void *ctx), void *ctx)
{
    char run[DT_SNAP_PATH], p[DT_SNAP_PATH + 300], q[2 * DT_SNAP_PATH];
    snprintf(run, sizeof run, "%s/dtrain-%016" PRIx64, base, run_key);
    DIR *d = opendir(run);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int node;
        char rest[8];
        if (sscanf(e->d_name, "node%d%1s", &node, rest) != 1) continue;
        snprintf(p, sizeof p, "%s/%s", run, e->d_name);
        DIR *n = opendir(p);
        if (!n) continue;
        for (struct dirent *f; (f = readdir(n)) != NULL;) {
            int o, tmp;
            int64_t s;
            struct stat sb;
            if (!parse_file(f->d_name, -1, &o, &s, &tmp)) continue;
            snprintf(q, sizeof q, "%s/%s", p, f->d_name);
            if (lstat(q, &sb) == 0 && S_ISREG(sb.st_mode)) fn(q, (int64_t)sb.st_size, ctx);
        }
        closedir(n);
        fn(p, -1, ctx);
    }
    closedir(d);
}

static void remove_one(const char *path, int64_t size, void *ctx)
{
    (void)ctx;
    if (size >= 0)
        unlink(path);
    else
        rmdir(path); /* only when empty: a file of someone else's stays */
}

static void add_size(const char *path, int64_t size, void *ctx)
{
    (void)path;
    if (size > 0) *(uint64_t *)ctx += (uint64_t)size;
}

void dt_snap_remove_run(const char *base, uint64_t run_key)
{
    char run[DT_SNAP_PATH];
    each_file(base, run_key, remove_one, NULL);
    snprintf(run, sizeof run, "%s/dtrain-%016" PRIx64, base, run_key);
    rmdir(run);
}

uint64_t dt_snap_run_bytes(const char *base, uint64_t run_key)
{
    uint64_t n = 0;
    each_file(base, run_key, add_size, &n);
    return n;
}

uint64_t dt_snap_free_bytes(const char *path)
{
    struct statvfs v;
    if (statvfs(path, &v) != 0) return UINT64_MAX;
    return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
}
