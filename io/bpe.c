/*
 * bpe.c - GPT-2's byte-level byte-pair encoding (see bpe.h).
 *
 * Tables: the vocabulary as a hash map from token string to id and an
 * array from id to the bytes it decodes to; the merges as a hash map from
 * the pair of ids (a, b) to (rank, id of the merged token); the 256 ids of
 * the byte symbols. Encoding cuts the text at special tokens, cuts each
 * piece into pre-tokens (next_pretoken), and looks each pre-token up in a
 * cache of earlier ones before merging its symbols, so a word seen before
 * costs one hash lookup.
 */
#include "bpe.h"

#include <errno.h>
#include <hdf5.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "hdf5_lock.h"

#define FILE_MAX (1u << 30)      /* a vocab.json or merges.txt larger than this is refused */
#define CACHE_MAX (1u << 20)     /* pre-tokens kept in the cache before it starts over */
#define WORD_MAX 4096            /* longer pre-tokens are merged without the cache */
#define BPE_GROUP "tokenizer"    /* the dataset's copy of the files */

/* ---- hash maps -------------------------------------------------------------- */

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h ? h : 1;
}

/* Byte strings (kept in a pool) to 64-bit values. */
struct smap {
    struct sent {
        uint64_t hash, off, val;
        uint32_t len, used;
    } *e;
    size_t cap, n;
    char *pool;
    size_t pool_len, pool_cap;
};

static void smap_free(struct smap *m)
{
    free(m->e);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

static int smap_grow(struct smap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    struct sent *e = calloc(cap, sizeof *e);
    if (!e)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].used) {
            size_t j = m->e[i].hash & (cap - 1);
            while (e[j].used)
                j = (j + 1) & (cap - 1);
            e[j] = m->e[i];
        }
    free(m->e);
    m->e = e;
    m->cap = cap;
    return 0;
}

static struct sent *smap_find(const struct smap *m, const char *k, size_t len, uint64_t h)
{
    if (!m->cap)
        return NULL;
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        struct sent *e = &m->e[j];
        if (!e->used)
            return NULL;
        if (e->hash == h && e->len == len && !memcmp(m->pool + e->off, k, len))
            return e;
    }
}

/* Adds k -> val (k must not be there yet). -1 when out of memory. */
static int smap_put(struct smap *m, const char *k, size_t len, uint64_t h, uint64_t val)
{
    if ((m->n + 1) * 2 > m->cap && smap_grow(m) != 0)
        return -1;
    if (m->pool_len + len > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap : 1 << 16;
        while (cap < m->pool_len + len)
            cap *= 2;
        char *p = realloc(m->pool, cap);
        if (!p)
            return -1;
        m->pool = p;
        m->pool_cap = cap;
    }
    memcpy(m->pool + m->pool_len, k, len);
    size_t j = h & (m->cap - 1);
    while (m->e[j].used)
        j = (j + 1) & (m->cap - 1);
    m->e[j] = (struct sent){.hash = h, .off = m->pool_len, .val = val, .len = (uint32_t)len, .used = 1};
    m->pool_len += len;
    m->n++;
    return 0;
}

/* Pairs of ids to (rank, merged id). */
struct pmap {
    struct pent {
        uint64_t key;
        int32_t rank, id;
    } *e;
    size_t cap, n;
};

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const struct pent *pmap_find(const struct pmap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    for (size_t j = mix(key) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        if (m->e[j].rank < 0)
            return NULL;
        if (m->e[j].key == key)
            return &m->e[j];
    }
}

static int pmap_init(struct pmap *m, size_t n)
{
    m->cap = 1024;
    while (m->cap < 2 * n + 2)
        m->cap *= 2;
    m->e = malloc(m->cap * sizeof *m->e);
    if (!m->e)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        m->e[i].rank = -1;
    return 0;
}

/* 1 when added, 0 when the pair was there already. */
static int pmap_put(struct pmap *m, uint64_t key, int32_t rank, int32_t id)
{
    size_t j = mix(key) & (m->cap - 1);
    while (m->e[j].rank >= 0) {
        if (m->e[j].key == key)
            return 0;
        j = (j + 1) & (m->cap - 1);
    }
    m->e[j] = (struct pent){.key = key, .rank = rank, .id = id};
    m->n++;
    return 1;
}

