/*
 * dataset_norm.c - normalisation: the tables built when a file is opened,
 * and the normalising copy every read makes, plain or through a crop and
 * flip.
 *
 * Normalisation is per channel when the file says so (norm_channel_mean,
 * norm_channel_std): a sample is then C planes of H x W values, each with
 * its own mean and std (a 256-entry table per channel for uint8). Without
 * those attributes it is one plane with the scalar mean and std, which is
 * the same arithmetic as before they existed. A crop-and-flip read
 * (augmentation) is the same normalising copy with the source index
 * moved, so it costs no extra pass over the data. File reads
 * (dataset_rows.c) and the row cache (dataset_cache.c) both copy through
 * these functions, so they give the same floats bit for bit. Reads refuse
 * non-finite inputs with one branch-free pass over the normalised floats.
 * No HDF5 call here: the copy runs outside the HDF5 lock, so loader
 * threads overlap.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "dataset_impl.h"

/* Per-channel normalisation: every split's samples are images of exactly
 * norm_channels channels. Sets the channel means and stds reads use. */
dt_status dt_ds_check_channels(struct dt_ds_file *ds)
{
    const struct dt_dataset_info *in = &ds->info;
    ds->nch = 1;
    ds->mean = &in->norm_mean;
    ds->sd = &in->norm_std;
    if (in->norm_channels == 0)
        return DT_OK;
    for (int i = 0; i < in->nsplits; i++) {
        const struct dt_split_info *si = &in->splits[i];
        int64_t c = 0, h, w;
        if (!dt_split_image_shape(si, &c, &h, &w))
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: attributes 'norm_channel_mean' and "
                                "'norm_channel_std' need image samples (H, W) or (C, H, W), but "
                                "the samples of split '%s' are not images",
                                in->path, si->name);
        if (c != in->norm_channels)
            return dt_set_error(DT_ERR_BAD_DATA,
                                "dataset %s: attributes 'norm_channel_mean' and "
                                "'norm_channel_std' have %d values, but split '%s' has %lld "
                                "channel(s); they need one value per channel",
                                in->path, in->norm_channels, si->name, (long long)c);
    }
    ds->nch = in->norm_channels;
    ds->mean = in->norm_channel_mean;
    ds->sd = in->norm_channel_std;
    return DT_OK;
}

/* The normalised value of every uint8 in every channel; all must be
 * finite where a split stores uint8 (v * 1e30 / 1e-10 is not). */
dt_status dt_ds_make_lut(struct dt_ds_file *ds)
{
    const struct dt_dataset_info *in = &ds->info;
    int u8 = 0;
    dt_status st;
    for (int i = 0; i < in->nsplits; i++)
        u8 |= in->splits[i].x_dtype == DT_U8;
    DT_CHECK(dt_calloc((size_t)ds->nch * 256, sizeof *ds->lut, "normalisation table",
                       (void **)&ds->lut));
    for (int c = 0; c < ds->nch; c++)
        for (int v = 0; v < 256; v++) {
            float *l = &ds->lut[c * 256 + v];
            *l = ((float)v * in->norm_scale - ds->mean[c]) / ds->sd[c];
            if (u8 && !isfinite(*l)) {
                char chan[32] = "";
                if (in->norm_channels)
                    snprintf(chan, sizeof chan, " in channel %d", c);
                return dt_set_error(DT_ERR_BAD_DATA,
                                    "dataset %s: normalisation turns the uint8 value %d%s into %g "
                                    "((v * %g - %g) / %g overflows float32)",
                                    in->path, v, chan, (double)*l, (double)in->norm_scale,
                                    (double)ds->mean[c], (double)ds->sd[c]);
            }
        }
out:
    return st;
}

/* Normalises one row of n stored values into dst: nch channel planes of
 * n / nch values each (one plane of n without per-channel attributes). */
void dt_ds_normalise_row(const struct dt_ds_file *ds, const struct dt_ds_split *sp, const void *src,
                         float *dst, int64_t n)
{
    int64_t plane = n / ds->nch;
    for (int c = 0; c < ds->nch; c++, dst += plane) {
        if (sp->x_mem_size == 1) {
            const unsigned char *s = (const unsigned char *)src + c * plane;
            const float *lut = ds->lut + c * 256;
            for (int64_t k = 0; k < plane; k++)
                dst[k] = lut[s[k]];
            continue;
        }
        const float *s = (const float *)src + c * plane;
        float scale = ds->info.norm_scale, mean = ds->mean[c], sd = ds->sd[c];
        for (int64_t k = 0; k < plane; k++)
            dst[k] = (s[k] * scale - mean) / sd;
    }
}

/* One output row of a crop: dst[x] for x in [x0, x1) from source row
 * `row` at column x + dx, or (flipped) w - 1 - x + dx; zero elsewhere. */
