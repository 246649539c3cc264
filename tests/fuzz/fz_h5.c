/*
 * fz_h5.c - the hostile HDF5 builder (see fz_h5.h).
 *
 * Every choice reads one byte (or a few) from the input; byte 0 is always
 * the well-formed choice. Writes are bounded (see writable): a huge
 * declared dataset is never written, so it costs neither time nor disk.
 */
#define _GNU_SOURCE
#include "fz_h5.h"

#include <stdlib.h>
#include <string.h>

#include "io/hdf5_lock.h"

#define WRITE_CAP ((uint64_t)1 << 18)  /* bytes written into one dataset, at most */
#define MAX_WRITTEN_CHUNKS 4096        /* chunks a write may touch, at most */
#define MAX_CHUNKS ((uint64_t)1 << 20) /* above: dim 0 unlimited (a sparse chunk index) */
#define STR_MAX 200                    /* bytes of a string taken from the input */
#define RAW_MAX 256                    /* bytes of raw values taken from the input */
#define ARRAY_MAX 300                  /* elements of an attribute array */

void fz_h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

hid_t fz_h5_create(struct fz_in *in, const char *path)
{
    static const H5F_libver_t low[] = {H5F_LIBVER_EARLIEST, H5F_LIBVER_V18, H5F_LIBVER_LATEST};
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, low[fz_pick(in, 3)], H5F_LIBVER_LATEST);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    FZ_REQUIRE(f >= 0, "cannot create %s", path);
    return f;
}

void fz_h5_close(hid_t file)
{
    FZ_REQUIRE(H5Fget_obj_count(file, H5F_OBJ_ALL) == 1, "the builder left objects open");
    FZ_REQUIRE(H5Fclose(file) >= 0, "cannot close a file the builder made");
}

long fz_h5_open_objects(void)
{
    return (long)H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
}

hid_t fz_h5_f16(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

/* ---- types ------------------------------------------------------------------ */

static hid_t string_type(int vlen, size_t size)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, vlen ? H5T_VARIABLE : (size ? size : 1));
    H5Tset_cset(t, vlen ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
    return t;
}

/* A number type, or something that is not one. 0: a copy of good. */
static hid_t pick_type(struct fz_in *in, hid_t good)
{
    hid_t t;
    hsize_t two = 2;
    unsigned char v = 0;
    switch (fz_u8(in) % 24) {
    case 1:
        return H5Tcopy(H5T_STD_U8LE);
    case 2:
        return H5Tcopy(H5T_STD_I8LE);
    case 3:
        return H5Tcopy(H5T_STD_U16BE);
    case 4:
        return H5Tcopy(H5T_STD_I32LE);
    case 5:
        return H5Tcopy(H5T_STD_I64LE);
    case 6:
        return H5Tcopy(H5T_STD_U64LE);
    case 7:
        return fz_h5_f16();
    case 8:
        return H5Tcopy(H5T_IEEE_F32LE);
    case 9:
        return H5Tcopy(H5T_IEEE_F32BE);
    case 10:
        return H5Tcopy(H5T_IEEE_F64LE);
    case 11:
        return string_type(0, 8);
    case 12:
        return string_type(1, 0);
    case 13:
        t = H5Tcreate(H5T_COMPOUND, 1);
        H5Tinsert(t, "v", 0, H5T_STD_U8LE);
        return t;
    case 14:
        t = H5Tenum_create(H5T_STD_U8LE);
        H5Tenum_insert(t, "zero", &v);
        v = 1;
        H5Tenum_insert(t, "one", &v);
        return t;
    case 15:
        t = H5Tcreate(H5T_OPAQUE, 1);
        H5Tset_tag(t, "fuzz");
        return t;
    case 16:
        return H5Tcopy(H5T_STD_B8LE);
    case 17:
        return H5Tarray_create2(H5T_STD_U8LE, 1, &two);
    case 18:
        return H5Tvlen_create(H5T_STD_U8LE);
    case 19: /* bfloat16: a 2-byte float of another layout */
        t = H5Tcopy(H5T_IEEE_F32LE);
        H5Tset_fields(t, 15, 7, 8, 0, 7);
        H5Tset_size(t, 2);
        H5Tset_ebias(t, 127);
        return t;
    case 20: /* a 3-byte unsigned integer */
        t = H5Tcopy(H5T_STD_U32LE);
        H5Tset_precision(t, 24);
        H5Tset_size(t, 3);
        return t;
    case 21:
        return H5Tcopy(H5T_NATIVE_LDOUBLE);
    case 22: /* 12 significant bits inside 16 */
        t = H5Tcopy(H5T_STD_I16LE);
        H5Tset_precision(t, 12);
        H5Tset_offset(t, 2);
        return t;
    default:
        return H5Tcopy(good);
    }
}

