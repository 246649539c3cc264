/*
 * test_config.c - the job file: defaults, loading, --set, validation, the
 * YAML dump (round-trip) and the reference page.
 *
 * Error tests compare the whole message a user would see, so a change in
 * the location, the key, the expectation or the hint shows up here. The
 * reference test compares docs/config.md with what dt_job_write_reference
 * prints, so the page cannot drift from the schema.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cu_util.h"
#include "runtime/config/config.h"
#include "runtime/config/config_impl.h"

#define PATH_MAX_ 4096

/* ---- helpers ----------------------------------------------------------- */

static void tmp_path(const char *name, char *buf)
{
    snprintf(buf, PATH_MAX_, "%s/test_config_%s", cu_tmpdir(), name);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
}

/* Writes text to a temp file named name, loads it; path gets the file name. */
static dt_status load_text(const char *name, const char *text, struct dt_job *job, char *path)
{
    tmp_path(name, path);
    write_text(path, text);
    return dt_job_load(path, job);
}

/* Loading text fails with DT_ERR_USAGE and exactly "<path><suffix>". */
static void expect_load_error(const char *text, const char *suffix)
{
    char path[PATH_MAX_], want[PATH_MAX_ + 512];
    struct dt_job job;
    dt_status st = load_text("err.yaml", text, &job, path);
    CU_ASSERT_EQUAL(st, DT_ERR_USAGE);
    snprintf(want, sizeof want, "%s%s", path, suffix);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);
    if (strcmp(dt_last_error(), want) != 0)
        fprintf(stderr, "\n  got:  %s\n  want: %s\n", dt_last_error(), want);
}

/* dt_job_set fails with DT_ERR_USAGE and exactly msg. */
static void expect_set_error(const char *assignment, const char *msg)
{
    struct dt_job job;
    dt_job_defaults(&job);
    CU_ASSERT_EQUAL(dt_job_set(&job, assignment), DT_ERR_USAGE);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), msg);
    if (strcmp(dt_last_error(), msg) != 0)
        fprintf(stderr, "\n  got:  %s\n  want: %s\n", dt_last_error(), msg);
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 4096 > cap) {
            cap = 2 * cap + 4096;
            buf = realloc(buf, cap);
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return buf;
}

/* Every field but source. */
static void assert_jobs_equal(const struct dt_job *a, const struct dt_job *b)
{
    CU_ASSERT_STRING_EQUAL(a->model.type, b->model.type);
    CU_ASSERT_EQUAL(a->model.nhidden, b->model.nhidden);
    for (int i = 0; i < a->model.nhidden && i < DT_JOB_MAX_HIDDEN; i++)
        CU_ASSERT_EQUAL(a->model.hidden[i], b->model.hidden[i]);
    CU_ASSERT_STRING_EQUAL(a->model.activation, b->model.activation);
    CU_ASSERT_EQUAL(a->model.dropout, b->model.dropout);
    CU_ASSERT_STRING_EQUAL(a->model.init, b->model.init);
    CU_ASSERT_STRING_EQUAL(a->data.path, b->data.path);
    CU_ASSERT_STRING_EQUAL(a->data.train_split, b->data.train_split);
    CU_ASSERT_STRING_EQUAL(a->data.test_split, b->data.test_split);
    CU_ASSERT_EQUAL(a->data.shuffle, b->data.shuffle);
    CU_ASSERT_EQUAL(a->data.drop_last, b->data.drop_last);
    CU_ASSERT_EQUAL(a->data.workers, b->data.workers);
    CU_ASSERT_EQUAL(a->data.prefetch, b->data.prefetch);
    CU_ASSERT_EQUAL(a->train.epochs, b->train.epochs);
    CU_ASSERT_EQUAL(a->train.steps, b->train.steps);
    CU_ASSERT_EQUAL(a->train.global_batch, b->train.global_batch);
    CU_ASSERT_EQUAL(a->train.micro_batch, b->train.micro_batch);
    CU_ASSERT_EQUAL(a->train.seed, b->train.seed);
    CU_ASSERT_EQUAL(a->train.eval_batch, b->train.eval_batch);
    CU_ASSERT_EQUAL(a->train.log_every, b->train.log_every);
    CU_ASSERT_EQUAL(a->train.clip_norm, b->train.clip_norm);
    CU_ASSERT_STRING_EQUAL(a->train.precision, b->train.precision);
    CU_ASSERT_STRING_EQUAL(a->train.optimizer.name, b->train.optimizer.name);
    CU_ASSERT_EQUAL(a->train.optimizer.lr, b->train.optimizer.lr);
    CU_ASSERT_EQUAL(a->train.optimizer.momentum, b->train.optimizer.momentum);
    CU_ASSERT_EQUAL(a->train.optimizer.nesterov, b->train.optimizer.nesterov);
    CU_ASSERT_EQUAL(a->train.optimizer.weight_decay, b->train.optimizer.weight_decay);
    CU_ASSERT_EQUAL(a->train.optimizer.beta1, b->train.optimizer.beta1);
    CU_ASSERT_EQUAL(a->train.optimizer.beta2, b->train.optimizer.beta2);
    CU_ASSERT_EQUAL(a->train.optimizer.eps, b->train.optimizer.eps);
    CU_ASSERT_STRING_EQUAL(a->train.schedule.name, b->train.schedule.name);
    CU_ASSERT_EQUAL(a->train.schedule.warmup_steps, b->train.schedule.warmup_steps);
    CU_ASSERT_EQUAL(a->train.schedule.step_size, b->train.schedule.step_size);
    CU_ASSERT_EQUAL(a->train.schedule.gamma, b->train.schedule.gamma);
    CU_ASSERT_EQUAL(a->train.schedule.min_lr, b->train.schedule.min_lr);
    CU_ASSERT_STRING_EQUAL(a->runtime.device, b->runtime.device);
    CU_ASSERT_EQUAL(a->runtime.allow_tf32, b->runtime.allow_tf32);
    CU_ASSERT_EQUAL(a->runtime.share_gpus, b->runtime.share_gpus);
    CU_ASSERT_STRING_EQUAL(a->comm.backend, b->comm.backend);
    CU_ASSERT_STRING_EQUAL(a->comm.grad_dtype, b->comm.grad_dtype);
    CU_ASSERT_EQUAL(a->runtime.threads, b->runtime.threads);
    CU_ASSERT_STRING_EQUAL(a->runtime.log_level, b->runtime.log_level);
    CU_ASSERT_EQUAL(a->runtime.reference_kernels, b->runtime.reference_kernels);
    CU_ASSERT_STRING_EQUAL(a->runtime.progress, b->runtime.progress);
    CU_ASSERT_STRING_EQUAL(a->output.dir, b->output.dir);
    CU_ASSERT_EQUAL(a->output.adopt, b->output.adopt);
}

