/*
 * config_schema.c - the job schema: every key of struct dt_job, once.
 *
 * Each row names a dotted key, its type, where it lives in struct dt_job,
 * its default (text, parsed exactly like user input), its allowed values and
 * a line of documentation. Defaults, the file parser, --set, the YAML dump,
 * the reference page and the typo hints all read this table, so adding a
 * key is adding a row (and the field in config.h). Sections get a line of
 * their own; checks that involve two keys live in the relation table below.
 */
#include "config_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"
#include "kernels/ops.h"

#define FIELD(f) .offset = offsetof(struct dt_job, f), .size = sizeof(((struct dt_job *)0)->f)
#define ROW(k, t, f, d, doc_, ...)                                                                 \
    {                                                                                              \
        .key = k, .type = t, FIELD(f), .def = d, .doc = doc_, __VA_ARGS__                          \
    }

/* Ranges, used as the variadic tail of ROW. */
#define ANY .range = 0
#define AT_LEAST(v) .range = DT_CFG_LO, .lo = (v)
#define ABOVE(v) .range = DT_CFG_LO | DT_CFG_LO_EXCL, .lo = (v)
#define FROM_TO(a, b) .range = DT_CFG_LO | DT_CFG_HI, .lo = (a), .hi = (b)
#define FROM_BELOW(a, b) .range = DT_CFG_LO | DT_CFG_HI | DT_CFG_HI_EXCL, .lo = (a), .hi = (b)
#define ABOVE_TO(a, b) .range = DT_CFG_LO | DT_CFG_LO_EXCL | DT_CFG_HI, .lo = (a), .hi = (b)
#define ONE_OF(list) .choices = (list)

static const char *const model_types[] = {"mlp", "cnn", "resnet", "gpt", "layers", NULL};
/* model.activation: every element-wise op of kernels/ops.h is a layer kind. */
#define ACTIVATION_NAME(a, name, s, forward, gradient, cpu, doc) #name,
static const char *const activations[] = {DT_UNARY_LIST(ACTIVATION_NAME, _) NULL};
#undef ACTIVATION_NAME
static const char *const inits[] = {"kaiming", "xavier", NULL};
static const char *const gpt_norms[] = {"layernorm", "rmsnorm", NULL};
static const char *const gpt_gelus[] = {"exact", "tanh", NULL};
static const char *const optimizers[] = {"sgd", "adamw", NULL};
static const char *const schedules[] = {"constant", "step", "cosine", NULL};
static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
static const char *const log_levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const progress_modes[] = {"auto", "bar", "lines", "off", NULL};
static const char *const comm_backends[] = {"auto", "mpi", "nccl", NULL};
static const char *const mpi_allreduces[] = {"ring", "library", NULL};
static const char *const precisions[] = {"fp32", "bf16", "fp16", NULL};
static const char *const wire_types[] = {"fp32", "bf16", NULL};
static const char *const shard_stages[] = {"auto", "none", "optimizer", "gradients", "parameters",
                                           NULL};
static const char *const ckpt_errors[] = {"stop", "continue", NULL};
static const char *const ckpt_async[] = {"auto", "on", "off", NULL};
static const char *const data_caches[] = {"none", "memory", NULL};

/* Short type names for the rows. */
#define I DT_CFG_INT
#define F DT_CFG_FLOAT
#define B DT_CFG_BOOL
#define S DT_CFG_STRING
#define E DT_CFG_ENUM
#define L DT_CFG_INT_LIST
#define P DT_CFG_PATH
#define PS DT_CFG_PATHS
#define LY DT_CFG_LAYERS

