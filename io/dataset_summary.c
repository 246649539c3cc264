/*
 * dataset_summary.c - the description of a dataset a person reads (what
 * dtrain data info prints): its files, size and format version, classes,
 * normalisation and splits, with per-class counts kept to one line.
 * Everything comes from what open validated; nothing is read from the
 * files again.
 */
#include <stdio.h>

#include "core/text.h"
#include "dataset_impl.h"

/* Per-class counts on one line: "6000 each" when equal, every count when
 * there are few classes, else the smallest and largest. */
static void print_counts(const struct dt_dataset_info *in, const struct dt_split_info *si,
                         FILE *out)
{
    int k = in->num_classes, lo = 0, hi = 0;
    for (int c = 1; c < k; c++) {
        if (si->class_counts[c] < si->class_counts[lo])
            lo = c;
        if (si->class_counts[c] > si->class_counts[hi])
            hi = c;
    }
    if (si->class_counts[lo] == si->class_counts[hi]) {
        fprintf(out, "    per class: %lld each\n", (long long)si->class_counts[lo]);
    } else if (k <= 32) {
        fprintf(out, "    per class:");
        for (int c = 0; c < k; c++)
            fprintf(out, " %d:%lld", c, (long long)si->class_counts[c]);
        fprintf(out, "\n");
    } else {
        fprintf(out, "    per class: min %lld (class %d), max %lld (class %d)\n",
                (long long)si->class_counts[lo], lo, (long long)si->class_counts[hi], hi);
    }
}

void dt_dataset_print(const dt_dataset_t *ds, FILE *out)
{
    const struct dt_dataset_info *in = &ds->info;
    char size[32];
    dt_format_bytes((uint64_t)in->file_bytes, size, sizeof size);
    fprintf(out, "dataset %s\n", in->path);
    if (ds->nfiles > 1) {
        fprintf(out, "  files (%d, rows numbered across them in this order):\n", ds->nfiles);
        for (int f = 0; f < ds->nfiles; f++) {
            const struct dt_dataset_info *fi = &ds->files[f]->info;
            dt_format_bytes((uint64_t)fi->file_bytes, size, sizeof size);
            fprintf(out, "    %s: %s,", fi->path, size);
            for (int i = 0; i < fi->nsplits; i++)
                fprintf(out, " %s %lld rows (from %lld)%s", fi->splits[i].name,
                        (long long)fi->splits[i].n, (long long)ds->first[i * (ds->nfiles + 1) + f],
                        i + 1 < fi->nsplits ? "," : "");
            fprintf(out, "\n");
        }
        dt_format_bytes((uint64_t)in->file_bytes, size, sizeof size);
        fprintf(out, "  total size: %s, format version %d\n", size, in->format_version);
    } else {
        fprintf(out, "  file size: %s, format version %d\n", size, in->format_version);
    }
    if (in->lm) {
        fprintf(out, "  language model: vocabulary %lld, tokenizer %s\n", (long long)in->vocab_size,
                in->tokenizer);
        for (int i = 0; i < in->nsplits; i++) {
            const struct dt_split_info *si = &in->splits[i];
            dt_format_bytes((uint64_t)si->x_bytes, size, sizeof size);
            fprintf(out, "  split %s: %lld tokens (%s), stored in %s", si->name,
                    (long long)si->tokens, dt_dtype_name(si->x_dtype), size);
            if (in->seq_len)
                fprintf(out, "; %lld windows of %lld + 1", (long long)si->n,
                        (long long)in->seq_len);
            fprintf(out, "\n");
        }
        return;
    }
    fprintf(out, "  classes (%d):", in->num_classes);
    for (int c = 0; c < in->num_classes; c++) {
        if (c == 32 && in->num_classes > 40) {
            fprintf(out, " ... (%d more)", in->num_classes - c);
            break;
        }
        fprintf(out, "%s %d=%s", c ? "," : "", c, in->class_names[c]);
    }
    if (in->norm_channels) {
        fprintf(out, "\n  normalisation per channel c: (v * %g - mean[c]) / std[c], mean",
                in->norm_scale);
        for (int c = 0; c < in->norm_channels && c < 16; c++)
            fprintf(out, "%s%g", c ? ", " : " ", in->norm_channel_mean[c]);
        fprintf(out, "%s; std", in->norm_channels > 16 ? ", ..." : "");
        for (int c = 0; c < in->norm_channels && c < 16; c++)
            fprintf(out, "%s%g", c ? ", " : " ", in->norm_channel_std[c]);
        fprintf(out, "%s\n", in->norm_channels > 16 ? ", ..." : "");
    } else {
        fprintf(out, "\n  normalisation: (v * %g - %g) / %g\n", in->norm_scale, in->norm_mean,
                in->norm_std);
    }
    for (int i = 0; i < in->nsplits; i++) {
        const struct dt_split_info *si = &in->splits[i];
        dt_format_bytes((uint64_t)si->x_bytes, size, sizeof size);
        fprintf(out, "  split %s: %lld samples of ", si->name, (long long)si->n);
        for (int d = 0; d < si->ndim; d++)
            fprintf(out, "%s%lld", d ? "x" : "", (long long)si->shape[d]);
        fprintf(out, ", x %s, y %s, x stored in %s\n", dt_dtype_name(si->x_dtype),
                dt_dtype_name(si->y_dtype), size);
        int64_t c, h, w;
        if (dt_split_image_shape(si, &c, &h, &w))
            fprintf(out, "    images, channels first: C x H x W = %lldx%lldx%lld\n", (long long)c,
                    (long long)h, (long long)w);
        print_counts(in, si, out);
    }
}
