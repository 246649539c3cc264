/*
 * torch_step.c - test driver: builds dtrain's model from a job file,
 * initialises it, runs `steps` optimizer steps on one given batch and
 * writes everything compare_torch.py needs to redo the same in PyTorch.
 *
 *   torch_step JOB.yaml X.bin Y.bin ROWS OUTDIR STEPS [SEQ_LEN VOCAB [PARAMS.bin]]
 *
 * X.bin: ROWS x 28 x 28 float32; Y.bin: ROWS int32 (10 classes). With
 * SEQ_LEN and VOCAB the model is a language model, as the trainer builds
 * it for a token dataset of that vocabulary: X.bin holds ROWS x SEQ_LEN
 * token ids as float32, Y.bin ROWS x SEQ_LEN next tokens as int32, and
 * the classes are VOCAB or model.vocab_size if larger. PARAMS.bin, when
 * given, replaces the initial parameters (float32 in the flat layout; run
 * with STEPS 0 first for layout.txt and params0.bin). Writes in OUTDIR:
 * layout.txt (per tensor: name offset group dims..., then the buffers such
 * as batch-norm running statistics with group "buffer"), params0.bin
 * (initial flat parameters), arena.txt (the activation arena's bytes, and
 * what they would be without model.recompute), and per step k:
 * loss_k.txt, grads_k.bin, params_k.bin, buffers_k.bin. The optimizer
 * takes the trainer's parameter groups.
 */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"
#include "runtime/train/optim.h"

#define SIDE 28
#define CLASSES 10

static int write_file(const char *dir, const char *name, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, bytes, fp) != bytes) {
        fprintf(stderr, "torch_step: cannot write %s\n", path);
        return 1;
    }
    return fclose(fp) != 0;
}

static int read_file(const char *path, void *p, size_t bytes)
{
    FILE *fp = fopen(path, "rb");
    int ok = fp && fread(p, 1, bytes, fp) == bytes;
    if (fp)
        fclose(fp);
    if (!ok)
        fprintf(stderr, "torch_step: cannot read %zu bytes from %s\n", bytes, path);
    return !ok;
}

static int fail(dt_status st)
{
    fprintf(stderr, "torch_step: %s\n", dt_last_error());
    return st == DT_OK ? 1 : 2;
}