/* ---- the tokenizer ---------------------------------------------------------- */

struct special {
    const char *text; /* in the token pool */
    size_t len;
    int32_t id;
};

struct dt_bpe {
    struct smap vocab;     /* token string -> id */
    int64_t size;          /* largest id + 1 */
    char **bytes;          /* id -> the bytes it decodes to (NULL: no such id) */
    uint32_t *nbytes;
    int32_t byte_id[256];  /* the symbol of each byte */
    struct pmap merges;
    struct special *specials;
    int nspecial;
    int32_t eot;
    struct smap cache; /* pre-token bytes -> offset << 20 | count into cache_ids */
    int32_t *cache_ids;
    size_t cache_n, cache_cap;
    int32_t *work; /* symbols of the word being merged */
    size_t work_cap;
    char *raw[2]; /* the files' bytes: vocab.json, merges.txt */
    size_t raw_len[2];
};

/* GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100 upwards in byte order. */
static void byte_table(uint32_t cp[256])
{
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? (uint32_t)b : (uint32_t)next++;
    }
}

static dt_status bad(const char *what, const char *file, const char *fmt, const char *detail)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, detail);
    return dt_set_error(DT_ERR_BAD_DATA, "%s%s%s: %s", what, what[0] ? " " : "", file, msg);
}

/* The bytes a token string stands for, through the inverse byte table;
 * -1 when a character is not one of the table's. */
static long token_to_bytes(const char *tok, size_t len, const int16_t *inv, char *out)
{
    utf8proc_ssize_t i = 0;
    long n = 0;
    while ((size_t)i < len) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)tok + i,
                                              (utf8proc_ssize_t)len - i, &c);
        if (k <= 0 || c < 0 || c >= 512 || inv[c] < 0)
            return -1;
        out[n++] = (char)inv[c];
        i += k;
    }
    return n;
}

static int is_special(const char *s, size_t n)
{
    return n >= 4 && !memcmp(s, "<|", 2) && !memcmp(s + n - 2, "|>", 2);
}

static dt_status load_vocab(dt_bpe_t *b, const char *text, size_t len, const char *what)
{
    json_error_t err;
    dt_status st = DT_OK;
    uint32_t cp[256];
    int16_t inv[512];
    char *buf = NULL;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        char d[300];
        snprintf(d, sizeof d, "%s, line %d", err.text, err.line);
        return bad(what, "vocab.json", "not valid JSON (%s)", d);
    }
    if (!json_is_object(root) || json_object_size(root) == 0) {
        st = bad(what, "vocab.json", "%sexpected a JSON object of token -> id", "");
        goto out;
    }
    byte_table(cp);
    memset(inv, 0xff, sizeof inv);
    for (int i = 0; i < 256; i++)
        inv[cp[i]] = (int16_t)i;
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX) {
            st = bad(what, "vocab.json", "token '%.100s': expected an id from 0 to 2^31-2", k);
            goto out;
        }
        if (json_integer_value(v) + 1 > b->size)
            b->size = json_integer_value(v) + 1;
    }
    if (b->size > 4 * (int64_t)json_object_size(root) + 1024) {
        st = bad(what, "vocab.json", "%sits ids leave most of 0..largest unused", "");
        goto out;
    }
    DT_CHECK(dt_calloc((size_t)b->size, sizeof *b->bytes, "the vocabulary", (void **)&b->bytes));
    DT_CHECK(dt_calloc((size_t)b->size, sizeof *b->nbytes, "the vocabulary", (void **)&b->nbytes));
    for (int i = 0; i < 256; i++)
        b->byte_id[i] = -1;
    json_object_foreach(root, k, v)
    {
        size_t n = strlen(k);
        int32_t id = (int32_t)json_integer_value(v);
        if (b->bytes[id]) {
            st = bad(what, "vocab.json", "token '%.100s': its id is another token's too", k);
            goto out;
        }
        DT_CHECK(dt_malloc(n + 1, "a token", (void **)&buf));
        long nb = is_special(k, n) ? -1 : token_to_bytes(k, n, inv, buf);
        if (nb < 0) { /* special, or text outside the byte table: stands for itself */
            memcpy(buf, k, n);
            nb = (long)n;
        }
        b->bytes[id] = buf;
        b->nbytes[id] = (uint32_t)nb;
        buf = NULL;
        if (smap_put(&b->vocab, k, n, fnv(k, n), (uint64_t)id) != 0) {
            st = dt_set_error(DT_ERR_NOMEM, "%s vocab.json: no memory", what);
            goto out;
        }
        if (is_special(k, n)) {
            struct special *s = realloc(b->specials, (size_t)(b->nspecial + 1) * sizeof *s);
            if (!s) {
                st = dt_set_error(DT_ERR_NOMEM, "%s vocab.json: no memory", what);
                goto out;
            }
            b->specials = s;
            b->specials[b->nspecial++] = (struct special){.len = n, .id = id};
            if (!strcmp(k, "<|endoftext|>"))
                b->eot = id;
        }
        if (nb == 1 && !is_special(k, n) && token_to_bytes(k, n, inv, (char[8]){0}) == 1)
            b->byte_id[(unsigned char)b->bytes[id][0]] = id;
    }
    for (int i = 0; i < 256; i++)
        if (b->byte_id[i] < 0) {
            char d[64];
            snprintf(d, sizeof d, "byte 0x%02x (U+%04X)", i, cp[i]);
            st = bad(what, "vocab.json",
                     "has no token for %s: a byte-level vocabulary holds all 256 byte symbols", d);
            goto out;
        }
    for (int i = 0; i < b->nspecial; i++) /* their text, now that the pool has stopped moving */
        b->specials[i].text = b->bytes[b->specials[i].id];
