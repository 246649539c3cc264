/*
 * bench_h5read.c - five ways of reading a batch of random rows of an HDF5
 * dataset's x, the figures behind three choices of the dataset reader
 * (io/dataset_rows.c, io/dataset_split.c):
 *
 *   (a) one H5Dread per run of consecutive rows, the memory space shaped
 *       like the file selection (run x row shape), chunk cache off: the
 *       reader's way;
 *   (b) one H5Dread of the union of the runs' hyperslabs (H5S_SELECT_OR);
 *   (c) one H5Dread of a point selection of every element;
 *   (d) (a) with HDF5's default dataset access (chunk cache on);
 *   (e) (a) with a flat 1-D memory space of the same size.
 *
 *   bench_h5read FILE SPLIT BATCH ROUNDS
 *
 * reads /SPLIT/x of FILE (read-only, plain serial HDF5). Each round draws
 * BATCH distinct random rows (a fixed seed, so every run reads the same
 * rows), sorts them as the reader does, and reads them once with every
 * variant, starting at a different variant each round so that a busy
 * machine slows them alike. Each variant opens x with its own dataset
 * access list before its read and closes it after, outside the timing: a
 * dataset open twice in one file shares one chunk cache, so two handles
 * could not hold two settings. The timing covers building the selections
 * and the reads; (c)'s coordinate list is filled beforehand. Every
 * variant's bytes are compared with (a)'s, and the program exits 1 if any
 * differ, so no figure is the time of a wrong read. x is read once whole,
 * in blocks, before the first round, so the page cache is warm.
 *
 * Prints the HDF5 version, x's shape, dtype, layout and chunking, then one
 * line per variant: mean ms per batch and the ratio to (a).
 */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

#define MAX_RANK 8
#define NVARIANTS 5
#define SEED 20261203u
#define WARM_BLOCK_BYTES ((size_t)8 << 20) /* rows read per block of the warm-up */
/* The reader's setting for unfiltered chunked x (io/dataset_split.c):
 * this many slots and no bytes, which turns the cache off. */
#define READER_CACHE_SLOTS 12421

enum variant { V_RUNS, V_UNION, V_POINTS, V_CACHE, V_FLAT };

static const char *variant_name[NVARIANTS] = {
    "(a) one read per run (the reader)", "(b) one read of the union of the runs",
    "(c) one read of a point selection", "(d) (a) with the chunk cache on",
    "(e) (a) with a flat 1-D memory space"};

