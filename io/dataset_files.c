/*
 * dataset_files.c - a dataset of several files (a list, or a glob pattern
 * expanded sorted by name), as large datasets are shipped.
 *
 * Each file is opened and validated on its own (dataset.c) and must match
 * the first in splits, sample shapes, dtypes, classes and normalisation; a
 * split's rows are the files' rows in order, and a global row maps to
 * (file, row) through prefix sums. A read is split into one read per file
 * holding requested rows, so a rank reads only its own rows whichever file
 * they are in. One file is read exactly as before, with no extra copy
 * (dataset.c does not come here for it).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "dataset_impl.h"

static int has_glob_chars(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* A pattern that matched nothing: why, as far as its fixed directory part
 * (before the first wildcard) tells. All "cannot be found or opened"
 * (DT_ERR_NOT_FOUND). */
static dt_status no_match(const char *pattern)
{
    char dir[4096];
    size_t wild = strcspn(pattern, "*?[");
    const char *slash = NULL;
    for (const char *p = pattern; p < pattern + wild; p++)
        if (*p == '/') slash = p;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == pattern ? 1 : (int)(slash - pattern), pattern);
    DIR *d = opendir(dir);
    if (d) {
        closedir(d);
        return dt_set_error(DT_ERR_NOT_FOUND,
                            "dataset %s: the pattern matches no file; check the directory and "
                            "the pattern",
                            pattern);
    }
    if (errno == ENOENT || errno == ENOTDIR)
        return dt_set_error(DT_ERR_NOT_FOUND, "dataset %s: the pattern matches no file: %s %s",
                            pattern, dir,
                            errno == ENOENT ? "does not exist" : "is not a directory");
    return dt_set_error(DT_ERR_NOT_FOUND,
                        "dataset %s: the pattern matches no file: directory %s cannot be read: %s",
                        pattern, dir, strerror(errno));
}

/* The files a path names, in order: one file, a list (entries separated by
 * newlines, the form a YAML sequence in data.path takes), or a glob pattern
 * expanded sorted by name. A pattern that matches nothing is
 * DT_ERR_NOT_FOUND naming it, unless a file of that very name exists. */
dt_status dt_ds_expand_path(const char *path, char ***names, int *count)
{
    dt_status st = DT_OK;
    glob_t g = {0};
    char **v = NULL;
    int n = 0;
    *names = NULL;
    *count = 0;
    if (strchr(path, '\n')) {
        int cap = 1;
        for (const char *p = path; *p; p++)
            cap += *p == '\n';
        DT_CHECK(dt_calloc((size_t)cap, sizeof *v, "dataset file list", (void **)&v));
        for (const char *p = path; *p;) {
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len == 0) {
                st = dt_set_error(DT_ERR_INVALID_ARG, "dataset list: entry %d is empty", n + 1);
                goto out;
            }
            DT_CHECK(dt_malloc(len + 1, "dataset file name", (void **)&v[n]));
            memcpy(v[n], p, len);
            v[n++][len] = '\0';
            p = e ? e + 1 : p + len;
        }
    } else if (has_glob_chars(path)) {
        int r = glob(path, 0, NULL, &g);
        if (r == GLOB_NOMATCH && access(path, F_OK) != 0) {
            st = no_match(path);
            goto out;
        }
        if (r == GLOB_NOMATCH) {
            g.gl_pathc = 0;
        } else if (r != 0) {
            st = dt_set_error(r == GLOB_NOSPACE ? DT_ERR_NOMEM : DT_ERR_IO,
                              "dataset %s: cannot expand the pattern (%s)", path,
                              r == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
            goto out;
        }
        size_t m = r == GLOB_NOMATCH ? 1 : g.gl_pathc;
        DT_CHECK(dt_calloc(m, sizeof *v, "dataset file list", (void **)&v));
        for (size_t i = 0; i < m; i++) {
            const char *name = r == GLOB_NOMATCH ? path : g.gl_pathv[i];
            DT_CHECK(dt_malloc(strlen(name) + 1, "dataset file name", (void **)&v[n]));
            strcpy(v[n++], name);
        }
    } else {
        DT_CHECK(dt_calloc(1, sizeof *v, "dataset file list", (void **)&v));
        DT_CHECK(dt_malloc(strlen(path) + 1, "dataset file name", (void **)&v[n]));
        strcpy(v[n++], path);
    }
    *names = v;
    *count = n;
    v = NULL;
out:
    if (v)
        for (int i = 0; i < n; i++)
            free(v[i]);
    free(v);
    globfree(&g);
    return st;
}