out:
    free(buf);
    json_decref(root);
    return st;
}

static dt_status load_merges(dt_bpe_t *b, const char *text, size_t len, const char *what)
{
    size_t lines = 1, line = 0;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    if (pmap_init(&b->merges, lines) != 0)
        return dt_set_error(DT_ERR_NOMEM, "%s merges.txt: no memory for %zu merges", what, lines);
    int32_t rank = 0;
    char *joined = NULL;
    size_t jcap = 0;
    dt_status st = DT_OK;
    for (size_t i = 0; i < len && st == DT_OK;) {
        const char *s = text + i, *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + 1;
        line++;
        if (n && s[n - 1] == '\r')
            n--;
        if (n == 0 || (line == 1 && n >= 8 && !memcmp(s, "#version", 8)))
            continue;
        const char *sp = memchr(s, ' ', n);
        char d[300];
        snprintf(d, sizeof d, "%zu ('%.*s')", line, (int)(n < 80 ? n : 80), s);
        if (!sp || sp == s || sp == s + n - 1 || memchr(sp + 1, ' ', (size_t)(s + n - sp - 1))) {
            st = bad(what, "merges.txt", "line %s: expected two symbols separated by one space", d);
            break;
        }
        size_t la = (size_t)(sp - s), lb = n - la - 1;
        const struct sent *a = smap_find(&b->vocab, s, la, fnv(s, la));
        const struct sent *c = smap_find(&b->vocab, sp + 1, lb, fnv(sp + 1, lb));
        if (la + lb > jcap) {
            jcap = 2 * (la + lb) + 64;
            char *j = realloc(joined, jcap);
            if (!j) {
                st = dt_set_error(DT_ERR_NOMEM, "%s merges.txt: no memory", what);
                break;
            }
            joined = j;
        }
        memcpy(joined, s, la);
        memcpy(joined + la, sp + 1, lb);
        const struct sent *r = smap_find(&b->vocab, joined, la + lb, fnv(joined, la + lb));
        if (!a || !c || !r) {
            st = bad(what, "merges.txt",
                     "line %s: a symbol or the merged token is not in vocab.json", d);
            break;
        }
        pmap_put(&b->merges, pair_key((int32_t)a->val, (int32_t)c->val), rank++, (int32_t)r->val);
    }
    free(joined);
    return st;
}