/* clang-format off */
const struct dt_cfg_key dt_cfg_keys[] = {
    ROW("model.type", E, model.type, "mlp",
        "model family: mlp (fully connected layers), cnn (convolution stages, then fully "
        "connected layers), resnet (residual stages, global average pooling, a linear "
        "classifier), gpt (a GPT-2 style decoder-only transformer language model, for "
        "language-model datasets) or layers (the list in model.layers); --print-config shows "
        "the layer list a family expands into", ONE_OF(model_types)),
    ROW("model.hidden", L, model.hidden, "[512, 512]",
        "mlp, cnn: widths of the fully connected hidden layers, input side first",
        FROM_TO(1, DT_JOB_MAX_WIDTH),
        .count_offset = offsetof(struct dt_job, model.nhidden), .min_count = 1),
    ROW("model.channels", L, model.channels, "[32, 64]",
        "cnn: output channels of each stage (3x3 convolution, batch norm, activation, 2x2 max "
        "pooling); resnet: channels of each stage (the first also the stem's)",
        FROM_TO(1, DT_JOB_MAX_WIDTH),
        .count_offset = offsetof(struct dt_job, model.nchannels), .min_count = 1),
    ROW("model.blocks", L, model.blocks, "[2, 2]",
        "resnet: residual blocks per stage (one entry per model.channels entry); every stage "
        "after the first halves the image with its first block. In all at most 72 in one or "
        "two stages, fewer with more stages (each block is 7 layers of the model's graph, "
        "each stage after the first 2 more, and a graph holds 512)",
        FROM_TO(1, 64),
        .count_offset = offsetof(struct dt_job, model.nblocks), .min_count = 1),
    ROW("model.activation", E, model.activation, "relu",
        "activation after each hidden layer", ONE_OF(activations)),
    ROW("model.dropout", F, model.dropout, "0.1",
        "dropout probability after each hidden activation; gpt: after the embeddings and on "
        "each block's two residual branches; 0 = off", FROM_BELOW(0, 1)),
    ROW("model.init", E, model.init, "kaiming", "weight initialisation", ONE_OF(inits)),
    ROW("model.sync_bn", B, model.sync_bn, "false",
        "batch norm computes its training statistics over the whole global micro-batch (every "
        "rank) instead of each rank's part: results then do not depend on how the batch is "
        "split, at the cost of two small all-reduces per batch-norm layer and step", ANY),
    ROW("model.n_layer", I, model.n_layer, "4",
        "gpt: transformer blocks; at most 42 with model.dropout > 0 (each block is 10 layers "
        "of the model's graph, 12 with dropout, and a graph holds 512)",
        FROM_TO(1, DT_JOB_MAX_GPT_BLOCKS),
        .bound_why = "a deeper gpt is more than the 512 layers a model holds: 10 per block"),
    ROW("model.n_head", I, model.n_head, "4",
        "gpt: attention heads (model.n_embd must be a multiple)", FROM_TO(1, 1024)),
    ROW("model.n_embd", I, model.n_embd, "128", "gpt: width of the residual stream",
        FROM_TO(1, 65536)),
    ROW("model.vocab_size", I, model.vocab_size, "0",
        "gpt: rows of the token embedding and outputs of the head; 0 = the dataset's "
        "vocabulary; a larger value pads the vocabulary (such as 50304 for GPT-2's 50257, for "
        "faster matrix shapes): the padded tokens never occur and learn a low probability",
        FROM_TO(0, 1 << 24)),
    ROW("model.tie_embeddings", B, model.tie_embeddings, "true",
        "gpt: the output head uses the token embedding's weights (one tensor, as GPT-2)", ANY),
    ROW("model.norm", E, model.norm, "layernorm",
        "gpt: the normalisation before each block's attention and MLP and before the head: "
        "layernorm (as GPT-2) or rmsnorm (no mean taken out, no shift; the layers keep the "
        "names ln1, ln2, ln_f)", ONE_OF(gpt_norms)),
    ROW("model.init_from", S, model.init_from, "none",
        "the starting parameters of a new run instead of the random initialisation (none): a "
        "Hugging Face GPT-2 directory (config.json, model.safetensors), a safetensors file "
        "(dtrain's tensor names or GPT-2's) or a dtrain model.h5; every tensor is checked "
        "against the model; a resumed run takes its checkpoint's instead",
        ANY),
    ROW("model.gelu", E, model.gelu, "exact",
        "gpt: the MLP's GELU: exact (x * Phi(x)) or tanh (the tanh approximation: GPT-2's "
        "gelu_new, which the released GPT-2 weights were trained with)",
        ONE_OF(gpt_gelus)),
    ROW("model.recompute", S, model.recompute, "none",
        "activation recomputation: none, all, or block names separated by commas (a block is "
        "a layer or a group of layers named <block>.<layer>, such as a resnet's stage1.block1); "
        "their activations are dropped after forward and recomputed in backward, with "
        "bit-identical gradients", ANY),
    ROW("model.layers", LY, model.layers, "[]",
        "model.type layers: the layers in order, each a mapping with kind (see the layer "
        "reference), an optional name and optional inputs (earlier layers' names, or x for the "
        "model input; several are summed), and the kind's settings; a residual entry is 7 "
        "layers of the model's graph (9 with a projection shortcut), and a graph holds 512",
        .count_offset = offsetof(struct dt_job, model.nlayers)),

    ROW("data.path", PS, data.path, "data/fashion-mnist.h5",
        "HDF5 dataset file, or several that are one dataset: a list of files (rows numbered "
        "across them in list order) or a glob pattern (files sorted by name); relative paths "
        "are taken from the working directory", ANY),
    ROW("data.train_split", S, data.train_split, "train", "split (group) to train on", ANY),
    ROW("data.test_split", S, data.test_split, "test", "split (group) to evaluate on", ANY),
    ROW("data.shuffle", B, data.shuffle, "true",
        "shuffle the training samples each epoch (from train.seed)", ANY),
    ROW("data.drop_last", B, data.drop_last, "true",
        "drop the incomplete last global batch of an epoch", ANY),
    ROW("data.workers", I, data.workers, "2", "loader threads per rank", FROM_TO(1, 64)),
    ROW("data.prefetch", I, data.prefetch, "4", "micro-batches each rank reads ahead",
        FROM_TO(1, 1024)),
    ROW("data.seq_len", I, data.seq_len, "128",
        "language-model datasets: tokens per sample; a sample is a window of seq_len + 1 "
        "tokens (inputs and the next token of each), the windows' start moved each epoch by a "
        "draw from train.seed", FROM_TO(1, 1 << 20)),
    ROW("data.cache", E, data.cache, "none",
        "none: every training batch is read from the dataset file; memory: each rank reads the "
        "training split into memory once at start (contiguous reads) and gathers its batches "
        "there. When the whole split fits data.cache_max_mb it is cached whole and the batches "
        "are the same as with none; otherwise each rank caches only its shard (its slice of "
        "every global batch in file order, about 1/world of the split) and shuffles within it "
        "each epoch, so samples then stay on one rank and batches differ from none. Not for "
        "language-model datasets", ONE_OF(data_caches)),
    ROW("data.cache_max_mb", I, data.cache_max_mb, "4096",
        "data.cache memory: the most MiB of cached rows one rank may hold (uint8 inputs take a "
        "byte a value, float16 and float32 four, plus 12 bytes a row); a shard larger than this "
        "is refused at start", FROM_TO(1, (int64_t)1 << 30)),
    ROW("data.augment.crop_padding", I, data.augment.crop_padding, "0",
        "training images only: a random crop of the original H x W from the image padded by "
        "this many pixels on each side with 0 (after normalisation), drawn per sample from "
        "train.seed and the epoch; 0 = off", FROM_TO(0, 1024)),
    ROW("data.augment.hflip", B, data.augment.hflip, "false",
        "training images only: flip left-right with probability 0.5, drawn per sample from "
        "train.seed and the epoch", ANY),

    ROW("train.epochs", I, train.epochs, "10",
        "passes over the training split; used when train.steps is 0",
        FROM_TO(0, DT_JOB_MAX_EPOCHS)),
    ROW("train.steps", I, train.steps, "0", "optimizer steps to run; 0 = use train.epochs",
        FROM_TO(0, DT_JOB_MAX_STEPS)),
    ROW("train.global_batch", I, train.global_batch, "128",
        "samples per optimizer step, summed over all ranks", FROM_TO(1, DT_JOB_MAX_BATCH)),
    ROW("train.micro_batch", I, train.micro_batch, "0",
        "samples per forward/backward pass on one rank; 0 = global_batch / world size "
        "(no accumulation)", FROM_TO(0, DT_JOB_MAX_BATCH)),
    ROW("train.reproducible", B, train.reproducible, "false",
        "the same parameters, losses and checkpoints on any number of ranks and any "
        "accumulation: the global batch is cut into shards of train.shard_rows rows, each "
        "shard's forward and backward runs on its own, and the shards' gradients, losses and "
        "batch-norm statistics are summed in a tree fixed by shard index (cpu backend, "
        "comm.shard none; docs/reproducibility.md)", ANY),
    ROW("train.shard_rows", I, train.shard_rows, "0",
        "train.reproducible: rows per shard (the rows every forward and backward pass runs "
        "on, and batch norm's batch); it divides the micro-batch; 0 = train.global_batch / 8",
        FROM_TO(0, DT_JOB_MAX_BATCH)),
    ROW("train.seed", I, train.seed, "42", "seed of every random draw (init, shuffle, dropout)",
        AT_LEAST(0)),
    ROW("train.eval_batch", I, train.eval_batch, "1000",
        "samples per evaluation batch, summed over all ranks (at most the test split's size is "
        "used)", FROM_TO(1, DT_JOB_MAX_BATCH)),
    ROW("train.log_every", I, train.log_every, "100",
        "optimizer steps between progress lines and metrics records",
        FROM_TO(1, DT_JOB_MAX_STEPS)),
    ROW("train.clip_norm", F, train.clip_norm, "0",
        "clip gradients to this global L2 norm; 0 = off", AT_LEAST(0)),
    ROW("train.precision", E, train.precision, "fp32",
        "type matmul inputs are rounded to: fp32, bf16 or fp16 (fp32 master weights, optimizer "
        "state and sums; fp16 adds dynamic loss scaling). Tensor cores on cuda; the cpu "
        "rounds the same way but gets no faster", ONE_OF(precisions)),

    ROW("train.optimizer.name", E, train.optimizer.name, "adamw", "optimizer",
        ONE_OF(optimizers)),
    ROW("train.optimizer.lr", F, train.optimizer.lr, "0.001",
        "peak learning rate (reached after warm-up)", ABOVE(0)),
    ROW("train.optimizer.momentum", F, train.optimizer.momentum, "0.9", "sgd: momentum",
        FROM_BELOW(0, 1)),
    ROW("train.optimizer.nesterov", B, train.optimizer.nesterov, "false",
        "sgd: Nesterov momentum", ANY),
    ROW("train.optimizer.weight_decay", F, train.optimizer.weight_decay, "0.01",
        "weight decay factor of the weight matrices and convolution kernels", AT_LEAST(0)),
    ROW("train.optimizer.bias_weight_decay", F, train.optimizer.bias_weight_decay, "0.0",
        "weight decay factor of the biases", AT_LEAST(0)),
    ROW("train.optimizer.norm_weight_decay", F, train.optimizer.norm_weight_decay, "0.0",
        "weight decay factor of the normalisation layers' scales and shifts", AT_LEAST(0)),
    ROW("train.optimizer.beta1", F, train.optimizer.beta1, "0.9",
        "adamw: decay of the first-moment average", FROM_BELOW(0, 1)),
    ROW("train.optimizer.beta2", F, train.optimizer.beta2, "0.999",
        "adamw: decay of the second-moment average", FROM_BELOW(0, 1)),
    ROW("train.optimizer.eps", F, train.optimizer.eps, "1e-8",
        "adamw: added to the denominator", ABOVE(0)),

    ROW("train.schedule.name", E, train.schedule.name, "cosine",
        "learning-rate schedule after warm-up", ONE_OF(schedules)),
    ROW("train.schedule.warmup_steps", I, train.schedule.warmup_steps, "0",
        "steps of linear warm-up from 0 to the peak learning rate; at most the run's length",
        FROM_TO(0, DT_JOB_MAX_STEPS)),
    ROW("train.schedule.step_size", I, train.schedule.step_size, "1000",
        "step: multiply the learning rate by gamma every step_size steps",
        FROM_TO(1, DT_JOB_MAX_STEPS)),
    ROW("train.schedule.gamma", F, train.schedule.gamma, "0.1", "step: decay factor",
        ABOVE_TO(0, 1)),
    ROW("train.schedule.min_lr", F, train.schedule.min_lr, "0",
        "cosine: learning rate at the last step", AT_LEAST(0)),

    ROW("runtime.device", E, runtime.device, "auto",
        "where to train; auto = cuda when a GPU is visible, else cpu", ONE_OF(devices)),
    ROW("runtime.allow_tf32", B, runtime.allow_tf32, "false",
        "cuda: fp32 matmuls may use TF32 tensor cores (faster, about 3 fewer significant "
        "digits)", ANY),
    ROW("runtime.share_gpus", B, runtime.share_gpus, "false",
        "cuda: allow several ranks of a node on one GPU (otherwise an error); gradients then "
        "travel through host memory over MPI", ANY),
    ROW("runtime.threads", I, runtime.threads, "0",
        "CPU threads per rank; 0 = all cores available to the rank",
        FROM_TO(0, DT_JOB_MAX_THREADS)),
    ROW("runtime.log_level", E, runtime.log_level, "info",
        "least severe level logged; DTRAIN_LOG overrides", ONE_OF(log_levels)),
    ROW("runtime.reference_kernels", B, runtime.reference_kernels, "false",
        "use the plain C reference ops (slow; for tests)", ANY),
    ROW("runtime.progress", E, runtime.progress, "auto",
        "progress display; auto = a bar on a terminal, lines otherwise",
        ONE_OF(progress_modes)),
    ROW("runtime.max_bad_steps", I, runtime.max_bad_steps, "5",
        "steps in a row with a non-finite loss or gradient (each skipped) before rolling back "
        "to the last checkpoint", FROM_TO(1, DT_JOB_MAX_COUNT)),
    ROW("runtime.max_rollbacks", I, runtime.max_rollbacks, "3",
        "rollbacks to the last checkpoint before the run stops as diverged",
        FROM_TO(0, DT_JOB_MAX_COUNT)),
    ROW("runtime.timeout_s", F, runtime.timeout_s, "600",
        "longest wait of one collective in the training loop; past it that rank gives up, "
        "aborts the job (exit 75, restartable) and notes it in <output.dir>/hang.txt. A step "
        "phase hung outside any collective is ended by the watchdog at this plus a grace of "
        "max(10 s, 10%); 0 = off", AT_LEAST(0)),
    ROW("runtime.memory_limit", F, runtime.memory_limit, "0",
        "GiB of host memory one rank may use; a job estimated to need more is refused before it "
        "allocates (exit 64). 0 = the rank's share of the node's memory (or its cgroup limit)",
        FROM_TO(0, 1048576)),

    ROW("comm.backend", E, comm.backend, "auto",
        "how gradients travel between ranks: nccl (GPU memory), mpi (host memory), or auto = "
        "nccl on cuda, mpi on cpu", ONE_OF(comm_backends)),
    ROW("comm.bucket_mb", F, comm.bucket_mb, "25",
        "gradient bucket size in MiB; each bucket is all-reduced as soon as backward has "
        "finished it (the first bucket is at most 1 MiB)", FROM_TO(0.001, 4096)),
    ROW("comm.grad_dtype", E, comm.grad_dtype, "fp32",
        "type gradients travel in between ranks: bf16 halves the bytes of every all-reduce "
        "(each rank's gradients and each partial sum rounded to bf16; the optimizer still "
        "works in fp32)", ONE_OF(wire_types)),
    ROW("comm.mpi_allreduce", E, comm.mpi_allreduce, "ring",
        "mpi: how gradient buckets (64 KiB and more) are summed: ring = dtrain's ring of "
        "point-to-point messages (the same work on every rank), library = the MPI library's "
        "non-blocking all-reduce (for libraries with offloaded collectives)",
        ONE_OF(mpi_allreduces)),
    ROW("comm.shard", E, comm.shard, "auto",
        "model state split over the ranks: optimizer = each rank keeps and updates the "
        "optimizer state of its 1/N of the parameters only (its chunk of every gradient "
        "bucket, reduce-scattered), and the updated chunks are gathered; gradients = the "
        "same, and each rank keeps only its 1/N of the gradients too (every micro-batch's "
        "buckets are reduce-scattered from a staging area as backward fills them; cpu "
        "backend); parameters = the same, and each rank keeps only its 1/N of the "
        "parameters too, each layer's gathered from all ranks before it runs forward and "
        "again before backward (cpu backend); none = every rank keeps all of it; auto = "
        "optimizer on the cpu backend where it runs (mpi with the ring, fp32 gradients on the "
        "wire), else none. optimizer also runs on GPUs over nccl, where auto keeps the state "
        "whole",
        ONE_OF(shard_stages)),
    ROW("comm.sharded_update", B, comm.sharded_update, "true",
        "the older spelling of comm.shard: false is comm.shard: none", ANY),
    ROW("comm.overlap", B, comm.overlap, "true",
        "all-reduce buckets while backward is still running; false waits for the whole "
        "backward (for comparison)", ANY),

    ROW("checkpoint.every_steps", I, checkpoint.every_steps, "0",
        "write a checkpoint every this many optimizer steps; 0 = off",
        FROM_TO(0, DT_JOB_MAX_STEPS)),
    ROW("checkpoint.every_minutes", F, checkpoint.every_minutes, "30",
        "write a checkpoint when this many minutes passed since the last (rank 0's clock "
        "decides); 0 = off", AT_LEAST(0)),
    ROW("checkpoint.keep_last", I, checkpoint.keep_last, "3",
        "newest valid checkpoints to keep", FROM_TO(1, DT_JOB_MAX_COUNT)),
    ROW("checkpoint.keep_every", I, checkpoint.keep_every, "0",
        "also keep checkpoints whose step is a multiple of this; 0 = off",
        FROM_TO(0, DT_JOB_MAX_STEPS)),
    ROW("checkpoint.on_error", E, checkpoint.on_error, "stop",
        "when a checkpoint cannot be written: stop (exit 74) or continue training",
        ONE_OF(ckpt_errors)),
    ROW("checkpoint.async", E, checkpoint.async, "auto",
        "write the periodic checkpoints in the background: training waits only while its state "
        "is copied into host staging memory (as large as the state each rank holds), and a "
        "writer thread writes, commits and checks the file while the next steps run; auto: in "
        "the background where MPI offers MPI_THREAD_MULTIPLE, else as off; on: refuse to start "
        "without it; off: every checkpoint stops training until it is committed. Checkpoints "
        "at a stop and at the end are always written before the run goes on",
        ONE_OF(ckpt_async)),
    ROW("checkpoint.memory_every_steps", I, checkpoint.memory_every_steps, "0",
        "keep an in-memory snapshot of the state every this many steps: each rank's in "
        "checkpoint.memory_dir on its node and a copy on a rank of another node, written in the "
        "background (needs checkpoint.async); a restart of the same run resumes from the newest "
        "one every rank has when it is newer than the latest file checkpoint; 0 = off",
        FROM_TO(0, DT_JOB_MAX_STEPS)),
    ROW("checkpoint.memory_dir", P, checkpoint.memory_dir, "/dev/shm",
        "where the in-memory snapshots are kept: a directory on a file system in memory, on "
        "every node (the run's files go into a dtrain-<key> directory in it, mode 600, removed "
        "when the run completes or starts over)", ANY),

    ROW("output.dir", P, output.dir, "runs/fashion-mnist-mlp",
        "run directory: resolved job, log, metrics, checkpoints", ANY),
    ROW("output.adopt", B, output.adopt, "false",
        "use output.dir even when it is a non-empty directory that dtrain did not make (files "
        "there named like dtrain's may be overwritten); otherwise such a directory is refused",
        ANY),
    ROW("output.tensorboard", B, output.tensorboard, "true",
        "also write the metrics as TensorBoard event files in <output.dir>/tensorboard (a new "
        "file for each run or resume; view with tensorboard --logdir <output.dir>)", ANY),
};
/* clang-format on */
#undef I
#undef F
#undef B
#undef S
#undef E
#undef L
#undef P
const size_t dt_cfg_nkeys = sizeof dt_cfg_keys / sizeof dt_cfg_keys[0];

