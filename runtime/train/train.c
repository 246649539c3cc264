/*
 * train.c - the step loop, on one rank or many.
 *
 * One optimizer step consumes one global batch. Each rank runs its
 * micro-batches of it forward and backward, adding into one gradient
 * buffer scaled by 1/(global batch rows), so the sum over micro-batches
 * and ranks is the mean over the global batch. On the last micro-batch
 * the gradient reducer all-reduces buckets while backward still runs; then
 * one small all-reduce carries every rank's outcome with the step's loss
 * and accuracy, so all ranks take the same branch: continue, or stop with
 * the failing rank's message. Every random draw is keyed by (seed,
 * purpose, step, row), so the result does not depend on how the global
 * batch is split over micro-batches and ranks.
 *
 * Time per step is split into data wait, compute, communication not
 * hidden behind compute, and optimizer, and reported in metrics.jsonl with
 * loss, accuracy, learning rate, throughput and accelerator utilisation
 * (and in TensorBoard event files); rank 0 shows a live bar on a terminal,
 * periodic lines otherwise. A loader that keeps the device waiting gets
 * one warning naming the keys to raise; the end-of-run summary adds the
 * time split, peak memory and the training time over every segment of a
 * resumed run.
 */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"
#include "core/fault.h"
#include "core/log.h"
#include "train_impl.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/host.h"
#include "core/text.h"
#include "kernels/gate.h"
#include "runtime/monitor/watchdog.h"

#define BAR_WIDTH 24
#define BAR_REFRESH_S 0.2
/* Loader starvation: utilisation under STARVE_UTIL in STARVE_WINDOWS
 * logged windows in a row (the first window of a segment, which holds the
 * warm-up, never counts), with data wait at least STARVE_DATA_SHARE of the
 * time the device did not compute. */
#define STARVE_UTIL 0.9
#define STARVE_WINDOWS 3
#define STARVE_DATA_SHARE 0.5
#define TB_DIR "tensorboard"
#define HANG_NOTE_PATH (DT_JOB_PATH + sizeof DT_WATCHDOG_NOTE + 1)
#define HANG_NOTE_LINES 32  /* lines of the hang note copied into the log */
#define HANG_NOTE_LINE 1024 /* bytes of each */

/* Progress accumulated between two log points: loss, accuracy and rows
 * are global values, times are this rank's. */
struct window {
    double loss_sum, correct, rows;
    int64_t steps, overflows; /* overflows: fp16 steps skipped by the loss scaler */
    double t0, data_s, compute_s, comm_s, optim_s;
    double eval_s, ckpt_s; /* evaluation and checkpoints that fell inside the window */
    double grad_norm;
    struct dt_backend_waits waits0; /* the backend's waits at the window's start */
};

/* Accelerator utilisation as the DLIO benchmark defines it: the time the
 * accelerator computes over the wall time of the training steps. Compute
 * is the forward and backward passes of every micro-batch plus the
 * optimizer step (the device's work in a step: with a GPU, up to the point
 * the host has the step's loss back); data wait and communication not
 * hidden behind backward are not compute. The wall time leaves out the
 * evaluations and checkpoints (reported apart) that fell in the window. */
static double accel_util(double compute_s, double wall_s)
{
    if (!(wall_s > 0))
        return 0;
    double u = compute_s / wall_s;
    return u > 1 ? 1 : u < 0 ? 0 : u;
}

static double window_wall(const struct window *w)
{
    return dt_now() - w->t0 - w->eval_s - w->ckpt_s;
}

/* What one rank contributes to a step's outcome, summed over ranks: its
 * failure, its loss and accuracy sums, and the coordinator's flags (a stop
 * was requested on this rank; rank 0's clock says a checkpoint is due). */
enum {
    OUT_FAILED,
    OUT_LOSS,
    OUT_CORRECT,
    OUT_ROWS,
    OUT_STOP,    /* ranks that received a stop signal ... */
    OUT_SIGTERM, /* ... by signal, so the stop message can name it */
    OUT_SIGUSR1,
    OUT_SIGINT,
    OUT_CKPT,
    OUT_SUMSQ, /* sharded update: each rank's sum of squares of its own gradients */
    OUT_WRITING, /* ranks whose background checkpoint writer is still writing */
    OUT_N
};

/* ---- progress ------------------------------------------------------------ */

/* Steps of epoch `epoch` (the last one may be cut short by train.steps). */
static int64_t epoch_steps(const struct run *r, int64_t epoch)
{
    int64_t left = r->total_steps - epoch * r->bpe;
    return left < r->bpe ? left : r->bpe;
}

/* The live bar on a terminal; otherwise (and always in the log file) a
 * line. `line` says whether this call is a logging point. */
