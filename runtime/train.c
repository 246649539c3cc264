/*
 * train.c - the step loop.
 *
 * One optimizer step consumes one global batch: this rank's micro-batches
 * are run forward and backward, adding into one gradient buffer scaled by
 * 1/global rows so the sum is the mean over the global batch; then the
 * gradients are clipped and the optimizer updates the parameters. Every
 * random draw is keyed by (seed, purpose, step, row), so the result does
 * not depend on how the global batch is split into micro-batches.
 *
 * Time per step is split into data wait, compute and optimizer, and
 * reported in metrics.jsonl with loss, accuracy, learning rate and
 * throughput; rank 0 shows a live bar on a terminal, periodic lines
 * otherwise.
 */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/dataset.h"
#include "../io/loader.h"
#include "backend.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"
#include "util.h"

#define TRAIN_LOG "train.log"
#define TRAIN_METRICS "metrics.jsonl"
#define TRAIN_CONFIG "config.yaml"
#define BAR_WIDTH 24
#define BAR_REFRESH_S 0.2

struct run {
    const struct dt_job *job;
    dt_dataset_t *ds;
    const struct dt_split_info *train, *test;
    dt_backend_t *be;
    dt_model_t *model;
    dt_optim_t *opt;
    dt_loader_t *train_ld, *test_ld;
    dt_metrics_t *metrics;
    FILE *logf;
    int64_t micro, bpe, total_steps, epochs;
    int bar; /* live progress bar instead of lines */
    int quiet;
    double flops_per_sample;
};

/* Progress accumulated between two log points. */
struct window {
    double loss_sum;
    int64_t correct, rows, steps;
    double t0, data_s, compute_s, optim_s;
    double grad_norm;
};

/* ---- set-up -------------------------------------------------------------- */

static dt_status open_run_dir(struct run *r)
{
    const char *dir = r->job->output.dir;
    char path[4096 + 64];
    dt_status st = dt_mkdir_p(dir);
    if (st != DT_OK)
        return dt_error_context(st, "output.dir");
    snprintf(path, sizeof path, "%s/%s.tmp", dir, TRAIN_CONFIG);
    FILE *fp = fopen(path, "w");
    if (!fp)
        return dt_set_error(DT_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    dt_job_write_yaml(r->job, fp);
    int bad = ferror(fp);
    bad |= fclose(fp) != 0;
    char final[4096 + 64];
    snprintf(final, sizeof final, "%s/%s", dir, TRAIN_CONFIG);
    if (bad || rename(path, final) != 0) {
        unlink(path);
        return dt_set_error(DT_ERR_IO, "cannot write '%s': %s", final, strerror(errno));
    }
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_LOG);
    r->logf = fopen(path, "a");
    if (!r->logf)
        return dt_set_error(DT_ERR_IO, "cannot open log '%s': %s", path, strerror(errno));
    dt_log_set_file(r->logf);
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_METRICS);
    return dt_metrics_open(path, &r->metrics);
}

static dt_status open_data(struct run *r)
{
    const struct dt_job *job = r->job;
    dt_status st = dt_dataset_open(job->data.path, &r->ds);
    if (st != DT_OK)
        return dt_error_context(st, "data.path");
    DT_CHECK(dt_dataset_split(r->ds, job->data.train_split, &r->train));
    DT_CHECK(dt_dataset_split(r->ds, job->data.test_split, &r->test));
    int same = r->train->ndim == r->test->ndim;
    for (int i = 0; same && i < r->train->ndim; i++)
        same = r->train->shape[i] == r->test->shape[i];
    if (!same)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "dataset '%s': splits '%s' and '%s' have different sample shapes",
                            job->data.path, r->train->name, r->test->name);
out:
    return st;
}