const struct dt_cfg_section dt_cfg_sections[] = {
    {"model", "The network."},
    {"data", "The dataset and how each rank reads it."},
    {"data.augment", "Random changes to the training images, drawn per sample from train.seed "
                     "and the epoch (the same on any number of ranks, and on resume). The test "
                     "split is never augmented; a dataset of vectors refuses these keys."},
    {"train", "Length of the run, batch sizes and the seed."},
    {"train.optimizer", "The optimizer. Keys marked sgd or adamw apply to that optimizer only."},
    {"train.schedule", "The learning-rate schedule. Keys marked step or cosine apply to that "
                       "schedule only."},
    {"runtime", "How each rank runs: device, threads, logging."},
    {"comm", "How the ranks exchange gradients."},
    {"checkpoint", "When checkpoints are written to <output.dir>/checkpoints and how many are "
                   "kept. A checkpoint is also written at the end of training and when the run "
                   "is stopped by SIGTERM, SIGUSR1 or SIGINT."},
    {"output", "Where the run writes."},
};
const size_t dt_cfg_nsections = sizeof dt_cfg_sections / sizeof dt_cfg_sections[0];

static int check_epochs(const struct dt_job *j, char *msg, size_t len)
{
    if (j->train.steps > 0 || j->train.epochs >= 1)
        return 0;
    snprintf(msg, len, "train.epochs must be at least 1 when train.steps is 0 (got %lld)",
             (long long)j->train.epochs);
    return 1;
}

