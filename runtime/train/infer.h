/*
 * infer.h - a trained model opened for inference on one rank: the job's
 * dataset (its vocabulary and tokenizer), a backend, the job's model built
 * for one row, and the parameters of a checkpoint or of a run's model.h5.
 *
 * It is the start-up `dtrain eval` uses (the same dataset checks, backend
 * choice and checkpoint reading, with the same messages) without its
 * loaders, optimizer or reducer, for callers above the training loop
 * (`dtrain generate`) that must not see the loop's own state. Opening is
 * two steps so that a caller can refuse a dataset (by its info) before a
 * model is built for it.
 */
#ifndef DT_INFER_H
#define DT_INFER_H

#include <stdint.h>

#include "collectives/comm.h"
#include "core/status.h"
#include "io/dataset.h"
#include "runtime/config/config.h"
#include "runtime/model/model.h"

typedef struct dt_infer dt_infer_t;

/* Opens the job's dataset (data.path) for inference on comm's rank.
 * The job and comm must outlive the handle. */
dt_status dt_infer_open(const struct dt_job *job, dt_comm_t *comm, dt_infer_t **out);

/* The dataset's summary: language model or not, tokenizer, vocabulary. */
const struct dt_dataset_info *dt_infer_dataset(const dt_infer_t *in);

/* Chooses the backend (runtime.device), builds the model for one row and
 * sets its parameters from `path`: a checkpoint (read and checked as
 * `dtrain eval --checkpoint` reads it) or a run's model.h5, each tensor
 * matched to the model by name and shape. DT_ERR_NOT_FOUND for a missing
 * file, DT_ERR_BAD_DATA for one of another model. */
dt_status dt_infer_load(dt_infer_t *in, const char *path);

/* The model (after dt_infer_load). */
dt_model_t *dt_infer_model(const dt_infer_t *in);

/* The classes the model outputs per position: the larger of
 * model.vocab_size and the dataset's vocabulary, as the model is built. */
int64_t dt_infer_vocab(const dt_infer_t *in);

/* Frees everything; st is the caller's outcome (an error skips nothing
 * but is not reported again). NULL is a no-op. */
void dt_infer_close(dt_infer_t *in, dt_status st);

#endif
