/*
 * gpt_probs.c - test driver: dtrain's next-token probabilities of a GPT
 * whose parameters come from a safetensors file with dtrain's names (as
 * `dtrain export --format safetensors` writes it), read with dtrain's
 * reader; every tensor of the model must be in the file with its shape.
 *
 *   gpt_probs JOB.yaml WEIGHTS.safetensors X.bin ROWS SEQ_LEN VOCAB OUT.bin
 *
 * X.bin: ROWS x SEQ_LEN token ids as float32. OUT.bin: ROWS x SEQ_LEN x
 * C float32 probabilities (C: the model's outputs per position).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"

static int fail(const char *what)
{
    fprintf(stderr, "gpt_probs: %s: %s\n", what, dt_last_error());
    return 1;
}

/* The model's parameters from f, by name; 0 or 1 after a message. */
static int load(dt_model_t *m, dt_safetensors_t *f, float *flat)
{
    for (int i = 0; i < dt_model_param_count(m); i++) {
        const struct dt_param_info *p = dt_model_param(m, i);
        const struct dt_st_tensor *t = dt_safetensors_find(f, p->name);
        int same = t && t->ndim == p->shape.ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == p->shape.dim[d];
        if (!same) {
            fprintf(stderr, "gpt_probs: tensor %s missing or of another shape\n", p->name);
            return 1;
        }
        if (dt_safetensors_read(f, t, flat + p->offset) != DT_OK)
            return fail("reading");
    }
    return dt_model_set_params(m, flat) != DT_OK ? fail("setting the parameters") : 0;
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: gpt_probs JOB WEIGHTS.safetensors X.bin ROWS SEQ_LEN VOCAB OUT\n");
        return 64;
    }
    static struct dt_job job;
    int rows = atoi(argv[4]);
    int64_t T = atoll(argv[5]), V = atoll(argv[6]);
    if (dt_job_load(argv[1], &job) != DT_OK)
        return fail(argv[1]);
    struct dt_model_io io = {.ndim = 1, .shape = {T}, .num_classes = V};
    if (job.model.vocab_size > V)
        io.num_classes = job.model.vocab_size;
    dt_backend_t *be;
    dt_model_t *m;
    dt_safetensors_t *f;
    struct dt_backend_opts bo = {.threads = 1};
    if (dt_backend_create("cpu", &bo, &be) != DT_OK ||
        dt_model_create(&job, &io, be, rows, &m) != DT_OK)
        return fail("building the model");
    if (dt_safetensors_open(argv[2], &f) != DT_OK)
        return fail(argv[2]);
    float *flat = calloc(dt_model_num_params(m), sizeof(float));
    size_t nx = (size_t)rows * (size_t)T;
    float *x = malloc(nx * sizeof *x), *probs = malloc(nx * (size_t)io.num_classes * sizeof *probs);
    int32_t *y = calloc(nx, sizeof *y);
    FILE *fx = fopen(argv[3], "rb");
    if (!flat || !x || !probs || !y || !fx || fread(x, sizeof *x, nx, fx) != nx) {
        fprintf(stderr, "gpt_probs: cannot read %zu token ids from %s\n", nx, argv[3]);
        return 1;
    }
    fclose(fx);
    if (load(m, f, flat))
        return 1;
    double loss = 0;
    int64_t correct = 0;
    if (dt_model_forward(m, x, y, rows, 0, 0, 0, 0, &loss, &correct) != DT_OK ||
        dt_model_get_output(m, probs) != DT_OK)
        return fail("forward");
    FILE *fo = fopen(argv[7], "wb");
    size_t np = nx * (size_t)io.num_classes;
    if (!fo || fwrite(probs, sizeof *probs, np, fo) != np || fclose(fo) != 0) {
        fprintf(stderr, "gpt_probs: cannot write %s\n", argv[7]);
        return 1;
    }
    dt_safetensors_close(f);
    dt_model_destroy(m);
    dt_backend_destroy(be);
    free(flat);
    free(x);
    free(y);
    free(probs);
    return 0;
}