static int check_micro(const struct dt_job *j, char *msg, size_t len)
{
    if (j->train.micro_batch <= j->train.global_batch)
        return 0;
    snprintf(msg, len, "train.micro_batch (%lld) must not exceed train.global_batch (%lld)",
             (long long)j->train.micro_batch, (long long)j->train.global_batch);
    return 1;
}

static int check_shard_rows(const struct dt_job *j, char *msg, size_t len)
{
    int64_t g = j->train.global_batch, s = j->train.shard_rows, m = j->train.micro_batch;
    if (!j->train.reproducible) return 0;
    if (s == 0 && g % 8 != 0) {
        snprintf(msg, len,
                 "train.reproducible needs train.shard_rows: its default, train.global_batch / 8, "
                 "is not whole for train.global_batch=%lld",
                 (long long)g);
        return 1;
    }
    if (s == 0) s = g / 8;
    if (g % s != 0) {
        snprintf(msg, len, "train.shard_rows (%lld) must divide train.global_batch (%lld)",
                 (long long)s, (long long)g);
        return 1;
    }
    if (m > 0 && m % s != 0) {
        snprintf(msg, len,
                 "train.micro_batch (%lld) must be a multiple of train.shard_rows (%lld) with "
                 "train.reproducible",
                 (long long)m, (long long)s);
        return 1;
    }
    return 0;
}

