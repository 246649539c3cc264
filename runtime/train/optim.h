/*
 * optim.h - optimizers (SGD with momentum/Nesterov/weight decay, AdamW)
 * and learning-rate schedules (constant, step, cosine; each with linear
 * warm-up). Global-norm clipping is the step gate's (kernels/gate.h).
 *
 * Optimizer state lives on the model's backend beside the flat parameter
 * buffer and is updated by one fused op per step.
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "runtime/config/config.h"
#include "core/status.h"
#include "runtime/model/model.h"

typedef struct dt_optim dt_optim_t;

dt_status dt_optim_create(const struct dt_job *job, dt_backend_t *be, size_t n, dt_optim_t **out);
/* The same, keeping state for the count ranges [lo[k], hi[k]) of the n
 * elements only (increasing, disjoint: this rank's shard), packed one after
 * another; count 0 is dt_optim_create. Such an optimizer updates through
 * dt_optim_step_ranges, each range within one of its own. */
dt_status dt_optim_create_sharded(const struct dt_job *job, dt_backend_t *be, size_t n,
                                  const size_t *lo, const size_t *hi, size_t count,
                                  dt_optim_t **out);
void dt_optim_destroy(dt_optim_t *o);

/* Parameter groups: the ranges of the flat buffers and the weight decay
 * each takes. Without groups every element takes
 * train.optimizer.weight_decay. Ranges must lie inside [0, n); elements no
 * range covers take no weight decay. The ranges are copied. */
struct dt_optim_range {
    size_t offset, numel;
    double weight_decay;
};
dt_status dt_optim_set_groups(dt_optim_t *o, const struct dt_optim_range *r, int count);

/* The groups of a model: each parameter tensor takes the factor of its
 * group (train.optimizer.weight_decay, bias_weight_decay or
 * norm_weight_decay). */
dt_status dt_optim_groups_from_model(dt_optim_t *o, const struct dt_job *job, const dt_model_t *m);

/* One update of params from grads with learning rate lr. */
dt_status dt_optim_step(dt_optim_t *o, float *params, const float *grads, double lr);
/* The same step, gated: it changes nothing when the backend's step gate
 * (kernels/ops.h, step_gate, queued before it) skips, which a backend
 * with a stream decides on the device. The step is counted; once the
 * gate's record shows it skipped, dt_optim_unstep takes the count back. */
dt_status dt_optim_step_gated(dt_optim_t *o, float *params, const float *grads, double lr);
/* The gated step that also zeroes all n gradients as it reads them (and
 * zeroes them when the gate skips): the next step's backward accumulates
 * into them with no fill first. */
dt_status dt_optim_step_gated_clear(dt_optim_t *o, float *params, float *grads, double lr);
void dt_optim_unstep(dt_optim_t *o);
/* The same step for the elements in [lo[k], hi[k]) only, k < count (a
 * sharded update: each rank's own chunks); the rest of params and of the
 * state is left as it is. Every element gets the update dt_optim_step
 * would give it. */
dt_status dt_optim_step_ranges(dt_optim_t *o, float *params, const float *grads, double lr,
                               const size_t *lo, const size_t *hi, size_t count);
/* A sharded optimizer's step over all its own ranges, with the gradients
 * packed as its state is (range k's at the sum of the earlier ranges'
 * lengths: sharded gradients). */
dt_status dt_optim_step_packed(dt_optim_t *o, float *params, const float *grads, double lr);
/* The same with the parameters packed too (sharded parameters). */
dt_status dt_optim_step_shard(dt_optim_t *o, float *params, const float *grads, double lr);

/* Steps taken so far; set when resuming from a checkpoint. */
int64_t dt_optim_steps(const dt_optim_t *o);
void dt_optim_set_steps(dt_optim_t *o, int64_t t);

/* The optimizer's state buffers, each laid out like the parameters (n
 * elements on the backend; sharded, the shard's ranges packed,
 * dt_optim_state_numel elements): 0 for SGD without momentum, 1
 * ("momentum") for SGD, 2 ("m", "v") for AdamW. */
int dt_optim_state_count(const dt_optim_t *o);
size_t dt_optim_state_numel(const dt_optim_t *o);
/* The shard's ranges [lo[k], hi[k]) and where each starts in the state
 * buffers (base[k]); returns their count, 0 when the state is whole. */
size_t dt_optim_shard(const dt_optim_t *o, const size_t **lo, const size_t **hi,
                      const size_t **base);
/* The same for the job's optimizer, before one exists. */
int dt_optim_state_count_for(const struct dt_job *job);
float *dt_optim_state(dt_optim_t *o, int i, const char **name);

/* Learning rate for 0-based optimizer step `step` of `total` steps:
 * linear warm-up from lr/warmup to lr over warmup_steps, then the schedule
 * (constant; step: lr * gamma^floor(s / step_size); cosine: from lr down to
 * min_lr at the last step), s counting from the end of warm-up. */
double dt_schedule_lr(const struct dt_job *job, int64_t step, int64_t total);

#endif