/* Writes job as YAML, loads it back, and checks the two are equal. */
static void assert_round_trip(const struct dt_job *job)
{
    char path[PATH_MAX_];
    struct dt_job back;
    tmp_path("roundtrip.yaml", path);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    dt_job_write_yaml(job, f);
    fclose(f);
    memset(&back, 0xab, sizeof back);
    CU_ASSERT_EQUAL_FATAL(dt_job_load(path, &back), DT_OK);
    assert_jobs_equal(job, &back);
    CU_ASSERT_STRING_EQUAL(back.source, path);
    /* unused bytes are zeroed on both sides, so the whole struct matches too */
    memcpy(back.source, job->source, sizeof back.source);
    CU_ASSERT_EQUAL(memcmp(job, &back, sizeof back), 0);
}

static const char full_job[] =
    "# every key, none at its default\n"
    "model:\n"
    "  type: mlp\n"
    "  hidden:\n"
    "    - 256\n"
    "    - 128\n"
    "    - 64\n"
    "  activation: gelu\n"
    "  dropout: 0.25\n"
    "  init: xavier\n"
    "data:\n"
    "  path: \"/data/my set.h5\"\n"
    "  train_split: training\n"
    "  test_split: 'validation'\n"
    "  shuffle: no\n"
    "  drop_last: off\n"
    "  workers: 8\n"
    "  prefetch: 16\n"
    "train:\n"
    "  epochs: 3\n"
    "  steps: 5000\n"
    "  global_batch: 1024\n"
    "  micro_batch: 64\n"
    "  seed: 7\n"
    "  eval_batch: 500\n"
    "  log_every: 10\n"
    "  clip_norm: 1.5\n"
    "  optimizer:\n"
    "    name: sgd\n"
    "    lr: 3e-2\n"
    "    momentum: 0.95\n"
    "    nesterov: yes\n"
    "    weight_decay: 0\n"
    "    beta1: 0.8\n"
    "    beta2: 0.99\n"
    "    eps: 1e-6\n"
    "  schedule: {name: step, warmup_steps: 100, step_size: 2000, gamma: 0.5, min_lr: 1e-5}\n"
    "runtime:\n"
    "  device: cpu\n"
    "  threads: 4\n"
    "  log_level: debug\n"
    "  reference_kernels: true\n"
    "  progress: lines\n"
    "output:\n"
    "  dir: runs/exp-1\n"
    "  adopt: true\n";

/* ---- defaults and loading ---------------------------------------------- */

static void test_defaults(void)
{
    struct dt_job j;
    memset(&j, 0x5a, sizeof j);
    dt_job_defaults(&j);
    CU_ASSERT_STRING_EQUAL(j.source, "");
    CU_ASSERT_STRING_EQUAL(j.model.type, "mlp");
    CU_ASSERT_EQUAL(j.model.nhidden, 2);
    CU_ASSERT_EQUAL(j.model.hidden[0], 512);
    CU_ASSERT_EQUAL(j.model.hidden[1], 512);
    CU_ASSERT_EQUAL(j.model.hidden[2], 0);
    CU_ASSERT_STRING_EQUAL(j.model.activation, "relu");
    CU_ASSERT_EQUAL(j.model.dropout, 0.1);
    CU_ASSERT_STRING_EQUAL(j.model.init, "kaiming");
    CU_ASSERT_STRING_EQUAL(j.data.path, "data/fashion-mnist.h5");
    CU_ASSERT_STRING_EQUAL(j.data.train_split, "train");
    CU_ASSERT_STRING_EQUAL(j.data.test_split, "test");
    CU_ASSERT(j.data.shuffle == 1 && j.data.drop_last == 1);
    CU_ASSERT(j.data.workers == 2 && j.data.prefetch == 4);
    CU_ASSERT(j.train.epochs == 10 && j.train.steps == 0);
    CU_ASSERT(j.train.global_batch == 128 && j.train.micro_batch == 0);
    CU_ASSERT(j.train.seed == 42 && j.train.eval_batch == 1000 && j.train.log_every == 100);
    CU_ASSERT_EQUAL(j.train.clip_norm, 0.0);
    CU_ASSERT_STRING_EQUAL(j.train.optimizer.name, "adamw");
    CU_ASSERT_EQUAL(j.train.optimizer.lr, 0.001);
    CU_ASSERT_EQUAL(j.train.optimizer.momentum, 0.9);
    CU_ASSERT_EQUAL(j.train.optimizer.nesterov, 0);
    CU_ASSERT_EQUAL(j.train.optimizer.weight_decay, 0.01);
    CU_ASSERT_EQUAL(j.train.optimizer.beta1, 0.9);
    CU_ASSERT_EQUAL(j.train.optimizer.beta2, 0.999);
    CU_ASSERT_EQUAL(j.train.optimizer.eps, 1e-8);
    CU_ASSERT_STRING_EQUAL(j.train.schedule.name, "cosine");
    CU_ASSERT(j.train.schedule.warmup_steps == 0 && j.train.schedule.step_size == 1000);
    CU_ASSERT_EQUAL(j.train.schedule.gamma, 0.1);
    CU_ASSERT_EQUAL(j.train.schedule.min_lr, 0.0);
    CU_ASSERT_STRING_EQUAL(j.runtime.device, "auto");
    CU_ASSERT_STRING_EQUAL(j.train.precision, "fp32");
    CU_ASSERT_EQUAL(j.runtime.allow_tf32, 0);
    CU_ASSERT_EQUAL(j.runtime.share_gpus, 0);
    CU_ASSERT_STRING_EQUAL(j.comm.backend, "auto");
    CU_ASSERT_STRING_EQUAL(j.comm.grad_dtype, "fp32");
    CU_ASSERT_EQUAL(j.runtime.threads, 0);
    CU_ASSERT_STRING_EQUAL(j.runtime.log_level, "info");
    CU_ASSERT_EQUAL(j.runtime.reference_kernels, 0);
    CU_ASSERT_STRING_EQUAL(j.runtime.progress, "auto");
    CU_ASSERT_STRING_EQUAL(j.output.dir, "runs/fashion-mnist-mlp");
    CU_ASSERT_EQUAL(dt_job_validate(&j), DT_OK);
}