static void show_progress(struct run *r, int64_t epoch, int64_t step, const struct window *w,
                          double lr, double elapsed, int64_t samples_done, int line)
{
    double util = accel_util(w->compute_s + w->optim_s, window_wall(w));
    double sps = elapsed > 0 ? (double)samples_done / elapsed : 0;
    double eta = step > 0 ? elapsed * (double)(r->total_steps - step) / (double)step : 0;
    char etas[32];
    dt_format_duration(eta, etas, sizeof etas);
    double loss = w->rows > 0 ? w->loss_sum / w->rows : 0;
    double acc = w->rows > 0 ? 100.0 * w->correct / (w->rows * r->labels_per_row) : 0;
    if (r->bar) {
        int64_t in_epoch = step - epoch * r->bpe, of = epoch_steps(r, epoch);
        int fill = (int)(BAR_WIDTH * in_epoch / of);
        char bar[BAR_WIDTH + 1];
        for (int i = 0; i < BAR_WIDTH; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[BAR_WIDTH] = '\0';
        printf("\rTrain epoch %lld/%lld [%s] %lld/%lld loss %.4f acc %.2f%% %.0f samples/s ETA %s  ",
               (long long)epoch + 1, (long long)r->epochs, bar, (long long)in_epoch,
               (long long)of, loss, acc, sps, etas);
        fflush(stdout);
    }
    if (!line)
        return;
    const char *fmt = "epoch %lld/%lld step %lld/%lld loss %.4f acc %.2f%% lr %.3g %.0f samples/s "
                      "accel util %.0f%% ETA %s";
    if (r->bar || r->quiet)
        dt_log_file_only("train", fmt, (long long)epoch + 1, (long long)r->epochs, (long long)step,
                         (long long)r->total_steps, loss, acc, lr, sps, 100.0 * util, etas);
    else
        DT_LOG_INFO("train", fmt, (long long)epoch + 1, (long long)r->epochs, (long long)step,
                    (long long)r->total_steps, loss, acc, lr, sps, 100.0 * util, etas);
}

static void end_bar(struct run *r)
{
    if (r->bar) {
        printf("\n");
        fflush(stdout);
    }
}

/* ---- agreement on a step's outcome ----------------------------------------- */

/* Sums the ranks' contributions; when any rank failed, every rank returns
 * the lowest failing rank's error. DT_ERR_COMM means the exchange itself
 * failed and the job cannot continue in step. */
static dt_status agree_outcome(struct run *r, dt_status local, double v[OUT_N])
{
    v[OUT_FAILED] = local != DT_OK;
    if (r->world > 1) {
        dt_status st = dt_comm_allreduce(r->comm, v, OUT_N, DT_F64, DT_COMM_SUM);
        if (st != DT_OK)
            return st;
    }
    if (v[OUT_FAILED] == 0)
        return DT_OK;
    return dt_dist_agree(r->comm, local);
}

/* Waits for the device with `wait` (dt_backend_sync, or a training
 * step's dt_backend_settle: until its results, loss totals and the gate,
 * are on the host, not for the update queued after them), so that loss
 * totals the forwards queued reach their host variables (before those go
 * out of scope); after a failure its status and message stand. */
static dt_status settle_with(struct run *r, dt_status st, dt_status (*wait)(dt_backend_t *))
{
    if (st == DT_OK) return wait(r->be);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    (void)wait(r->be);
    return dt_set_error(st, "%s", msg);
}

/* ---- evaluation ---------------------------------------------------------- */

/* Sharded parameters: every rank runs as many forwards as the rank with
 * the most (*most, from this rank's `mine`; -1 when every rank's data has
 * ended), since each forward gathers the parameters from all of them. */
static dt_status eval_rounds(struct run *r, int64_t mine, int64_t *most)
{
    double x = (double)mine;
    *most = mine;
    if (r->shard < 3) return DT_OK;
    dt_status st = dt_comm_allreduce(r->comm, &x, 1, DT_F64, DT_COMM_MAX);
    *most = (int64_t)x;
    return st;
}

static dt_status eval_local(struct run *r, int64_t step, double v[OUT_N])
{
    dt_status st;
    int end = 0;
    int64_t correct = 0;
    DT_CHECK(dt_loader_start_epoch(r->test_ld, 0, 0));
    for (;;) {
        struct dt_batch b = {0};
        DT_CHECK(dt_loader_next(r->test_ld, &b, &end));
        /* in pieces of the rows the model was sized for (the training
         * micro-batch): the evaluation batch sets no memory floor */
        int64_t chunk = dt_model_max_rows(r->model), numel = dt_model_input_numel(r->model);
        int64_t labels = dt_model_labels_per_row(r->model), most;
        int64_t pieces = end ? 0 : (b.rows + chunk - 1) / chunk;
        st = eval_rounds(r, end ? -1 : pieces, &most);
        if (st != DT_OK || most < 0) {
            if (!end) dt_loader_release(r->test_ld, &b);
            break;
        }
        for (int64_t off = 0; off < b.rows && st == DT_OK; off += chunk) {
            int64_t n = b.rows - off < chunk ? b.rows - off : chunk;
            double *loss = r->repro ? dt_repro_eval_slot(r, b.batch, b.row0 + off) : NULL;
            st = dt_model_forward(r->model, b.x + off * numel, b.y + off * labels, n, 0,
                                  (uint64_t)r->job->train.seed, step, b.row0 + off,
                                  loss ? loss : &v[OUT_LOSS], &correct);
        }
        for (int64_t k = pieces; k < most && st == DT_OK; k++)
            st = dt_model_replay(r->model, 0, NULL);
        v[OUT_ROWS] += (double)b.rows;
        if (!end) dt_loader_release(r->test_ld, &b);
        if (st != DT_OK)
            goto out;
    }
out:
    st = settle_with(r, st, dt_backend_sync); /* the loss totals the forwards queued */
    v[OUT_CORRECT] = (double)correct;
    return st;
}

static dt_status evaluate(struct run *r, int64_t epoch, int64_t step, double *loss, double *acc)
{
    double v[OUT_N] = {0};
    dt_status st = dt_train_sync_buffers(r);
    if (st != DT_OK)
        return st;
    dt_repro_eval_begin(r);
    st = agree_outcome(r, eval_local(r, step, v), v);
    if (st == DT_OK && r->repro) st = dt_repro_eval_loss(r, &v[OUT_LOSS]);
    if (st != DT_OK)
        return st;
    *loss = v[OUT_ROWS] > 0 ? v[OUT_LOSS] / v[OUT_ROWS] : 0;
    *acc = v[OUT_ROWS] > 0 ? v[OUT_CORRECT] / (v[OUT_ROWS] * r->labels_per_row) : 0;
    if (r->lm)
        DT_LOG_INFO("eval",
                    "epoch %lld: %s loss %.4f, perplexity %.2f, next-token accuracy %.2f%% "
                    "(%.0f windows, %.0f tokens)",
                    (long long)epoch + 1, r->test->name, *loss, exp(*loss), 100.0 * *acc,
                    v[OUT_ROWS], v[OUT_ROWS] * r->labels_per_row);
    else
        DT_LOG_INFO("eval", "epoch %lld: test loss %.4f, test accuracy %.2f%% (%.0f samples)",
                    (long long)epoch + 1, *loss, 100.0 * *acc, v[OUT_ROWS]);
    if (!isfinite(*loss))
        DT_LOG_WARN("eval",
                    "epoch %lld: the test loss is not finite: the model's outputs "
                    "overflow on the test split",
                    (long long)epoch + 1);
    struct dt_metrics_rec rec;
    dt_metrics_begin(&rec, "eval");
    dt_metrics_str(&rec, "split", r->test->name);
    dt_metrics_int(&rec, "epoch", epoch + 1);
    dt_metrics_int(&rec, "step", step);
    dt_metrics_num(&rec, "loss", *loss, 9);
    dt_metrics_num(&rec, "acc", *acc, 6);
    dt_metrics_int(&rec, "samples", (int64_t)v[OUT_ROWS]);
    if (r->lm) {
        dt_metrics_num(&rec, "perplexity", exp(*loss), 9);
        dt_metrics_int(&rec, "tokens", (int64_t)(v[OUT_ROWS] * r->labels_per_row));
    }
    st = dt_metrics_put(r->metrics, &rec);
    struct dt_tb_rec tb;
    dt_tb_begin(&tb, step);
    dt_tb_add(&tb, "eval/loss", *loss);
    dt_tb_add(&tb, "eval/accuracy", *acc);
    if (r->lm)
        dt_tb_add(&tb, "eval/perplexity", exp(*loss));
    dt_status tst = dt_tb_put(r->tb, &tb);
    return st != DT_OK ? st : tst;
}

/* ---- one optimizer step -------------------------------------------------- */

static dt_status reducer_ready(void *ctx, size_t done) { return dt_reducer_ready(ctx, done); }

static dt_status reducer_place(void *ctx, size_t off, size_t n, float **g)
{
    return dt_reducer_place(ctx, off, n, g);
}

/* What backward tells the reducer: which gradients are final, and with
 * sharded gradients where each one goes. */
static struct dt_grad_hook grad_hook(struct run *r)
{
    return (struct dt_grad_hook){
        .ready = reducer_ready, .ctx = r->red, .place = r->shard >= 2 ? reducer_place : NULL};
}

/* The sharded update's gradients: this rank's chunks, at [lo[k], hi[k])
 * of the flat buffer, or with sharded gradients packed in the reducer's
 * shard. */
static float *own_grads(struct run *r, const size_t **lo, const size_t **hi)
{
    size_t n;
    *lo = r->shard >= 2 ? r->pk_lo : r->own_lo;
    *hi = r->shard >= 2 ? r->pk_hi : r->own_hi;
    return r->shard >= 2 ? dt_reducer_shard_grads(r->red, &n) : dt_model_grads(r->model);
}

/* DTRAIN_FAULT events inside a step: die, or stop responding. */
static void inject_step_faults(struct run *r, int64_t step)
{
    int bg = dt_fault_armed("bgkill", r->rank, step) && dt_train_ckpt_writing(r);
    if (dt_fault_armed("kill", r->rank, step) || bg) {
        if (!bg && r->writer)
            (void)dt_ckpt_writer_wait(r->writer, NULL, 0, NULL);
        fprintf(stderr, "dtrain: rank %d: killing itself at step %lld%s (DTRAIN_FAULT)\n",
                r->rank, (long long)step + 1,
                bg ? " with a background checkpoint in flight" : "");
        raise(SIGKILL);
    }
    if (dt_fault_armed("hang", r->rank, step))
        for (;;)
            pause();
}

/* Forward and backward of one micro-batch; when it is reduced (the last
 * one of the step, or every one with sharded gradients) the backward feeds
 * the gradient reducer as layers finish. *comm_st gets a failure of the
 * reducer (the job can no longer stay in step). */
static dt_status micro_step(struct run *r, const struct dt_batch *b, int64_t step, int last,
                            int reduce, double v[OUT_N], int64_t *correct, dt_status *comm_st)
{
    dt_status st = DT_OK;
    struct dt_grad_hook hook = grad_hook(r);
    /* The loss is summed over the global batch's rows, so this scale makes
     * the gradients the global mean (times the fp16 loss scale). */
    double loss_scale = r->scaling ? r->scaler.scale : 1.0;
    if (last && dt_fault_armed("overflow", r->rank, step))
        loss_scale = INFINITY; /* gradients overflow, as fp16 ones can */
    if (last && !r->nan_injected && dt_fault_armed("nan", r->rank, step)) {
        loss_scale = NAN; /* a NaN loss: its gradients are NaN too */
        r->nan_injected = 1;
        r->nan_now = 1;
    }
    if (reduce && (*comm_st = dt_reducer_begin(r->red)) != DT_OK)
        return DT_OK;
    if (r->repro) {
        st = dt_repro_micro(r, b, step, loss_scale, correct);
    } else if (b->rows > 0) {
        st = dt_model_forward(r->model, b->x, b->y, b->rows, 1, (uint64_t)r->job->train.seed,
                              step, b->row0, &v[OUT_LOSS], correct);
        if (st == DT_OK)
            st = dt_model_backward(r->model, b->rows, (float)(loss_scale / (double)b->global_rows),
                                   reduce && !r->stage_grads ? &hook : NULL);
    } else if (r->shard == 3) { /* no rows here: the peers' gathers still need this rank */
        st = dt_model_replay(r->model, reduce, &hook);
    }
    if (st == DT_ERR_COMM || st == DT_ERR_TIMEOUT) {
        *comm_st = st;
        st = DT_OK;
    }
    v[OUT_ROWS] += (double)b->rows;
    return st;
}

/* Starts what is left of the reduction and waits for it. Staged
 * gradients (device memory, host communicator) go out to host memory
 * first and come back after. */
static dt_status finish_reduction(struct run *r, double *wait)
{
    size_t bytes = dt_model_num_params(r->model) * sizeof(float);
    dt_status st = DT_OK;
    if (r->stage_grads)
        st = dt_backend_copy(r->be, r->host_grads, dt_model_grads(r->model), bytes, DT_COPY_D2H);
    if (st != DT_OK) { /* still take part, so no peer waits; the copy's error wins */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        (void)dt_reducer_finish(r->red, wait);
        return dt_set_error(st, "%s", msg);
    }
    st = dt_reducer_finish(r->red, wait);
    if (st == DT_OK && r->stage_grads)
        st = dt_backend_copy(r->be, dt_model_grads(r->model), r->host_grads, bytes, DT_COPY_H2D);
    return st;
}

/* Queues the check of the reduced gradients (step_gate): their sum of
 * squares, all of them or with the sharded update this rank's own (the
 * step's agreement adds up the ranks'); finite exactly when every
 * gradient is (squares of floats summed in double cannot overflow), so it
 * is the fp16 overflow check too. Replicated, the gate also decides on the
 * backend, from the gradients alone (the same on every rank, so every
 * rank decides alike): skip when they are not finite, else unscale and
 * clip them; the update queued next follows it. Nothing waits here. */
static dt_status queue_gate(struct run *r, struct dt_gate *gate)
{
    const struct dt_ops *ops = dt_backend_ops(r->be);
    size_t whole_lo = 0, whole_hi = dt_model_num_params(r->model);
    struct dt_gate_args a = {.lo = &whole_lo, .hi = &whole_hi, .count = 1, .unscale = 1.0f};
    float *g = dt_model_grads(r->model);
    if (r->nown) {
        g = own_grads(r, &a.lo, &a.hi);
        a.count = r->nown;
    } else {
        a.decide = 1;
        a.unscale = r->scaling ? (float)dt_scaler_unscale(&r->scaler) : 1.0f;
        a.clip_norm = r->job->train.clip_norm;
    }
    return ops->step_gate(r->be, g, &a, gate);
}

/* How many micro-batches a step reduces: one (the last), or with sharded
 * gradients each of a full global batch's, so that every rank reduces
 * as often whatever its share of a short last batch. */
static int reductions_per_step(const struct run *r)
{
    if (!r->red) return 0;
    return r->shard >= 2 ? (int)(r->per_rank / r->micro) : 1;
}

/* Runs this rank's micro-batches of one global batch, reduces the
 * gradients and queues their check (queue_gate, into *gate). A local
 * failure (data, compute) is returned in *local after the rank has still
 * taken part in the reduction, so no peer waits; the function's own
 * status is a communication failure. *end = 1 when the epoch ran out
 * before the batch started. The loss totals reach v[OUT_LOSS] and
 * *correct, and the check *gate, at the step's wait (train_step). */
static dt_status run_batch(struct run *r, int64_t step, struct window *w, int *end, double v[OUT_N],
                           int64_t *correct, struct dt_gate *gate, dt_status *local)
{
    dt_status comm_st = DT_OK;
    int reduced = 0, need = reductions_per_step(r);
    *local = r->grads_zero ? DT_OK : dt_model_zero_grads(r->model);
    r->grads_zero = 0;
    if (r->shard >= 2) dt_reducer_clear(r->red);
    dt_repro_begin_step(r);
    while (*local == DT_OK) {
        struct dt_batch b;
        double t0 = dt_now();
        dt_watchdog_phase(r->wd, "data", step);
        *local = dt_fault_armed("read", r->rank, step)
                     ? dt_set_error(DT_ERR_IO, "reading a training batch failed (DTRAIN_FAULT)")
                     : dt_loader_next(r->train_ld, &b, end);
        double t1 = dt_now();
        w->data_s += t1 - t0;
        if (*local != DT_OK || *end)
            break;
        int last = b.micro == b.micro_count - 1, reduce = r->red && (last || r->shard >= 2);
        dt_watchdog_phase(r->wd, "forward/backward", step);
        inject_step_faults(r, step);
        *local = micro_step(r, &b, step, last, reduce, v, correct, &comm_st);
        dt_loader_release(r->train_ld, &b);
        double t2 = dt_now();
        w->compute_s += t2 - t1;
        if (reduce && comm_st == DT_OK) {
            double wait = 0;
            dt_watchdog_phase(r->wd, "gradient all-reduce (waiting for buckets)", step);
            comm_st = finish_reduction(r, &wait);
            w->comm_s += wait;
            reduced++;
        }
        if (last || comm_st != DT_OK) break;
    }
    if (*end && *local == DT_OK)
        return DT_OK;
    if (r->repro) { /* every rank takes part, whatever happened here */
        double t0 = dt_now();
        dt_watchdog_phase(r->wd, "gradient sum (reproducible tree)", step);
        comm_st = dt_repro_reduce(r);
        w->comm_s += dt_now() - t0;
    }
    /* failed early, or fewer micro-batches here than elsewhere: still take
     * part in every reduction, so no peer waits */
    while (reduced < need && r->red && comm_st == DT_OK) {
        double wait = 0;
        struct dt_grad_hook hook = grad_hook(r);
        comm_st = dt_reducer_begin(r->red);
        if (comm_st == DT_OK && r->shard == 3) /* the gathers of a forward and backward */
            comm_st = dt_model_replay(r->model, 1, &hook);
        if (comm_st == DT_OK)
            comm_st = dt_reducer_finish(r->red, &wait);
        reduced++;
    }
    if (comm_st == DT_OK && *local == DT_OK) { /* the optimizer's first stage */
        double t0 = dt_now();
        *local = queue_gate(r, gate);
        w->optim_s += dt_now() - t0;
    }
    return comm_st;
}

/* Replicated: queues the update, which follows the gate queue_gate set
 * (so it may run before the host has read the gate) and zeroes the
 * gradients as it reads them, in place of the next step's fill
 * (train_step notes it once the step has gone through). */
static dt_status queue_update(struct run *r, int64_t step)
{
    double lr = dt_schedule_lr(r->job, step, r->total_steps);
    return dt_optim_step_gated_clear(r->opt, dt_model_params(r->model), dt_model_grads(r->model),
                                     lr);
}

/* x *= f over this rank's own chunks of the gradients (f == 1: nothing). */
static dt_status scale_own(struct run *r, float f)
{
    const size_t *lo, *hi;
    float *g = own_grads(r, &lo, &hi);
    dt_status st = DT_OK;
    for (size_t k = 0; k < r->nown && st == DT_OK && f != 1.0f; k++)
        st = dt_backend_ops(r->be)->scale(r->be, g + lo[k], hi[k] - lo[k], f);
    return st;
}

/* Sharded update: decides as the step gate does from the global sum of
 * squares (the agreed sum of the ranks' shares): an fp16 overflow halves
 * the loss scale and skips (*overflow); otherwise this rank's own
 * gradients are unscaled and clipped, in the gate's order, its own chunks
 * updated and every rank's chunks of the parameters gathered. A failed
 * gather is a communication failure (*comm_failed = 1). */
static dt_status sharded_step(struct run *r, int64_t step, double loss, double sumsq,
                              struct window *w, int *skipped, int *overflow, int *comm_failed)
{
    float *p = dt_model_params(r->model);
    float unscale = r->scaling ? (float)dt_scaler_unscale(&r->scaler) : 1.0f, factor;
    int nonfinite = dt_gate_decide(sumsq, unscale, r->job->train.clip_norm, &factor);
    double norm = dt_gate_norm(sumsq, unscale);
    dt_status st = DT_OK;
    if (r->scaling && isfinite(loss)) {
        st = dt_scaler_update(&r->scaler, !nonfinite, overflow);
        if (st != DT_OK) return dt_error_context(st, "step %lld", (long long)step + 1);
        if (*overflow)
            return DT_OK; /* skipped on every rank, not a bad step */
    }
    *skipped = !(isfinite(loss) && isfinite(norm));
    if (*skipped)
        return DT_OK; /* the parameters are unchanged on every rank */
    double lr = dt_schedule_lr(r->job, step, r->total_steps);
    st = scale_own(r, unscale);
    if (st == DT_OK) st = scale_own(r, factor);
    if (st == DT_OK && r->shard == 3) {
        size_t n;
        st = dt_optim_step_shard(r->opt, dt_reducer_shard_params(r->red, &n),
                                 dt_reducer_shard_grads(r->red, &n), lr);
    } else if (st == DT_OK && r->shard == 2) {
        size_t n;
        st = dt_optim_step_packed(r->opt, p, dt_reducer_shard_grads(r->red, &n), lr);
    } else if (st == DT_OK) {
        st = dt_optim_step_ranges(r->opt, p, dt_model_grads(r->model), lr, r->own_lo, r->own_hi,
                                  r->nown);
    }
    if (st != DT_OK)
        return st;
    if (r->shard == 3) { /* the shard is the parameters: the slots' copies are stale */
        st = dt_reducer_params_changed(r->red);
    } else {
        dt_watchdog_phase(r->wd, "gathering the updated parameters", step);
        st = dt_reducer_gather(r->red, p, "parameters");
    }
    if (st != DT_OK)
        *comm_failed = 1;
    w->grad_norm = norm;
    return st;
}

/* After the step's wait and agreement: the outcome of the update. The
 * replicated update is already queued and followed the gate (skipped on
 * the device when the gradients are not finite); here the host takes the
 * same decision from the gate's record: an fp16 overflow halves the loss
 * scale and skips without counting as a bad step; a non-finite loss or
 * non-finite gradients are a bad step (*skipped = 1). A non-finite loss
 * has non-finite gradients with every loss dtrain has, so the device's
 * decision from the gradients alone is the host's. The sharded update
 * runs here (sharded_step), from the agreed sum of squares. */
static dt_status optimizer_step(struct run *r, int64_t step, double loss,
                                const struct dt_gate *gate, double sumsq, struct window *w,
                                int *skipped, int *comm_failed)
{
    double t0 = dt_now();
    int overflow = 0;
    dt_status st = DT_OK;
    dt_watchdog_phase(r->wd, "optimizer", step);
    *skipped = 0;
    if (r->nown) {
        st = sharded_step(r, step, loss, sumsq, w, skipped, &overflow, comm_failed);
        w->overflows += overflow;
        w->optim_s += dt_now() - t0;
        w->steps++;
        return st;
    }
    float unscale = r->scaling ? (float)dt_scaler_unscale(&r->scaler) : 1.0f;
    if (gate->skip) dt_optim_unstep(r->opt); /* the device changed nothing */
    if (r->scaling && isfinite(loss)) {
        double before = r->scaler.scale;
        st = dt_scaler_update(&r->scaler, !gate->skip, &overflow);
        if (st != DT_OK) return dt_error_context(st, "step %lld", (long long)step + 1);
        if (overflow)
            DT_LOG_DEBUG("train",
                         "step %lld: fp16 gradients overflowed; step skipped, loss "
                         "scale %g -> %g",
                         (long long)step + 1, before, r->scaler.scale);
    }
    if (!overflow) {
        double norm = dt_gate_norm(gate->sumsq, unscale);
        *skipped = !(isfinite(loss) && isfinite(norm));
        if (!*skipped) w->grad_norm = norm;
    }
    w->overflows += overflow;
    w->optim_s += dt_now() - t0;
    w->steps++;
    return st;
}

/* Loader starvation (rank 0's view): counts windows in a row where the
 * device waited mostly for data, and warns once when there are enough. */
static void check_starvation(struct run *r, int64_t step, const struct window *w, double wall,
                             double util)
{
    double ns = w->steps ? (double)w->steps : 1.0;
    double compute = w->compute_s + w->optim_s, lost = wall - compute;
    int starved =
        r->windows > 1 && util < STARVE_UTIL && lost > 0 && w->data_s >= STARVE_DATA_SHARE * lost;
    r->starved_windows = starved ? r->starved_windows + 1 : 0;
    if (r->rank != 0 || r->starve_warned || r->starved_windows < STARVE_WINDOWS)
        return;
    r->starve_warned = 1;
    DT_LOG_WARN("train",
                "the data loader is starving the device: accelerator utilisation %.0f%% (under "
                "%.0f%% for %d logged windows in a row, up to step %lld); per step %.1f ms "
                "waiting for data against %.1f ms of compute. Raise data.workers (now %lld) "
                "and data.prefetch (now %lld), or put the dataset on faster storage",
                100.0 * util, 100.0 * STARVE_UTIL, r->starved_windows, (long long)step,
                1e3 * w->data_s / ns, 1e3 * compute / ns, (long long)r->job->data.workers,
                (long long)r->job->data.prefetch);
}

/* The GPU sample of a window, into both records; peaks for the summary. */
static void put_gpu(struct run *r, struct dt_metrics_rec *rec, struct dt_tb_rec *tb)
{
    struct dt_nvml_sample g;
    if (!dt_nvml_sample(r->nvml, &g))
        return;
    if (g.has_util) {
        dt_metrics_num(rec, "gpu_util", g.util, 4);
        dt_tb_add(tb, "gpu/util", g.util);
    }
    if (g.has_mem) {
        dt_metrics_int(rec, "gpu_mem_bytes", (int64_t)g.mem_used);
        dt_tb_add(tb, "gpu/mem_bytes", (double)g.mem_used);
        if ((double)g.mem_used > r->gpu_mem_peak)
            r->gpu_mem_peak = (double)g.mem_used;
    }
    if (g.has_power) {
        dt_metrics_num(rec, "gpu_power_w", g.power_w, 5);
        dt_tb_add(tb, "gpu/power_w", g.power_w);
        if (g.power_w > r->gpu_power_peak)
            r->gpu_power_peak = g.power_w;
    }
}

static dt_status log_window(struct run *r, int64_t epoch, int64_t step, double lr, struct window *w,
                            double elapsed, int64_t samples)
{
    double dt = dt_now() - w->t0, ns = w->steps ? (double)w->steps : 1.0;
    double wall = window_wall(w), util = accel_util(w->compute_s + w->optim_s, wall);
    double loss = w->rows > 0 ? w->loss_sum / w->rows : 0;
    double acc = w->rows > 0 ? w->correct / (w->rows * r->labels_per_row) : 0;
    double sps = dt > 0 ? w->rows / dt : 0.0;
    double scale = r->scaling ? r->scaler.scale : 1.0;
    r->windows++;
    r->spent.data_s += w->data_s;
    r->spent.compute_s += w->compute_s;
    r->spent.comm_s += w->comm_s;
    r->spent.optim_s += w->optim_s;
    r->spent.ckpt_s += w->ckpt_s;
    struct dt_metrics_rec rec;
    struct dt_tb_rec tb;
    dt_tb_begin(&tb, step);
    dt_metrics_begin(&rec, "train");
    dt_metrics_int(&rec, "epoch", epoch + 1);
    dt_metrics_int(&rec, "step", step);
    dt_metrics_num(&rec, "loss", loss, 9);
    dt_metrics_num(&rec, "acc", acc, 6);
    dt_metrics_num(&rec, "lr", lr, 9);
    dt_metrics_num(&rec, "grad_norm", w->grad_norm, 9);
    dt_metrics_int(&rec, "samples", samples);
    dt_metrics_num(&rec, "samples_per_s", sps, 6);
    if (r->lm)
        dt_metrics_num(&rec, "tokens_per_s", sps * r->labels_per_row, 6);
    dt_metrics_num(&rec, "step_s", dt / ns, 6);
    dt_metrics_num(&rec, "data_wait_s", w->data_s / ns, 6);
    dt_metrics_num(&rec, "compute_s", w->compute_s / ns, 6);
    dt_metrics_num(&rec, "comm_exposed_s", w->comm_s / ns, 6);
    dt_metrics_num(&rec, "optimizer_s", w->optim_s / ns, 6);
    dt_metrics_num(&rec, "accel_util", util, 6);
    dt_metrics_num(&rec, "loss_scale", scale, 9);
    dt_metrics_int(&rec, "overflow_steps", w->overflows);
    if (dt_backend_caps(r->be)->has_stream) { /* the host's waits for the device */
        struct dt_backend_waits now;
        dt_backend_waits(r->be, &now);
        double waits = (double)(now.count - w->waits0.count) / ns;
        double wait_s = (now.seconds - w->waits0.seconds) / ns;
        dt_metrics_num(&rec, "host_waits_per_step", waits, 6);
        dt_metrics_num(&rec, "host_wait_s", wait_s, 6);
        dt_tb_add(&tb, "time/host_waits_per_step", waits);
        dt_tb_add(&tb, "time/host_wait_s", wait_s);
    }
    dt_tb_add(&tb, "train/loss", loss);
    dt_tb_add(&tb, "train/accuracy", acc);
    dt_tb_add(&tb, "train/lr", lr);
    dt_tb_add(&tb, "train/grad_norm", w->grad_norm);
    dt_tb_add(&tb, "train/samples_per_s", sps);
    dt_tb_add(&tb, "train/loss_scale", scale);
    dt_tb_add(&tb, "time/step_s", dt / ns);
    dt_tb_add(&tb, "time/data_wait_s", w->data_s / ns);
    dt_tb_add(&tb, "time/compute_s", w->compute_s / ns);
    dt_tb_add(&tb, "time/comm_exposed_s", w->comm_s / ns);
    dt_tb_add(&tb, "time/optimizer_s", w->optim_s / ns);
    dt_tb_add(&tb, "time/accel_util", util);
    put_gpu(r, &rec, &tb);
    dt_status st = dt_metrics_put(r->metrics, &rec);
    dt_status tst = dt_tb_put(r->tb, &tb);
    show_progress(r, epoch, step, w, lr, elapsed, samples, 1);
    check_starvation(r, step, w, wall, util);
    return st != DT_OK ? st : tst;
}

/* ---- the loop ------------------------------------------------------------ */

/* "SIGTERM on 2 of 2 ranks": which signals asked for the stop (a time-limit
 * warning or a preemption notice shows up here by name). */
static void describe_stop(struct run *r, const double v[OUT_N])
{
    static const struct {
        int slot;
        const char *name;
    } sigs[] = {{OUT_SIGTERM, "SIGTERM"}, {OUT_SIGUSR1, "SIGUSR1"}, {OUT_SIGINT, "SIGINT"}};
    size_t n = 0;
    r->stop_why[0] = '\0';
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        if (v[sigs[i].slot] <= 0 || n >= sizeof r->stop_why)
            continue;
        n += (size_t)snprintf(r->stop_why + n, sizeof r->stop_why - n, "%s%s on %.0f of %d rank%s",
                              n ? " and " : "", sigs[i].name, v[sigs[i].slot], r->world,
                              r->world == 1 ? "" : "s");
    }
    if (!r->stop_why[0])
        snprintf(r->stop_why, sizeof r->stop_why, "a signal");
    if (r->rank == 0)
        DT_LOG_INFO("train", "stop requested by %s after step %lld: saving a checkpoint",
                    r->stop_why, (long long)r->step + 1);
}

