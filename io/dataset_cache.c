/*
 * dataset_cache.c - the row cache (dt_row_cache_*, data.cache: memory):
 * chosen rows of a split held in memory as read from the file (uint8, or
 * float32 for float16 and float32 x).
 *
 * The rows are read once, in runs of up to DT_ROW_CACHE_READ_BYTES per
 * H5Dread, from whichever files hold them. A read from the cache skips the
 * sort and the HDF5 lock: it normalises each requested row straight from
 * memory with the same dt_ds_normalise_row and dt_ds_normalise_crop_flip
 * as a file read (files of one dataset share their normalisation, so the
 * first file's tables serve), hence the same floats bit for bit. Stored
 * non-finite floats are refused at the fill, once.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dataset_impl.h"
#include "hdf5_lock.h"

struct dt_row_cache {
    dt_dataset_t *ds;
    char split[DT_NAME_MAX];
    int s; /* split index */
    int64_t rows, per_row;
    size_t row_bytes; /* stored bytes of one row in memory (uint8 or float32 values) */
    unsigned char *x; /* rows x row_bytes */
    int32_t *y;       /* rows labels */
    uint64_t *ids;    /* rows dataset row numbers */
    uint64_t bytes_read;
};

uint64_t dt_row_cache_row_bytes(const struct dt_split_info *si)
{
    uint64_t v = si->x_dtype == DT_U8 ? 1 : sizeof(float);
    return (uint64_t)si->sample_elems * v + sizeof(int32_t) + sizeof(uint64_t);
}

/* Stored non-finite floats in rows [0, count) of a block read at dataset
 * row `row0` are refused here, once, as a read would refuse them. */
static dt_status cache_check_block(const struct dt_row_cache *c, const struct dt_ds_file *f,
                                   uint64_t row0, const unsigned char *buf, size_t count)
{
    if (f->splits[c->s].x_mem_size == 1)
        return DT_OK;
    int64_t k = dt_ds_first_nonfinite((const float *)buf, (int64_t)count * c->per_row);
    if (k < 0)
        return DT_OK;
    int64_t i = k / c->per_row;
    return dt_ds_nonfinite_row_error(&c->ds->info, c->split, row0 + (uint64_t)i,
                                     buf + (size_t)i * c->row_bytes, (const float *)buf, k,
                                     c->per_row);
}

/* Rows [row, row + count) of the dataset into cache positions from `at`:
 * one H5Dread per file part of at most DT_ROW_CACHE_READ_BYTES. */
static dt_status cache_fill(struct dt_row_cache *c, uint64_t row, uint64_t count, int64_t at)
{
    dt_status st = DT_OK;
    dt_dataset_t *ds = c->ds;
    int nf = ds->nfiles;
    uint64_t piece = DT_ROW_CACHE_READ_BYTES / c->row_bytes;
    if (piece < 1)
        piece = 1;
    while (count > 0) {
        int f = nf == 1 ? 0 : dt_ds_file_of(ds->first + c->s * (nf + 1), nf, row);
        uint64_t base = nf == 1 ? 0 : (uint64_t)ds->first[c->s * (nf + 1) + f];
        const struct dt_ds_file *file = ds->files[f];
        const struct dt_ds_split *sp = &file->splits[c->s];
        const struct dt_split_info *fsi = &file->info.splits[c->s];
        uint64_t local = row - base, take = count < piece ? count : piece;
        if (take > (uint64_t)fsi->n - local)
            take = (uint64_t)fsi->n - local;
        unsigned char *dst = c->x + (size_t)at * c->row_bytes;
        dt_h5_lock();
        st = dt_ds_read_block(file, c->split, sp, fsi, local, (size_t)take, dst);
        dt_h5_unlock();
        if (st != DT_OK)
            return st;
        DT_CHECK(cache_check_block(c, file, row, dst, (size_t)take));
        memcpy(c->y + at, sp->labels + local, (size_t)take * sizeof *c->y);
        for (uint64_t i = 0; i < take; i++)
            c->ids[at + (int64_t)i] = row + i;
        c->bytes_read += take * (uint64_t)fsi->sample_elems * sp->x_file_size;
        row += take;
        count -= take;
        at += (int64_t)take;
    }
out:
    return st;
}

