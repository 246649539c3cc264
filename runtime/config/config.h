/*
 * config.h - the job file.
 *
 * A job is YAML (read with libyaml) mapped onto struct dt_job through one
 * schema table: every key has a type, a default, allowed values or range,
 * and a line of documentation. The same table prints the resolved job, the
 * reference page (docs/config.md) and the nearest-key hints for typos.
 * Errors name the file (or "--set"), line and column, the key and what was
 * expected, and return DT_ERR_USAGE (exit 64).
 */
#ifndef DT_CONFIG_H
#define DT_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

#define DT_JOB_STR 256
#define DT_JOB_PATH 4096
#define DT_JOB_MAX_HIDDEN 32
#define DT_JOB_MAX_LAYERS 128  /* entries of model.layers */
#define DT_LAYER_MAX_ARGS 8    /* settings of one entry besides name, kind, inputs */
#define DT_LAYER_NAME 48
#define DT_LAYER_KIND 24
#define DT_LAYER_INPUTS 144
#define DT_LAYER_ARG_KEY 24
#define DT_LAYER_ARG_VALUE 40

/* Upper bounds of the job's sizes and counts, so that every product of
 * them (epochs x steps per epoch, rows x widths) stays far inside 64 bits
 * and every matrix dimension inside what BLAS takes (int). */
#define DT_JOB_MAX_WIDTH 1048576    /* a hidden layer's width: 2^20 */
#define DT_JOB_MAX_BATCH 1000000000 /* samples in one batch */
#define DT_JOB_MAX_EPOCHS 1000000
#define DT_JOB_MAX_STEPS 1000000000000 /* steps, and intervals counted in steps */
#define DT_JOB_MAX_THREADS 4096
#define DT_JOB_MAX_COUNT 1000000 /* retries, rollbacks, checkpoints kept */

/* The layers a model's graph holds once model.type's family and every
 * residual block are expanded (runtime/model/model_expand.c, runtime/model/model.c).
 * The families' own counts are bounded here so that every job the schema
 * accepts fits, and a message can say the limit in the key the user set:
 *   gpt:    wte, wpe, ln_f, head, loss, and drop with model.dropout > 0;
 *           per transformer block 10 layers, 12 with dropout
 *   resnet: the stem's 3, pool, fc, loss; per residual block 7 layers,
 *           the first block of each stage after the first 2 more (its
 *           projection shortcut)
 *   mlp, cnn: at most 3 per hidden layer and 4 per stage: always fit. */
#define DT_JOB_MAX_GRAPH 512
#define DT_JOB_GPT_LAYERS(blocks, drop) (5 + (drop) + (blocks) * (10 + 2 * (drop)))
#define DT_JOB_MAX_GPT_BLOCKS 50         /* the most that fit, without dropout */
#define DT_JOB_MAX_GPT_BLOCKS_DROPOUT 42 /* and with it */
#define DT_JOB_RESNET_LAYERS(blocks, stages) (6 + 7 * (blocks) + 2 * ((stages)-1))

/* One entry of model.layers, as written: the layer kinds (runtime/model/layers/)
 * check the settings when the model is built. */
struct dt_layer_spec {
    char name[DT_LAYER_NAME];     /* unique; letters, digits, '_', '-' ("" = kind + index) */
    char kind[DT_LAYER_KIND];     /* linear, conv2d, ... (runtime/model/layers/) */
    char inputs[DT_LAYER_INPUTS]; /* earlier layers' names joined by ','; "" = the previous
                                     layer (or the model input for the first); several are summed */
    int nargs;
    struct {
        char key[DT_LAYER_ARG_KEY];
        char value[DT_LAYER_ARG_VALUE]; /* a scalar, or a list's entries joined by ',' */
    } args[DT_LAYER_MAX_ARGS];
};