/* This rank's coordinator flags for the step's agreement. */
static void coordinator_flags(struct run *r, double v[OUT_N])
{
    int sig = r->opts && r->opts->stop_flag ? (int)*r->opts->stop_flag : 0;
    v[OUT_STOP] = sig != 0;
    v[OUT_SIGTERM] = sig == SIGTERM;
    v[OUT_SIGUSR1] = sig == SIGUSR1;
    v[OUT_SIGINT] = sig == SIGINT;
    double every = r->job->checkpoint.every_minutes;
    v[OUT_CKPT] = r->rank == 0 && every > 0 && dt_now() - r->last_ckpt_time >= 60.0 * every;
    v[OUT_WRITING] = dt_train_ckpt_writing(r);
}

/* After a skipped step: roll back when there were too many in a row. */
static dt_status after_bad_step(struct run *r, int64_t step, double loss)
{
    r->bad_steps++;
    DT_LOG_WARN("train", "step %lld: the loss (%g) or the gradients are not finite; step skipped "
                         "(%lld in a row, runtime.max_bad_steps=%lld)",
                (long long)step + 1, loss, (long long)r->bad_steps,
                (long long)r->job->runtime.max_bad_steps);
    if (r->bad_steps < r->job->runtime.max_bad_steps)
        return DT_OK;
    if (r->rollbacks >= r->job->runtime.max_rollbacks)
        return dt_set_error(DT_ERR_USAGE,
                            "training diverged: %lld steps in a row with a non-finite loss or "
                            "gradients after %lld rollback%s (runtime.max_rollbacks); lower "
                            "train.optimizer.lr or set train.clip_norm",
                            (long long)r->bad_steps, (long long)r->rollbacks,
                            r->rollbacks == 1 ? "" : "s");
    return dt_train_ckpt_rollback(r);
}