static dt_status choose_backend(struct run *r)
{
    const struct dt_job *job = r->job;
    int threads = job->runtime.threads > 0 ? (int)job->runtime.threads : dt_cpu_count();
    struct dt_backend_opts o = {.threads = threads,
                                .reference_kernels = job->runtime.reference_kernels};
    const char *name = job->runtime.device;
    if (strcmp(name, "auto") == 0) {
        char why[512];
        if (dt_cuda_usable(why, sizeof why))
            DT_LOG_INFO("runtime", "device: cpu (a GPU is present, %s, but this version of dtrain "
                                   "has no CUDA compute backend yet)", why);
        else
            DT_LOG_INFO("runtime", "device: cpu; %s", why);
        name = "cpu";
    }
    dt_status st = dt_backend_create(name, &o, &r->be);
    if (st != DT_OK)
        return dt_error_context(st, "runtime.device");
    DT_LOG_INFO("runtime", "backend %s, %d thread%s%s", name, threads, threads == 1 ? "" : "s",
                job->runtime.reference_kernels ? ", reference kernels" : "");
    return DT_OK;
}

static void log_layer(void *ctx, const char *s) { DT_LOG_INFO("model", "%s", s); }

static dt_status build(struct run *r)
{
    const struct dt_job *job = r->job;
    dt_status st;
    const struct dt_dataset_info *info = dt_dataset_get_info(r->ds);
    struct dt_model_io io = {.ndim = r->train->ndim, .num_classes = info->num_classes};
    for (int i = 0; i < r->train->ndim && i < 4; i++)
        io.shape[i] = r->train->shape[i];
    int64_t g = job->train.global_batch;
    r->micro = job->train.micro_batch > 0 ? job->train.micro_batch : g;
    if (g % r->micro != 0) {
        return dt_set_error(DT_ERR_USAGE,
                            "train.micro_batch=%lld does not divide train.global_batch=%lld; use "
                            "a divisor of %lld",
                            (long long)r->micro, (long long)g, (long long)g);
    }
    if (g > r->train->n)
        return dt_set_error(DT_ERR_USAGE,
                            "train.global_batch=%lld is larger than split '%s' (%lld samples)",
                            (long long)g, r->train->name, (long long)r->train->n);
    int64_t max_rows = r->micro > job->train.eval_batch ? r->micro : job->train.eval_batch;
    DT_CHECK(dt_model_create(job, &io, r->be, max_rows, &r->model));
    DT_CHECK(dt_model_init_params(r->model, (uint64_t)job->train.seed));
    DT_CHECK(dt_optim_create(job, r->be, dt_model_num_params(r->model), &r->opt));
    r->flops_per_sample = dt_model_flops_per_sample(r->model, 1);

    struct dt_loader_opts lo = {.ds = r->ds,
                                .split = job->data.train_split,
                                .global_batch = g,
                                .micro_batch = r->micro,
                                .rank = 0,
                                .world = 1,
                                .seed = (uint64_t)job->train.seed,
                                .shuffle = job->data.shuffle,
                                .drop_last = job->data.drop_last,
                                .workers = (int)job->data.workers,
                                .prefetch = (int)job->data.prefetch};
    DT_CHECK(dt_loader_create(&lo, &r->train_ld));
    lo.split = job->data.test_split;
    lo.global_batch = lo.micro_batch = job->train.eval_batch;
    lo.shuffle = 0;
    lo.drop_last = 0;
    DT_CHECK(dt_loader_create(&lo, &r->test_ld));

    r->bpe = dt_loader_batches_per_epoch(r->train_ld);
    if (r->bpe < 1)
        return dt_set_error(DT_ERR_USAGE, "an epoch of split '%s' has no full global batch",
                            r->train->name);
    r->total_steps = job->train.steps > 0 ? job->train.steps : job->train.epochs * r->bpe;
    r->epochs = (r->total_steps + r->bpe - 1) / r->bpe;

    DT_LOG_INFO("model", "%s: %zu parameters in %d tensors, %.2f MFLOP per sample forward",
                job->model.type, dt_model_num_params(r->model), dt_model_param_count(r->model),
                dt_model_flops_per_sample(r->model, 0) / 1e6);
    dt_model_describe(r->model, log_layer, NULL);
    DT_LOG_INFO("data", "%s: train %lld samples, test %lld; global batch %lld = micro-batch %lld "
                        "x %lld accumulation; %lld steps/epoch, %lld steps",
                job->data.path, (long long)r->train->n, (long long)r->test->n, (long long)g,
                (long long)r->micro, (long long)(g / r->micro), (long long)r->bpe,
                (long long)r->total_steps);
out:
    return st;
}

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
    double sps = elapsed > 0 ? (double)samples_done / elapsed : 0;
    double eta = step > 0 ? elapsed * (double)(r->total_steps - step) / (double)step : 0;
    char etas[32];
    dt_format_duration(eta, etas, sizeof etas);
    double loss = w->rows ? w->loss_sum / (double)w->rows : 0;
    double acc = w->rows ? 100.0 * (double)w->correct / (double)w->rows : 0;
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
                      "ETA %s";
    if (r->bar || r->quiet)
        dt_log_file_only("train", fmt, (long long)epoch + 1, (long long)r->epochs, (long long)step,
                         (long long)r->total_steps, loss, acc, lr, sps, etas);
    else
        DT_LOG_INFO("train", fmt, (long long)epoch + 1, (long long)r->epochs, (long long)step,
                    (long long)r->total_steps, loss, acc, lr, sps, etas);
}