static int check_warmup(const struct dt_job *j, char *msg, size_t len)
{
    if (j->train.steps == 0 || j->train.schedule.warmup_steps <= j->train.steps)
        return 0;
    snprintf(msg, len,
             "train.schedule.warmup_steps (%lld) must not exceed train.steps (%lld)",
             (long long)j->train.schedule.warmup_steps, (long long)j->train.steps);
    return 1;
}

static int check_min_lr(const struct dt_job *j, char *msg, size_t len)
{
    if (strcmp(j->train.schedule.name, "cosine") != 0 ||
        j->train.schedule.min_lr <= j->train.optimizer.lr)
        return 0;
    snprintf(msg, len,
             "train.schedule.min_lr (%g) must not exceed train.optimizer.lr (%g) with the cosine "
             "schedule",
             j->train.schedule.min_lr, j->train.optimizer.lr);
    return 1;
}

static int check_nesterov(const struct dt_job *j, char *msg, size_t len)
{
    if (strcmp(j->train.optimizer.name, "sgd") != 0 || !j->train.optimizer.nesterov ||
        j->train.optimizer.momentum > 0)
        return 0;
    snprintf(msg, len, "train.optimizer.nesterov needs train.optimizer.momentum > 0 with sgd");
    return 1;
}

static int check_layers(const struct dt_job *j, char *msg, size_t len)
{
    int want = strcmp(j->model.type, "layers") == 0;
    if (want && j->model.nlayers == 0) {
        snprintf(msg, len, "model.type layers needs model.layers: a list of layers, each a "
                           "mapping with a kind");
        return 1;
    }
    if (!want && j->model.nlayers > 0) {
        snprintf(msg, len,
                 "model.layers is read only with model.type: layers (model.type is %s, which "
                 "builds its own layers; --print-config shows them)",
                 j->model.type);
        return 1;
    }
    return 0;
}

static int check_resnet(const struct dt_job *j, char *msg, size_t len)
{
    if (strcmp(j->model.type, "resnet") != 0 || j->model.nblocks == j->model.nchannels)
        return 0;
    snprintf(msg, len,
             "model.blocks has %d entries and model.channels %d: a resnet needs one block count "
             "per stage",
             j->model.nblocks, j->model.nchannels);
    return 1;
}

static int check_gpt(const struct dt_job *j, char *msg, size_t len)
{
    if (strcmp(j->model.type, "gpt") != 0 || j->model.n_embd % j->model.n_head == 0)
        return 0;
    snprintf(msg, len, "model.n_embd (%lld) must be a multiple of model.n_head (%lld) with gpt",
             (long long)j->model.n_embd, (long long)j->model.n_head);
    return 1;
}

/* What the families expand into fits the graph (config.h); mlp and cnn
 * always do. */
_Static_assert(3 + 3 * DT_JOB_MAX_HIDDEN + 4 * DT_JOB_MAX_HIDDEN <= DT_JOB_MAX_GRAPH,
               "the largest cnn or mlp fits the graph");