int main(int argc, char **argv)
{
    if (argc != 7 && argc != 9 && argc != 10) {
        fprintf(stderr, "usage: torch_step JOB X.bin Y.bin ROWS OUTDIR STEPS [SEQ_LEN VOCAB "
                        "[PARAMS.bin]]\n");
        return 64;
    }
    static struct dt_job job;
    dt_status st = dt_job_load(argv[1], &job);
    if (st != DT_OK)
        return fail(st);
    int rows = atoi(argv[4]), steps = atoi(argv[6]);
    const char *out = argv[5];
    struct dt_model_io io = {.ndim = 2, .shape = {SIDE, SIDE}, .num_classes = CLASSES};
    size_t xper = SIDE * SIDE, yper = 1;
    if (argc >= 9) {
        int64_t T = atoll(argv[7]), V = atoll(argv[8]);
        if (T < 1 || V < 2) {
            fprintf(stderr, "torch_step: SEQ_LEN must be at least 1 and VOCAB at least 2\n");
            return 64;
        }
        io = (struct dt_model_io){.ndim = 1, .shape = {T}, .num_classes = V};
        if (job.model.vocab_size > V)
            io.num_classes = job.model.vocab_size;
        xper = yper = (size_t)T;
    }
    float *x = malloc((size_t)rows * xper * sizeof(float));
    int32_t *y = malloc((size_t)rows * yper * sizeof(int32_t));
    if (!x || !y || read_file(argv[2], x, (size_t)rows * xper * sizeof(float)) ||
        read_file(argv[3], y, (size_t)rows * yper * sizeof(int32_t)))
        return 1;

    dt_backend_t *be;
    struct dt_backend_opts bo = {.threads = 1};
    dt_model_t *m;
    dt_optim_t *o;
    if ((st = dt_backend_create("cpu", &bo, &be)) != DT_OK ||
        (st = dt_model_create(&job, &io, be, rows, &m)) != DT_OK ||
        (st = dt_model_init_params(m, (uint64_t)job.train.seed)) != DT_OK ||
        (st = dt_optim_create(&job, be, dt_model_num_params(m), &o)) != DT_OK ||
        (st = dt_optim_groups_from_model(o, &job, m)) != DT_OK)
        return fail(st);
    if ((size_t)dt_model_input_numel(m) != xper || (size_t)dt_model_labels_per_row(m) != yper) {
        fprintf(stderr,
                "torch_step: the model takes %lld inputs and %lld labels per row, the files "
                "%zu and %zu\n",
                (long long)dt_model_input_numel(m), (long long)dt_model_labels_per_row(m), xper,
                yper);
        return 1;
    }

    size_t n = dt_model_num_params(m);
    char path[4096];
    snprintf(path, sizeof path, "%s/layout.txt", out);
    FILE *lay = fopen(path, "w");
    if (!lay)
        return 1;
    for (int b = 0; b < 2; b++) {
        int count = b ? dt_model_buffer_count(m) : dt_model_param_count(m);
        for (int i = 0; i < count; i++) {
            const struct dt_param_info *p = b ? dt_model_buffer(m, i) : dt_model_param(m, i);
            fprintf(lay, "%s %zu %s", p->name, p->offset,
                    b ? "buffer" : dt_decay_group_name(p->group));
            for (int d = 0; d < p->shape.ndim; d++)
                fprintf(lay, " %lld", (long long)p->shape.dim[d]);
            fputc('\n', lay);
        }
    }
    fclose(lay);
    snprintf(path, sizeof path, "%s/arena.txt", out);
    FILE *ar = fopen(path, "w");
    if (!ar)
        return 1;
    fprintf(ar, "%llu %llu\n", (unsigned long long)dt_model_arena_bytes(m),
            (unsigned long long)dt_model_arena_bytes_full(m));
    fclose(ar);
    size_t nb = dt_model_num_buffer_elems(m);
    float *bufs = malloc((nb ? nb : 1) * sizeof(float));
    float *buf = malloc(n * sizeof(float));
    if (!buf)
        return 1;
    if (argc == 10 &&
        (read_file(argv[9], buf, n * sizeof(float)) || (st = dt_model_set_params(m, buf)) != DT_OK))
        return st != DT_OK ? fail(st) : 1;
    if (dt_model_get_params(m, buf) != DT_OK || write_file(out, "params0.bin", buf, n * 4))
        return 1;
    for (int k = 1; k <= steps; k++) {
        double loss = 0;
        int64_t correct = 0;
        char name[64];
        if ((st = dt_model_zero_grads(m)) != DT_OK ||
            (st = dt_model_forward(m, x, y, rows, 1, 1, k - 1, 0, &loss, &correct)) != DT_OK ||
            (st = dt_model_backward(m, rows, 1.0f / (float)rows, NULL)) != DT_OK ||
            (st = dt_model_get_grads(m, buf)) != DT_OK)
            return fail(st);
        snprintf(name, sizeof name, "grads_%d.bin", k);
        if (write_file(out, name, buf, n * 4))
            return 1;
        snprintf(path, sizeof path, "%s/loss_%d.txt", out, k);
        FILE *fp = fopen(path, "w");
        if (!fp)
            return 1;
        fprintf(fp, "%.10e\n", loss / rows);
        fclose(fp);
        double lr = dt_schedule_lr(&job, k - 1, steps);
        if ((st = dt_optim_step(o, dt_model_params(m), dt_model_grads(m), lr)) != DT_OK ||
            (st = dt_model_get_params(m, buf)) != DT_OK)
            return fail(st);
        snprintf(name, sizeof name, "params_%d.bin", k);
        if (write_file(out, name, buf, n * 4))
            return 1;
        if ((st = dt_model_get_buffers(m, bufs)) != DT_OK)
            return fail(st);
        snprintf(name, sizeof name, "buffers_%d.bin", k);
        if (write_file(out, name, bufs, nb * 4))
            return 1;
    }
    free(buf);
    free(bufs);
    free(x);
    free(y);
    dt_optim_destroy(o);
    dt_model_destroy(m);
    dt_backend_destroy(be);
    return 0;
}
