/*
 * dataset_rows.c - reading arbitrary rows of one dataset file.
 *
 * The requested rows are sorted and de-duplicated, consecutive rows are
 * merged into runs, and each run is one H5Dread of a hyperslab into a
 * contiguous buffer; rows are then normalised into the caller's buffer in
 * request order (dataset_norm.c), outside the HDF5 lock. One read per run
 * beats both one read of the union of the hyperslabs (HDF5 1.10 handles
 * irregular selections slowly) and a point selection. uint8 inputs map
 * through a table checked at open; float inputs are checked after
 * normalisation, which catches what it overflows too.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dataset_impl.h"
#include "hdf5_lock.h"

struct req {
    uint64_t row;
    size_t pos; /* position in the caller's request */
};

static int req_cmp(const void *a, const void *b)
{
    const struct req *x = a, *y = b;
    if (x->row != y->row)
        return x->row < y->row ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Reads sorted unique rows[0..m) of x into buf, one H5Dread per run of
 * consecutive rows. The memory space has the shape of the file selection
 * (run x sample shape): HDF5 then copies straight through, while a 1-D
 * memory space of the same size takes its general path, much slower.
 * Lock held. */
static dt_status read_runs(const struct dt_ds_file *ds, const char *split,
                           const struct dt_ds_split *sp, const struct dt_split_info *si,
                           const uint64_t *rows, size_t m, unsigned char *buf)
{
    dt_status st = DT_OK;
    hsize_t start[DT_DATASET_MAX_DIMS + 1] = {0}, count[DT_DATASET_MAX_DIMS + 1];
    size_t row_bytes = (size_t)si->sample_elems * sp->x_mem_size;
    hid_t fs = H5Dget_space(sp->x);
    if (fs < 0) {
        st = dt_h5_error(DT_ERR_IO, "dataset %s: cannot set up a read of /%s/x", ds->info.path,
                         split);
        goto out;
    }
    for (int d = 0; d < si->ndim; d++)
        count[d + 1] = (hsize_t)si->shape[d];
    for (size_t i = 0; i < m;) {
        size_t j = i + 1;
        while (j < m && rows[j] == rows[j - 1] + 1)
            j++;
        start[0] = rows[i];
        count[0] = j - i;
        hid_t ms = H5Screate_simple(si->ndim + 1, count, NULL);
        herr_t r = -1;
        if (ms >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0)
            r = H5Dread(sp->x, sp->x_mem, ms, fs, H5P_DEFAULT, buf + i * row_bytes);
        if (r < 0) {
            st = dt_h5_error(DT_ERR_IO, "dataset %s: cannot read rows %llu..%llu of /%s/x",
                             ds->info.path, (unsigned long long)rows[i],
                             (unsigned long long)rows[j - 1], split);
            dt_h5_close(ms);
            goto out;
        }
        H5Sclose(ms);
        i = j;
    }
out:
    dt_h5_close(fs);
    return st;
}

/* Reads rows [row, row + count) of x into buf (one run of read_runs).
 * Lock held. */
dt_status dt_ds_read_block(const struct dt_ds_file *ds, const char *split,
                           const struct dt_ds_split *sp, const struct dt_split_info *si,
                           uint64_t row, size_t count, unsigned char *buf)
{
    dt_status st = DT_OK;
    uint64_t *rows = NULL;
    DT_CHECK(dt_calloc(count, sizeof *rows, "cache read", (void **)&rows));
    for (size_t i = 0; i < count; i++)
        rows[i] = row + i;
    st = read_runs(ds, split, sp, si, rows, count, buf);
out:
    free(rows);
    return st;
}

/* The message for the non-finite input at position k of a read's output. */
static dt_status nonfinite_error(const struct dt_ds_file *ds, const char *split,
                                 const uint64_t *idx, const size_t *uidx, const unsigned char *buf,
                                 size_t row_bytes, const float *x, int64_t k, int64_t per_row)
{
    int64_t i = k / per_row;
    return dt_ds_nonfinite_row_error(&ds->info, split, idx[i], buf + uidx[i] * row_bytes, x, k,
                                     per_row);
}

/* A crop-and-flip read of float x: a non-finite stored value anywhere in
 * the rows read (m rows of `per_row`, rows[] their numbers) is refused as
 * without the crop; an overflow of normalisation only where the crop
 * takes the value (k: position in the output). */
static dt_status crop_nonfinite(const struct dt_ds_file *ds, const char *split,
                                const uint64_t *rows, size_t m, const uint64_t *idx,
                                const unsigned char *buf, int64_t per_row, const float *x, size_t n)
{
    const struct dt_dataset_info *in = &ds->info;
    int64_t k = dt_ds_first_nonfinite((const float *)buf, (int64_t)m * per_row);
    if (k >= 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: x holds %g at element %lld; "
                            "inputs must be finite",
                            in->path, split, (unsigned long long)rows[k / per_row],
                            (double)((const float *)buf)[k], (long long)(k % per_row));
    k = dt_ds_first_nonfinite(x, (int64_t)n * per_row);
    if (k >= 0)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: normalisation ((v * %g - mean) / "
                            "std) turns a value of x into %g (element %lld after the crop)",
                            in->path, split, (unsigned long long)idx[k / per_row],
                            (double)in->norm_scale, (double)x[k], (long long)(k % per_row));
    return DT_OK;
}

/* Reads rows idx[0..n) of one file, each through cf[i] when cf is given
 * (pad: the crop's padding). */
dt_status dt_ds_file_read(struct dt_ds_file *ds, const char *split, const uint64_t *idx, size_t n,
                          int32_t pad, const struct dt_crop_flip *cf, float *x, int32_t *y,
                          uint64_t *bytes_read)
{
    dt_status st = DT_OK;
    struct req *reqs = NULL;
    uint64_t *rows = NULL;
    size_t *uidx = NULL;
    unsigned char *buf = NULL;
    int s = dt_ds_find_split(ds, split);
    if (s < 0) {
        const struct dt_split_info *dummy;
        return dt_ds_file_split(ds, split, &dummy);
    }
    const struct dt_split_info *si = &ds->info.splits[s];
    const struct dt_ds_split *sp = &ds->splits[s];
    if (n == 0)
        return DT_OK;
    for (size_t i = 0; i < n; i++)
        if (idx[i] >= (uint64_t)si->n)
            return dt_set_error(DT_ERR_INVALID_ARG,
                                "dataset %s: row %llu of split '%s' requested, which has %lld rows",
                                ds->info.path, (unsigned long long)idx[i], split,
                                (long long)si->n);

    struct dt_ds_geom g = {.pad = pad};
    if (cf && !dt_split_image_shape(si, &g.c, &g.h, &g.w)) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dataset %s: split '%s' holds vectors, not images; they cannot be "
                          "cropped or flipped",
                          ds->info.path, split);
        goto out;
    }
    DT_CHECK(dt_calloc(n, sizeof *reqs, "read request", (void **)&reqs));
    DT_CHECK(dt_calloc(n, sizeof *rows, "read request", (void **)&rows));
    DT_CHECK(dt_calloc(n, sizeof *uidx, "read request", (void **)&uidx));
    for (size_t i = 0; i < n; i++)
        reqs[i] = (struct req){idx[i], i};
    qsort(reqs, n, sizeof *reqs, req_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m == 0 || rows[m - 1] != reqs[i].row)
            rows[m++] = reqs[i].row;
        uidx[reqs[i].pos] = m - 1;
    }
    size_t row_bytes = 0, all_bytes = 0;
    if (!dt_mul_size((size_t)si->sample_elems, sp->x_mem_size, &row_bytes) ||
        !dt_mul_size(m, row_bytes, &all_bytes)) {
        st = dt_set_error(DT_ERR_INVALID_ARG,
                          "dataset %s: a read of %zu rows of split '%s' is "
                          "too large",
                          ds->info.path, m, split);
        goto out;
    }
    DT_CHECK(dt_malloc(all_bytes, "rows read from the dataset", (void **)&buf));

    dt_h5_lock();
    st = read_runs(ds, split, sp, si, rows, m, buf);
    dt_h5_unlock();
    if (st != DT_OK)
        goto out;

    for (size_t i = 0; i < n; i++) {
        float *dst = x + i * (size_t)si->sample_elems;
        if (cf)
            dt_ds_normalise_crop_flip(ds, sp, buf + uidx[i] * row_bytes, dst, &g, &cf[i]);
        else
            dt_ds_normalise_row(ds, sp, buf + uidx[i] * row_bytes, dst, si->sample_elems);
        if (y)
            y[i] = sp->labels[idx[i]];
    }
    /* uint8 inputs map through a table checked at open; floats are checked
     * here, after normalisation, which catches what it overflows too */
    if (cf && sp->x_mem_size != 1)
        DT_CHECK(crop_nonfinite(ds, split, rows, m, idx, buf, si->sample_elems, x, n));
    int64_t bad =
        sp->x_mem_size == 1 || cf ? -1 : dt_ds_first_nonfinite(x, (int64_t)n * si->sample_elems);
    if (bad >= 0) {
        st = nonfinite_error(ds, split, idx, uidx, buf, row_bytes, x, bad, si->sample_elems);
        goto out;
    }
    if (bytes_read)
        *bytes_read += (uint64_t)m * (uint64_t)si->sample_elems * sp->x_file_size;
out:
    free(buf);
    free(uidx);
    free(rows);
    free(reqs);
    return st;
}