static void test_empty_mappings_are_defaults(void)
{
    static const char *const texts[] = {"{}\n", "{}\n---\n", "# defaults\n{}\n",
                                        "runtime:\n  # threads: 4\noutput:\n"};
    struct dt_job def, j;
    char path[PATH_MAX_];
    dt_job_defaults(&def);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        dt_job_defaults(&j);
        CU_ASSERT_EQUAL(dt_job_set(&j, "train.epochs=99"), DT_OK);
        CU_ASSERT_EQUAL_FATAL(load_text("empty.yaml", texts[i], &j, path), DT_OK);
        CU_ASSERT_STRING_EQUAL(j.source, path);
        assert_jobs_equal(&def, &j); /* load starts from defaults, not from j */
    }
}

/* A file without keys is refused, naming the file, and the job is kept. */
static void test_empty_files_are_refused(void)
{
    static const char *const texts[] = {"",    "\n\n  \n", "# only a comment\n", "---\n",
                                        "~\n", "null\n",   "--- ~\n...\n",       "\xef\xbb\xbf"};
    struct dt_job j, before;
    char path[PATH_MAX_], want[PATH_MAX_ + 64];
    dt_job_defaults(&j);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.epochs=99"), DT_OK);
    memcpy(&before, &j, sizeof j);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        CU_ASSERT_EQUAL(load_text("empty.yaml", texts[i], &j, path), DT_ERR_USAGE);
        snprintf(want, sizeof want, "job file %s is empty (no keys: ", path);
        CU_ASSERT_NSTRING_EQUAL(dt_last_error(), want, strlen(want));
        CU_ASSERT(memcmp(&j, &before, sizeof j) == 0);
    }
}

static void test_full_file(void)
{
    struct dt_job j;
    char path[PATH_MAX_];
    CU_ASSERT_EQUAL_FATAL(load_text("full.yaml", full_job, &j, path), DT_OK);
    CU_ASSERT_STRING_EQUAL(j.source, path);
    CU_ASSERT_EQUAL(j.model.nhidden, 3);
    CU_ASSERT(j.model.hidden[0] == 256 && j.model.hidden[1] == 128 && j.model.hidden[2] == 64);
    CU_ASSERT_STRING_EQUAL(j.model.activation, "gelu");
    CU_ASSERT_EQUAL(j.model.dropout, 0.25);
    CU_ASSERT_STRING_EQUAL(j.model.init, "xavier");
    CU_ASSERT_STRING_EQUAL(j.data.path, "/data/my set.h5");
    CU_ASSERT_STRING_EQUAL(j.data.train_split, "training");
    CU_ASSERT_STRING_EQUAL(j.data.test_split, "validation");
    CU_ASSERT(j.data.shuffle == 0 && j.data.drop_last == 0);
    CU_ASSERT(j.data.workers == 8 && j.data.prefetch == 16);
    CU_ASSERT(j.train.epochs == 3 && j.train.steps == 5000 && j.train.global_batch == 1024);
    CU_ASSERT(j.train.micro_batch == 64 && j.train.seed == 7 && j.train.eval_batch == 500);
    CU_ASSERT(j.train.log_every == 10 && j.train.clip_norm == 1.5);
    CU_ASSERT_STRING_EQUAL(j.train.optimizer.name, "sgd");
    CU_ASSERT(j.train.optimizer.lr == 3e-2 && j.train.optimizer.momentum == 0.95);
    CU_ASSERT(j.train.optimizer.nesterov == 1 && j.train.optimizer.weight_decay == 0);
    CU_ASSERT(j.train.optimizer.beta1 == 0.8 && j.train.optimizer.beta2 == 0.99);
    CU_ASSERT_EQUAL(j.train.optimizer.eps, 1e-6);
    CU_ASSERT_STRING_EQUAL(j.train.schedule.name, "step");
    CU_ASSERT(j.train.schedule.warmup_steps == 100 && j.train.schedule.step_size == 2000);
    CU_ASSERT(j.train.schedule.gamma == 0.5 && j.train.schedule.min_lr == 1e-5);
    CU_ASSERT_STRING_EQUAL(j.runtime.device, "cpu");
    CU_ASSERT_EQUAL(j.runtime.threads, 4);
    CU_ASSERT_STRING_EQUAL(j.runtime.log_level, "debug");
    CU_ASSERT_EQUAL(j.runtime.reference_kernels, 1);
    CU_ASSERT_STRING_EQUAL(j.runtime.progress, "lines");
    CU_ASSERT_STRING_EQUAL(j.output.dir, "runs/exp-1");
    CU_ASSERT_EQUAL(j.output.adopt, 1);
    CU_ASSERT_EQUAL(dt_job_validate(&j), DT_OK);
}