/* What a batch's reads need: x's geometry and the current batch. */
struct geom {
    int rank;               /* of x: rows, then the row shape */
    hsize_t dims[MAX_RANK]; /* x's shape */
    hsize_t row_elems;      /* elements in one row */
    size_t row_bytes;       /* bytes of one row in memory */
    hid_t mem_type;         /* the type rows are read as */
    const uint64_t *rows;   /* sorted unique rows of the batch */
    size_t m;               /* how many */
    size_t coord_cap;       /* hsize_t's allocated for (c)'s coordinates */
    hsize_t *coords;        /* (c): every element of the batch, in row order */
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* batch distinct rows of [0, n): a partial Fisher-Yates shuffle of perm,
 * the way an epoch's permutation yields a batch; sorted into out. */
static void draw_rows(uint64_t *perm, uint64_t n, size_t batch, uint64_t *state, uint64_t *out)
{
    for (size_t i = 0; i < batch; i++) {
        uint64_t j = i + splitmix64(state) % (n - i);
        uint64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
    qsort(out, batch, sizeof *out, u64_cmp);
}

/* A memory space of `rows` rows: shaped like the file selection, or flat. */
static hid_t mem_space(const struct geom *g, hsize_t rows, int flat)
{
    hsize_t count[MAX_RANK];
    if (flat) {
        count[0] = rows * g->row_elems;
        return H5Screate_simple(1, count, NULL);
    }
    count[0] = rows;
    for (int d = 1; d < g->rank; d++)
        count[d] = g->dims[d];
    return H5Screate_simple(g->rank, count, NULL);
}

/* Selects rows [row, row + count) in fs, set or or-ed into the selection. */
static herr_t select_rows(const struct geom *g, hid_t fs, H5S_seloper_t op, uint64_t row,
                          hsize_t count)
{
    hsize_t start[MAX_RANK] = {0}, cnt[MAX_RANK];
    start[0] = row;
    cnt[0] = count;
    for (int d = 1; d < g->rank; d++)
        cnt[d] = g->dims[d];
    return H5Sselect_hyperslab(fs, op, start, NULL, cnt, NULL);
}

/* The length of the run of consecutive rows that starts at rows[i]. */
static size_t run_len(const struct geom *g, size_t i)
{
    size_t j = i + 1;
    while (j < g->m && g->rows[j] == g->rows[j - 1] + 1)
        j++;
    return j - i;
}

/* (a), (d), (e): one read per run. */
static int read_runs(const struct geom *g, hid_t x, int flat, unsigned char *buf)
{
    hid_t fs = H5Dget_space(x);
    int rc = fs < 0;
    for (size_t i = 0; i < g->m && !rc;) {
        size_t len = run_len(g, i);
        hid_t ms = mem_space(g, len, flat);
        rc = ms < 0 || select_rows(g, fs, H5S_SELECT_SET, g->rows[i], len) < 0 ||
             H5Dread(x, g->mem_type, ms, fs, H5P_DEFAULT, buf + i * g->row_bytes) < 0;
        if (ms >= 0) H5Sclose(ms);
        i += len;
    }
    if (fs >= 0) H5Sclose(fs);
    return rc;
}

/* (b): the runs' hyperslabs or-ed into one selection, one read. */
static int read_union(const struct geom *g, hid_t x, unsigned char *buf)
{
    hid_t fs = H5Dget_space(x), ms = mem_space(g, g->m, 0);
    int rc = fs < 0 || ms < 0;
    for (size_t i = 0; i < g->m && !rc;) {
        size_t len = run_len(g, i);
        rc = select_rows(g, fs, i ? H5S_SELECT_OR : H5S_SELECT_SET, g->rows[i], len) < 0;
        i += len;
    }
    if (!rc) rc = H5Dread(x, g->mem_type, ms, fs, H5P_DEFAULT, buf) < 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return rc;
}

/* Fills (c)'s coordinates, every element of every row in row order (the
 * order a point selection returns them in); outside the timing. */
static int fill_coords(struct geom *g)
{
    size_t need = g->m * (size_t)g->row_elems * (size_t)g->rank;
    if (need > g->coord_cap) {
        free(g->coords);
        g->coords = malloc(need * sizeof *g->coords);
        if (!g->coords) return 1;
        g->coord_cap = need;
    }
    hsize_t *c = g->coords;
    for (size_t i = 0; i < g->m; i++)
        for (hsize_t e = 0; e < g->row_elems; e++) {
            hsize_t rest = e;
            c[0] = g->rows[i];
            for (int d = g->rank - 1; d >= 1; d--) {
                c[d] = rest % g->dims[d];
                rest /= g->dims[d];
            }
            c += g->rank;
        }
    return 0;
}

/* (c): a point selection of every element, one read. */
static int read_points(const struct geom *g, hid_t x, unsigned char *buf)
{
    hid_t fs = H5Dget_space(x), ms = mem_space(g, g->m, 0);
    int rc = fs < 0 || ms < 0 ||
             H5Sselect_elements(fs, H5S_SELECT_SET, g->m * (size_t)g->row_elems, g->coords) < 0 ||
             H5Dread(x, g->mem_type, ms, fs, H5P_DEFAULT, buf) < 0;
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return rc;
}

/* Opens x with the variant's dataset access: the reader's (cache off) or
 * HDF5's default (d). */
static hid_t open_x(hid_t file, const char *path, int variant)
{
    if (variant == V_CACHE) return H5Dopen2(file, path, H5P_DEFAULT);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    if (dapl < 0) return -1;
    hid_t x = -1;
    if (H5Pset_chunk_cache(dapl, READER_CACHE_SLOTS, 0, 1.0) >= 0) x = H5Dopen2(file, path, dapl);
    H5Pclose(dapl);
    return x;
}

/* One timed read of the batch with one variant; seconds, or -1. */
static double timed_read(hid_t file, const char *path, struct geom *g, int v, unsigned char *buf)
{
    hid_t x = open_x(file, path, v);
    if (x < 0) return -1;
    memset(buf, 0xA0 + v, g->m * g->row_bytes); /* a fill of its own per variant */
    double t0 = dt_now();
    int rc = v == V_UNION    ? read_union(g, x, buf)
             : v == V_POINTS ? read_points(g, x, buf)
                             : read_runs(g, x, v == V_FLAT, buf);
    double t = dt_now() - t0;
    H5Dclose(x);
    return rc ? -1 : t;
}

/* Reads all of x in blocks, so that the page cache holds it. */
static int warm_up(hid_t file, const char *path, struct geom *g)
{
    hid_t x = open_x(file, path, V_RUNS);
    size_t block = WARM_BLOCK_BYTES / g->row_bytes + 1;
    unsigned char *buf = malloc(block * g->row_bytes);
    hid_t fs = x >= 0 ? H5Dget_space(x) : -1;
    int rc = !buf || fs < 0;
    for (hsize_t r = 0; r < g->dims[0] && !rc; r += block) {
        hsize_t len = g->dims[0] - r < block ? g->dims[0] - r : block;
        hid_t ms = mem_space(g, len, 0);
        rc = ms < 0 || select_rows(g, fs, H5S_SELECT_SET, r, len) < 0 ||
             H5Dread(x, g->mem_type, ms, fs, H5P_DEFAULT, buf) < 0;
        if (ms >= 0) H5Sclose(ms);
    }
    if (fs >= 0) H5Sclose(fs);
    if (x >= 0) H5Dclose(x);
    free(buf);
    return rc;
}

/* x's shape, type and layout into g, and printed. */
static int describe(hid_t file, const char *path, struct geom *g)
{
    int rc = 1;
    hid_t x = H5Dopen2(file, path, H5P_DEFAULT), fs = -1, t = -1, dcpl = -1, dapl = -1;
    if (x < 0 || (fs = H5Dget_space(x)) < 0 || (t = H5Dget_type(x)) < 0 ||
        (dcpl = H5Dget_create_plist(x)) < 0 || (dapl = H5Dget_access_plist(x)) < 0)
        goto out;
    g->rank = H5Sget_simple_extent_ndims(fs);
    if (g->rank < 2 || g->rank > MAX_RANK) {
        fprintf(stderr, "bench_h5read: %s has rank %d; 2 to %d supported\n", path, g->rank,
                MAX_RANK);
        goto out;
    }
    H5Sget_simple_extent_dims(fs, g->dims, NULL);
    H5T_class_t cls = H5Tget_class(t);
    size_t size = H5Tget_size(t);
    int u8 = cls == H5T_INTEGER && size == 1 && H5Tget_sign(t) == H5T_SGN_NONE;
    if (!u8 && !(cls == H5T_FLOAT && (size == 2 || size == 4))) {
        fprintf(stderr, "bench_h5read: %s is neither uint8 nor float16/32\n", path);
        goto out;
    }
    /* as the reader: uint8 read as bytes, floats as float */
    g->mem_type = u8 ? H5T_NATIVE_UCHAR : H5T_NATIVE_FLOAT;
    g->row_elems = 1;
    for (int d = 1; d < g->rank; d++)
        g->row_elems *= g->dims[d];
    g->row_bytes = (size_t)g->row_elems * (u8 ? 1 : sizeof(float));

    printf("%s: ", path);
    for (int d = 0; d < g->rank; d++)
        printf("%s%llu", d ? " x " : "", (unsigned long long)g->dims[d]);
    printf(", %s\n", u8 ? "uint8" : size == 2 ? "float16 (read as float)" : "float32");
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t chunk[MAX_RANK];
        H5Pget_chunk(dcpl, g->rank, chunk);
        hsize_t cb = size;
        printf("layout: chunked ");
        for (int d = 0; d < g->rank; d++) {
            printf("%s%llu", d ? " x " : "", (unsigned long long)chunk[d]);
            cb *= chunk[d];
        }
        printf(" (%llu bytes a chunk), %d filter(s)\n", (unsigned long long)cb,
               H5Pget_nfilters(dcpl));
        size_t slots = 0, bytes = 0;
        double w0 = 0;
        H5Pget_chunk_cache(dapl, &slots, &bytes, &w0);
        printf("default chunk cache (d): %zu slots, %zu bytes; the reader's (others): %d "
               "slots, 0 bytes\n",
               slots, bytes, READER_CACHE_SLOTS);
    } else {
        printf("layout: %s, not chunked: (d), the chunk cache, measures nothing here\n",
               H5Pget_layout(dcpl) == H5D_CONTIGUOUS ? "contiguous" : "compact");
    }
    rc = 0;
out:
    if (dapl >= 0) H5Pclose(dapl);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (t >= 0) H5Tclose(t);
    if (fs >= 0) H5Sclose(fs);
    if (x >= 0) H5Dclose(x);
    return rc;
}

static void report(const double *total, int rounds, double runs)
{
    printf("%-40s %10s %8s\n", "variant", "ms/batch", "ratio");
    for (int v = 0; v < NVARIANTS; v++)
        printf("%-40s %10.3f %8.2f\n", variant_name[v], 1e3 * total[v] / rounds,
               total[v] / total[V_RUNS]);
    printf("mean runs per batch: %.1f\n", runs / rounds);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: bench_h5read FILE SPLIT BATCH ROUNDS\n");
        return 2;
    }
    const char *file_path = argv[1];
    char path[512];
    snprintf(path, sizeof path, "/%s/x", argv[2]);
    long batch = atol(argv[3]), rounds = atol(argv[4]);
    if (batch < 1 || rounds < 1) {
        fprintf(stderr, "bench_h5read: BATCH and ROUNDS must be positive\n");
        return 2;
    }
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    printf("HDF5 %u.%u.%u\n", maj, min, rel);