/* Values for a type: `size` bytes that HDF5 can write with it unconverted. */
static int raw_writable(hid_t t)
{
    H5T_class_t c = H5Tget_class(t);
    return c != H5T_VLEN && c != H5T_REFERENCE && !(c == H5T_STRING && H5Tis_variable_str(t) > 0);
}

/* n bytes cycling through src (zeros when src is NULL or empty). malloc'd. */
static void *cycle(const void *src, size_t srclen, size_t n)
{
    unsigned char *b = calloc(n ? n : 1, 1);
    FZ_REQUIRE(b, "out of memory");
    for (size_t i = 0; src && srclen && i < n; i++)
        b[i] = ((const unsigned char *)src)[i % srclen];
    return b;
}

/* ---- attributes ------------------------------------------------------------- */

static void put_attr(hid_t obj, const char *name, hid_t ftype, hid_t space, hid_t mtype,
                     const void *buf)
{
    hid_t a = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        if (buf) H5Awrite(a, mtype, buf);
        H5Aclose(a);
    }
}

/* A dataspace: scalar (n < 0), 1-D of n, 2-D of 2 x n, or null. */
static hid_t make_space(int shape, hsize_t n)
{
    hsize_t d2[2] = {2, n};
    switch (shape) {
    case 1:
        return H5Screate_simple(1, &n, NULL);
    case 2:
        return H5Screate_simple(2, d2, NULL);
    case 3:
        return H5Screate(H5S_NULL);
    default:
        return H5Screate(H5S_SCALAR);
    }
}

static hssize_t space_points(hid_t s)
{
    return H5Sget_simple_extent_type(s) == H5S_NULL ? 0 : H5Sget_simple_extent_npoints(s);
}

/* Strings attribute: the values (or hostile ones), vlen or fixed. */
static void put_strings(struct fz_in *in, hid_t obj, const struct fz_attr *a, int vlen, int shape,
                        hsize_t n, int hostile)
{
    hid_t space = make_space(shape, n);
    hssize_t count = space_points(space);
    char(*own)[STR_MAX + 1] = calloc((size_t)(count ? count : 1), sizeof *own);
    const char **ptrs = calloc((size_t)(count ? count : 1), sizeof *ptrs);
    size_t longest = 1;
    FZ_REQUIRE(own && ptrs, "out of memory");
    for (hssize_t i = 0; i < count; i++) {
        int k = a->nstrs ? (int)(i % a->nstrs) : 0;
        if (hostile)
            fz_str(in, own[i], sizeof own[i]);
        else
            snprintf(own[i], sizeof own[i], "%s", a->strs[k]);
        ptrs[i] = own[i];
        if (strlen(own[i]) + 1 > longest) longest = strlen(own[i]) + 1;
    }
    if (vlen) {
        hid_t t = string_type(1, 0);
        put_attr(obj, a->name, t, space, t, ptrs);
        H5Tclose(t);
    } else {
        /* Fixed strings, NUL-padded (or space-padded, or cut short of the
         * terminator, as the input says). */
        unsigned pad = fz_pick(in, 3);
        size_t size = pad == 2 && longest > 1 ? longest - 1 : longest;
        hid_t t = string_type(0, size);
        if (pad == 1) H5Tset_strpad(t, H5T_STR_SPACEPAD);
        char *flat = calloc((size_t)(count ? count : 1), size);
        FZ_REQUIRE(flat, "out of memory");
        for (hssize_t i = 0; i < count; i++)
            memcpy(flat + (size_t)i * size, own[i], strnlen(own[i], size));
        put_attr(obj, a->name, t, space, t, flat);
        free(flat);
        H5Tclose(t);
    }
    H5Sclose(space);
    free(ptrs);
    free(own);
}

/* A number (of a's kind, or hostile) into a buffer for mem type *mt. */
static void number_value(struct fz_in *in, const struct fz_attr *a, int hostile, void *buf,
                         hid_t *mt)
{
    if (a->kind == FZ_ATTR_FLOAT) {
        double v = hostile ? fz_f64(in, a->f) : a->f;
        memcpy(buf, &v, sizeof v);
        *mt = H5T_NATIVE_DOUBLE;
    } else if (a->kind == FZ_ATTR_UINT) {
        uint64_t v = hostile ? (uint64_t)fz_i64(in, (int64_t)a->u) : a->u;
        memcpy(buf, &v, sizeof v);
        *mt = H5T_NATIVE_UINT64;
    } else {
        int64_t v = hostile ? fz_i64(in, a->i) : a->i;
        memcpy(buf, &v, sizeof v);
        *mt = H5T_NATIVE_INT64;
    }
}