static void end_bar(struct run *r)
{
    if (r->bar) {
        printf("\n");
        fflush(stdout);
    }
}

/* ---- evaluation ---------------------------------------------------------- */

static dt_status evaluate(struct run *r, int64_t epoch, int64_t step, double *loss, double *acc)
{
    dt_status st;
    double loss_sum = 0;
    int64_t correct = 0, rows = 0;
    int end = 0;
    DT_CHECK(dt_loader_start_epoch(r->test_ld, 0, 0));
    for (;;) {
        struct dt_batch b;
        DT_CHECK(dt_loader_next(r->test_ld, &b, &end));
        if (end)
            break;
        st = dt_model_forward(r->model, b.x, b.y, b.rows, 0, (uint64_t)r->job->train.seed, step,
                              b.row0, &loss_sum, &correct);
        rows += b.rows;
        dt_loader_release(r->test_ld, &b);
        if (st != DT_OK)
            goto out;
    }
    *loss = rows ? loss_sum / (double)rows : 0;
    *acc = rows ? (double)correct / (double)rows : 0;
    DT_LOG_INFO("eval", "epoch %lld: test loss %.4f, test accuracy %.2f%% (%lld samples)",
                (long long)epoch + 1, *loss, 100.0 * *acc, (long long)rows);
    st = dt_metrics_write(r->metrics,
                          "\"type\":\"eval\",\"split\":\"%s\",\"epoch\":%lld,\"step\":%lld,"
                          "\"loss\":%.6f,\"acc\":%.6f,\"samples\":%lld",
                          r->test->name, (long long)epoch + 1, (long long)step, *loss, *acc,
                          (long long)rows);
out:
    return st;
}

/* ---- one optimizer step -------------------------------------------------- */

/* Runs this rank's micro-batches of one global batch. *end = 1 when the
 * epoch ran out before the batch started. */
static dt_status run_batch(struct run *r, int64_t step, struct window *w, int *end)
{
    dt_status st;
    struct dt_batch b;
    int64_t rows = 0;
    double loss_sum = 0;
    int64_t correct = 0;
    DT_CHECK(dt_model_zero_grads(r->model));
    for (;;) {
        double t0 = dt_now();
        DT_CHECK(dt_loader_next(r->train_ld, &b, end));
        double t1 = dt_now();
        w->data_s += t1 - t0;
        if (*end)
            return DT_OK;
        st = dt_model_forward(r->model, b.x, b.y, b.rows, 1, (uint64_t)r->job->train.seed, step,
                              b.row0, &loss_sum, &correct);
        if (st == DT_OK)
            st = dt_model_backward(r->model, b.rows, 1.0f / (float)b.global_rows);
        rows += b.rows;
        int last = b.micro == b.micro_count - 1;
        dt_loader_release(r->train_ld, &b);
        w->compute_s += dt_now() - t1;
        if (st != DT_OK || last)
            break;
    }
    if (st == DT_OK && !isfinite(loss_sum))
        st = dt_set_error(DT_ERR_USAGE,
                          "the loss is not finite at step %lld; training diverged: lower "
                          "train.optimizer.lr or set train.clip_norm",
                          (long long)step + 1);
    w->loss_sum += loss_sum;
    w->correct += correct;
    w->rows += rows;
out:
    return st;
}

