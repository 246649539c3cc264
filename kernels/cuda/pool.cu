/*
 * pool.cu - 2-d max and average pooling on the GPU (NCHW): cuDNN's pooling
 * for max forward and backward and for average forward, and a kernel of
 * our own for average backward.
 *
 * Max pooling uses CUDNN_POOLING_MAX_DETERMINISTIC, so the backward pass
 * gives the same bits on every run; padded positions never win a max, as
 * ops.h asks, and a NaN in a window propagates to its output. ops.h routes
 * the gradient of a window to its FIRST maximum (row-major within the
 * window); cuDNN does not document which of several equal maxima it picks,
 * so on inputs with ties inside a window the GPU may route a gradient to
 * another (equal) element than the CPU. Inputs without ties (random
 * values) give the same result.
 *
 * Average pooling divides by R*S including padded positions
 * (CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, PyTorch's
 * count_include_pad=True). Its backward op gets neither x nor y, both of
 * which cuDNN's backward call takes, so it is a gather of our own: each
 * input position sums dy/(R*S) over the windows that hold it, in a fixed
 * order, so it is deterministic and needs no atomics.
 *
 * The descriptors are made per call: they are host-side structs, cheap
 * next to the pooling itself. Gradients of activations are WRITTEN (=);
 * pooling has no parameters.
 */
#include "cuda_impl.h"

#ifdef DT_HAVE_CUDNN

#define SHAPE_FMT "N=%d C=%d H=%d W=%d R=%d S=%d stride=%dx%d pad=%dx%d P=%d Q=%d"
#define SHAPE_ARGS(s)                                                                              \
    (s)->N, (s)->C, (s)->H, (s)->W, (s)->R, (s)->S, (s)->stride_h, (s)->stride_w, (s)->pad_h,      \
        (s)->pad_w, (s)->P, (s)->Q

/* The descriptors of one pooling call. */
struct pool_desc {
    cudnnPoolingDescriptor_t pool;
    cudnnTensorDescriptor_t x, y;
};

/* Positive sizes and strides, padding below the window (so every window
 * holds at least one real value), and P, Q as dt_conv_out_dim gives them. */
static dt_status check_shape(const char *op, const struct dt_pool2d_shape *s)
{
    return dt_check_pool2d("cuda", op, s);
}

static void desc_free(struct pool_desc *d)
{
    if (d->pool)
        (void)cudnnDestroyPoolingDescriptor(d->pool);
    if (d->x)
        (void)cudnnDestroyTensorDescriptor(d->x);
    if (d->y)
        (void)cudnnDestroyTensorDescriptor(d->y);
}

/* Checks the shape, gets the handle and describes the call. */
static dt_status describe(struct cuda_backend *cb, const char *op, const struct dt_pool2d_shape *s,
                          cudnnPoolingMode_t mode, cudnnHandle_t *h, struct pool_desc *d)
{
    dt_status st = check_shape(op, s);
    if (st != DT_OK)
        return st;
    st = dt_cuda_dnn(cb, op, h);
    if (st != DT_OK)
        return st;
    cudnnStatus_t cst = cudnnCreatePoolingDescriptor(&d->pool);
    if (cst == CUDNN_STATUS_SUCCESS)
        cst = cudnnCreateTensorDescriptor(&d->x);
    if (cst == CUDNN_STATUS_SUCCESS)
        cst = cudnnCreateTensorDescriptor(&d->y);
    if (cst == CUDNN_STATUS_SUCCESS)
        cst = cudnnSetPooling2dDescriptor(d->pool, mode, CUDNN_PROPAGATE_NAN, s->R, s->S, s->pad_h,
                                          s->pad_w, s->stride_h, s->stride_w);
    if (cst == CUDNN_STATUS_SUCCESS)
        cst = dt_cudnn_tensor4d(d->x, s->N, s->C, s->H, s->W);
    if (cst == CUDNN_STATUS_SUCCESS)
        cst = dt_cudnn_tensor4d(d->y, s->N, s->C, s->P, s->Q);
    if (cst != CUDNN_STATUS_SUCCESS)
        return dt_cudnn_status(cb, cst, op, "describing " SHAPE_FMT, SHAPE_ARGS(s));
    int n = 0, c = 0, p = 0, q = 0;
    cst = cudnnGetPooling2dForwardOutputDim(d->pool, d->x, &n, &c, &p, &q);
    if (cst != CUDNN_STATUS_SUCCESS)
        return dt_cudnn_status(cb, cst, op, "output size of " SHAPE_FMT, SHAPE_ARGS(s));
    if (n != s->N || c != s->C || p != s->P || q != s->Q)
        return dt_set_error(DT_ERR_INTERNAL,
                            "cuda %s: cuDNN computes a (%d,%d,%d,%d) output where dtrain "
                            "computes (%d,%d,%d,%d) (" SHAPE_FMT ")",
                            op, n, c, p, q, s->N, s->C, s->P, s->Q, SHAPE_ARGS(s));
    return DT_OK;
}

