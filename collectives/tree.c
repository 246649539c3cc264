/*
 * tree.c - sums in a tree fixed by leaf index (see tree.h).
 *
 * The local accumulator is a binary counter: a stack of partial sums, each
 * the sum of a complete subtree of 2^level leaves; a new leaf merges with
 * the top while the levels match, so at most log2(leaves) + 1 partial sums
 * are held. finish() adds what is left from the right (the top, the
 * youngest and smallest subtree) to the left, which is the padded tree's
 * rule for a block whose right part is absent.
 *
 * Across ranks every rank owns one chunk of the vector (the ring's
 * chunks, dt_ring_chunk_start): it receives that chunk from every rank in
 * size - 1 rounds of paired sends and receives, sums the chunks in the
 * tree over rank index, and the summed chunks are gathered.
 */
#include "tree.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "core/alloc.h"

#define TREE_MAX_LEVELS 64
#define TREE_ALIGN 64 /* bytes */

struct dt_tree {
    size_t n;
    int depth;                       /* partial sums on the stack */
    int level[TREE_MAX_LEVELS];      /* stack: subtree level of each partial sum */
    float *part[TREE_MAX_LEVELS];    /* stack: its sum (n floats) */
    int nfree;                       /* buffers not on the stack */
    float *spare[TREE_MAX_LEVELS];
    size_t pushed;
    float *next;    /* dt_tree_next's buffer, not yet committed */
    float *scratch; /* dt_comm_allreduce_tree's */
    size_t scratch_elems;
};