static void test_bool_spellings(void)
{
    static const char *const on[] = {"true", "True", "yes", "on", "ON", "1"};
    static const char *const off[] = {"false", "FALSE", "no", "off", "Off", "0"};
    char text[128], path[PATH_MAX_];
    struct dt_job j;
    for (size_t i = 0; i < sizeof on / sizeof on[0]; i++) {
        snprintf(text, sizeof text, "data:\n  shuffle: %s\n  drop_last: %s\n", off[i], on[i]);
        CU_ASSERT_EQUAL_FATAL(load_text("bool.yaml", text, &j, path), DT_OK);
        CU_ASSERT_EQUAL(j.data.shuffle, 0);
        CU_ASSERT_EQUAL(j.data.drop_last, 1);
    }
}

static void test_failed_load_leaves_job(void)
{
    struct dt_job j, before;
    char path[PATH_MAX_];
    dt_job_defaults(&j);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.optimizer.lr=0.5"), DT_OK);
    memcpy(&before, &j, sizeof j);
    /* the first key is fine and the second is not: nothing may stick */
    CU_ASSERT_EQUAL(load_text("partial.yaml", "train:\n  epochs: 3\n  steps: x\n", &j, path),
                    DT_ERR_USAGE);
    CU_ASSERT_EQUAL(memcmp(&j, &before, sizeof j), 0);
    CU_ASSERT_EQUAL(j.train.epochs, 10);
}

static void test_missing_file(void)
{
    char path[PATH_MAX_], want[PATH_MAX_ + 128];
    struct dt_job j;
    tmp_path("does-not-exist.yaml", path);
    remove(path);
    dt_status st = dt_job_load(path, &j);
    CU_ASSERT_EQUAL(st, DT_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(dt_status_exit_code(st), 66);
    snprintf(want, sizeof want, "job file %s: no such file", path);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);
    CU_ASSERT_EQUAL(dt_job_load(cu_tmpdir(), &j), DT_ERR_NOT_FOUND); /* a directory */
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "not a regular file (it is a directory)"));
}

/* A FIFO is refused at once (opening one to read would wait for a writer). */
static void test_fifo_job(void)
{
    char path[PATH_MAX_];
    struct dt_job j;
    tmp_path("job.fifo", path);
    remove(path);
    CU_ASSERT_EQUAL_FATAL(mkfifo(path, 0600), 0);
    CU_ASSERT_EQUAL(dt_job_load(path, &j), DT_ERR_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "not a regular file (it is a FIFO)"));
    remove(path);
}

/* 200,000 nested brackets are refused before libyaml sees them (it takes
 * minutes on them), naming the place; a job nested 32 deep still parses
 * as far as its keys go. */
static void test_deep_nesting(void)
{
    enum { N = 200000 };
    char path[PATH_MAX_];
    struct dt_job j;
    char *text = malloc(2 * N + 64);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    size_t k = (size_t)sprintf(text, "model:\n  hidden: ");
    memset(text + k, '[', N);
    memset(text + k + N, ']', N);
    text[k + 2 * N] = '\0';
    CU_ASSERT_EQUAL(load_text("deep.yaml", text, &j, path), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "deep.yaml:2:43: nested deeper "
                                                   "than 32 levels"));
    /* the same through --set */
    dt_job_defaults(&j);
    memcpy(text, "model.hidden=", 13);
    memset(text + 13, '{', N);
    text[13 + N] = '\0';
    CU_ASSERT_EQUAL(dt_job_set(&j, text), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "nested deeper than 32 levels"));
    /* brackets inside quotes and comments do not count */
    k = (size_t)sprintf(text, "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\noutput:\n  dir: '");
    memset(text + k, '[', 40);
    sprintf(text + k + 40, "'\nmodel:\n  hidden: [[1]]\n");
    CU_ASSERT_EQUAL(load_text("quoted.yaml", text, &j, path), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "model.hidden[0]: expected an integer"));
    free(text);
}

/* A job file larger than 1 MiB is refused before it is parsed. */
static void test_huge_job(void)
{
    char path[PATH_MAX_];
    struct dt_job j;
    size_t n = (1u << 20) + 10;
    char *text = malloc(n + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(text);
    memset(text, '#', n);
    text[n] = '\0';
    CU_ASSERT_EQUAL(load_text("huge.yaml", text, &j, path), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "a job is at most 1048576 bytes"));
    free(text);
}

/* Every integer key has an upper bound, so no product of job sizes can
 * overflow: a value past it names the key and the range. */
static void test_upper_bounds(void)
{
    expect_set_error("train.eval_batch=4611686018427387904",
                     "--set train.eval_batch=4611686018427387904: train.eval_batch: expected an "
                     "integer from 1 to 1000000000, got '4611686018427387904'");
    expect_set_error("model.hidden=[2000000]",
                     "--set model.hidden=[2000000]: model.hidden[0]: expected an integer from 1 "
                     "to 1048576, got '2000000'");
    expect_set_error("checkpoint.keep_last=4294967296",
                     "--set checkpoint.keep_last=4294967296: checkpoint.keep_last: expected an "
                     "integer from 1 to 1000000, got '4294967296'");
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        const struct dt_cfg_key *k = &dt_cfg_keys[i];
        if ((k->type == DT_CFG_INT && strcmp(k->key, "train.seed") != 0) ||
            k->type == DT_CFG_INT_LIST)
            CU_ASSERT((k->range & DT_CFG_HI) && k->hi <= 1e12);
    }
}

