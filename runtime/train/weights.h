/*
 * weights.h - parameters from elsewhere as the starting point of a model
 * (model.init_from, and what dtrain eval / generate / export take besides
 * checkpoints): a Hugging Face GPT-2 directory (config.json +
 * model.safetensors, io/hf_gpt2.h), a safetensors file with dtrain's
 * tensor names or GPT-2's, or a dtrain model file (model.h5).
 *
 * Every tensor of the model must be in the source with its shape (GPT-2's
 * Conv1D weights transposed; a wpe of more positions than data.seq_len
 * gives its first rows); the buffers (batch norm's running statistics)
 * are taken where the source has them and keep their values otherwise.
 * Every problem found is reported in one message: the config fields that
 * differ from the job, the tensors missing, of another shape, or that the
 * model does not have.
 */
#ifndef DT_WEIGHTS_H
#define DT_WEIGHTS_H

#include "core/status.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"

/* Whether path is one of the sources above other than a model file: a
 * directory, or a name ending in .safetensors. */
int dt_weights_is_external(const char *path);

/* Sets m's parameters (and buffers) from path. `what` starts the messages
 * ("model.init_from"). DT_ERR_NOT_FOUND for a missing path,
 * DT_ERR_BAD_DATA for a source that does not fit the job's model (every
 * mismatch named) or a malformed one, DT_ERR_IO. */
dt_status dt_weights_load(dt_model_t *m, const struct dt_job *job, const char *path,
                          const char *what);

#endif