void dt_tree_add(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

dt_status dt_tree_create(size_t n, dt_tree_t **out)
{
    *out = NULL;
    dt_tree_t *t;
    dt_status st = dt_calloc(1, sizeof *t, "a sum tree", (void **)&t);
    if (st != DT_OK) return st;
    t->n = n;
    *out = t;
    return DT_OK;
}

void dt_tree_destroy(dt_tree_t *t)
{
    if (!t) return;
    for (int i = 0; i < t->depth; i++)
        free(t->part[i]);
    for (int i = 0; i < t->nfree; i++)
        free(t->spare[i]);
    free(t->next);
    free(t->scratch);
    free(t);
}

static void give_back(dt_tree_t *t, float *p) { t->spare[t->nfree++] = p; }

static dt_status take(dt_tree_t *t, float **p)
{
    if (t->nfree > 0) {
        *p = t->spare[--t->nfree];
        return DT_OK;
    }
    /* aligned as the model's own gradient buffer, whose place a leaf takes */
    size_t bytes = (t->n * sizeof(float) + TREE_ALIGN - 1) / TREE_ALIGN * TREE_ALIGN;
    if (posix_memalign((void **)p, TREE_ALIGN, bytes ? bytes : TREE_ALIGN) != 0)
        return dt_set_error(DT_ERR_NOMEM, "out of memory: %zu bytes for a partial sum of the "
                            "gradients (train.reproducible)", bytes);
    return DT_OK;
}

dt_status dt_tree_next(dt_tree_t *t, float **leaf)
{
    if (!t->next) {
        dt_status st = take(t, &t->next);
        if (st != DT_OK) return st;
    }
    *leaf = t->next;
    return DT_OK;
}

/* Adds leaf p: summed into a lone leaf on top, else pushed (then it
 * belongs to the stack; *kept = 1). */
static dt_status add_leaf(dt_tree_t *t, float *p, int *kept)
{
    *kept = 0;
    if (t->depth > 0 && t->level[t->depth - 1] == 0) {
        dt_tree_add(t->part[t->depth - 1], p, t->n);
        t->level[t->depth - 1] = 1;
    } else {
        if (t->depth >= TREE_MAX_LEVELS)
            return dt_set_error(DT_ERR_INTERNAL, "sum tree: more than 2^%d leaves",
                                TREE_MAX_LEVELS);
        t->part[t->depth] = p;
        t->level[t->depth++] = 0;
        *kept = 1;
    }
    /* complete subtrees of equal size merge, left + right */
    while (t->depth >= 2 && t->level[t->depth - 1] == t->level[t->depth - 2]) {
        dt_tree_add(t->part[t->depth - 2], t->part[t->depth - 1], t->n);
        t->level[t->depth - 2]++;
        give_back(t, t->part[--t->depth]);
    }
    t->pushed++;
    return DT_OK;
}

dt_status dt_tree_commit(dt_tree_t *t)
{
    int kept;
    dt_status st = add_leaf(t, t->next, &kept);
    if (st == DT_OK && kept) t->next = NULL;
    return st;
}

dt_status dt_tree_push(dt_tree_t *t, const float *leaf)
{
    float *p;
    int kept;
    dt_status st = take(t, &p);
    if (st != DT_OK) return st;
    memcpy(p, leaf, t->n * sizeof(float));
    st = add_leaf(t, p, &kept);
    if (!kept) give_back(t, p);
    return st;
}

size_t dt_tree_count(const dt_tree_t *t) { return t->pushed; }

void dt_tree_finish(dt_tree_t *t, float *out)
{
    while (t->depth >= 2) {
        dt_tree_add(t->part[t->depth - 2], t->part[t->depth - 1], t->n);
        give_back(t, t->part[--t->depth]);
    }
    if (t->depth == 1) {
        memcpy(out, t->part[0], t->n * sizeof(float));
        give_back(t, t->part[--t->depth]);
    }
    t->pushed = 0;
}

static dt_status scratch(dt_tree_t *t, size_t elems, float **out)
{
    if (t->scratch_elems < elems) {
        free(t->scratch);
        t->scratch = NULL;
        t->scratch_elems = 0;
        dt_status st = dt_malloc(elems * sizeof(float), "the tree all-reduce's chunks",
                                 (void **)&t->scratch);
        if (st != DT_OK) return st;
        t->scratch_elems = elems;
    }
    *out = t->scratch;
    return DT_OK;
}

/* Sums slot[i] (len floats, present[i]) over i in 0..w-1 in the padded
 * tree; the result is slot[0] when present[0] after the call. */
static void sum_slots(float **slot, int *present, int w, size_t len)
{
    for (int step = 1; step < w; step *= 2)
        for (int i = 0; i + step < w; i += 2 * step) {
            int b = i + step;
            if (!present[b]) continue;
            if (!present[i]) {
                slot[i] = slot[b];
                present[i] = 1;
            } else {
                dt_tree_add(slot[i], slot[b], len);
            }
        }
}

dt_status dt_comm_allreduce_tree(dt_comm_t *c, dt_tree_t *t, float *buf, size_t count,
                                 int present)
{
    int w = dt_comm_size(c), me = dt_comm_rank(c);
    dt_status st = DT_OK;
    int *pres = NULL;
    float **slot = NULL, *area;
    if (w == 1) return DT_OK;
    size_t cmax = (count + (size_t)w - 1) / (size_t)w;
    DT_CHECK(scratch(t, ((size_t)w + 1) * cmax, &area));
    DT_CHECK(dt_calloc((size_t)w, sizeof *pres, "rank flags", (void **)&pres));
    DT_CHECK(dt_calloc((size_t)w, sizeof *slot, "rank slots", (void **)&slot));
    DT_CHECK(dt_comm_allgather(c, &present, pres, sizeof present));
    size_t lo = dt_ring_chunk_start(count, w, me), len = dt_ring_chunk_start(count, w, me + 1) - lo;
    for (int i = 0; i < w; i++)
        slot[i] = area + (size_t)i * cmax;
    memcpy(slot[me], buf + lo, len * sizeof(float));
    for (int i = 1; i < w && st == DT_OK; i++) {
        int to = (me + i) % w, from = (me - i + w) % w;
        size_t tlo = dt_ring_chunk_start(count, w, to);
        size_t tlen = dt_ring_chunk_start(count, w, to + 1) - tlo;
        st = dt_comm_sendrecv(c, buf + tlo, tlen * sizeof(float), to, slot[from],
                              len * sizeof(float), from);
    }
    if (st != DT_OK) goto out;
    sum_slots(slot, pres, w, len);
    float *mine = area + (size_t)w * cmax; /* the summed chunk, padded to cmax */
    if (pres[0])
        memcpy(mine, slot[0], len * sizeof(float));
    else
        memset(mine, 0, len * sizeof(float));
    memset(mine + len, 0, (cmax - len) * sizeof(float));
    DT_CHECK(dt_comm_allgather(c, mine, area, cmax * sizeof(float)));
    for (int i = 0; i < w; i++) {
        size_t ilo = dt_ring_chunk_start(count, w, i);
        memcpy(buf + ilo, area + (size_t)i * cmax,
               (dt_ring_chunk_start(count, w, i + 1) - ilo) * sizeof(float));
    }
out:
    free(pres);
    free(slot);
    if (st != DT_OK)
        return dt_error_context(st, "summing the gradients in the reproducible tree");
    return st;
}
