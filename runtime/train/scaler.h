/*
 * scaler.h - dynamic loss scaling for fp16 training, as plain C shared by
 * every backend: the loss is multiplied by the scale before backward, the
 * gradients divided by it after; a step whose gradients overflowed is
 * skipped and the scale halved; after `growth_interval` clean steps in a
 * row the scale doubles. A scale that would fall below `min_scale` stops
 * the run with an explanation instead of training on garbage.
 */
#ifndef DT_SCALER_H
#define DT_SCALER_H

#include <stdint.h>

#include "core/status.h"

#define DT_SCALER_INIT 65536.0        /* 2^16 */
#define DT_SCALER_GROWTH_INTERVAL 2000
#define DT_SCALER_GROWTH 2.0
#define DT_SCALER_BACKOFF 0.5
#define DT_SCALER_MIN 1.0

struct dt_scaler {
    double scale;
    double min_scale;
    int64_t growth_interval;
    int64_t clean_steps; /* finite steps since the last change */
    int64_t overflows;   /* skipped steps so far */
};

/* Defaults above (scale 2^16, x2 after 2000 clean steps, x0.5 on overflow,
 * floor 1). */
void dt_scaler_init(struct dt_scaler *s);

/* After a step's gradients were checked: `finite` = no inf/NaN anywhere
 * (agreed over ranks). Sets *skip when the optimizer must not step.
 * DT_ERR_BAD_DATA when the scale would drop below the floor. */
dt_status dt_scaler_update(struct dt_scaler *s, int finite, int *skip);

/* Factor to multiply gradients by before the optimizer (1 / scale). */
static inline double dt_scaler_unscale(const struct dt_scaler *s) { return 1.0 / s->scale; }

#endif