_Static_assert(DT_JOB_GPT_LAYERS(DT_JOB_MAX_GPT_BLOCKS, 0) <= DT_JOB_MAX_GRAPH &&
                   DT_JOB_GPT_LAYERS(DT_JOB_MAX_GPT_BLOCKS + 1, 0) > DT_JOB_MAX_GRAPH &&
                   DT_JOB_GPT_LAYERS(DT_JOB_MAX_GPT_BLOCKS_DROPOUT, 1) <= DT_JOB_MAX_GRAPH &&
                   DT_JOB_GPT_LAYERS(DT_JOB_MAX_GPT_BLOCKS_DROPOUT + 1, 1) > DT_JOB_MAX_GRAPH,
               "the gpt bounds are the deepest that fit the graph");
/* the numbers the documentation above states */
_Static_assert(DT_JOB_MAX_GRAPH == 512 && DT_JOB_MAX_GPT_BLOCKS_DROPOUT == 42 &&
                   (DT_JOB_MAX_GRAPH - DT_JOB_RESNET_LAYERS(0, 2)) / 7 == 72 &&
                   (DT_JOB_MAX_GRAPH - DT_JOB_RESNET_LAYERS(0, 1)) / 7 == 72 &&
                   (DT_JOB_MAX_GRAPH - DT_JOB_RESNET_LAYERS(0, 4)) / 7 == 71,
               "model.n_layer's and model.blocks' documentation");

static int check_gpt_depth(const struct dt_job *j, char *msg, size_t len)
{
    if (strcmp(j->model.type, "gpt") != 0 || j->model.dropout <= 0 ||
        j->model.n_layer <= DT_JOB_MAX_GPT_BLOCKS_DROPOUT)
        return 0;
    snprintf(msg, len,
             "model.n_layer: a gpt of %lld transformer blocks with model.dropout %g is %lld "
             "layers (12 per block with dropout, 6 more), more than the %d a model holds: at "
             "most %d blocks with dropout, %d with model.dropout 0",
             (long long)j->model.n_layer, j->model.dropout,
             (long long)DT_JOB_GPT_LAYERS(j->model.n_layer, 1), DT_JOB_MAX_GRAPH,
             DT_JOB_MAX_GPT_BLOCKS_DROPOUT, DT_JOB_MAX_GPT_BLOCKS);
    return 1;
}

static int check_resnet_depth(const struct dt_job *j, char *msg, size_t len)
{
    int stages = j->model.nblocks;
    int64_t blocks = 0;
    if (strcmp(j->model.type, "resnet") != 0 || stages != j->model.nchannels) return 0;
    for (int i = 0; i < stages; i++)
        blocks += j->model.blocks[i];
    int64_t layers = DT_JOB_RESNET_LAYERS(blocks, stages);
    if (layers <= DT_JOB_MAX_GRAPH) return 0;
    snprintf(msg, len,
             "model.blocks: a resnet of %lld residual blocks in %d stage%s is %lld layers (7 per "
             "block, 2 more for each stage after the first, 6 more), more than the %d a model "
             "holds: at most %d blocks in %d stage%s",
             (long long)blocks, stages, stages == 1 ? "" : "s", (long long)layers, DT_JOB_MAX_GRAPH,
             (DT_JOB_MAX_GRAPH - DT_JOB_RESNET_LAYERS(0, stages)) / 7, stages,
             stages == 1 ? "" : "s");
    return 1;
}

static int check_cpu_nccl(const struct dt_job *j, char *msg, size_t len)
{
    if (strcmp(j->runtime.device, "cpu") != 0 || strcmp(j->comm.backend, "nccl") != 0)
        return 0;
    snprintf(msg, len,
             "comm.backend=nccl all-reduces GPU memory, but runtime.device is cpu; set "
             "comm.backend to mpi or auto");
    return 1;
}

const struct dt_cfg_relation dt_cfg_relations[] = {
    {"`train.epochs` >= 1 when `train.steps` is 0.", check_epochs},
    {"`train.micro_batch` <= `train.global_batch`.", check_micro},
    {"with `train.reproducible`, `train.shard_rows` (0: `train.global_batch` / 8) divides "
     "`train.global_batch` and `train.micro_batch`.",
     check_shard_rows},
    {"`train.schedule.warmup_steps` <= `train.steps` when `train.steps` > 0.", check_warmup},
    {"`train.schedule.min_lr` <= `train.optimizer.lr` with the cosine schedule.", check_min_lr},
    {"`train.optimizer.nesterov` needs `train.optimizer.momentum` > 0 with sgd.", check_nesterov},
    {"`comm.backend` is not nccl when `runtime.device` is cpu.", check_cpu_nccl},
    {"`model.layers` is given exactly when `model.type` is layers.", check_layers},
    {"`model.blocks` has as many entries as `model.channels` with resnet.", check_resnet},
    {"`model.n_embd` is a multiple of `model.n_head` with gpt.", check_gpt},
    {"`model.n_layer` is at most 42 with gpt and `model.dropout` > 0.", check_gpt_depth},
    {"`model.blocks` add up to at most (512 - 6 - 2 x (stages - 1)) / 7 with resnet: 72 in "
     "two stages, 71 in four.",
     check_resnet_depth},
};
const size_t dt_cfg_nrelations = sizeof dt_cfg_relations / sizeof dt_cfg_relations[0];

/* ---- names ------------------------------------------------------------ */

void dt_cfg_parent(const char *dotted, char *buf, size_t len)
{
    const char *dot = strrchr(dotted, '.');
    size_t n = dot ? (size_t)(dot - dotted) : 0;
    snprintf(buf, len, "%.*s", (int)n, dotted);
}

const char *dt_cfg_leaf(const char *dotted)
{
    const char *dot = strrchr(dotted, '.');
    return dot ? dot + 1 : dotted;
}

/* Whether name lies inside section (at any depth); everything lies in "". */
static int within(const char *name, const char *section)
{
    size_t n = strlen(section);
    if (n == 0)
        return 1;
    return strncmp(name, section, n) == 0 && name[n] == '.';
}

const struct dt_cfg_key *dt_cfg_find(const char *dotted)
{
    for (size_t i = 0; i < dt_cfg_nkeys; i++)
        if (strcmp(dt_cfg_keys[i].key, dotted) == 0)
            return &dt_cfg_keys[i];
    return NULL;
}