/* One step: batch, reduction, agreement, optimizer. *end when the epoch is
 * over; *flags gets the agreed coordinator flags (stop, checkpoint).
 * *comm_failed = 1 when the step failed before the ranks agreed on it (a
 * communication failure of any status: comm, timeout, cuda). */
static dt_status train_step(struct run *r, struct window *w, int *end, int *stop, int *ckpt,
                            int *comm_failed)
{
    double v[OUT_N] = {0};
    int64_t correct = 0;
    struct dt_gate gate = {0};
    dt_status local = DT_OK;
    int64_t step = r->step;
    int queued = 0;
    dt_status st = run_batch(r, step, w, end, v, &correct, &gate, &local);
    if (st == DT_OK && local == DT_OK && !*end && !r->nown) {
        double t0 = dt_now(); /* on the CPU the update itself; on a device its launch */
        local = queue_update(r, step);
        queued = local == DT_OK;
        w->optim_s += dt_now() - t0;
    }
    /* the step's one wait: the loss totals and the gate reach the host
     * (on a device, the update queued after them may still run) */
    local = settle_with(r, local, dt_backend_settle);
    queued = queued && local == DT_OK;
    v[OUT_CORRECT] = (double)correct;
    if (r->nown) v[OUT_SUMSQ] = gate.sumsq;
    if (st != DT_OK) {
        *comm_failed = 1;
        return dt_error_context(st, "step %lld", (long long)step + 1); /* the caller aborts */
    }
    if (*end && local == DT_OK)
        return DT_OK;
    if (r->nan_now) {
        v[OUT_LOSS] = NAN;
        r->nan_now = 0;
    }
    coordinator_flags(r, v);
    double t0 = dt_now();
    dt_watchdog_phase(r->wd, "step agreement all-reduce", step);
    st = agree_outcome(r, local, v);
    if (st == DT_OK && r->repro) st = dt_repro_settle(r, &v[OUT_LOSS]);
    w->comm_s += dt_now() - t0;
    if (st == DT_ERR_TIMEOUT)
        return dt_error_context(st, "step %lld: the step agreement", (long long)step + 1);
    if (st != DT_OK)
        return st;
    *stop = v[OUT_STOP] > 0;
    if (*stop)
        describe_stop(r, v);
    *ckpt = v[OUT_CKPT] > 0;
    r->bg_done = v[OUT_WRITING] == 0; /* every rank's writer has finished */
    int skipped = 0;
    if ((st = optimizer_step(r, step, v[OUT_LOSS], &gate, v[OUT_SUMSQ], w, &skipped,
                             comm_failed)) != DT_OK)
        return st;
    r->step++;
    r->grads_zero = queued; /* queue_update zeroed them */
    r->buffers_synced = 0; /* training forwards moved the running statistics */
    r->batch++;
    r->samples += (int64_t)v[OUT_ROWS];
    if (skipped)
        return after_bad_step(r, step, v[OUT_LOSS]);
    r->bad_steps = 0;
    w->loss_sum += v[OUT_LOSS];
    w->correct += v[OUT_CORRECT];
    w->rows += v[OUT_ROWS];
    return DT_OK;
}