static void put_numbers(struct fz_in *in, hid_t obj, const struct fz_attr *a, hid_t ftype,
                        int shape, hsize_t n, int hostile)
{
    hid_t space = make_space(shape, n), mt = H5T_NATIVE_INT64;
    hssize_t count = space_points(space);
    uint64_t *vals = calloc((size_t)(count ? count : 1), sizeof *vals);
    FZ_REQUIRE(vals, "out of memory");
    for (hssize_t i = 0; i < (count ? count : 1); i++)
        number_value(in, a, hostile, &vals[i], &mt);
    put_attr(obj, a->name, ftype, space, mt, vals);
    free(vals);
    H5Sclose(space);
}

/* Raw bytes under a type that is not what the reader expects. */
static void put_raw(struct fz_in *in, hid_t obj, const char *name)
{
    const uint8_t *raw;
    hid_t t = pick_type(in, H5T_STD_U8LE);
    hid_t s = make_space(fz_pick(in, 4), fz_u8(in) % 4);
    size_t rawlen = fz_blob(in, RAW_MAX, &raw);
    if (raw_writable(t)) {
        size_t n = H5Tget_size(t) * (size_t)space_points(s);
        void *buf = cycle(raw, rawlen, n);
        put_attr(obj, name, t, s, t, buf);
        free(buf);
    } else {
        put_attr(obj, name, t, s, t, NULL);
    }
    H5Sclose(s);
    H5Tclose(t);
}

void fz_h5_attr(struct fz_in *in, hid_t obj, const struct fz_attr *a)
{
    int str = a->kind == FZ_ATTR_STR;
    int shape = str && a->nstrs ? 1 : 0;
    hsize_t n = (hsize_t)a->nstrs;
    hid_t t;
    unsigned code = fz_u8(in) % 10;
    switch (code) {
    case 1:
        return; /* left out */
    case 2:     /* the other encoding: vlen <-> fixed, another number type */
        if (str) {
            put_strings(in, obj, a, !a->vlen, shape, n, 0);
        } else {
            t = pick_type(in, a->type);
            put_numbers(in, obj, a, t, 0, 0, 0);
            H5Tclose(t);
        }
        return;
    case 3: /* hostile values */
        if (str)
            put_strings(in, obj, a, a->vlen, shape, n, 1);
        else
            put_numbers(in, obj, a, a->type, 0, 0, 1);
        return;
    case 4: /* the other class: a number for a string, a string for a number */
        if (str) {
            struct fz_attr num = {.name = a->name, .kind = FZ_ATTR_INT, .i = 1};
            put_numbers(in, obj, &num, H5T_STD_I64LE, shape, n, 1);
        } else {
            static const char *const one[] = {"1"};
            struct fz_attr s = {.name = a->name, .kind = FZ_ATTR_STR, .strs = one, .vlen = 1};
            put_strings(in, obj, &s, fz_pick(in, 2), 0, 0, fz_pick(in, 2));
        }
        return;
    case 5: /* a 1-D array of any length, empty included */
    case 6: /* a 2-D array */
    case 7: /* a null dataspace */
        shape = (int)(code - 4);
        n = fz_u16(in) % ARRAY_MAX;
        if (str)
            put_strings(in, obj, a, a->vlen, shape, n, fz_pick(in, 2));
        else
            put_numbers(in, obj, a, a->type, shape, n, fz_pick(in, 2));
        return;
    case 8:
        put_raw(in, obj, a->name);
        return;
    case 9: /* big-endian numbers; strings of another padding */
        if (str) {
            put_strings(in, obj, a, 0, shape, n, 0);
        } else {
            t = H5Tcopy(a->type);
            H5Tset_order(t, H5Tget_order(t) == H5T_ORDER_BE ? H5T_ORDER_LE : H5T_ORDER_BE);
            put_numbers(in, obj, a, t, 0, 0, 0);
            H5Tclose(t);
        }
        return;
    default:
        if (str)
            put_strings(in, obj, a, a->vlen, shape, n, 0);
        else
            put_numbers(in, obj, a, a->type, 0, 0, 0);
    }
}