struct dt_job {
    char source[DT_JOB_PATH]; /* the job file it came from ("" for defaults) */
    struct {
        char type[DT_JOB_STR];       /* mlp | cnn | resnet | gpt | layers */
        int64_t hidden[DT_JOB_MAX_HIDDEN]; /* hidden layer widths */
        int nhidden;
        int64_t channels[DT_JOB_MAX_HIDDEN]; /* cnn, resnet: channels per stage */
        int nchannels;
        int64_t blocks[DT_JOB_MAX_HIDDEN];   /* resnet: residual blocks per stage */
        int nblocks;
        int sync_bn;                 /* batch-norm statistics over every rank */
        int64_t n_layer, n_head, n_embd; /* gpt: blocks, attention heads, width */
        int64_t vocab_size;          /* gpt: 0 = the dataset's vocabulary */
        int tie_embeddings;          /* gpt: the output head uses the token embedding */
        char norm[DT_JOB_STR];       /* gpt: layernorm | rmsnorm */
        char gelu[DT_JOB_STR];       /* gpt: exact | tanh (the MLP's GELU) */
        char init_from[DT_JOB_PATH]; /* "none" or the starting parameters' path */
        char recompute[DT_JOB_STR];  /* none | all | comma-separated block names */
        struct dt_layer_spec layers[DT_JOB_MAX_LAYERS]; /* model.type layers */
        int nlayers;
        char activation[DT_JOB_STR]; /* a row of DT_UNARY_LIST: relu, gelu, tanh, silu */
        double dropout;              /* after each hidden activation, [0, 1) */
        char init[DT_JOB_STR];       /* kaiming | xavier */
    } model;
    struct {
        char path[DT_JOB_PATH];      /* HDF5 dataset */
        char train_split[DT_JOB_STR];
        char test_split[DT_JOB_STR];
        int shuffle;
        int drop_last;
        int64_t workers;             /* loader threads */
        int64_t prefetch;            /* micro-batches read ahead */
        int64_t seq_len;             /* language-model datasets: tokens per sample */
        char cache[DT_JOB_STR];      /* none | memory: training rows held in memory */
        int64_t cache_max_mb;        /* the most MiB one rank's cache may hold */
        struct {
            int64_t crop_padding;    /* random crop of the padded image; 0 = off */
            int hflip;               /* random left-right flip */
        } augment;                   /* training split only, image samples only */
    } data;
    struct {
        int64_t epochs;              /* used when steps == 0 */
        int64_t steps;               /* optimizer steps; 0 = use epochs */
        int64_t global_batch;
        int64_t micro_batch;         /* 0 = global_batch / world (no accumulation) */
        int reproducible;            /* the same bits on any world size (shards, fixed sum tree) */
        int64_t shard_rows;          /* reproducible: rows per shard; 0 = global_batch / 8 */
        int64_t seed;
        int64_t eval_batch;
        int64_t log_every;           /* steps between progress lines / metrics */
        double clip_norm;            /* global-norm clipping; 0 = off */
        char precision[DT_JOB_STR];  /* fp32 | bf16 | fp16 (matmul inputs) */
        struct {
            char name[DT_JOB_STR];   /* sgd | adamw */
            double lr;
            double momentum;         /* sgd */
            int nesterov;            /* sgd */
            double weight_decay;      /* matrices and conv kernels */
            double bias_weight_decay; /* biases */
            double norm_weight_decay; /* normalisation scales and shifts */
            double beta1, beta2, eps;/* adamw */
        } optimizer;
        struct {
            char name[DT_JOB_STR];   /* constant | step | cosine */
            int64_t warmup_steps;    /* linear warm-up from 0 */
            int64_t step_size;       /* step: decay every step_size steps */
            double gamma;            /* step: factor */
            double min_lr;           /* cosine: floor */
        } schedule;
    } train;
    struct {
        char device[DT_JOB_STR];     /* auto | cpu | cuda */
        int allow_tf32;              /* cuda: TF32 tensor cores for fp32 matmuls */
        int share_gpus;              /* cuda: several ranks of a node may share a GPU */
        int64_t threads;             /* 0 = cores available to this rank */
        char log_level[DT_JOB_STR];  /* error | warn | info | debug */
        int reference_kernels;       /* plain C reference ops (slow; tests) */
        char progress[DT_JOB_STR];   /* auto | bar | lines | off */
        int64_t max_bad_steps;       /* non-finite steps in a row before a rollback */
        int64_t max_rollbacks;       /* rollbacks before giving up */
        double timeout_s;            /* watchdog: longest step/collective/checkpoint; 0 = off */
        double memory_limit;         /* GiB of host memory per rank; 0 = the machine's share */
    } runtime;
    struct {
        int64_t every_steps;         /* 0 = off */
        double every_minutes;        /* 0 = off; rank 0's clock decides */
        int64_t keep_last;           /* newest checkpoints kept */
        int64_t keep_every;          /* also keep steps that are multiples; 0 = off */
        char on_error[DT_JOB_STR];   /* stop | continue */
        char async[DT_JOB_STR];      /* auto | on | off: periodic checkpoints in the background */
        int64_t memory_every_steps;  /* in-memory snapshots; 0 = off */
        char memory_dir[DT_JOB_PATH]; /* where they are kept on each node */
    } checkpoint;
    struct {
        char backend[DT_JOB_STR];    /* auto | mpi | nccl (gradients) */
        double bucket_mb;            /* gradient bucket size, MiB */
        char grad_dtype[DT_JOB_STR]; /* fp32 | bf16: gradients on the wire */
        int overlap;                 /* all-reduce buckets while backward runs */
        char mpi_allreduce[DT_JOB_STR]; /* ring | library: buckets over mpi */
        char shard[DT_JOB_STR];         /* auto | none | optimizer | gradients | parameters */
        int sharded_update;             /* false: comm.shard none (the older key) */
    } comm;
    struct {
        char dir[DT_JOB_PATH];       /* run directory */
        int adopt;                   /* use a non-empty directory dtrain did not make */
        int tensorboard;             /* rank 0 writes <dir>/tensorboard event files */
    } output;
};