/* Checkpoints the coordinator asked for, and the stop. */
static dt_status after_step(struct run *r, int stop, int ckpt)
{
    int64_t every = r->job->checkpoint.every_steps;
    dt_status st = DT_OK;
    if (stop) {
        st = dt_train_ckpt_save(r, "stop requested");
        if (st != DT_OK)
            return st;
        return dt_set_error(DT_ERR_STOPPED,
                            "stopped by %s after step %lld with a checkpoint in %s; run "
                            "the same command again (--resume auto) to continue",
                            r->stop_why, (long long)r->step, r->ckpt_dir);
    }
    if (r->bg_done) /* a background write every rank has finished: its outcome */
        st = dt_train_ckpt_collect(r);
    if (st == DT_OK && (ckpt || (every > 0 && r->step % every == 0)))
        st = dt_train_ckpt_save_periodic(r, ckpt ? "checkpoint.every_minutes"
                                                 : "checkpoint.every_steps");
    if (st == DT_OK)
        st = dt_train_snap_save(r);
    return st;
}

static dt_status train_loop(struct run *r, struct dt_train_result *res)
{
    dt_status st = DT_OK;
    const struct dt_job *job = r->job;
    int64_t first_step = r->step, first_samples = r->samples;
    double start = dt_now(), last_bar = 0, eval_s = 0;
    struct window w = {.t0 = dt_now()};
    dt_backend_waits(r->be, &w.waits0);
    r->seg_start = start;
    /* the collectives of the loop give up first, the watchdog later */
    dt_comm_set_timeout(r->comm, job->runtime.timeout_s);
    while (r->epoch < r->epochs && r->step < r->total_steps) {
        int64_t epoch = r->epoch, rollbacks = r->rollbacks;
        DT_CHECK(dt_loader_start_epoch(r->train_ld, epoch, r->batch));
        res->epochs = epoch + 1;
        int end = 0;
        while (r->step < r->total_steps && rollbacks == r->rollbacks) {
            int stop = 0, ckpt = 0;
            DT_CHECK(train_step(r, &w, &end, &stop, &ckpt, &res->comm_failed));
            if (end)
                break;
            int64_t step = r->step;
            double elapsed = dt_now() - start - eval_s;
            double lr = dt_schedule_lr(job, step - 1, r->total_steps);
            int64_t done = r->samples - first_samples;
            int logged = step % job->train.log_every == 0 || step == r->total_steps;
            int epoch_end = step == epoch * r->bpe + epoch_steps(r, epoch);
            if (r->bar && !logged && (epoch_end || dt_now() - last_bar > BAR_REFRESH_S)) {
                show_progress(r, epoch, step, &w, lr, elapsed, done, 0);
                last_bar = dt_now();
            }
            if (logged) {
                res->train_loss = w.rows > 0 ? w.loss_sum / w.rows : 0;
                DT_CHECK(log_window(r, epoch, step, lr, &w, elapsed, done));
                w = (struct window){.t0 = dt_now()};
                dt_backend_waits(r->be, &w.waits0);
            }
            double tc = dt_now();
            DT_CHECK(after_step(r, stop, ckpt));
            w.ckpt_s += dt_now() - tc;
        }
        if (rollbacks != r->rollbacks)
            continue; /* position reloaded from a checkpoint */
        end_bar(r);
        if (end || r->step == r->total_steps) {
            double t0 = dt_now();
            dt_watchdog_phase(r->wd, "evaluation", r->step);
            DT_CHECK(evaluate(r, epoch, r->step, &res->test_loss, &res->test_acc));
            eval_s += dt_now() - t0;
            w.eval_s += dt_now() - t0;
        }
        if (end) {
            r->epoch++;
            r->batch = 0;
        }
    }
    dt_watchdog_idle(r->wd);
    dt_comm_set_timeout(r->comm, 0);
    res->steps = r->step;
    res->samples = r->samples;
    res->seconds = dt_now() - start;
    r->spent.eval_s = eval_s;
    double train_s = res->seconds - eval_s;
    res->samples_per_s = train_s > 0 ? (double)(r->samples - first_samples) / train_s : 0;
    res->gflops = res->samples_per_s * r->flops_per_sample / 1e9;
    if (r->step == first_step) {
        DT_LOG_INFO("train", "the run in %s already reached step %lld of %lld: evaluating only "
                             "(train with --resume never or another output.dir to start again)",
                    job->output.dir, (long long)r->step, (long long)r->total_steps);
        res->epochs = r->epoch + 1;
        DT_CHECK(evaluate(r, r->epoch, r->step, &res->test_loss, &res->test_acc));
    }
out:
    return st;
}