/* DT_ERR_BAD_DATA naming two files and what differs between them. */
static dt_status differ(const struct dt_ds_file *a, const struct dt_ds_file *b, const char *what)
{
    return dt_set_error(DT_ERR_BAD_DATA,
                        "datasets %s and %s differ in %s; the files of one dataset must have "
                        "the same splits, sample shapes, dtypes, classes and normalisation",
                        a->info.path, b->info.path, what);
}

/* Checks that file b can continue file a. */
dt_status dt_ds_same_kind(const struct dt_ds_file *a, const struct dt_ds_file *b)
{
    const struct dt_dataset_info *x = &a->info, *y = &b->info;
    char what[DT_NAME_MAX * 2 + 64];
    if (x->num_classes != y->num_classes)
        return differ(a, b, "the number of classes");
    for (int c = 0; c < x->num_classes; c++)
        if (strcmp(x->class_names[c], y->class_names[c]) != 0) {
            snprintf(what, sizeof what, "the name of class %d ('%s', '%s')", c, x->class_names[c],
                     y->class_names[c]);
            return differ(a, b, what);
        }
    if (x->norm_scale != y->norm_scale || x->norm_mean != y->norm_mean ||
        x->norm_std != y->norm_std)
        return differ(a, b, "the normalisation attributes (norm_scale, norm_mean, norm_std)");
    int same_ch = x->norm_channels == y->norm_channels;
    for (int c = 0; same_ch && c < x->norm_channels; c++)
        same_ch = x->norm_channel_mean[c] == y->norm_channel_mean[c] &&
                  x->norm_channel_std[c] == y->norm_channel_std[c];
    if (!same_ch)
        return differ(a, b, "the per-channel normalisation (norm_channel_mean, norm_channel_std)");
    if (x->nsplits != y->nsplits)
        return differ(a, b, "their splits (how many there are)");
    for (int i = 0; i < x->nsplits; i++) {
        const struct dt_split_info *s = &x->splits[i], *t = &y->splits[i];
        if (strcmp(s->name, t->name) != 0) {
            snprintf(what, sizeof what, "their splits ('%s' and '%s')", s->name, t->name);
            return differ(a, b, what);
        }
        int same = s->ndim == t->ndim;
        for (int d = 0; same && d < s->ndim; d++)
            same = s->shape[d] == t->shape[d];
        if (!same) {
            snprintf(what, sizeof what, "the sample shape of split '%s'", s->name);
            return differ(a, b, what);
        }
        if (s->x_dtype != t->x_dtype || s->y_dtype != t->y_dtype) {
            snprintf(what, sizeof what, "the dtypes of split '%s' (x %s, y %s vs x %s, y %s)",
                     s->name, dt_dtype_name(s->x_dtype), dt_dtype_name(s->y_dtype),
                     dt_dtype_name(t->x_dtype), dt_dtype_name(t->y_dtype));
            return differ(a, b, what);
        }
    }
    return DT_OK;
}

/* The whole: the first file's description with rows, sizes and counts
 * summed, and the prefix sums that map a global row to a file. */
dt_status dt_ds_combine(struct dt_dataset *ds, const char *path)
{
    int nf = ds->nfiles;
    struct dt_dataset_info *in = &ds->info;
    *in = ds->files[0]->info;
    if (nf == 1)
        return DT_OK;
    snprintf(in->path, sizeof in->path, "%s", path);
    for (char *p = in->path; *p; p++)
        if (*p == '\n')
            *p = ',';
    dt_status st = dt_calloc((size_t)in->nsplits * (size_t)(nf + 1), sizeof *ds->first,
                             "dataset row map", (void **)&ds->first);
    if (st != DT_OK)
        return st;
    in->file_bytes = 0;
    for (int s = 0; s < in->nsplits; s++) {
        struct dt_split_info *si = &in->splits[s];
        si->n = 0;
        si->x_bytes = 0;
        memset(si->class_counts, 0, sizeof si->class_counts);
    }
    for (int f = 0; f < nf; f++) {
        const struct dt_dataset_info *fi = &ds->files[f]->info;
        in->file_bytes += fi->file_bytes;
        for (int s = 0; s < in->nsplits; s++) {
            struct dt_split_info *si = &in->splits[s];
            const struct dt_split_info *fs = &fi->splits[s];
            ds->first[s * (nf + 1) + f] = si->n;
            si->n += fs->n;
            si->x_bytes += fs->x_bytes;
            for (int c = 0; c < in->num_classes; c++)
                si->class_counts[c] += fs->class_counts[c];
        }
    }
    for (int s = 0; s < in->nsplits; s++)
        ds->first[s * (nf + 1) + nf] = in->splits[s].n;
    return DT_OK;
}

