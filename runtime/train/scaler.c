/*
 * scaler.c - the dynamic loss-scale state machine (see scaler.h). Pure
 * arithmetic on a small struct: the same on every rank, because every rank
 * feeds it the same agreed overflow flag.
 */
#include "scaler.h"

void dt_scaler_init(struct dt_scaler *s)
{
    s->scale = DT_SCALER_INIT;
    s->min_scale = DT_SCALER_MIN;
    s->growth_interval = DT_SCALER_GROWTH_INTERVAL;
    s->clean_steps = 0;
    s->overflows = 0;
}

dt_status dt_scaler_update(struct dt_scaler *s, int finite, int *skip)
{
    *skip = !finite;
    if (finite) {
        if (++s->clean_steps >= s->growth_interval) {
            s->scale *= DT_SCALER_GROWTH;
            s->clean_steps = 0;
        }
        return DT_OK;
    }
    s->overflows++;
    s->clean_steps = 0;
    double next = s->scale * DT_SCALER_BACKOFF;
    if (next < s->min_scale)
        return dt_set_error(DT_ERR_BAD_DATA,
                            "fp16 loss scaling: the gradients overflow even at loss scale %g "
                            "(the floor is %g) after %lld skipped steps; the model diverges in "
                            "fp16: train in bf16 or fp32, or lower the learning rate",
                            s->scale, s->min_scale, (long long)s->overflows);
    s->scale = next;
    return DT_OK;
}
