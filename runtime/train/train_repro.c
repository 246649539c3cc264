/*
 * train_repro.c - train.reproducible: the same bits on any world size and
 * any accumulation.
 *
 * The global batch is cut into shards of train.shard_rows rows (shard i is
 * rows [i*S, (i+1)*S) of it, the last one shorter when the batch is), a
 * number that does not depend on the world size. Each shard runs forward
 * and backward on its own, with the same shapes on every world size, and
 * its gradient is a leaf of one sum tree fixed by shard index
 * (collectives/tree.h): a rank sums its block of shards in the tree, the
 * ranks' sums meet in the tree's upper levels. The loader hands rank r the
 * aligned block [r*k, (r+1)*k) of shards (k = shards / ranks, a power of
 * two), so the block is a subtree.
 *
 * Every other number a step makes is a function of the shards too: each
 * shard's loss goes to its own slot and the slots are summed in shard
 * order; batch norm computes its statistics over the shard, reports them
 * instead of moving its running statistics, and after the step every rank
 * applies every shard's statistics in shard order. The gradient norm and
 * the update see the summed gradients, the same on every rank. Evaluation
 * runs in aligned pieces of S rows whose losses are summed in piece order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "train_impl.h"

static int power_of_two(int64_t k) { return k > 0 && (k & (k - 1)) == 0; }

/* World sizes up to 64 on which the job's shards split as the mode needs
 * (one rank always: it sums every shard in the tree itself). */
static void working_worlds(int64_t nshards, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int64_t w = 1; w <= 64 && w <= nshards && k + 8 < len; w++)
        if (w == 1 || (nshards % w == 0 && power_of_two(nshards / w)))
            k += (size_t)snprintf(buf + k, len - k, "%s%lld", k ? ", " : "", (long long)w);
}

dt_status dt_repro_plan(struct run *r)
{
    const struct dt_job *job = r->job;
    int64_t g = job->train.global_batch;
    char ok[256];
    r->repro = job->train.reproducible && !r->eval_only;
    if (!r->repro) return DT_OK;
    r->shard_rows = job->train.shard_rows > 0 ? job->train.shard_rows : g / 8;
    r->nshards = g / r->shard_rows;
    working_worlds(r->nshards, ok, sizeof ok);
    if (r->world > 1 && (r->nshards % r->world || !power_of_two(r->nshards / r->world)))
        return dt_set_error(DT_ERR_USAGE,
                            "train.reproducible: the %lld shards of a global batch "
                            "(train.global_batch=%lld / train.shard_rows=%lld) must split into "
                            "a power of two per rank, so that each rank's shards are one subtree "
                            "of the sum tree; %d ranks would take %g each. This job gives the "
                            "same bits on %s ranks; or change train.shard_rows",
                            (long long)r->nshards, (long long)g, (long long)r->shard_rows,
                            r->world, (double)r->nshards / r->world, ok);
    if (r->micro % r->shard_rows)
        return dt_set_error(DT_ERR_USAGE,
                            "train.micro_batch=%lld must be a multiple of train.shard_rows=%lld "
                            "with train.reproducible",
                            (long long)r->micro, (long long)r->shard_rows);
    if (job->runtime.threads == 0)
        return dt_set_error(DT_ERR_USAGE,
                            "train.reproducible needs a fixed runtime.threads: 0 gives each rank "
                            "the cores it finds, which change with the ranks per node, and "
                            "BLAS sums in another order on another thread count; set "
                            "runtime.threads: 1 (or the count every run will use)");
    if (strcmp(job->comm.grad_dtype, "fp32") != 0)
        return dt_set_error(DT_ERR_USAGE,
                            "train.reproducible sums the gradients in fp32 in its own tree; "
                            "comm.grad_dtype: %s would round them on the wire: set it to fp32",
                            job->comm.grad_dtype);
    if (r->world > 1 && strcmp(job->comm.shard, "auto") != 0 &&
        strcmp(job->comm.shard, "none") != 0 && job->comm.sharded_update)
        return dt_set_error(DT_ERR_USAGE,
                            "train.reproducible keeps the whole model state on every rank: "
                            "comm.shard: %s splits it and sums the gradients in the ring's "
                            "order; set comm.shard: none (or auto)",
                            job->comm.shard);
    return DT_OK;
}

dt_status dt_repro_check_backend(struct run *r)
{
    if (!r->repro || !dt_backend_caps(r->be)->device_memory) return DT_OK;
    return dt_set_error(DT_ERR_USAGE,
                        "train.reproducible runs on the cpu backend: on %s the kernels "
                        "(cuDNN's algorithm choice, cuBLAS's, atomic additions in reductions) "
                        "are not made deterministic yet; set runtime.device: cpu",
                        dt_backend_name(r->be));
}