/* The gradient norm costs a pass over the gradients: it is computed when
 * clipping needs it or when this step is logged. */
static dt_status optimizer_step(struct run *r, int64_t step, double lr, struct window *w)
{
    double t0 = dt_now(), norm = w->grad_norm;
    size_t n = dt_model_num_params(r->model);
    dt_status st = DT_OK;
    int logged = (step + 1) % r->job->train.log_every == 0 || step + 1 == r->total_steps;
    if (r->job->train.clip_norm > 0 || logged)
        st = dt_clip_grad_norm(r->be, dt_model_grads(r->model), n, r->job->train.clip_norm, &norm);
    if (st == DT_OK)
        st = dt_optim_step(r->opt, dt_model_params(r->model), dt_model_grads(r->model), lr);
    w->grad_norm = norm;
    w->optim_s += dt_now() - t0;
    w->steps++;
    return st;
}

static dt_status log_window(struct run *r, int64_t epoch, int64_t step, double lr,
                            struct window *w, double elapsed, int64_t samples)
{
    double dt = dt_now() - w->t0;
    double loss = w->rows ? w->loss_sum / (double)w->rows : 0;
    double acc = w->rows ? (double)w->correct / (double)w->rows : 0;
    dt_status st = dt_metrics_write(
        r->metrics,
        "\"type\":\"train\",\"epoch\":%lld,\"step\":%lld,\"loss\":%.6f,\"acc\":%.6f,\"lr\":%.6g,"
        "\"grad_norm\":%.6g,\"samples\":%lld,\"samples_per_s\":%.1f,\"step_s\":%.6f,"
        "\"data_wait_s\":%.6f,\"compute_s\":%.6f,\"comm_exposed_s\":0,\"optimizer_s\":%.6f",
        (long long)epoch + 1, (long long)step, loss, acc, lr, w->grad_norm, (long long)samples,
        dt > 0 ? (double)w->rows / dt : 0.0, w->steps ? dt / (double)w->steps : 0.0,
        w->steps ? w->data_s / (double)w->steps : 0.0,
        w->steps ? w->compute_s / (double)w->steps : 0.0,
        w->steps ? w->optim_s / (double)w->steps : 0.0);
    show_progress(r, epoch, step, w, lr, elapsed, samples, 1);
    return st;
}

/* ---- the loop ------------------------------------------------------------ */

static dt_status train_loop(struct run *r, struct dt_train_result *res)
{
    dt_status st = DT_OK;
    const struct dt_job *job = r->job;
    int64_t step = 0, samples = 0;
    double start = dt_now(), last_bar = 0, eval_s = 0;
    struct window w = {.t0 = dt_now()};
    for (int64_t epoch = 0; epoch < r->epochs && step < r->total_steps; epoch++) {
        DT_CHECK(dt_loader_start_epoch(r->train_ld, epoch, 0));
        res->epochs = epoch + 1;
        for (int end = 0; step < r->total_steps;) {
            int64_t rows_before = w.rows;
            DT_CHECK(run_batch(r, step, &w, &end));
            if (end)
                break;
            double lr = dt_schedule_lr(job, step, r->total_steps);
            DT_CHECK(optimizer_step(r, step, lr, &w));
            samples += w.rows - rows_before;
            step++;
            double elapsed = dt_now() - start - eval_s;
            int logged = step % job->train.log_every == 0 || step == r->total_steps;
            int epoch_end = step == epoch * r->bpe + epoch_steps(r, epoch);
            if (r->bar && !logged && (epoch_end || dt_now() - last_bar > BAR_REFRESH_S)) {
                show_progress(r, epoch, step, &w, lr, elapsed, samples, 0);
                last_bar = dt_now();
            }
            if (logged) {
                res->train_loss = w.rows ? w.loss_sum / (double)w.rows : 0;
                DT_CHECK(log_window(r, epoch, step, lr, &w, elapsed, samples));
                w = (struct window){.t0 = dt_now()};
            }
        }
        end_bar(r);
        double t0 = dt_now();
        DT_CHECK(evaluate(r, epoch, step, &res->test_loss, &res->test_acc));
        eval_s += dt_now() - t0;
    }
    res->steps = step;
    res->samples = samples;
    res->seconds = dt_now() - start;
    double train_s = res->seconds - eval_s;
    res->samples_per_s = train_s > 0 ? (double)samples / train_s : 0;
    res->gflops = res->samples_per_s * r->flops_per_sample / 1e9;
out:
    return st;
}