/* The file holding global row `row` of a split, by binary search over
 * first[0..nf] (first[nf] is the split's size). */
int dt_ds_file_of(const int64_t *first, int nf, uint64_t row)
{
    int lo = 0, hi = nf - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((uint64_t)first[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Several files: the request is split by file (each file gets only its
 * own rows, so the bytes read stay the rows asked for), each part read as
 * one file read, and the rows put back in request order. */
dt_status dt_ds_files_read(dt_dataset_t *ds, const char *split, const uint64_t *idx, size_t n,
                           int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                           uint64_t *bytes_read)
{
    dt_status st = DT_OK;
    const struct dt_split_info *si;
    if ((st = dt_dataset_split(ds, split, &si)) != DT_OK)
        return st;
    int s = (int)(si - ds->info.splits), nf = ds->nfiles;
    const int64_t *first = ds->first + s * (nf + 1);
    size_t elems = (size_t)si->sample_elems;
    size_t *cnt = NULL, *pos = NULL;
    uint64_t *local = NULL;
    float *tx = NULL;
    int32_t *ty = NULL;
    int *fof = NULL;
    struct dt_crop_flip *tcf = NULL;
    if (n == 0)
        return DT_OK;
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= (uint64_t)si->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: row %llu of split '%s' requested, which has %lld rows",
                                ds->info.path, (unsigned long long)idx[i], split, (long long)si->n);
    size_t xn = 0;
    if (!dt_mul_size(n, elems, &xn)) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dataset %s: a read of %zu rows of split '%s' is too large",
                          ds->info.path, n, split);
        goto out;
    }
    DT_CHECK(dt_calloc((size_t)nf + 1, sizeof *cnt, "read request", (void **)&cnt));
    DT_CHECK(dt_calloc(n, sizeof *pos, "read request", (void **)&pos));
    DT_CHECK(dt_calloc(n, sizeof *local, "read request", (void **)&local));
    DT_CHECK(dt_calloc(n, sizeof *fof, "read request", (void **)&fof));
    DT_CHECK(dt_calloc(n, sizeof *ty, "read request", (void **)&ty));
    DT_CHECK(dt_calloc(xn, sizeof *tx, "rows read from the dataset", (void **)&tx));
    if (cf)
        DT_CHECK(dt_calloc(n, sizeof *tcf, "read request", (void **)&tcf));
    for (size_t i = 0; i < n; i++) {
        fof[i] = dt_ds_file_of(first, nf, idx[i]);
        cnt[fof[i] + 1]++;
    }
    for (int f = 0; f < nf; f++)
        cnt[f + 1] += cnt[f]; /* cnt[f]: where file f's rows start in the part order */
    for (size_t i = 0; i < n; i++) {
        size_t p = cnt[fof[i]]++;
        pos[i] = p;
        local[p] = idx[i] - (uint64_t)first[fof[i]];
        if (cf)
            tcf[p] = cf[i];
    }
    /* cnt[f] is now where file f's rows end */
    for (int f = 0; f < nf; f++) {
        size_t b = f ? cnt[f - 1] : 0;
        if (cnt[f] > b)
            DT_CHECK(dt_ds_file_read(ds->files[f], split, local + b, cnt[f] - b, pad,
                                     cf ? tcf + b : NULL, tx + b * elems, ty + b, bytes_read));
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(x + i * elems, tx + pos[i] * elems, elems * sizeof *x);
        if (y)
            y[i] = ty[pos[i]];
    }
out:
    free(tcf);
    free(tx);
    free(ty);
    free(fof);
    free(local);
    free(pos);
    free(cnt);
    return st;
}