/* Fills job with every default. */
void dt_job_defaults(struct dt_job *job);

/* Defaults, then the YAML file at path on top. A file without keys
 * (empty, blanks, comments, a null document) is DT_ERR_USAGE; `{}` is the
 * job of defaults. */
dt_status dt_job_load(const char *path, struct dt_job *job);

/* Defaults, then the YAML job in `text` (as written by dt_job_write_yaml,
 * e.g. the job stored in a checkpoint); `name` stands for the file in
 * messages. */
dt_status dt_job_load_text(const char *name, const char *text, struct dt_job *job);

/* Applies one "key.sub=value" override (value is a YAML scalar or a flow
 * sequence such as [512, 512]). */
dt_status dt_job_set(struct dt_job *job, const char *assignment);

/* Checks relations between keys (e.g. warmup within steps). */
dt_status dt_job_validate(const struct dt_job *job);

/* Writes the resolved job as YAML that dt_job_load reads back to an equal job. */
void dt_job_write_yaml(const struct dt_job *job, FILE *out);

/* The keys of the given sections (NULL-terminated list of top-level or
 * dotted section names: "model", "train") whose values differ between a
 * and b, written into out as "key: <a_name> <a's value>, <b_name> <b's
 * value>" joined by "; " (a layer list as "model.layers (another list)";
 * cut with "..." when out is too short). Returns how many keys differ. */
int dt_job_diff(const struct dt_job *a, const char *a_name, const struct dt_job *b,
                const char *b_name, const char *const *sections, char *out, size_t len);

/* Writes n layer entries as YAML flow mappings, each on a new line that
 * starts with prefix ("\n<prefix>- {name: fc1, kind: linear, out: 512}"). */
void dt_job_write_layer_list(const struct dt_layer_spec *l, int n, const char *prefix, FILE *out);

/* Writes the reference page (every key: type, default, allowed, meaning) as Markdown. */
void dt_job_write_reference(FILE *out);

#endif