static void crop_row_u8(const unsigned char *row, const float *lut, float *dst, int64_t w,
                        int64_t x0, int64_t x1, int64_t dx, int flip)
{
    memset(dst, 0, (size_t)x0 * sizeof *dst);
    if (flip)
        for (int64_t x = x0; x < x1; x++)
            dst[x] = lut[row[w - 1 - x + dx]];
    else
        for (int64_t x = x0; x < x1; x++)
            dst[x] = lut[row[x + dx]];
    memset(dst + x1, 0, (size_t)(w - x1) * sizeof *dst);
}

static void crop_row_f32(const float *row, float scale, float mean, float sd, float *dst, int64_t w,
                         int64_t x0, int64_t x1, int64_t dx, int flip)
{
    memset(dst, 0, (size_t)x0 * sizeof *dst);
    if (flip)
        for (int64_t x = x0; x < x1; x++)
            dst[x] = (row[w - 1 - x + dx] * scale - mean) / sd;
    else
        for (int64_t x = x0; x < x1; x++)
            dst[x] = (row[x + dx] * scale - mean) / sd;
    memset(dst + x1, 0, (size_t)(w - x1) * sizeof *dst);
}

/* dt_ds_normalise_row through a crop and flip: output (c, y, x) is stored
 * (c, y + top - pad, x' + left - pad) with x' = w - 1 - x when flipped,
 * else x; outside the stored image it is 0. One pass over the output:
 * the columns that fall inside are worked out once per image, so the
 * inner loops have no bounds tests. */
void dt_ds_normalise_crop_flip(const struct dt_ds_file *ds, const struct dt_ds_split *sp,
                               const void *src, float *dst, const struct dt_ds_geom *g,
                               const struct dt_crop_flip *cf)
{
    int64_t h = g->h, w = g->w, dy = cf->top - g->pad, dx = cf->left - g->pad;
    /* inside: 0 <= x + dx < w, or 0 <= w - 1 - x + dx < w when flipped */
    int64_t x0 = cf->flip ? dx : -dx, x1 = cf->flip ? w + dx : w - dx;
    x0 = x0 < 0 ? 0 : x0 > w ? w : x0;
    x1 = x1 > w ? w : x1 < x0 ? x0 : x1;
    for (int64_t c = 0; c < g->c; c++) {
        int nc = ds->nch > 1 ? (int)c : 0;
        for (int64_t y = 0; y < h; y++, dst += w) {
            int64_t sy = y + dy;
            if (sy < 0 || sy >= h) {
                memset(dst, 0, (size_t)w * sizeof *dst);
                continue;
            }
            int64_t at = (c * h + sy) * w;
            if (sp->x_mem_size == 1)
                crop_row_u8((const unsigned char *)src + at, ds->lut + nc * 256, dst, w, x0, x1, dx,
                            cf->flip);
            else
                crop_row_f32((const float *)src + at, ds->info.norm_scale, ds->mean[nc], ds->sd[nc],
                             dst, w, x0, x1, dx, cf->flip);
        }
    }
}

/* Position of the first value of x[0..n) that is not finite, or -1. The
 * scan is one branch-free pass the compiler can vectorise (v * 0 is 0 for
 * a finite v, NaN for an infinite or NaN one); the position is looked for
 * only when there is one. */
int64_t dt_ds_first_nonfinite(const float *x, int64_t n)
{
    int bad = 0;
    for (int64_t k = 0; k < n; k++)
        bad |= !(x[k] * 0.0f == 0.0f);
    if (!bad) return -1;
    for (int64_t k = 0; k < n; k++)
        if (!isfinite(x[k])) return k;
    return -1;
}

/* The message for the non-finite input at position k of a read's output,
 * whose output row k / per_row is dataset row `row`, stored at `stored_row`
 * (in: the file's description, or the whole dataset's for a cache). */
dt_status dt_ds_nonfinite_row_error(const struct dt_dataset_info *in, const char *split,
                                    uint64_t row, const unsigned char *stored_row, const float *x,
                                    int64_t k, int64_t per_row)
{
    int64_t e = k % per_row;
    float stored;
    memcpy(&stored, stored_row + (size_t)e * sizeof(float), sizeof stored);
    if (!isfinite(stored))
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset %s: split '%s', row %llu: x holds %g at element %lld; "
                            "inputs must be finite",
                            in->path, split, (unsigned long long)row, (double)stored, (long long)e);
    return dt_set_error(DT_ERR_BAD_DATA,
                        "dataset %s: split '%s', row %llu: x holds %g at element %lld, which "
                        "normalisation ((v * %g - %g) / %g) turns into %g",
                        in->path, split, (unsigned long long)row, (double)stored, (long long)e,
                        (double)in->norm_scale, (double)in->norm_mean, (double)in->norm_std,
                        (double)x[k]);
}