/* ---- load errors ------------------------------------------------------- */

static void test_unknown_keys(void)
{
    expect_load_error("train:\n  optimizer:\n    lrr: 0.1\n",
                      ":3:5: train.optimizer.lrr: unknown key; did you mean 'train.optimizer.lr'?");
    expect_load_error("train:\n  lr: 0.1\n",
                      ":2:3: train.lr: unknown key; did you mean 'train.optimizer.lr'?");
    expect_load_error("trian:\n  epochs: 3\n", ":1:1: trian: unknown key; did you mean 'train'?");
    expect_load_error("model:\n  tpye: mlp\n",
                      ":2:3: model.tpye: unknown key; did you mean 'model.type'?");
    expect_load_error("train:\n  optimiser:\n    lr: 1\n",
                      ":2:3: train.optimiser: unknown key; did you mean 'train.optimizer'?");
    expect_load_error("model:\n  colour: red\n", ":2:3: model.colour: unknown key; the keys of "
                                                 "model are type, hidden, channels, blocks, "
                                                 "activation, dropout, init, sync_bn, n_layer, "
                                                 "n_head, n_embd, vocab_size, tie_embeddings, "
                                                 "norm, init_from, gelu, recompute, layers");
    expect_load_error("foo: 1\n", ":1:1: foo: unknown key; the sections are model, data, train, "
                                  "runtime, comm, checkpoint, output");
    expect_load_error("train.epochs: 3\n", ":1:1: train.epochs: dotted names are for --set; in a "
                                           "job file nest each part as a mapping");
}

static void test_bad_ints(void)
{
    expect_load_error(
        "train:\n  global_batch: abc\n",
        ":2:17: train.global_batch: expected an integer from 1 to 1000000000, got 'abc'");
    expect_load_error(
        "train:\n  global_batch: 0\n",
        ":2:17: train.global_batch: expected an integer from 1 to 1000000000, got '0'");
    expect_load_error("train:\n  epochs: 1.5\n",
                      ":2:11: train.epochs: expected an integer from 0 to 1000000, got '1.5'");
    expect_load_error("train:\n  epochs: 12x\n",
                      ":2:11: train.epochs: expected an integer from 0 to 1000000, got '12x'");
    expect_load_error("train:\n  seed: 99999999999999999999\n",
                      ":2:9: train.seed: expected an integer >= 0, got '99999999999999999999' "
                      "(beyond a 64-bit integer)");
    expect_load_error("data:\n  workers: 65\n",
                      ":2:12: data.workers: expected an integer from 1 to 64, got '65'");
    expect_load_error("data:\n  workers:\n",
                      ":2:11: data.workers: expected an integer from 1 to 64, got no value");
}

static void test_bad_floats_bools_enums(void)
{
    expect_load_error("train:\n  optimizer:\n    lr: 0\n",
                      ":3:9: train.optimizer.lr: expected a number > 0, got '0'");
    expect_load_error("train:\n  optimizer:\n    lr: fast\n",
                      ":3:9: train.optimizer.lr: expected a number > 0, got 'fast'");
    expect_load_error("train:\n  optimizer: {eps: 1e999}\n",
                      ":2:20: train.optimizer.eps: expected a number > 0, got '1e999' "
                      "(beyond the largest double, 1.8e+308)");
    expect_load_error("model:\n  dropout: 1\n",
                      ":2:12: model.dropout: expected a number in [0, 1), got '1'");
    expect_load_error("train:\n  schedule:\n    gamma: 0\n",
                      ":3:12: train.schedule.gamma: expected a number in (0, 1], got '0'");
    expect_load_error("data:\n  shuffle: maybe\n",
                      ":2:12: data.shuffle: expected true or false, got 'maybe'");
    expect_load_error("model:\n  activation: relu6\n",
                      ":2:15: model.activation: expected one of relu, gelu, gelu_tanh, tanh, silu, "
                      "got 'relu6'");
    expect_load_error("runtime:\n  progress: \"\"\n",
                      ":2:13: runtime.progress: expected one of auto, bar, lines, off, got ''");
}

static void test_bad_strings(void)
{
    char text[600];
    char want[400];
    snprintf(text, sizeof text, "data:\n  test_split: %0300d\n", 0);
    snprintf(want, sizeof want,
             ":2:15: data.test_split: expected a non-empty string, got '%060d...' "
             "(300 bytes; at most 255)",
             0);
    expect_load_error(text, want);
    expect_load_error("output:\n  dir: ''\n", ":2:8: output.dir: expected a non-empty path, got ''");
    expect_load_error("model:\n  init: \"a\\nb\"\n",
                      ":2:9: model.init: expected one of kaiming, xavier, got 'a?b'");
}

static void test_shape_errors(void)
{
    expect_load_error("train: 5\n",
                      ":1:8: train: expected a mapping (a section with keys epochs, steps, "
                      "global_batch, micro_batch, reproducible, shard_rows, seed, eval_batch, log_every, clip_norm, "
                      "precision, optimizer, schedule), got '5'");
    expect_load_error("train:\n  optimizer: [1]\n",
                      ":2:14: train.optimizer: expected a mapping (a section with keys name, lr, "
                      "momentum, nesterov, weight_decay, bias_weight_decay, norm_weight_decay, beta1, "
                      "beta2, eps), got a sequence");
    expect_load_error("model:\n  dropout:\n    x: 1\n",
                      ":3:5: model.dropout: expected a number in [0, 1), got a mapping");
    expect_load_error("- a\n- b\n", ":1:1: expected a mapping of sections (model, data, train, "
                                    "runtime, comm, checkpoint, output), got a sequence");
    expect_load_error("train:\n  epochs: 3\n  epochs: 4\n",
                      ":3:3: train.epochs: duplicate key (first given at line 2)");
    expect_load_error("train:\n  epochs: 3\n---\ntrain:\n  epochs: 4\n",
                      ":3:1: found a second YAML document; a job is one document");
}

