/*
 * make_h5.c - writes small float32 dtrain datasets for the command-line
 * tests, with chosen values planted in them (a NaN, an infinity, a value
 * large enough to overflow a model's outputs) and splits of any size,
 * including empty ones.
 *
 *   make_h5 OUT.h5 NTRAIN NTEST DIM CLASSES [from=TRAIN_ROW,TEST_ROW] [SPLIT:ROW:COL=VALUE ...]
 *
 * Inputs are a fixed pseudo-random pattern in [0, 1) from which the label
 * is learnable (the class whose block of inputs has the largest sum);
 * normalisation is the identity. VALUE is anything strtof reads ("nan",
 * "inf", "1e30"). from= makes the file's rows those numbered from
 * TRAIN_ROW and TEST_ROW in a larger file of the same pattern, so a file
 * can be cut into parts that together hold the same rows.
 */
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float value_at(uint64_t row, uint64_t col, int test)
{
    uint64_t z = (row * 0x9E3779B97F4A7C15ull) ^ (col * 0xBF58476D1CE4E5B9ull) ^ (uint64_t)test;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 29;
    return (float)(z >> 40) / (float)(1u << 24);
}

static int label_of(const float *x, int dim, int classes)
{
    int best = 0;
    double best_sum = -1;
    for (int c = 0; c < classes; c++) {
        double sum = 0;
        for (int d = c; d < dim; d += classes)
            sum += x[d];
        if (sum > best_sum) {
            best_sum = sum;
            best = c;
        }
    }
    return best;
}

static int put_attr(hid_t f, const char *name, hid_t type, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
    int ok = a >= 0 && H5Awrite(a, type, v) >= 0;
    H5Aclose(a);
    H5Sclose(s);
    return ok;
}

static int put_str(hid_t f, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    int ok = put_attr(f, name, t, v);
    H5Tclose(t);
    return ok;
}

static int write_split(hid_t f, const char *name, int test, hsize_t first, hsize_t n, int dim,
                       int classes, int nplant, char **plant)
{
    float *x = calloc(n * (size_t)dim + 1, sizeof *x);
    int32_t *y = calloc(n + 1, sizeof *y);
    if (!x || !y)
        return 0;
    for (hsize_t r = 0; r < n; r++) {
        for (int d = 0; d < dim; d++)
            x[r * (size_t)dim + d] = value_at(first + r, (uint64_t)d, test);
        y[r] = label_of(x + r * (size_t)dim, dim, classes);
    }
    for (int i = 0; i < nplant; i++) {
        char split[64];
        unsigned long long row, col;
        char val[64];
        if (sscanf(plant[i], "%63[^:]:%llu:%llu=%63s", split, &row, &col, val) != 4) {
            fprintf(stderr, "make_h5: bad plant '%s' (SPLIT:ROW:COL=VALUE)\n", plant[i]);
            return 0;
        }
        if (strcmp(split, name) == 0 && row < n && col < (unsigned long long)dim)
            x[row * (size_t)dim + col] = strtof(val, NULL);
    }
    hsize_t xd[2] = {n, (hsize_t)dim}, yd[1] = {n};
    hid_t g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t xs = H5Screate_simple(2, xd, NULL), ys = H5Screate_simple(1, yd, NULL);
    hid_t xds = H5Dcreate2(g, "x", H5T_IEEE_F32LE, xs, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t yds = H5Dcreate2(g, "y", H5T_STD_I32LE, ys, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok = xds >= 0 && yds >= 0 &&
             (n == 0 || (H5Dwrite(xds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0 &&
                         H5Dwrite(yds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, y) >= 0));
    H5Dclose(xds);
    H5Dclose(yds);
    H5Sclose(xs);
    H5Sclose(ys);
    H5Gclose(g);
    free(x);
    free(y);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: make_h5 OUT.h5 NTRAIN NTEST DIM CLASSES [from=TRAIN_ROW,TEST_ROW] "
                        "[SPLIT:ROW:COL=VALUE ...]\n");
        return 2;
    }
    hsize_t ntrain = strtoull(argv[2], NULL, 10), ntest = strtoull(argv[3], NULL, 10);
    int dim = atoi(argv[4]), classes = atoi(argv[5]), version = 1;
    float one = 1, zero = 0;
    unsigned long long from_train = 0, from_test = 0;
    int nplant = argc - 6;
    char **plant = argv + 6;
    if (nplant > 0 && strncmp(plant[0], "from=", 5) == 0) {
        if (sscanf(plant[0], "from=%llu,%llu", &from_train, &from_test) != 2) {
            fprintf(stderr, "make_h5: bad '%s' (from=TRAIN_ROW,TEST_ROW)\n", plant[0]);
            return 2;
        }
        nplant--;
        plant++;
    }
    hid_t f = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int ok = f >= 0 && put_str(f, "dtrain_format", "dataset") &&
             put_attr(f, "format_version", H5T_NATIVE_INT, &version) &&
             put_attr(f, "num_classes", H5T_NATIVE_INT, &classes) &&
             put_attr(f, "norm_scale", H5T_NATIVE_FLOAT, &one) &&
             put_attr(f, "norm_mean", H5T_NATIVE_FLOAT, &zero) &&
             put_attr(f, "norm_std", H5T_NATIVE_FLOAT, &one) &&
             write_split(f, "train", 0, from_train, ntrain, dim, classes, nplant, plant) &&
             write_split(f, "test", 1, from_test, ntest, dim, classes, nplant, plant);
    if (f >= 0 && H5Fclose(f) < 0)
        ok = 0;
    if (!ok)
        fprintf(stderr, "make_h5: cannot write %s\n", argv[1]);
    return ok ? 0 : 1;
}
