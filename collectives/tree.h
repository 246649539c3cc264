/*
 * tree.h - sums of float vectors in a tree fixed by leaf index, so that
 * the bits of a sum depend on the leaves alone, not on how they were
 * split over ranks or over calls (train.reproducible).
 *
 * The tree: leaves 0..n-1 padded with absent leaves to a power of two;
 * each inner node is left + right, or the one side present when the
 * other is absent. IEEE addition is commutative, so only the tree's
 * shape matters. A rank that holds the aligned block of leaves
 * [r*k, r*k + m) (k a power of two, m <= k) sums its leaves with
 * dt_tree_push in order and dt_tree_finish, which gives that block's
 * subtree; dt_comm_allreduce_tree then sums the ranks' subtrees in the
 * tree's upper levels (rank r's block is leaf r there). One rank holding
 * all n leaves gets the same bits as any such split.
 *
 * Host memory; not thread-safe (one accumulator per thread).
 */
#ifndef DT_TREE_H
#define DT_TREE_H

#include <stddef.h>

#include "core/status.h"
#include "comm.h"

typedef struct dt_tree dt_tree_t;

/* An accumulator of leaves of n floats each. */
dt_status dt_tree_create(size_t n, dt_tree_t **out);
void dt_tree_destroy(dt_tree_t *t);
/* Adds the next leaf (copied or summed in; `leaf` is not kept). */
dt_status dt_tree_push(dt_tree_t *t, const float *leaf);
/* The same without the copy: *leaf gets n floats of the accumulator's
 * (contents undefined) to compute the next leaf in, then
 * dt_tree_commit adds it. */
dt_status dt_tree_next(dt_tree_t *t, float **leaf);
dt_status dt_tree_commit(dt_tree_t *t);
/* Leaves pushed since the last finish. */
size_t dt_tree_count(const dt_tree_t *t);
/* The sum of the leaves pushed since the last finish into out (n
 * floats; untouched when there were none), and starts over. */
void dt_tree_finish(dt_tree_t *t, float *out);

/* Every rank's buf (count floats: the sum of its block of leaves, or
 * nothing when present is 0) summed in the tree over rank index, the
 * result in every rank's buf (zeros when no rank is present).
 * Bandwidth as a ring all-reduce: each rank sums one chunk of the vector
 * over the ranks (point-to-point exchange) and the chunks are gathered.
 * Host-buffer communicators with dt_comm_sendrecv (mpi). t lends its
 * scratch memory (kept for the next call). Collective. */
dt_status dt_comm_allreduce_tree(dt_comm_t *c, dt_tree_t *t, float *buf, size_t count,
                                 int present);

/* dst[i] += src[i], in float (the tree's one operation). */
void dt_tree_add(float *dst, const float *src, size_t n);

#endif