const struct dt_cfg_section *dt_cfg_find_section(const char *dotted)
{
    for (size_t i = 0; i < dt_cfg_nsections; i++)
        if (strcmp(dt_cfg_sections[i].name, dotted) == 0)
            return &dt_cfg_sections[i];
    return NULL;
}

/* The component of key that comes right after section, as (start, length). */
static size_t child_of(const char *key, const char *section, const char **start)
{
    *start = key + (section[0] ? strlen(section) + 1 : 0);
    const char *dot = strchr(*start, '.');
    return dot ? (size_t)(dot - *start) : strlen(*start);
}

void dt_cfg_children(const char *section, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        const char *c, *prev;
        if (!within(dt_cfg_keys[i].key, section))
            continue;
        size_t n = child_of(dt_cfg_keys[i].key, section, &c);
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = within(dt_cfg_keys[j].key, section) &&
                   child_of(dt_cfg_keys[j].key, section, &prev) == n && !strncmp(prev, c, n);
        if (seen || used >= len)
            continue;
        used += (size_t)snprintf(buf + used, len - used, "%s%.*s", used ? ", " : "", (int)n, c);
    }
}

/* ---- schema self-check ------------------------------------------------- */

static size_t type_size(const struct dt_cfg_key *k)
{
    switch (k->type) {
    case DT_CFG_INT: return sizeof(int64_t);
    case DT_CFG_FLOAT: return sizeof(double);
    case DT_CFG_BOOL: return sizeof(int);
    case DT_CFG_INT_LIST: return k->size - k->size % sizeof(int64_t);
    case DT_CFG_LAYERS: return k->size - k->size % sizeof(struct dt_layer_spec);
    default: return k->size; /* strings: any buffer */
    }
}

/* Keys under one section must be contiguous, or the YAML dump would open the
 * section twice. */
static void check_contiguous(const char *section)
{
    size_t first = dt_cfg_nkeys, last = 0;
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        if (within(dt_cfg_keys[i].key, section)) {
            if (first == dt_cfg_nkeys)
                first = i;
            last = i;
        }
    }
    DT_ASSERT(first < dt_cfg_nkeys); /* a section with no keys */
    for (size_t i = first; i <= last; i++)
        DT_ASSERT(within(dt_cfg_keys[i].key, section));
}

void dt_cfg_check_schema(void)
{
    for (size_t i = 0; i < dt_cfg_nkeys; i++) {
        const struct dt_cfg_key *k = &dt_cfg_keys[i];
        char parent[DT_JOB_STR];
        dt_cfg_parent(k->key, parent, sizeof parent);
        DT_ASSERT(dt_cfg_find_section(parent) != NULL);
        DT_ASSERT(k->size == type_size(k) && k->def && k->doc);
        DT_ASSERT((k->type == DT_CFG_ENUM) == (k->choices != NULL));
        DT_ASSERT(k->type != DT_CFG_INT_LIST || (k->min_count >= 1 && k->count_offset > 0));
    }
    for (size_t s = 0; s < dt_cfg_nsections; s++) {
        char parent[DT_JOB_STR];
        dt_cfg_parent(dt_cfg_sections[s].name, parent, sizeof parent);
        DT_ASSERT(!parent[0] || dt_cfg_find_section(parent) != NULL);
        check_contiguous(dt_cfg_sections[s].name);
    }
}

/* ---- nearest-key hints ------------------------------------------------- */

/* Largest edit distance still taken for a typo of a name this long. */
static int leaf_limit(size_t n) { return n <= 3 ? 1 : n <= 5 ? 2 : 3; }
static int full_limit(size_t n) { return n < 12 ? 1 : n < 18 ? 2 : 3; }

/* Whether two dotted names start in the same top-level section. */
static int same_top(const char *a, const char *b)
{
    size_t n = strcspn(a, ".");
    return n == strcspn(b, ".") && !strncmp(a, b, n);
}

/* How far name (a key or section) is from the typed dotted name, or a large
 * number when too far to suggest. Three ways to be close: the whole dotted
 * name is a small edit away; the last component is a small edit away within
 * the same section; or the last component is exactly that of a key or
 * section elsewhere in the same top-level section (train.lr for
 * train.optimizer.lr), or anywhere when typed at the top level (lr). */
static int closeness(const char *typed, const char *name)
{
    enum { FAR = 1 << 20 };
    char tp[DT_JOB_STR], np[DT_JOB_STR];
    const char *tl = dt_cfg_leaf(typed), *nl = dt_cfg_leaf(name);
    int best = FAR;
    int d = dt_edit_distance(typed, name);
    if (d <= full_limit(strlen(typed)))
        best = d;
    dt_cfg_parent(typed, tp, sizeof tp);
    dt_cfg_parent(name, np, sizeof np);
    d = dt_edit_distance(tl, nl);
    if (strcmp(tp, np) == 0 && d <= leaf_limit(strlen(tl)) && d < best)
        best = d;
    if (strcmp(tl, nl) == 0 && best > 1 && (!tp[0] || same_top(typed, name)))
        best = 1;
    return best;
}

int dt_cfg_suggest(const char *dotted, char *buf, size_t len)
{
    const char *best = NULL;
    int best_d = 1 << 20;
    for (size_t i = 0; i < dt_cfg_nsections + dt_cfg_nkeys; i++) {
        const char *name = i < dt_cfg_nsections ? dt_cfg_sections[i].name
                                                : dt_cfg_keys[i - dt_cfg_nsections].key;
        int d = closeness(dotted, name);
        if (d < best_d) {
            best_d = d;
            best = name;
        }
    }
    if (!best)
        return 0;
    snprintf(buf, len, "%s", best);
    return 1;
}

/* ---- words for values -------------------------------------------------- */