dt_status dt_bpe_load_mem(const char *vocab, size_t vlen, const char *merges, size_t mlen,
                          const char *what, dt_bpe_t **out)
{
    dt_status st;
    dt_bpe_t *b = NULL;
    *out = NULL;
    DT_CHECK(dt_calloc(1, sizeof *b, "a tokenizer", (void **)&b));
    b->eot = -1;
    DT_CHECK(load_vocab(b, vocab, vlen, what));
    DT_CHECK(load_merges(b, merges, mlen, what));
    DT_CHECK(dt_malloc(vlen + 1, "the tokenizer's files", (void **)&b->raw[0]));
    DT_CHECK(dt_malloc(mlen + 1, "the tokenizer's files", (void **)&b->raw[1]));
    memcpy(b->raw[0], vocab, vlen);
    memcpy(b->raw[1], merges, mlen);
    b->raw_len[0] = vlen;
    b->raw_len[1] = mlen;
    *out = b;
    b = NULL;
out:
    dt_bpe_free(b);
    return st;
}

static dt_status read_all(const char *path, char **text, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    *text = NULL;
    if (!fp)
        return dt_set_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                            "tokenizer file %s: cannot open it: %s", path, strerror(errno));
    dt_status st = DT_OK;
    long size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    if (size < 0 || (unsigned long)size > FILE_MAX || fseek(fp, 0, SEEK_SET) != 0)
        st = dt_set_error(size < 0 ? DT_ERR_IO : DT_ERR_BAD_DATA,
                          "tokenizer file %s: %s", path,
                          size < 0 ? "cannot tell its size" : "larger than 1 GiB");
    else if ((st = dt_malloc((size_t)size + 1, "a tokenizer file", (void **)text)) == DT_OK &&
             fread(*text, 1, (size_t)size, fp) != (size_t)size)
        st = dt_set_error(DT_ERR_IO, "tokenizer file %s: cannot read it", path);
    fclose(fp);
    if (st != DT_OK) {
        free(*text);
        *text = NULL;
    } else
        *len = (size_t)size;
    return st;
}

dt_status dt_bpe_load_dir(const char *dir, dt_bpe_t **out)
{
    char vp[4200], mp[4200];
    char *v = NULL, *m = NULL;
    size_t vl = 0, ml = 0;
    dt_status st;
    *out = NULL;
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    DT_CHECK(read_all(vp, &v, &vl));
    DT_CHECK(read_all(mp, &m, &ml));
    char what[4200];
    snprintf(what, sizeof what, "tokenizer %s:", dir);
    st = dt_bpe_load_mem(v, vl, m, ml, what, out);
out:
    free(v);
    free(m);
    return st;
}

/* One byte dataset of the tokenizer group, malloc'd; DT_ERR_NOT_FOUND
 * when the file has none. */
static dt_status read_h5_bytes(hid_t f, const char *name, const char *path, char **buf,
                               size_t *len)
{
    char full[64];
    snprintf(full, sizeof full, "/%s/%s", BPE_GROUP, name);
    *buf = NULL;
    if (H5Lexists(f, "/" BPE_GROUP, H5P_DEFAULT) <= 0 || H5Lexists(f, full, H5P_DEFAULT) <= 0)
        return dt_set_error(DT_ERR_NOT_FOUND, "dataset %s keeps no tokenizer files", path);
    hid_t d = H5Dopen2(f, full, H5P_DEFAULT), s = d >= 0 ? H5Dget_space(d) : -1;
    hssize_t n = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
    dt_status st = DT_OK;
    if (n < 0 || (uint64_t)n > FILE_MAX)
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: %s is not a byte array of at most 1 GiB",
                          path, full);
    else if ((st = dt_malloc((size_t)n + 1, "a tokenizer file", (void **)buf)) == DT_OK &&
             H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, *buf) < 0)
        st = dt_set_error(DT_ERR_BAD_DATA, "dataset %s: cannot read %s", path, full);
    if (s >= 0)
        H5Sclose(s);
    if (d >= 0)
        H5Dclose(d);
    if (st != DT_OK) {
        free(*buf);
        *buf = NULL;
    } else
        *len = (size_t)n;
    return st;
}