static void test_list_errors(void)
{
    const char *want = "expected a list of 1 to 32 integers from 1 to 1048576";
    char text[512], suffix[256];
    expect_load_error(
        "model:\n  hidden: 512\n",
        ":2:11: model.hidden: expected a list of 1 to 32 integers from 1 to 1048576, got '512'");
    snprintf(suffix, sizeof suffix, ":2:11: model.hidden: %s, got 0 entries", want);
    expect_load_error("model:\n  hidden: []\n", suffix);
    expect_load_error("model:\n  hidden: [1, 0]\n",
                      ":2:15: model.hidden[1]: expected an integer from 1 to 1048576, got '0'");
    expect_load_error("model:\n  hidden:\n    - 3\n    - x\n",
                      ":4:7: model.hidden[1]: expected an integer from 1 to 1048576, got 'x'");
    expect_load_error(
        "model:\n  hidden: [[1]]\n",
        ":2:12: model.hidden[0]: expected an integer from 1 to 1048576, got a sequence");
    int n = snprintf(text, sizeof text, "model:\n  hidden: [");
    for (int i = 0; i < 33; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%d", i ? ", " : "", i + 1);
    snprintf(text + n, sizeof text - (size_t)n, "]\n");
    snprintf(suffix, sizeof suffix, ":2:11: model.hidden: %s, got 33 entries", want);
    expect_load_error(text, suffix);
}

static void test_syntax_errors(void)
{
    struct dt_job j;
    char path[PATH_MAX_], want[PATH_MAX_ + 64];
    CU_ASSERT_EQUAL(load_text("syntax.yaml", "train:\n  epochs: 3\n   steps: 4\n", &j, path),
                    DT_ERR_USAGE);
    snprintf(want, sizeof want, "%s:3:9: invalid YAML: ", path);
    CU_ASSERT_EQUAL(strncmp(dt_last_error(), want, strlen(want)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "mapping values are not allowed"));
    CU_ASSERT_EQUAL(load_text("syntax.yaml", "train: {epochs: 3\n", &j, path), DT_ERR_USAGE);
    snprintf(want, sizeof want, "%s:2:1: invalid YAML: ", path);
    CU_ASSERT_EQUAL(strncmp(dt_last_error(), want, strlen(want)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "did not find expected ',' or '}'"));
}

/* ---- --set ------------------------------------------------------------- */

static void test_set_overrides(void)
{
    struct dt_job j;
    dt_job_defaults(&j);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.optimizer.lr=3e-4"), DT_OK);
    CU_ASSERT_EQUAL(j.train.optimizer.lr, 3e-4);
    CU_ASSERT_EQUAL(dt_job_set(&j, " train.epochs = 5"), DT_OK);
    CU_ASSERT_EQUAL(j.train.epochs, 5);
    CU_ASSERT_EQUAL(dt_job_set(&j, "data.shuffle=off"), DT_OK);
    CU_ASSERT_EQUAL(j.data.shuffle, 0);
    CU_ASSERT_EQUAL(dt_job_set(&j, "data.cache=memory"), DT_OK);
    CU_ASSERT_STRING_EQUAL(j.data.cache, "memory");
    CU_ASSERT_EQUAL(dt_job_set(&j, "model.activation=tanh"), DT_OK);
    CU_ASSERT_STRING_EQUAL(j.model.activation, "tanh");
    CU_ASSERT_EQUAL(dt_job_set(&j, "model.hidden=[256,128]"), DT_OK);
    CU_ASSERT(j.model.nhidden == 2 && j.model.hidden[0] == 256 && j.model.hidden[1] == 128);
    CU_ASSERT_EQUAL(dt_job_set(&j, "model.hidden=[1024]"), DT_OK);
    CU_ASSERT(j.model.nhidden == 1 && j.model.hidden[0] == 1024 && j.model.hidden[1] == 0);
    CU_ASSERT_EQUAL(dt_job_set(&j, "output.dir=\"runs/a: b #c\""), DT_OK);
    CU_ASSERT_STRING_EQUAL(j.output.dir, "runs/a: b #c");
    CU_ASSERT_EQUAL(dt_job_set(&j, "data.train_split='yes'"), DT_OK);
    CU_ASSERT_STRING_EQUAL(j.data.train_split, "yes");
    CU_ASSERT_EQUAL(dt_job_set(&j, "data.path=a=b.h5"), DT_OK); /* only the first '=' splits */
    CU_ASSERT_STRING_EQUAL(j.data.path, "a=b.h5");
}

static void test_set_errors(void)
{
    expect_set_error("train.lr=0.1",
                     "--set train.lr=0.1: train.lr: unknown key; did you mean 'train.optimizer.lr'?");
    expect_set_error("trian.epochs=2",
                     "--set trian.epochs=2: trian.epochs: unknown key; did you mean 'train.epochs'?");
    expect_set_error("runtime.thread=2", "--set runtime.thread=2: runtime.thread: unknown key; did "
                                         "you mean 'runtime.threads'?");
    expect_set_error("train.optimizer.warmup_steps=5",
                     "--set train.optimizer.warmup_steps=5: train.optimizer.warmup_steps: unknown "
                     "key; did you mean 'train.schedule.warmup_steps'?");
    expect_set_error("lr=0.1", "--set lr=0.1: lr: unknown key; did you mean 'train.optimizer.lr'?");
    expect_set_error("model.name=x",
                     "--set model.name=x: model.name: unknown key; the keys of "
                     "model are type, hidden, channels, blocks, activation, dropout, "
                     "init, sync_bn, n_layer, n_head, n_embd, vocab_size, "
                     "tie_embeddings, norm, init_from, gelu, recompute, layers");
    expect_set_error("train=5", "--set train=5: train: is a section with keys epochs, steps, "
                                "global_batch, micro_batch, reproducible, shard_rows, seed, eval_batch, log_every, "
                                "clip_norm, precision, optimizer, schedule; set one key in it, e.g. --set "
                                "train.epochs=...");
    expect_set_error("train.schedule=1",
                     "--set train.schedule=1: train.schedule: is a section with keys name, "
                     "warmup_steps, step_size, gamma, min_lr; set one key in it, e.g. --set "
                     "train.schedule.name=...");
    expect_set_error("train.global_batch=abc",
                     "--set train.global_batch=abc: train.global_batch: "
                     "expected an integer from 1 to 1000000000, got 'abc'");
    expect_set_error("train.optimizer.lr=", "--set train.optimizer.lr=: train.optimizer.lr: "
                                            "expected a number > 0, got no value");
    expect_set_error("model.hidden=256", "--set model.hidden=256: model.hidden: expected a list "
                                         "of 1 to 32 integers from 1 to 1048576, got '256'");
    expect_set_error(
        "model.hidden=[256,-1]",
        "--set model.hidden=[256,-1]: model.hidden[1]: expected an integer from 1 to 1048576, "
        "got '-1'");
    expect_set_error("train.optimizer.lr",
                     "--set train.optimizer.lr: expected key=value, e.g. train.optimizer.lr=0.01");
    expect_set_error("=5", "--set =5: no key before '='");
    expect_set_error("data.cache=disk", "--set data.cache=disk: data.cache: expected one of none, "
                                        "memory, got 'disk'");
    expect_set_error("data.cache_max_mb=0", "--set data.cache_max_mb=0: data.cache_max_mb: "
                                            "expected an integer from 1 to 1073741824, got '0'");
}

static void test_set_syntax_error_and_atomicity(void)
{
    struct dt_job j, before;
    const char *want = "--set model.hidden=[256,128: model.hidden: invalid YAML value: ";
    dt_job_defaults(&j);
    memcpy(&before, &j, sizeof j);
    CU_ASSERT_EQUAL(dt_job_set(&j, "model.hidden=[256,128"), DT_ERR_USAGE);
    CU_ASSERT_EQUAL(strncmp(dt_last_error(), want, strlen(want)), 0);
    CU_ASSERT_EQUAL(dt_job_set(&j, "model.hidden=[64, 0]"), DT_ERR_USAGE);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.epochs=-3"), DT_ERR_USAGE);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.epochs=5\n---\n6"), DT_ERR_USAGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(dt_last_error(), "found a second YAML document"));
    CU_ASSERT_EQUAL(memcmp(&j, &before, sizeof j), 0);
}