static void close_run(struct run *r, dt_status st)
{
    dt_loader_destroy(r->train_ld);
    dt_loader_destroy(r->test_ld);
    dt_optim_destroy(r->opt);
    dt_model_destroy(r->model);
    dt_backend_destroy(r->be);
    if (r->ds)
        dt_dataset_close(r->ds);
    dt_metrics_close(r->metrics);
    if (r->logf) {
        dt_log_set_file(NULL);
        if (st != DT_OK) /* the launcher prints it; the log keeps it too */
            fprintf(r->logf, "error: %s\n", dt_last_error());
        fclose(r->logf);
    }
}

static int want_bar(const struct dt_job *job)
{
    const char *p = job->runtime.progress;
    if (strcmp(p, "bar") == 0)
        return 1;
    if (strcmp(p, "auto") == 0)
        return isatty(STDOUT_FILENO);
    return 0;
}

dt_status dt_train_run(const struct dt_job *job, struct dt_train_result *res)
{
    dt_status st;
    struct run r = {.job = job};
    memset(res, 0, sizeof *res);
    r.quiet = strcmp(job->runtime.progress, "off") == 0;
    r.bar = !r.quiet && want_bar(job);
    DT_CHECK(open_run_dir(&r));
    DT_LOG_INFO("train", "run directory %s (job %s)", job->output.dir,
                job->source[0] ? job->source : "defaults");
    DT_CHECK(open_data(&r));
    DT_CHECK(choose_backend(&r));
    DT_CHECK(build(&r));
    DT_CHECK(dt_metrics_write(r.metrics,
                              "\"type\":\"start\",\"version\":\"%s\",\"world\":1,\"params\":%zu,"
                              "\"steps\":%lld,\"global_batch\":%lld,\"micro_batch\":%lld",
                              DT_VERSION, dt_model_num_params(r.model),
                              (long long)r.total_steps, (long long)job->train.global_batch,
                              (long long)r.micro));
    DT_CHECK(train_loop(&r, res));
    char dur[32];
    dt_format_duration(res->seconds, dur, sizeof dur);
    DT_LOG_INFO("train", "done: %lld steps (%lld epoch%s) in %s, %.0f samples/s, %.1f GFLOP/s; "
                         "final test accuracy %.2f%% (loss %.4f)",
                (long long)res->steps, (long long)res->epochs, res->epochs == 1 ? "" : "s", dur, res->samples_per_s,
                res->gflops, 100.0 * res->test_acc, res->test_loss);
    DT_CHECK(dt_metrics_write(r.metrics,
                              "\"type\":\"summary\",\"steps\":%lld,\"epochs\":%lld,\"samples\":%lld,"
                              "\"seconds\":%.3f,\"samples_per_s\":%.1f,\"gflops\":%.3f,"
                              "\"test_loss\":%.6f,\"test_acc\":%.6f",
                              (long long)res->steps, (long long)res->epochs,
                              (long long)res->samples, res->seconds, res->samples_per_s,
                              res->gflops, res->test_loss, res->test_acc));
out:
    close_run(&r, st);
    return st;
}