static int want_bar(const struct dt_job *job)
{
    const char *p = job->runtime.progress;
    if (strcmp(p, "bar") == 0)
        return 1;
    if (strcmp(p, "auto") == 0)
        return dt_stdout_is_terminal();
    return 0;
}

/* After resume: the earlier segments' time; the TensorBoard file (rank
 * 0) and NVML (a GPU run). */
static dt_status monitor_open(struct run *r)
{
    r->gpu_mem_peak = r->gpu_power_peak = -1;
    if (r->loaded) {
        r->prior_unknown = !r->loaded_has_time;
        r->prior_seconds = r->loaded_seconds;
        r->prior_segments = r->loaded_has_time ? r->loaded_segments : 1;
    }
    r->nvml = dt_nvml_open(dt_backend_device_uuid(r->be));
    dt_status st = DT_OK;
    if (r->rank == 0 && r->job->output.tensorboard) {
        char dir[sizeof r->job->output.dir + sizeof TB_DIR + 1], path[8192];
        snprintf(dir, sizeof dir, "%s/%s", r->job->output.dir, TB_DIR);
        st = dt_tb_open(dir, &r->tb, path, sizeof path);
        if (st == DT_OK)
            DT_LOG_DEBUG("train", "TensorBoard events go to %s", path);
    }
    return dt_dist_agree(r->comm, st);
}

static void monitor_close(struct run *r)
{
    dt_tb_close(r->tb);
    r->tb = NULL;
    dt_nvml_close(r->nvml);
    r->nvml = NULL;
}

/* The Slurm job this run belongs to, in train.log and the start record, so
 * a run directory shows which job and which requeue wrote each segment.
 * SLURM_RESTART_COUNT is absent until the first requeue. */
static void record_slurm(struct dt_metrics_rec *rec)
{
    const char *job = getenv("SLURM_JOB_ID");
    if (!job || !*job)
        return;
    const char *restarts = getenv("SLURM_RESTART_COUNT");
    char *end, array[96] = "";
    long long n = restarts && *restarts ? strtoll(restarts, &end, 10) : 0;
    if (restarts && *restarts && (*end || n < 0))
        n = 0;
    const char *ajob = getenv("SLURM_ARRAY_JOB_ID"), *atask = getenv("SLURM_ARRAY_TASK_ID");
    if (ajob && atask)
        snprintf(array, sizeof array, " (array job %s, task %s)", ajob, atask);
    const char *tasks = getenv("SLURM_NTASKS"), *nodes = getenv("SLURM_JOB_NUM_NODES");
    DT_LOG_INFO("train", "Slurm job %s%s, restart count %lld (SLURM_RESTART_COUNT), %s task%s on %s "
                         "node%s",
                job, array, n, tasks ? tasks : "?", tasks && !strcmp(tasks, "1") ? "" : "s",
                nodes ? nodes : "?", nodes && !strcmp(nodes, "1") ? "" : "s");
    dt_metrics_str(rec, "slurm_job_id", job);
    dt_metrics_int(rec, "slurm_restart_count", n);
}

static void hang_note_path(const struct run *r, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", r->job->output.dir, DT_WATCHDOG_NOTE);
}

/* Rank 0: the note a rank of the previous run left when it gave up on a
 * hang (watchdog.h), into this run's log; then removed, so it is told
 * once. Read as any input (a FIFO or a directory of that name is named,
 * never opened for reading), and bounded: at most HANG_NOTE_LINES lines of
 * at most HANG_NOTE_LINE bytes each go into the log. */