/* ---- validation -------------------------------------------------------- */

/* Defaults plus the given sets (NULL-terminated) fail validation with msg. */
static void expect_invalid(const char *const *sets, const char *msg)
{
    struct dt_job j;
    dt_job_defaults(&j);
    CU_ASSERT_EQUAL_FATAL(dt_job_validate(&j), DT_OK);
    for (const char *const *s = sets; *s; s++)
        CU_ASSERT_EQUAL_FATAL(dt_job_set(&j, *s), DT_OK);
    CU_ASSERT_EQUAL(dt_job_validate(&j), DT_ERR_USAGE);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), msg);
}

static void test_validate(void)
{
    struct dt_job j;
    char path[PATH_MAX_], want[PATH_MAX_ + 128];
    expect_invalid((const char *[]){"train.epochs=0", NULL},
                   "train.epochs must be at least 1 when train.steps is 0 (got 0)");
    expect_invalid((const char *[]){"train.micro_batch=256", NULL},
                   "train.micro_batch (256) must not exceed train.global_batch (128)");
    expect_invalid((const char *[]){"train.steps=100", "train.schedule.warmup_steps=101", NULL},
                   "train.schedule.warmup_steps (101) must not exceed train.steps (100)");
    expect_invalid((const char *[]){"train.optimizer.lr=0.01", "train.schedule.min_lr=0.1", NULL},
                   "train.schedule.min_lr (0.1) must not exceed train.optimizer.lr (0.01) with "
                   "the cosine schedule");
    expect_invalid((const char *[]){"train.optimizer.name=sgd", "train.optimizer.nesterov=true",
                                    "train.optimizer.momentum=0", NULL},
                   "train.optimizer.nesterov needs train.optimizer.momentum > 0 with sgd");
    expect_invalid((const char *[]){"runtime.device=cpu", "comm.backend=nccl", NULL},
                   "comm.backend=nccl all-reduces GPU memory, but runtime.device is cpu; set "
                   "comm.backend to mpi or auto");
    dt_job_defaults(&j);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.precision=fp16"), DT_OK);
    CU_ASSERT_EQUAL(dt_job_set(&j, "runtime.device=cpu"), DT_OK);
    CU_ASSERT_EQUAL(dt_job_validate(&j), DT_OK); /* the cpu rounds matmul inputs too */
    dt_job_defaults(&j);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.epochs=0"), DT_OK);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.steps=500"), DT_OK);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.schedule.name=step"), DT_OK);
    CU_ASSERT_EQUAL(dt_job_set(&j, "train.schedule.min_lr=5"), DT_OK);
    CU_ASSERT_EQUAL(dt_job_validate(&j), DT_OK); /* steps set, min_lr unused by step */
    CU_ASSERT_EQUAL_FATAL(load_text("invalid.yaml", "train: {epochs: 0}\n", &j, path), DT_OK);
    CU_ASSERT_EQUAL(dt_job_validate(&j), DT_ERR_USAGE);
    snprintf(want, sizeof want, "%s: train.epochs must be at least 1 when train.steps is 0 (got 0)",
             path);
    CU_ASSERT_STRING_EQUAL(dt_last_error(), want);
}