const char *dt_cfg_type_name(enum dt_cfg_type t)
{
    switch (t) {
    case DT_CFG_INT: return "int";
    case DT_CFG_FLOAT: return "float";
    case DT_CFG_BOOL: return "bool";
    case DT_CFG_STRING: return "string";
    case DT_CFG_ENUM: return "enum";
    case DT_CFG_INT_LIST: return "int list";
    case DT_CFG_PATH: return "path";
    case DT_CFG_PATHS: return "path(s)";
    case DT_CFG_LAYERS: return "layer list";
    }
    return "?";
}

/* A bound as written in messages: integers in full ("1000000000", not
 * "1e+09"), floats in %g. */
static void bound_text(const struct dt_cfg_key *k, double v, char *buf, size_t len)
{
    if (k->type == DT_CFG_FLOAT)
        snprintf(buf, len, "%g", v);
    else
        snprintf(buf, len, "%.0f", v);
}

/* The bounds in math form: ">= 1", "> 0", "[0, 1)", "(0, 1]", "1 to 64". */
static void bounds(const struct dt_cfg_key *k, char *buf, size_t len)
{
    unsigned r = k->range;
    char lo[32], hi[32];
    bound_text(k, k->lo, lo, sizeof lo);
    bound_text(k, k->hi, hi, sizeof hi);
    if ((r & DT_CFG_LO) && (r & DT_CFG_HI)) {
        if (k->type != DT_CFG_FLOAT && !(r & (DT_CFG_LO_EXCL | DT_CFG_HI_EXCL)))
            snprintf(buf, len, "%s to %s", lo, hi);
        else
            snprintf(buf, len, "%c%s, %s%c", r & DT_CFG_LO_EXCL ? '(' : '[', lo, hi,
                     r & DT_CFG_HI_EXCL ? ')' : ']');
    } else if (r & DT_CFG_LO) {
        snprintf(buf, len, "%s %s", r & DT_CFG_LO_EXCL ? ">" : ">=", lo);
    } else if (r & DT_CFG_HI) {
        snprintf(buf, len, "%s %s", r & DT_CFG_HI_EXCL ? "<" : "<=", hi);
    } else {
        buf[0] = '\0';
    }
}

/* "a positive integer" / "an integer >= 0" / "an integer from 1 to 64", or
 * the plural forms for list entries. */
static void int_phrase(const struct dt_cfg_key *k, int plural, char *buf, size_t len)
{
    char b[64];
    bounds(k, b, sizeof b);
    const char *noun = plural ? "integers" : "an integer";
    if (k->range == DT_CFG_LO && k->lo == 1)
        snprintf(buf, len, "%s", plural ? "positive integers" : "a positive integer");
    else if (!b[0])
        snprintf(buf, len, "%s", noun);
    else if (b[0] == '>' || b[0] == '<')
        snprintf(buf, len, "%s %s", noun, b);
    else
        snprintf(buf, len, "%s %s %s", noun, b[0] == '[' || b[0] == '(' ? "in" : "from", b);
}

static void choices_text(const struct dt_cfg_key *k, const char *quote, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (const char *const *c = k->choices; *c && used < len; c++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s", used ? ", " : "", quote, *c,
                                 quote);
}

void dt_cfg_expect_entry(const struct dt_cfg_key *k, char *buf, size_t len)
{
    int_phrase(k, 0, buf, len);
}

void dt_cfg_expect(const struct dt_cfg_key *k, char *buf, size_t len)
{
    char b[256];
    switch (k->type) {
    case DT_CFG_INT: int_phrase(k, 0, buf, len); return;
    case DT_CFG_FLOAT:
        bounds(k, b, sizeof b);
        snprintf(buf, len, "a number%s%s", b[0] == '[' || b[0] == '(' ? " in " : b[0] ? " " : "",
                 b);
        return;
    case DT_CFG_BOOL: snprintf(buf, len, "true or false"); return;
    case DT_CFG_ENUM:
        choices_text(k, "", b, sizeof b);
        snprintf(buf, len, "one of %s", b);
        return;
    case DT_CFG_INT_LIST:
        int_phrase(k, 1, b, sizeof b);
        snprintf(buf, len, "a list of %d to %zu %s", k->min_count, k->size / sizeof(int64_t), b);
        return;
    case DT_CFG_STRING: snprintf(buf, len, "a non-empty string"); return;
    case DT_CFG_PATH: snprintf(buf, len, "a non-empty path"); return;
    case DT_CFG_PATHS:
        snprintf(buf, len, "a non-empty path, a glob pattern or a list of paths");
        return;
    case DT_CFG_LAYERS:
        snprintf(buf, len, "a list of up to %zu layers, each a mapping with a kind",
                 k->size / sizeof(struct dt_layer_spec));
        return;
    }
}

void dt_cfg_allowed(const struct dt_cfg_key *k, char *buf, size_t len)
{
    char b[256];
    switch (k->type) {
    case DT_CFG_INT:
    case DT_CFG_FLOAT:
        bounds(k, b, sizeof b);
        snprintf(buf, len, "%s", b[0] ? b : "any");
        return;
    case DT_CFG_BOOL: snprintf(buf, len, "`true`, `false`"); return;
    case DT_CFG_ENUM: choices_text(k, "`", buf, len); return;
    case DT_CFG_INT_LIST:
        bounds(k, b, sizeof b);
        snprintf(buf, len, "%d to %zu entries, each %s", k->min_count, k->size / sizeof(int64_t),
                 b);
        return;
    case DT_CFG_STRING:
    case DT_CFG_PATH: snprintf(buf, len, "non-empty"); return;
    case DT_CFG_PATHS: snprintf(buf, len, "non-empty path or pattern, or list of them"); return;
    case DT_CFG_LAYERS:
        snprintf(buf, len, "0 to %zu layers", k->size / sizeof(struct dt_layer_spec));
        return;
    }
}

void dt_cfg_format_float(double v, char *buf, size_t len)
{
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    char *e = strchr(tmp, 'e');
    if (strchr(tmp, '.') || strchr(tmp, 'n') || strchr(tmp, 'i'))
        snprintf(buf, len, "%s", tmp); /* has a point already (or inf/nan) */
    else if (e)
        snprintf(buf, len, "%.*s.0%s", (int)(e - tmp), tmp, e);
    else
        snprintf(buf, len, "%s.0", tmp);
}