void fz_h5_junk_attrs(struct fz_in *in, hid_t obj)
{
    unsigned n = fz_pick(in, 4);
    for (unsigned i = 0; i < n; i++) {
        char name[STR_MAX + 1];
        fz_str(in, name, sizeof name);
        if (!name[0]) snprintf(name, sizeof name, "extra%u", i);
        put_raw(in, obj, name);
    }
}

/* ---- datasets --------------------------------------------------------------- */

/* Dimensions: as described, or another count of them, or other sizes. */
static int pick_dims(struct fz_in *in, const struct fz_dset *d, uint64_t *dims)
{
    unsigned code = fz_u8(in) % 10;
    int nd = d->ndims;
    if (code >= 1 && code <= 6)
        nd = (int)code - 1; /* 0: scalar */
    else if (code == 7)
        nd = -1; /* null */
    for (int i = 0; i < (nd > 0 ? nd : 0); i++)
        dims[i] = fz_dim(in, i < d->ndims ? d->dims[i] : 2);
    return nd;
}

static hid_t dset_space(int nd, const uint64_t *dims, hsize_t *maxdims)
{
    hsize_t h[FZ_MAX_DIMS];
    if (nd < 0) return H5Screate(H5S_NULL);
    if (nd == 0) return H5Screate(H5S_SCALAR);
    for (int i = 0; i < nd; i++)
        h[i] = dims[i];
    return H5Screate_simple(nd, h, maxdims);
}

/* Layout and filters: contiguous, chunked, chunked + deflate, chunked +
 * shuffle + fletcher32, compact. Chunks are small; a dimension of size 0
 * or a dataset of very many chunks gets an unlimited dimension. */
static hid_t dset_create_plist(struct fz_in *in, const struct fz_dset *d, int nd,
                               const uint64_t *dims, hsize_t *maxdims)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    unsigned layout = fz_u8(in) % 6;
    if (layout == 0) layout = d->chunked ? 2 : 1;
    if (nd <= 0 || layout == 1) return dcpl;
    if (layout == 5) {
        H5Pset_layout(dcpl, H5D_COMPACT);
        return dcpl;
    }
    hsize_t chunk[FZ_MAX_DIMS];
    uint64_t nchunks = 1;
    for (int i = 0; i < nd; i++) {
        uint64_t c = 1 + fz_u8(in) % 16;
        chunk[i] = dims[i] && c > dims[i] ? dims[i] : c;
        uint64_t per = dims[i] / chunk[i] + 1;
        nchunks = nchunks > MAX_CHUNKS / per ? MAX_CHUNKS + 1 : nchunks * per;
        if (!dims[i]) maxdims[i] = H5S_UNLIMITED;
    }
    if (nchunks > MAX_CHUNKS) maxdims[0] = H5S_UNLIMITED;
    H5Pset_chunk(dcpl, nd, chunk);
    if (layout == 3) H5Pset_deflate(dcpl, 1 + fz_u8(in) % 9);
    if (layout == 4) {
        H5Pset_shuffle(dcpl);
        H5Pset_fletcher32(dcpl);
    }
    return dcpl;
}

/* Writes rows [0, rows) (all of a scalar) from values cycled to fit. */
static int write_rows(hid_t ds, int nd, const uint64_t *dims, uint64_t rows, hid_t mt,
                      const void *src, size_t srclen)
{
    hsize_t start[FZ_MAX_DIMS] = {0}, count[FZ_MAX_DIMS];
    uint64_t n = 1, esize = H5Tget_size(mt);
    for (int i = 0; i < nd; i++) {
        count[i] = i ? dims[i] : rows;
        if (count[i] && n > WRITE_CAP / count[i]) return 0;
        n *= count[i];
    }
    if (!n || n > WRITE_CAP / esize) return 0;
    void *buf = cycle(src, srclen, (size_t)(n * esize));
    hid_t fs = H5Dget_space(ds);
    hid_t ms = nd ? H5Screate_simple(nd, count, NULL) : H5Screate(H5S_SCALAR);
    herr_t r = -1;
    if (fs >= 0 && ms >= 0 &&
        (nd == 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0))
        r = H5Dwrite(ds, mt, ms, fs, H5P_DEFAULT, buf);
    dt_h5_close(ms);
    dt_h5_close(fs);
    free(buf);
    return r >= 0;
}