/* ---- writing ----------------------------------------------------------- */

static void test_round_trip_defaults_and_full(void)
{
    struct dt_job j;
    char path[PATH_MAX_];
    dt_job_defaults(&j);
    assert_round_trip(&j);
    CU_ASSERT_EQUAL_FATAL(load_text("full.yaml", full_job, &j, path), DT_OK);
    assert_round_trip(&j);
}

/* Like the loader, leaves no stale bytes after the string (for memcmp). */
static void set_str(char *field, size_t size, const char *s)
{
    memset(field, 0, size);
    snprintf(field, size, "%s", s);
}

static void test_round_trip_awkward_values(void)
{
    struct dt_job j;
    dt_job_defaults(&j);
    j.train.optimizer.lr = 0.1 + 0.2; /* 0.30000000000000004 */
    j.model.dropout = 1.0 / 3.0;
    j.train.optimizer.weight_decay = 1e-310; /* subnormal */
    j.train.clip_norm = 1e300;
    j.train.seed = INT64_MAX;
    set_str(j.data.path, sizeof j.data.path, " lead space/quote\"back\\slash\ttab");
    set_str(j.data.train_split, sizeof j.data.train_split, "yes");
    set_str(j.data.test_split, sizeof j.data.test_split, "1e3");
    set_str(j.output.dir, sizeof j.output.dir, "runs/données: #1 - [x]");
    j.model.nhidden = DT_JOB_MAX_HIDDEN;
    for (int i = 0; i < DT_JOB_MAX_HIDDEN; i++)
        j.model.hidden[i] = 1 + i * 33331;
    assert_round_trip(&j);
}

/* Characters YAML does not allow raw, or folds as line breaks, are escaped
 * in the resolved job, so it reads back to the same bytes. */
static void test_round_trip_unprintable(void)
{
    static const char *const texts[] = {"\xc2\x8f", "a\xc2\x85" "b", "\xe2\x80\xa8x",
                                        "x\xe2\x80\xa9", "\xef\xbf\xbe", "\xef\xbf\xbf",
                                        "\x7f\x01\xc3\xa9\xe6\x97\xa5"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        struct dt_job j;
        dt_job_defaults(&j);
        set_str(j.output.dir, sizeof j.output.dir, texts[i]);
        assert_round_trip(&j);
    }
}

static void test_yaml_layout(void)
{
    struct dt_job j;
    char *text = NULL;
    size_t len = 0;
    dt_job_defaults(&j);
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    dt_job_write_yaml(&j, f);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\nmodel:\n  type: mlp\n  hidden: [512, 512]\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "  clip_norm: 0.0\n  precision: fp32\n  optimizer:\n    name: adamw\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "    eps: 1.0e-08\n  schedule:\n    name: cosine\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "    min_lr: 0.0\nruntime:\n  device: auto\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "output:\n  dir: runs/fashion-mnist-mlp\n"));
    free(text);
}

/* docs/config.md, found from this source file's path (tests/unit/..). */
static void docs_path(char *buf, size_t len)
{
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    int dir = slash ? (int)(slash - file) : 1;
    snprintf(buf, len, "%.*s/../../docs/config.md", dir, slash ? file : ".");
}

static void test_reference_page(void)
{
    char path[PATH_MAX_], *doc, *text = NULL;
    size_t doc_len = 0, len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    dt_job_write_reference(f);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "--set"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "dtrain train JOB --print-config"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\n## train.optimizer\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "| `train.optimizer.lr` | float | `0.001` | > 0 |"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "| `model.hidden` | int list | `[512, 512]` |"));
    docs_path(path, sizeof path);
    doc = read_all(path, &doc_len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(doc);
    CU_ASSERT_EQUAL(doc_len, len);
    CU_ASSERT(doc_len == len && memcmp(doc, text, len) == 0);
    if (doc_len != len || memcmp(doc, text, len) != 0)
        fprintf(stderr, "\n  %s is out of date: regenerate it with dt_job_write_reference\n",
                path);
    free(doc);
    free(text);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("config", NULL, NULL);
    CU_ADD(s, test_defaults);
    CU_ADD(s, test_empty_mappings_are_defaults);
    CU_ADD(s, test_empty_files_are_refused);
    CU_ADD(s, test_full_file);
    CU_ADD(s, test_bool_spellings);
    CU_ADD(s, test_failed_load_leaves_job);
    CU_ADD(s, test_missing_file);
    CU_ADD(s, test_unknown_keys);
    CU_ADD(s, test_bad_ints);
    CU_ADD(s, test_bad_floats_bools_enums);
    CU_ADD(s, test_bad_strings);
    CU_ADD(s, test_shape_errors);
    CU_ADD(s, test_list_errors);
    CU_ADD(s, test_syntax_errors);
    CU_ADD(s, test_set_overrides);
    CU_ADD(s, test_set_errors);
    CU_ADD(s, test_set_syntax_error_and_atomicity);
    CU_ADD(s, test_validate);
    CU_ADD(s, test_round_trip_defaults_and_full);
    CU_ADD(s, test_round_trip_awkward_values);
    CU_ADD(s, test_round_trip_unprintable);
    CU_ADD(s, test_fifo_job);
    CU_ADD(s, test_deep_nesting);
    CU_ADD(s, test_huge_job);
    CU_ADD(s, test_upper_bounds);
    CU_ADD(s, test_yaml_layout);
    CU_ADD(s, test_reference_page);
    return cu_run_all();
}