dt_status dt_row_cache_create(dt_dataset_t *ds, const char *split, const int64_t *start,
                              const int64_t *count, int nranges, dt_row_cache_t **out)
{
    dt_status st = DT_OK;
    struct dt_row_cache *c = NULL;
    const struct dt_split_info *si;
    *out = NULL;
    if (ds->info.lm)
        return dt_set_error(DT_ERR_UNSUPPORTED,
                            "dataset %s: data.cache=memory is not implemented for "
                            "language-model datasets in this version; set data.cache: none",
                            ds->info.path);
    DT_CHECK(dt_dataset_split(ds, split, &si));
    int64_t rows = 0;
    for (int k = 0; k < nranges; k++) {
        if (start[k] < 0 || count[k] < 0 || start[k] > si->n - count[k])
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: cannot cache rows %lld..%lld of split '%s', which "
                                "has %lld rows",
                                ds->info.path, (long long)start[k],
                                (long long)(start[k] + count[k]), split, (long long)si->n);
        rows += count[k];
    }
    DT_CHECK(dt_calloc(1, sizeof *c, "row cache", (void **)&c));
    c->ds = ds;
    dt_ds_copy_name(c->split, sizeof c->split, split);
    c->s = (int)(si - ds->info.splits);
    c->rows = rows;
    c->per_row = si->sample_elems;
    c->row_bytes = (size_t)si->sample_elems * ds->files[0]->splits[c->s].x_mem_size;
    size_t all = 0;
    if (!dt_mul_size((size_t)rows, c->row_bytes, &all)) {
        st = dt_set_error(DT_ERR_NOMEM, "dataset %s: %lld rows of split '%s' do not fit in memory",
                          ds->info.path, (long long)rows, split);
        goto out;
    }
    DT_CHECK(dt_malloc(all ? all : 1, "cached rows of the dataset", (void **)&c->x));
    DT_CHECK(dt_calloc((size_t)rows + 1, sizeof *c->y, "cached labels", (void **)&c->y));
    DT_CHECK(dt_calloc((size_t)rows + 1, sizeof *c->ids, "cached row ids", (void **)&c->ids));
    int64_t at = 0;
    for (int k = 0; k < nranges; k++) {
        DT_CHECK(cache_fill(c, (uint64_t)start[k], (uint64_t)count[k], at));
        at += count[k];
    }
    *out = c;
    c = NULL;
out:
    dt_row_cache_destroy(c);
    return st;
}

void dt_row_cache_destroy(dt_row_cache_t *c)
{
    if (!c)
        return;
    free(c->x);
    free(c->y);
    free(c->ids);
    free(c);
}

int64_t dt_row_cache_rows(const dt_row_cache_t *c) { return c->rows; }

uint64_t dt_row_cache_bytes(const dt_row_cache_t *c)
{
    return (uint64_t)c->rows * (c->row_bytes + sizeof *c->y + sizeof *c->ids);
}

uint64_t dt_row_cache_bytes_read(const dt_row_cache_t *c) { return c->bytes_read; }

uint64_t dt_row_cache_row_id(const dt_row_cache_t *c, int64_t pos) { return c->ids[pos]; }

dt_status dt_row_cache_read(const dt_row_cache_t *c, const uint64_t *pos, size_t n, int32_t pad,
                            const struct dt_crop_flip *cf, float *x, int32_t *y)
{
    const struct dt_ds_file *f0 = c->ds->files[0];
    const struct dt_ds_split *sp = &f0->splits[c->s];
    const struct dt_split_info *si = &c->ds->info.splits[c->s];
    struct dt_ds_geom g = {.pad = pad};
    if (cf && (pad < 0 || !dt_split_image_shape(si, &g.c, &g.h, &g.w)))
        return dt_set_error(DT_ERR_INVALID_ARG,
                            "dataset %s: split '%s' cannot be cropped or flipped (vectors, or a "
                            "negative padding)",
                            c->ds->info.path, c->split);
    for (size_t i = 0; i < n; i++) {
        if (pos[i] >= (uint64_t)c->rows)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: cached row %llu of split '%s' requested; the cache "
                                "holds %lld",
                                c->ds->info.path, (unsigned long long)pos[i], c->split,
                                (long long)c->rows);
        if (cf && (cf[i].top < 0 || cf[i].top > 2 * pad || cf[i].left < 0 || cf[i].left > 2 * pad))
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: crop %zu at (%d, %d) is outside [0, %d] for "
                                "padding %d",
                                c->ds->info.path, i, (int)cf[i].top, (int)cf[i].left, 2 * (int)pad,
                                (int)pad);
    }
    for (size_t i = 0; i < n; i++) {
        const unsigned char *src = c->x + (size_t)pos[i] * c->row_bytes;
        float *dst = x + i * (size_t)c->per_row;
        if (cf)
            dt_ds_normalise_crop_flip(f0, sp, src, dst, &g, &cf[i]);
        else
            dt_ds_normalise_row(f0, sp, src, dst, c->per_row);
        if (y)
            y[i] = c->y[pos[i]];
    }
    if (sp->x_mem_size == 1)
        return DT_OK; /* the table was checked at open */
    /* stored values were checked when cached; what normalisation overflows is caught here */
    int64_t k = dt_ds_first_nonfinite(x, (int64_t)n * c->per_row);
    if (k < 0)
        return DT_OK;
    int64_t i = k / c->per_row;
    if (cf)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: normalisation ((v * %g - mean) / "
                            "std) turns a value of x into %g (element %lld after the crop)",
                            c->ds->info.path, c->split, (unsigned long long)c->ids[pos[i]],
                            (double)f0->info.norm_scale, (double)x[k], (long long)(k % c->per_row));
    return dt_ds_nonfinite_row_error(&c->ds->info, c->split, c->ids[pos[i]],
                                     c->x + (size_t)pos[i] * c->row_bytes, x, k, c->per_row);
}