dt_status dt_bpe_load_dataset(const char *h5path, dt_bpe_t **out)
{
    char *v = NULL, *m = NULL;
    size_t vl = 0, ml = 0;
    dt_status st = DT_OK;
    *out = NULL;
    dt_h5_lock();
    H5E_BEGIN_TRY
    {
        hid_t f = H5Fopen(h5path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f < 0)
            st = dt_set_error(DT_ERR_IO, "dataset %s: cannot open it", h5path);
        if (st == DT_OK)
            st = read_h5_bytes(f, "vocab.json", h5path, &v, &vl);
        if (st == DT_OK)
            st = read_h5_bytes(f, "merges.txt", h5path, &m, &ml);
        if (f >= 0)
            H5Fclose(f);
    }
    H5E_END_TRY;
    dt_h5_unlock();
    if (st == DT_OK) {
        char what[4200];
        snprintf(what, sizeof what, "dataset %s: the tokenizer's", h5path);
        st = dt_bpe_load_mem(v, vl, m, ml, what, out);
    }
    free(v);
    free(m);
    return st;
}

int64_t dt_bpe_vocab_size(const dt_bpe_t *b) { return b->size; }

void dt_bpe_files(const dt_bpe_t *b, const char **vocab, size_t *vlen, const char **merges,
                  size_t *mlen)
{
    *vocab = b->raw[0];
    *vlen = b->raw_len[0];
    *merges = b->raw[1];
    *mlen = b->raw_len[1];
}

int32_t dt_bpe_eot(const dt_bpe_t *b) { return b->eot; }

size_t dt_bpe_token_bytes(const dt_bpe_t *b, int32_t id, const char **bytes)
{
    if (id < 0 || id >= b->size || !b->bytes[id])
        return 0;
    *bytes = b->bytes[id];
    return b->nbytes[id];
}

void dt_bpe_free(dt_bpe_t *b)
{
    if (!b)
        return;
    for (int64_t i = 0; b->bytes && i < b->size; i++)
        free(b->bytes[i]);
    free(b->bytes);
    free(b->nbytes);
    smap_free(&b->vocab);
    smap_free(&b->cache);
    free(b->merges.e);
    free(b->specials);
    free(b->cache_ids);
    free(b->work);
    free(b->raw[0]);
    free(b->raw[1]);
    free(b);
}

/* ---- encoding ---------------------------------------------------------------------- */

enum cls { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

/* The character at s[0..n): its class and byte length (an invalid UTF-8
 * byte is one OTHER character). */
static enum cls char_at(const unsigned char *s, size_t n, int *len, int32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k;
    if (s[0] < 0x80) {
        c = s[0];
        k = 1;
    } else {
        k = utf8proc_iterate(s, (utf8proc_ssize_t)(n < 4 ? n : 4), &c);
        if (k <= 0) {
            *len = 1;
            *cp = -1;
            return C_OTHER;
        }
    }
    *len = (int)k;
    *cp = c;
    if ((c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
        (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
        c == 0x205F || c == 0x3000)
        return C_SPACE;
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
            return C_LETTER;
        return c >= '0' && c <= '9' ? C_NUMBER : C_OTHER;
    }
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return C_LETTER;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return C_NUMBER;
    default: return C_OTHER;
    }
}

/* The length of the pre-token at s[0..n) (n > 0), by GPT-2's pattern. */
static size_t next_pretoken(const unsigned char *s, size_t n)
{
    int l0;
    int32_t c0;
    enum cls k0 = char_at(s, n, &l0, &c0);
    if (c0 == '\'' && n >= 2) { /* 's 't 're 've 'm 'll 'd */
        unsigned char a = s[1], b = n >= 3 ? s[2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd')
            return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
            return 3;
    }
    size_t i = 0;
    enum cls want = k0;
    if (c0 == ' ' && n > 1) { /* ' ?X+': a space, then a run of letters, numbers or others */
        int l1;
        int32_t c1;
        enum cls k1 = char_at(s + 1, n - 1, &l1, &c1);
        if (k1 != C_SPACE) {
            want = k1;
            i = 1;
        }
    }
    if (want != C_SPACE) {
        while (i < n) {
            int l;
            int32_t c;
            if (char_at(s + i, n - i, &l, &c) != want)
                break;
            i += (size_t)l;
        }
        return i;
    }
    /* a run of whitespace: all of it at the end of the text or before more
     * whitespace; before anything else, all but its last character (which
     * starts the next pre-token), unless that leaves nothing */
    size_t last = 0;
    while (i < n) {
        int l;
        int32_t c;
        if (char_at(s + i, n - i, &l, &c) != C_SPACE)
            break;
        last = i;
        i += (size_t)l;
    }
    if (i < n && last > 0)
        return last;
    return i;
}

static dt_status push(int32_t **ids, size_t *n, size_t *cap, const int32_t *src, size_t k)
{
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *n + k)
            c *= 2;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p)
            return dt_set_error(DT_ERR_NOMEM, "tokenizer: no memory for %zu tokens", c);
        *ids = p;
        *cap = c;
    }
    memcpy(*ids + *n, src, k * sizeof *src);
    *n += k;
    return DT_OK;
}