    int rc = 1;
    struct geom g = {0};
    uint64_t *perm = NULL, *rows = NULL;
    unsigned char *buf[NVARIANTS] = {0};
    hid_t file = H5Fopen(file_path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0 || describe(file, path, &g)) goto out;
    if ((uint64_t)batch > g.dims[0]) {
        fprintf(stderr, "bench_h5read: BATCH %ld is more than the %llu rows\n", batch,
                (unsigned long long)g.dims[0]);
        goto out;
    }
    perm = malloc(g.dims[0] * sizeof *perm);
    rows = malloc((size_t)batch * sizeof *rows);
    for (int v = 0; v < NVARIANTS; v++)
        if (!(buf[v] = malloc((size_t)batch * g.row_bytes))) goto out;
    if (!perm || !rows || warm_up(file, path, &g)) goto out;
    for (uint64_t i = 0; i < g.dims[0]; i++)
        perm[i] = i;
    printf("batch: %ld random rows, sorted; %ld rounds, the variants in turn\n", batch, rounds);

    double total[NVARIANTS] = {0}, runs = 0;
    uint64_t state = SEED;
    for (long r = 0; r < rounds; r++) {
        draw_rows(perm, g.dims[0], (size_t)batch, &state, rows);
        g.rows = rows;
        g.m = (size_t)batch; /* distinct draws: nothing to de-duplicate */
        for (size_t i = 0; i < g.m; i += run_len(&g, i))
            runs++;
        if (fill_coords(&g)) goto out;
        for (int k = 0; k < NVARIANTS; k++) {
            int v = (int)((r + k) % NVARIANTS);
            double t = timed_read(file, path, &g, v, buf[v]);
            if (t < 0) {
                fprintf(stderr, "bench_h5read: %s failed in round %ld\n", variant_name[v], r);
                goto out;
            }
            total[v] += t;
        }
        for (int v = 1; v < NVARIANTS; v++)
            if (memcmp(buf[v], buf[V_RUNS], g.m * g.row_bytes) != 0) {
                fprintf(stderr, "bench_h5read: %s read other bytes than (a) in round %ld\n",
                        variant_name[v], r);
                goto out;
            }
    }
    report(total, (int)rounds, runs);
    printf("every variant read the same bytes as (a)\n");
    rc = 0;
out:
    for (int v = 0; v < NVARIANTS; v++)
        free(buf[v]);
    free(g.coords);
    free(rows);
    free(perm);
    if (file >= 0) H5Fclose(file);
    return rc;
}