dt_status dt_repro_open(struct run *r)
{
    dt_status st;
    if (!r->repro) return DT_OK;
    r->shard_stride = 1 + dt_model_stat_len(r->model);
    DT_CHECK(dt_tree_create(dt_model_num_params(r->model), &r->tree));
    r->grads = dt_model_grads(r->model);
    DT_CHECK(dt_calloc((size_t)r->nshards * r->shard_stride, sizeof(double),
                       "the shards' losses and statistics", (void **)&r->shard_vals));
    r->eval_pieces = r->test ? (r->test->n + r->shard_rows - 1) / r->shard_rows : 0;
    if (r->eval_pieces > 0)
        DT_CHECK(dt_calloc((size_t)r->eval_pieces, sizeof(double), "the evaluation pieces' losses",
                           (void **)&r->eval_loss));
    if (r->job->model.sync_bn && r->rank == 0 && dt_model_stat_len(r->model) > 0)
        DT_LOG_INFO("train", "train.reproducible: batch norm takes its statistics over each "
                             "shard (train.shard_rows=%lld rows) on every world size; "
                             "model.sync_bn adds nothing to that",
                    (long long)r->shard_rows);
    DT_LOG_INFO("train",
                "train.reproducible: %lld shards of %lld rows per step, %lld per rank; the same "
                "bits on any world size that splits them into a power of two per rank",
                (long long)r->nshards, (long long)r->shard_rows,
                (long long)(r->nshards / r->world));
out:
    return st;
}

void dt_repro_close(struct run *r)
{
    dt_tree_destroy(r->tree);
    free(r->shard_vals);
    free(r->eval_loss);
    r->tree = NULL;
    r->shard_vals = r->eval_loss = NULL;
}

void dt_repro_begin_step(struct run *r)
{
    if (r->repro)
        memset(r->shard_vals, 0, (size_t)r->nshards * r->shard_stride * sizeof(double));
}

dt_status dt_repro_micro(struct run *r, const struct dt_batch *b, int64_t step, double loss_scale,
                         int64_t *correct)
{
    dt_status st = DT_OK;
    int64_t S = r->shard_rows, numel = dt_model_input_numel(r->model);
    int64_t labels = dt_model_labels_per_row(r->model);
    float scale = (float)(loss_scale / (double)b->global_rows);
    for (int64_t off = 0; off < b->rows && st == DT_OK; off += S) {
        int64_t n = b->rows - off < S ? b->rows - off : S, idx = (b->row0 + off) / S;
        if (idx >= r->nshards || (b->row0 + off) % S)
            return dt_set_error(DT_ERR_INTERNAL,
                                "train.reproducible: rows %lld.. of the global batch are not "
                                "the start of one of its %lld shards",
                                (long long)(b->row0 + off), (long long)r->nshards);
        double *rec = r->shard_vals + (size_t)idx * r->shard_stride;
        float *leaf;
        DT_CHECK(dt_tree_next(r->tree, &leaf)); /* the shard's gradient goes there */
        dt_model_set_grads(r->model, leaf);
        st = dt_model_zero_grads(r->model);
        dt_model_set_stat_out(r->model, r->shard_stride > 1 ? rec + 1 : NULL);
        if (st == DT_OK)
            st = dt_model_forward(r->model, b->x + off * numel, b->y + off * labels, n, 1,
                                  (uint64_t)r->job->train.seed, step, b->row0 + off, &rec[0],
                                  correct);
        dt_model_set_stat_out(r->model, NULL);
        if (st == DT_OK) st = dt_model_backward(r->model, n, scale, NULL);
        if (st == DT_OK) st = dt_backend_sync(r->be);
        dt_model_set_grads(r->model, r->grads);
        if (st == DT_OK) st = dt_tree_commit(r->tree);
    }
out:
    return st;
}

dt_status dt_repro_reduce(struct run *r)
{
    int present = dt_tree_count(r->tree) > 0;
    float *g = dt_model_grads(r->model);
    dt_status st = DT_OK;
    if (present)
        dt_tree_finish(r->tree, g);
    else
        st = dt_model_zero_grads(r->model);
    if (st == DT_OK && r->world > 1)
        st = dt_comm_allreduce_tree(r->comm, r->tree, g, dt_model_num_params(r->model), present);
    return st;
}

/* Each slot was written by one rank and is zero on the others, so the sum
 * over ranks is exact whatever order the library adds in. */
static dt_status gather_slots(struct run *r, double *v, size_t n)
{
    return r->world > 1 ? dt_comm_allreduce(r->comm, v, n, DT_F64, DT_COMM_SUM) : DT_OK;
}

dt_status dt_repro_settle(struct run *r, double *loss)
{
    size_t stride = r->shard_stride;
    double sum = 0;
    dt_status st = gather_slots(r, r->shard_vals, (size_t)r->nshards * stride);
    if (st != DT_OK) return st;
    for (int64_t i = 0; i < r->nshards; i++) {
        sum += r->shard_vals[(size_t)i * stride];
        if (stride > 1)
            dt_model_apply_stats(r->model, r->shard_vals + (size_t)i * stride + 1);
    }
    if (!isnan(*loss)) *loss = sum;
    return DT_OK;
}

void dt_repro_eval_begin(struct run *r)
{
    if (r->repro && r->eval_loss)
        memset(r->eval_loss, 0, (size_t)r->eval_pieces * sizeof(double));
}

double *dt_repro_eval_slot(struct run *r, int64_t batch, int64_t row)
{
    int64_t i = (batch * r->eval_global + row) / r->shard_rows;
    return i >= 0 && i < r->eval_pieces ? &r->eval_loss[i] : NULL;
}

dt_status dt_repro_eval_loss(struct run *r, double *loss)
{
    double sum = 0;
    dt_status st = gather_slots(r, r->eval_loss, (size_t)r->eval_pieces);
    for (int64_t i = 0; i < r->eval_pieces && st == DT_OK; i++)
        sum += r->eval_loss[i];
    if (st == DT_OK && !isnan(*loss)) *loss = sum;
    return st;
}