/* The tokens of one pre-token: its byte symbols merged by rank. */
static size_t merge_word(dt_bpe_t *b, const unsigned char *s, size_t len, int32_t *w)
{
    size_t n = len;
    for (size_t i = 0; i < len; i++)
        w[i] = b->byte_id[s[i]];
    while (n > 1) {
        int32_t best = INT32_MAX, id = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const struct pent *p = pmap_find(&b->merges, pair_key(w[i], w[i + 1]));
            if (p && p->rank < best) {
                best = p->rank;
                id = p->id;
                at = i;
            }
        }
        if (id < 0)
            break;
        w[at] = id;
        memmove(w + at + 1, w + at + 2, (n - at - 2) * sizeof *w);
        n--;
    }
    return n;
}

static dt_status encode_word(dt_bpe_t *b, const unsigned char *s, size_t len, int32_t **ids,
                             size_t *n, size_t *cap)
{
    dt_status st;
    if (len > b->work_cap) {
        int32_t *w = realloc(b->work, len * sizeof *w);
        if (!w)
            return dt_set_error(DT_ERR_NOMEM, "tokenizer: no memory for a word of %zu bytes", len);
        b->work = w;
        b->work_cap = len;
    }
    if (len > WORD_MAX)
        return push(ids, n, cap, b->work, merge_word(b, s, len, b->work));
    uint64_t h = fnv(s, len);
    const struct sent *e = smap_find(&b->cache, (const char *)s, len, h);
    if (e)
        return push(ids, n, cap, b->cache_ids + (e->val >> 20), (size_t)(e->val & 0xfffff));
    size_t k = merge_word(b, s, len, b->work);
    if (b->cache.n >= CACHE_MAX || b->cache_n + k > ((size_t)1 << 40)) {
        smap_free(&b->cache);
        b->cache_n = 0;
    }
    size_t at = b->cache_n, cn = b->cache_n, cc = b->cache_cap;
    DT_CHECK(push(&b->cache_ids, &cn, &cc, b->work, k));
    b->cache_n = cn;
    b->cache_cap = cc;
    if (smap_put(&b->cache, (const char *)s, len, h, (uint64_t)at << 20 | k) != 0)
        return dt_set_error(DT_ERR_NOMEM, "tokenizer: no memory for its cache");
    st = push(ids, n, cap, b->work, k);
out:
    return st;
}

/* The first special token in s[0..n): its place and index, or n. */
static size_t find_special(const dt_bpe_t *b, const char *s, size_t n, int *which)
{
    size_t best = n;
    if (!b->nspecial)
        return n;
    for (const char *p = s; (p = memchr(p, '<', (size_t)(s + n - p))) != NULL; p++) {
        if ((size_t)(s + n - p) < 4 || p[1] != '|')
            continue;
        for (int i = 0; i < b->nspecial; i++)
            if (b->specials[i].len <= (size_t)(s + n - p) &&
                !memcmp(p, b->specials[i].text, b->specials[i].len)) {
                *which = i;
                return (size_t)(p - s);
            }
    }
    return best;
}

dt_status dt_bpe_encode(dt_bpe_t *b, const char *text, size_t len, int32_t **ids, size_t *n,
                        size_t *cap)
{
    dt_status st = DT_OK;
    size_t i = 0;
    while (i < len && st == DT_OK) {
        int which = -1;
        size_t end = i + find_special(b, text + i, len - i, &which);
        while (i < end && st == DT_OK) {
            size_t k = next_pretoken((const unsigned char *)text + i, end - i);
            st = encode_word(b, (const unsigned char *)text + i, k, ids, n, cap);
            i += k;
        }
        if (which >= 0 && st == DT_OK) {
            st = push(ids, n, cap, &b->specials[which].id, 1);
            i += b->specials[which].len;
        }
    }
    return st;
}
