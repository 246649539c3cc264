/*
 * infer.c - a trained model opened for inference (see infer.h).
 *
 * A thin handle over the training loop's own start-up (train_setup.c:
 * dataset, backend, the model built for one row, no loaders) and its
 * checkpoint loading (train_ckpt.c), so a checkpoint that `dtrain eval`
 * reads is one that inference reads, with the same checks. A run's
 * model.h5 is read with the model-file reader (io/model_file.h) and matched
 * to the model by name.
 */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/alloc.h"
#include "infer.h"
#include "io/model_file.h"
#include "train_impl.h"

struct dt_infer {
    struct run r;
};

/* The tensor of t[0..n) named name, or NULL. */
static const struct dt_named_tensor *find_tensor(const struct dt_named_tensor *t, int n,
                                                 const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return &t[i];
    return NULL;
}

/* A run's model.h5 (io/model_file.h: every parameter and buffer by name) into
 * the model, each tensor checked against the model's shape. */
static dt_status set_from_model_file(struct run *r, const struct dt_named_tensor *t, int nt,
                                     const char *path)
{
    size_t np = dt_model_num_params(r->model);
    int count = dt_model_param_count(r->model) + dt_model_buffer_count(r->model);
    float *host = NULL;
    dt_status st;
    /* zeroed: the padding between tensors */
    DT_CHECK(dt_calloc(np + dt_model_num_buffer_elems(r->model) + 1, sizeof(float),
                       "the model file's tensors", (void **)&host));
    for (int i = 0; i < count; i++) {
        int is_param = i < dt_model_param_count(r->model);
        const struct dt_param_info *p =
            is_param ? dt_model_param(r->model, i)
                     : dt_model_buffer(r->model, i - dt_model_param_count(r->model));
        const struct dt_named_tensor *f = find_tensor(t, nt, p->name);
        char want[DT_MAX_DIMS * 21 + 8], have[DT_MAX_DIMS * 21 + 8];
        if (!f || !dt_shape_equal(&f->shape, &p->shape)) {
            dt_shape_format(&p->shape, want, sizeof want);
            if (f)
                dt_shape_format(&f->shape, have, sizeof have);
            st = dt_set_error(DT_ERR_BAD_DATA,
                              "model file %s %s tensor %s%s%s, where the job's model has %s: it "
                              "was written for another model (check the job's model settings)",
                              path, f ? "has" : "lacks", p->name, f ? " of shape " : "",
                              f ? have : "", want);
            goto out;
        }
        memcpy(host + (is_param ? 0 : np) + p->offset, f->data, p->numel * sizeof(float));
    }
    DT_CHECK(dt_model_set_params(r->model, host));
    DT_CHECK(dt_model_set_buffers(r->model, host + np));
    DT_LOG_INFO("generate", "generating from model file %s", path);
out:
    free(host);
    return st;
}

/* The parameters: a checkpoint (with its checks and messages), or a run's
 * model.h5. */
static dt_status load_params(struct run *r, const char *path)
{
    struct dt_named_tensor *t = NULL;
    int nt = 0;
    if (dt_model_file_load(path, &t, &nt) != DT_OK)
        return dt_train_ckpt_load_params(r, path);
    dt_status st = set_from_model_file(r, t, nt, path);
    dt_model_file_free(t, nt);
    return st;
}

dt_status dt_infer_open(const struct dt_job *job, dt_comm_t *comm, dt_infer_t **out)
{
    dt_infer_t *in = NULL;
    dt_status st;
    *out = NULL;
    DT_CHECK(dt_calloc(1, sizeof *in, "the inference state", (void **)&in));
    in->r = (struct run){.job = job, .comm = comm, .quiet = 1, .eval_only = 1, .gen_only = 1};
    in->r.rank = dt_comm_rank(comm);
    in->r.world = dt_comm_size(comm);
    DT_CHECK(dt_train_open_data(&in->r));
    *out = in;
    in = NULL;
out:
    dt_infer_close(in, st);
    return st;
}

const struct dt_dataset_info *dt_infer_dataset(const dt_infer_t *in)
{
    return dt_dataset_get_info(in->r.ds);
}

dt_status dt_infer_load(dt_infer_t *in, const char *path)
{
    dt_status st;
    DT_CHECK(dt_train_choose_backend(&in->r));
    DT_CHECK(dt_train_build(&in->r));
    DT_CHECK(load_params(&in->r, path));
out:
    return st;
}

dt_model_t *dt_infer_model(const dt_infer_t *in) { return in->r.model; }

int64_t dt_infer_vocab(const dt_infer_t *in)
{
    int64_t v = dt_dataset_get_info(in->r.ds)->vocab_size;
    return in->r.job->model.vocab_size > v ? in->r.job->model.vocab_size : v;
}

void dt_infer_close(dt_infer_t *in, dt_status st)
{
    if (!in)
        return;
    dt_train_close(&in->r, st);
    free(in);
}