static void show_hang_note(const struct run *r)
{
    char path[HANG_NOTE_PATH], line[HANG_NOTE_LINE + 2];
    struct stat sb;
    int fd = -1, shown = 0, more = 0;
    hang_note_path(r, path, sizeof path);
    if (lstat(path, &sb) != 0) return;
    if (dt_input_open(path, "hang note", &fd, NULL) != DT_OK) {
        DT_LOG_WARN("train", "%s; it is left as it is", dt_last_error());
        return;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        int whole = strchr(line, '\n') != NULL;
        line[strcspn(line, "\n")] = '\0';
        if (line[0] && shown < HANG_NOTE_LINES) {
            DT_LOG_WARN("train", "the previous run in %s ended on a hang (%s): %s%s",
                        r->job->output.dir, DT_WATCHDOG_NOTE, line, whole ? "" : "...");
            shown++;
        } else if (line[0])
            more++;
        for (int c = whole ? '\n' : 0; c != '\n' && c != EOF;)
            c = fgetc(f); /* the rest of a long line */
    }
    fclose(f);
    if (more)
        DT_LOG_WARN("train", "%s: %d more line%s not shown", path, more, more == 1 ? "" : "s");
    if (unlink(path) != 0)
        DT_LOG_WARN("train", "cannot remove %s: %s", path, strerror(errno));
}

static dt_status start(struct run *r)
{
    dt_status st;
    char note[HANG_NOTE_PATH];
    hang_note_path(r, note, sizeof note);
    DT_CHECK(dt_dist_check_job(r->comm, r->job));
    DT_CHECK(dt_train_open_run_dir(r));
    DT_LOG_INFO("train", "run directory %s (job %s), %d rank%s", r->job->output.dir,
                r->job->source[0] ? r->job->source : "defaults", r->world,
                r->world == 1 ? "" : "s");
    if (r->rank == 0)
        show_hang_note(r);
    DT_CHECK(dt_train_open_data(r));
    DT_CHECK(dt_train_choose_backend(r));
    DT_CHECK(dt_train_ckpt_async_open(r));
    DT_CHECK(dt_train_build(r));
    DT_CHECK(dt_train_ckpt_async_ready(r));
    DT_CHECK(dt_train_snap_open(r));
    DT_CHECK(dt_train_ckpt_resume(r));
    DT_CHECK(monitor_open(r));
    DT_CHECK(dt_watchdog_start(r->job->runtime.timeout_s, r->rank, r->comm, note, &r->wd));
    r->last_ckpt_time = dt_now();
    struct dt_metrics_rec rec;
    dt_metrics_begin(&rec, "start");
    dt_metrics_str(&rec, "version", DT_VERSION);
    dt_metrics_int(&rec, "world", r->world);
    dt_metrics_int(&rec, "params", (int64_t)dt_model_param_numel(r->model));
    dt_metrics_int(&rec, "model_state_bytes", (int64_t)r->state_bytes);
    dt_metrics_int(&rec, "optim_state_bytes", (int64_t)r->optim_bytes);
    dt_metrics_str(&rec, "shard", dt_train_shard_name(r->shard));
    dt_metrics_int(&rec, "activation_bytes", (int64_t)dt_model_arena_bytes(r->model));
    dt_metrics_int(&rec, "activation_bytes_without_recompute",
                   (int64_t)dt_model_arena_bytes_full(r->model));
    dt_metrics_int(&rec, "steps", r->total_steps);
    dt_metrics_int(&rec, "global_batch", r->job->train.global_batch);
    dt_metrics_int(&rec, "micro_batch", r->micro);
    dt_metrics_int(&rec, "first_step", r->step);
    dt_metrics_str(&rec, "device", dt_backend_name(r->be));
    dt_metrics_str(&rec, "precision", r->job->train.precision);
    if (r->rank == 0)
        record_slurm(&rec);
    st = dt_metrics_put(r->metrics, &rec);
    st = dt_dist_agree(r->comm, st);
out:
    return st;
}

/* Training-split bytes each rank read from the dataset, gathered on every
 * rank into all[world] (malloc'd). */
static dt_status bytes_per_rank(struct run *r, uint64_t **all)
{
    uint64_t mine = dt_loader_bytes_read(r->train_ld);
    dt_status st = dt_calloc((size_t)r->world, sizeof **all, "per-rank byte counts", (void **)all);
    if (st == DT_OK)
        st = r->world == 1 ? ((*all)[0] = mine, DT_OK)
                           : dt_comm_allgather(r->comm, &mine, *all, sizeof mine);
    return st;
}

/* Peaks over the ranks, each in every rank's v[]: host memory (bytes of
 * resident memory at its highest, getrusage), GPU memory and power (NVML
 * samples at the logged windows; -1 without any). */
enum { PEAK_HOST, PEAK_GPU_MEM, PEAK_GPU_POWER, PEAK_N };

static dt_status peaks(struct run *r, double v[PEAK_N])
{
    struct rusage ru;
    v[PEAK_HOST] = getrusage(RUSAGE_SELF, &ru) == 0 ? 1024.0 * (double)ru.ru_maxrss : 0;
    v[PEAK_GPU_MEM] = r->gpu_mem_peak;
    v[PEAK_GPU_POWER] = r->gpu_power_peak;
    if (r->world == 1)
        return DT_OK;
    return dt_comm_allreduce(r->comm, v, PEAK_N, DT_F64, DT_COMM_MAX);
}

/* The time split of this segment, in seconds and as shares of its wall
 * time. Checkpoints include the final one and model.h5; "other" is what no
 * part holds (the loop's own work: agreement flags, logging, the bar). */
enum { SP_DATA, SP_COMPUTE, SP_COMM, SP_OPTIM, SP_EVAL, SP_CKPT, SP_OTHER, SP_N };
struct split {
    double wall, part[SP_N];
};
static const char *const split_names[] = {"data_wait", "compute",    "comm_exposed", "optimizer",
                                          "eval",      "checkpoint", "other"};

static void time_split(const struct run *r, double final_ckpt_s, struct split *sp)
{
    sp->wall = dt_now() - r->seg_start;
    sp->part[SP_DATA] = r->spent.data_s;
    sp->part[SP_COMPUTE] = r->spent.compute_s;
    sp->part[SP_COMM] = r->spent.comm_s;
    sp->part[SP_OPTIM] = r->spent.optim_s;
    sp->part[SP_EVAL] = r->spent.eval_s;
    sp->part[SP_CKPT] = r->spent.ckpt_s + final_ckpt_s;
    double known = 0;
    for (int i = 0; i < SP_OTHER; i++)
        known += sp->part[i];
    sp->part[SP_OTHER] = sp->wall > known ? sp->wall - known : 0;
}

static double share(const struct split *sp, int i)
{
    return sp->wall > 0 ? sp->part[i] / sp->wall : 0;
}

static void summary_record(struct run *r, const struct dt_train_result *res, const struct split *sp,
                           double util, const double pk[PEAK_N], struct dt_metrics_rec *rec)
{
    char key[64];
    dt_metrics_begin(rec, "summary");
    dt_metrics_int(rec, "world", r->world);
    dt_metrics_int(rec, "steps", res->steps);
    dt_metrics_int(rec, "epochs", res->epochs);
    dt_metrics_int(rec, "samples", res->samples);
    dt_metrics_num(rec, "seconds", res->seconds, 9);
    dt_metrics_num(rec, "samples_per_s", res->samples_per_s, 6);
    dt_metrics_num(rec, "gflops", res->gflops, 6);
    dt_metrics_num(rec, "test_loss", res->test_loss, 9);
    dt_metrics_num(rec, "test_acc", res->test_acc, 6);
    dt_metrics_num(rec, "accel_util", util, 6);
    dt_metrics_num(rec, "segment_s", sp->wall, 9);
    for (int i = 0; i < SP_N; i++) {
        snprintf(key, sizeof key, "time_%s_s", split_names[i]);
        dt_metrics_num(rec, key, sp->part[i], 6);
        snprintf(key, sizeof key, "share_%s", split_names[i]);
        dt_metrics_num(rec, key, share(sp, i), 4);
    }
    dt_metrics_num(rec, "total_train_s", r->prior_seconds + sp->wall, 9);
    dt_metrics_int(rec, "segments", r->prior_segments + 1);
    if (r->prior_unknown) /* resumed from a checkpoint without the stored time */
        dt_metrics_str(rec, "total_train_s_note",
                       "lower bound: an earlier segment's time was not recorded");
    dt_metrics_int(rec, "peak_host_mem_bytes", (int64_t)pk[PEAK_HOST]);
    if (r->shard >= 2 && r->red) /* sized in the first step, the same on every rank */
        dt_metrics_int(rec, "grad_staging_bytes", (int64_t)dt_reducer_staging_bytes(r->red));
    if (r->shard == 3 && r->red)
        dt_metrics_int(rec, "param_gather_bytes", (int64_t)dt_reducer_gather_bytes(r->red));
    if (pk[PEAK_GPU_MEM] >= 0)
        dt_metrics_int(rec, "peak_gpu_mem_bytes", (int64_t)pk[PEAK_GPU_MEM]);
    if (pk[PEAK_GPU_POWER] >= 0)
        dt_metrics_num(rec, "peak_gpu_power_w", pk[PEAK_GPU_POWER], 5);
}