static uint64_t good_count(const struct fz_dset *d)
{
    uint64_t n = 1;
    for (int i = 0; i < d->ndims; i++)
        n *= d->dims[i];
    return n;
}

/* Whether a write may go ahead. A contiguous or compact dataset gets all
 * of its storage on the first write (a sparse file of terabytes for a
 * huge declared size, or terabytes of fill values), so it is written only
 * when small. A chunked one stores only the chunks written, but each
 * costs HDF5 an index entry and a pass through the filters, so it is
 * written only when that is a few thousand chunks. */
static int writable(hid_t ds, hid_t ftype, int nd, const uint64_t *dims)
{
    hid_t dcpl = H5Dget_create_plist(ds);
    hsize_t chunk[FZ_MAX_DIMS];
    int chunked = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_CHUNKED &&
                  H5Pget_chunk(dcpl, FZ_MAX_DIMS, chunk) == nd;
    dt_h5_close(dcpl);
    uint64_t bytes = H5Tget_size(ftype), chunks = 1;
    for (int i = 0; i < nd; i++) {
        uint64_t per = chunked && chunk[i] ? (dims[i] + chunk[i] - 1) / chunk[i] : 1;
        if (per && chunks > MAX_WRITTEN_CHUNKS / per) return 0;
        chunks *= per;
        if (!chunked && dims[i] && bytes > WRITE_CAP / dims[i]) return 0;
        bytes *= dims[i];
    }
    return chunked || bytes <= WRITE_CAP;
}

/* Values: d's own (converted by HDF5), raw bytes of the file type, none,
 * or only the first rows. */
static int dset_write(struct fz_in *in, hid_t ds, hid_t ftype, const struct fz_dset *d, int nd,
                      const uint64_t *dims)
{
    if (nd < 0) return 0;
    /* The choices are read before writable() may refuse, so an input means
     * the same file whatever the bounds. */
    unsigned mode = fz_u8(in) % 6;
    const uint8_t *raw = NULL;
    size_t rawlen = mode == 1 ? fz_blob(in, RAW_MAX, &raw) : 0;
    if (!writable(ds, ftype, nd, dims)) return 0;
    uint64_t rows = nd ? dims[0] : 1;
    size_t good_bytes = (size_t)good_count(d) * H5Tget_size(d->mem_type);
    switch (mode) {
    case 1:
        return raw_writable(ftype) && write_rows(ds, nd, dims, rows, ftype, raw, rawlen);
    case 2:
        return 0; /* declared, never written */
    case 3:
        return write_rows(ds, nd, dims, rows / 2, d->mem_type, d->values, good_bytes);
    case 4:
        return write_rows(ds, nd, dims, rows ? 1 : 0, d->mem_type, d->values, good_bytes);
    default:
        return write_rows(ds, nd, dims, rows, d->mem_type, d->values, good_bytes);
    }
}

void fz_h5_dataset(struct fz_in *in, hid_t loc, const struct fz_dset *d, struct fz_made *made)
{
    struct fz_made m = {0};
    hsize_t maxdims[FZ_MAX_DIMS];
    if (fz_u8(in) % 8 == 1) { /* left out */
        if (made) *made = m;
        return;
    }
    hid_t ftype = pick_type(in, d->type);
    m.ndims = pick_dims(in, d, m.dims);
    for (int i = 0; i < FZ_MAX_DIMS; i++)
        maxdims[i] = i < m.ndims ? m.dims[i] : 0;
    hid_t dcpl = dset_create_plist(in, d, m.ndims, m.dims, maxdims);
    hid_t space = dset_space(m.ndims, m.dims, maxdims);
    if (fz_u8(in) % 4 == 1) { /* a fill value of the input's choosing */
        const uint8_t *raw;
        size_t rawlen = fz_blob(in, RAW_MAX, &raw);
        if (raw_writable(ftype)) {
            void *fill = cycle(raw, rawlen, H5Tget_size(ftype));
            H5Pset_fill_value(dcpl, ftype, fill);
            free(fill);
        }
    }
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t ds = space >= 0 ? H5Dcreate2(loc, d->name, ftype, space, lcpl, dcpl, H5P_DEFAULT) : -1;
    if (ds >= 0) {
        m.ok = 1;
        m.written = dset_write(in, ds, ftype, d, m.ndims, m.dims);
        fz_h5_junk_attrs(in, ds);
        H5Dclose(ds);
    }
    H5Pclose(lcpl);
    dt_h5_close(space);
    H5Pclose(dcpl);
    H5Tclose(ftype);
    if (made) *made = m;
}