static dt_status pool_fwd(dt_backend_t *be, const char *op, cudnnPoolingMode_t mode, float *y,
                          const float *x, const struct dt_pool2d_shape *s)
{
    struct cuda_backend *cb = dt_cuda_of(be);
    struct pool_desc d = {NULL, NULL, NULL};
    cudnnHandle_t h = NULL;
    const float one = 1.0f, zero = 0.0f;
    dt_status st = describe(cb, op, s, mode, &h, &d);
    if (st == DT_OK)
        st = dt_cudnn_status(cb, cudnnPoolingForward(h, d.pool, &one, d.x, x, &zero, d.y, y), op,
                             SHAPE_FMT, SHAPE_ARGS(s));
    desc_free(&d);
    return st;
}

/* dx(n,c,h,w) = sum of dy(n,c,p,q)/(R*S) over the windows (p,q) that
 * hold (h,w): p*stride_h - pad_h <= h < p*stride_h - pad_h + R. */
static __global__ void avgpool_gather(float *dx, const float *dy, struct dt_pool2d_shape s,
                                      size_t n)
{
    const float area = (float)(s.R * s.S);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int w = (int)(i % s.W), h = (int)(i / s.W % s.H);
        const size_t plane = i / ((size_t)s.H * s.W);
        const int hp = h + s.pad_h, wp = w + s.pad_w;
        /* first window reaching down to hp: p*stride + R > hp */
        const int p0 = hp >= s.R ? (hp - s.R) / s.stride_h + 1 : 0;
        const int q0 = wp >= s.S ? (wp - s.S) / s.stride_w + 1 : 0;
        const int p1 = min(hp / s.stride_h, s.P - 1), q1 = min(wp / s.stride_w, s.Q - 1);
        const float *g = dy + plane * s.P * s.Q;
        float sum = 0.0f;
        for (int p = p0; p <= p1; p++)
            for (int q = q0; q <= q1; q++)
                sum += g[(size_t)p * s.Q + q] / area;
        dx[i] = sum;
    }
}

/* y(N,C,P,Q) = window maxima of x */
dt_status dt_cuda_maxpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                                const struct dt_pool2d_shape *s)
{
    DT_CUDA_REQUIRE(y && x, "maxpool2d_fwd", "pointers must not be NULL");
    return pool_fwd(be, "maxpool2d_fwd", CUDNN_POOLING_MAX_DETERMINISTIC, y, x, s);
}

/* dx (written) = dy routed to the maximum of each window, summed */
dt_status dt_cuda_maxpool2d_bwd(dt_backend_t *be, float *dx, const float *dy, const float *x,
                                const float *y, const struct dt_pool2d_shape *s)
{
    DT_CUDA_REQUIRE(dx && dy && x && y, "maxpool2d_bwd", "pointers must not be NULL");
    struct cuda_backend *cb = dt_cuda_of(be);
    struct pool_desc d = {NULL, NULL, NULL};
    cudnnHandle_t h = NULL;
    const float one = 1.0f, zero = 0.0f;
    dt_status st = describe(cb, "maxpool2d_bwd", s, CUDNN_POOLING_MAX_DETERMINISTIC, &h, &d);
    if (st == DT_OK)
        st = dt_cudnn_status(
            cb, cudnnPoolingBackward(h, d.pool, &one, d.y, y, d.y, dy, d.x, x, &zero, d.x, dx),
            "maxpool2d_bwd", SHAPE_FMT, SHAPE_ARGS(s));
    desc_free(&d);
    return st;
}

/* y = window sums / (R*S), padding included */
dt_status dt_cuda_avgpool2d_fwd(dt_backend_t *be, float *y, const float *x,
                                const struct dt_pool2d_shape *s)
{
    DT_CUDA_REQUIRE(y && x, "avgpool2d_fwd", "pointers must not be NULL");
    return pool_fwd(be, "avgpool2d_fwd", CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, y, x, s);
}

/* dx (written) = dy / (R*S) spread over each window, summed */
dt_status dt_cuda_avgpool2d_bwd(dt_backend_t *be, float *dx, const float *dy,
                                const struct dt_pool2d_shape *s)
{
    DT_CUDA_REQUIRE(dx && dy, "avgpool2d_bwd", "pointers must not be NULL");
    dt_status st = check_shape("avgpool2d_bwd", s);
    if (st != DT_OK)
        return st;
    struct cuda_backend *cb = dt_cuda_of(be);
    const size_t n = (size_t)s->N * s->C * s->H * s->W;
    DT_CUDA_LAUNCH(avgpool_gather, dt_cuda_blocks(n), DT_CUDA_THREADS, 0, cb->stream, dx, dy, *s, n);
    return DT_CUDA_LAUNCHED(cb, "avgpool2d_bwd", SHAPE_FMT, SHAPE_ARGS(s));
}

#endif