static void summary_line(struct run *r, const struct dt_train_result *res, const struct split *sp,
                         double util, const double pk[PEAK_N])
{
    char dur[32], total[32], host[32], gpu[64] = "", segs[96] = "";
    dt_format_duration(res->seconds, dur, sizeof dur);
    dt_format_duration(r->prior_seconds + sp->wall, total, sizeof total);
    dt_format_bytes((uint64_t)pk[PEAK_HOST], host, sizeof host);
    if (r->prior_segments > 0)
        snprintf(segs, sizeof segs, " (%s%s in all over %lld segments)",
                 r->prior_unknown ? "at least " : "", total, (long long)r->prior_segments + 1);
    if (pk[PEAK_GPU_MEM] >= 0) {
        char b[32];
        dt_format_bytes((uint64_t)pk[PEAK_GPU_MEM], b, sizeof b);
        snprintf(gpu, sizeof gpu, ", peak GPU memory %s", b);
    }
    char fin[96];
    if (r->lm)
        snprintf(fin, sizeof fin, "final %.32s loss %.4f (perplexity %.2f), %.0f tokens/s",
                 r->test->name, res->test_loss, exp(res->test_loss),
                 res->samples_per_s * r->labels_per_row);
    else
        snprintf(fin, sizeof fin, "final test accuracy %.2f%% (loss %.4f)", 100.0 * res->test_acc,
                 res->test_loss);
    DT_LOG_INFO("train",
                "done: %lld steps (%lld epoch%s) on %d rank%s in %s%s, %.0f samples/s, "
                "%.1f GFLOP/s, accelerator utilisation %.0f%%; time: data wait %.0f%%, compute "
                "%.0f%%, exposed comm %.0f%%, optimizer %.0f%%, eval %.0f%%, checkpoints %.0f%%, "
                "other %.0f%%; peak host memory %s per rank%s; %s",
                (long long)res->steps, (long long)res->epochs, res->epochs == 1 ? "" : "s",
                r->world, r->world == 1 ? "" : "s", dur, segs, res->samples_per_s, res->gflops,
                100.0 * util, 100.0 * share(sp, SP_DATA), 100.0 * share(sp, SP_COMPUTE),
                100.0 * share(sp, SP_COMM), 100.0 * share(sp, SP_OPTIM), 100.0 * share(sp, SP_EVAL),
                100.0 * share(sp, SP_CKPT), 100.0 * share(sp, SP_OTHER), host, gpu, fin);
}

static dt_status finish(struct run *r, const struct dt_train_result *res, double final_ckpt_s)
{
    uint64_t *bytes = NULL;
    double pk[PEAK_N];
    struct split sp;
    dt_status st = bytes_per_rank(r, &bytes);
    if (st == DT_OK)
        st = peaks(r, pk);
    if (st != DT_OK) {
        free(bytes);
        return st;
    }
    time_split(r, final_ckpt_s, &sp);
    /* the training steps' wall time, as in each window */
    double util = accel_util(r->spent.compute_s + r->spent.optim_s,
                             sp.wall - sp.part[SP_EVAL] - sp.part[SP_CKPT]);
    summary_line(r, res, &sp, util, pk);
    struct dt_metrics_rec rec;
    summary_record(r, res, &sp, util, pk, &rec);
    dt_metrics_u64_list(&rec, "train_bytes_read_per_rank", bytes, r->world);
    free(bytes);
    st = dt_metrics_put(r->metrics, &rec);
    return dt_dist_agree(r->comm, st);
}

static const char *nonfinite_name(double v) { return isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf"; }

/* A run whose final evaluation is not finite has not produced a usable
 * model: it ends as diverged, without a final checkpoint or model.h5 (the
 * checkpoints written so far stay). */
static dt_status check_final_eval(struct run *r, double test_loss)
{
    if (isfinite(test_loss))
        return DT_OK;
    return dt_set_error(DT_ERR_USAGE,
                        "training diverged: the final test loss is %s after step %lld, so no "
                        "final checkpoint or %s/model.h5 was written (earlier checkpoints in %s "
                        "are kept); lower train.optimizer.lr or set train.clip_norm",
                        nonfinite_name(test_loss), (long long)r->step, r->job->output.dir,
                        r->ckpt_dir);
}

dt_status dt_train_run(const struct dt_job *job, dt_comm_t *comm, const struct dt_train_opts *opts,
                       struct dt_train_result *res)
{
    dt_status st;
    struct run r = {.job = job, .comm = comm, .opts = opts, .last_ckpt_step = -1};
    memset(res, 0, sizeof *res);
    r.rank = dt_comm_rank(comm);
    r.world = dt_comm_size(comm);
    r.quiet = strcmp(job->runtime.progress, "off") == 0;
    r.bar = r.rank == 0 && !r.quiet && want_bar(job);
    DT_CHECK(dt_fault_init());
    DT_CHECK(start(&r));
    DT_CHECK(train_loop(&r, res));
    DT_CHECK(check_final_eval(&r, res->test_loss));
    double t0 = dt_now();
    DT_CHECK(dt_train_ckpt_save(&r, "end of training"));
    DT_CHECK(dt_train_save_model(&r));
    dt_train_snap_discard(&r); /* the run is complete */
    st = finish(&r, res, dt_now() - t0);
out:
    /* every failure past start-up that is not a communication failure was
     * agreed by all ranks (see agree_outcome) */
    res->comm_failed = res->comm_failed || st == DT_ERR_COMM || st == DT_ERR_TIMEOUT;
    if (st == DT_ERR_TIMEOUT && res->comm_failed && r.ckpt_dir[0]) { /* this rank gave up first */
        char note[HANG_NOTE_PATH];
        hang_note_path(&r, note, sizeof note);
        dt_watchdog_note(note, r.rank, dt_last_error());
    }
    dt_watchdog_stop(r.wd);
    monitor_close(&r);
    dt_train_close(&r, st);
    return st;
}

dt_status dt_eval_run(const struct dt_job *job, dt_comm_t *comm, const char *checkpoint,
                      struct dt_train_result *res)
{
    dt_status st;
    struct run r = {.job = job, .comm = comm, .quiet = 1, .eval_only = 1};
    memset(res, 0, sizeof *res);
    r.rank = dt_comm_rank(comm);
    r.world = dt_comm_size(comm);
    DT_CHECK(dt_fault_init());
    DT_CHECK(dt_train_open_data(&r));
    DT_CHECK(dt_train_choose_backend(&r));
    DT_CHECK(dt_train_build(&r));
    DT_CHECK(dt_train_ckpt_load_params(&r, checkpoint));
    DT_CHECK(evaluate(&r, r.epoch, r.step, &res->test_loss, &res->test_acc));
    res->steps = r.step;
    res->lm = r.lm;
    if (!isfinite(res->test_loss))
        st = dt_set_error(DT_ERR_USAGE,
                          "checkpoint %s gives a test loss of %s: its parameters are not usable "
                          "(the run that wrote it diverged)",
                          checkpoint, nonfinite_name(res->test_loss));
out:
    res->comm_failed = st == DT_ERR_COMM || st == DT_ERR_TIMEOUT;
    dt_train_close(&r, st);
    return st;
}
