/*
 * export.h - a trained model written for other tools (`dtrain export`):
 * safetensors with dtrain's tensor names (any model: its parameters and
 * buffers, such as batch norm's running statistics), or, for a gpt, a
 * Hugging Face GPT-2 directory (config.json + model.safetensors, GPT-2's
 * names and layouts: io/hf_gpt2.h) that transformers' GPT2LMHeadModel
 * loads.
 */
#ifndef DT_EXPORT_H
#define DT_EXPORT_H

#include "collectives/comm.h"
#include "core/status.h"
#include "runtime/config/config.h"

enum dt_export_format { DT_EXPORT_SAFETENSORS, DT_EXPORT_HF };

struct dt_export_opts {
    const char *checkpoint; /* a checkpoint, or a run's model.h5 */
    const char *out;        /* a file (safetensors) or a directory (hf) */
    enum dt_export_format format;
    int force; /* replace an existing out, once the new one is complete */
};

/* Builds the job's model on one rank, loads the checkpoint and writes it.
 * Nothing is left half written: the file or the directory appears whole,
 * under its name, or not at all. DT_ERR_USAGE for an out that exists
 * without force, for hf and a model that is not a GPT-2 (model.type gpt
 * with layer norms), or several ranks; the checkpoint's errors
 * (DT_ERR_NOT_FOUND, DT_ERR_BAD_DATA); DT_ERR_IO for a write. */
dt_status dt_export_run(const struct dt_job *job, dt_comm_t *comm, const struct dt_export_opts *o);

#endif
