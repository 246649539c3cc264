/*
 * compare_models.c - test tool: compares two model.h5 files tensor by
 * tensor. Prints the largest difference relative to each tensor's largest
 * value and exits 0 when every tensor is within RELTOL (0 = bit-identical),
 * 1 otherwise, 2 on a read error.
 *   compare_models A.h5 B.h5 RELTOL
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/model_file.h"

static size_t numel(const struct dt_named_tensor *t) { return (size_t)dt_shape_numel(&t->shape); }

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: compare_models A.h5 B.h5 RELTOL\n");
        return 2;
    }
    double tol = atof(argv[3]), worst = 0;
    struct dt_named_tensor *a = NULL, *b = NULL;
    int na = 0, nb = 0, identical = 1;
    if (dt_model_file_load(argv[1], &a, &na) != DT_OK || dt_model_file_load(argv[2], &b, &nb) != DT_OK) {
        fprintf(stderr, "compare_models: %s\n", dt_last_error());
        return 2;
    }
    if (na != nb || na == 0) {
        fprintf(stderr, "compare_models: %d tensors vs %d\n", na, nb);
        return 1;
    }
    for (int i = 0; i < na; i++) {
        if (strcmp(a[i].name, b[i].name) != 0 || !dt_shape_equal(&a[i].shape, &b[i].shape)) {
            char sa[DT_MAX_DIMS * 21 + 8], sb[DT_MAX_DIMS * 21 + 8];
            fprintf(stderr, "compare_models: tensor %d is %s %s vs %s %s\n", i, a[i].name,
                    dt_shape_format(&a[i].shape, sa, sizeof sa), b[i].name,
                    dt_shape_format(&b[i].shape, sb, sizeof sb));
            return 1;
        }
        double scale = 0, diff = 0;
        for (size_t e = 0; e < numel(&a[i]); e++) {
            scale = fmax(scale, fabs(a[i].data[e]));
            diff = fmax(diff, fabs((double)a[i].data[e] - b[i].data[e]));
        }
        identical &= memcmp(a[i].data, b[i].data, numel(&a[i]) * sizeof(float)) == 0;
        double rel = scale > 0 ? diff / scale : diff;
        worst = fmax(worst, rel);
        printf("%-16s max rel diff %.3e\n", a[i].name, rel);
    }
    printf("worst %.3e (tolerance %.1e)%s\n", worst, tol, identical ? ", bit-identical" : "");
    dt_model_file_free(a, na);
    dt_model_file_free(b, nb);
    return (tol == 0 ? identical : worst <= tol) ? 0 : 1;
}
