/*
 * dnn.cu - the CUDA backend's link to cuDNN: one handle per backend, bound
 * to the backend's stream, and cuDNN's failures turned into a status.
 *
 * The handle is created by the first op that needs it (a convolution or a
 * pooling, or conv2d_workspace when the model is built), not with the
 * backend: creating it loads cuDNN's sub-libraries and takes device
 * memory, which a job without such layers should not pay for.
 *
 * Only built with DT_HAVE_CUDNN (cuDNN found at configure time); without
 * it the backend has no convolution or pooling ops.
 */
#include <stdarg.h>
#include <stdio.h>

#include "cuda_impl.h"

#ifdef DT_HAVE_CUDNN

dt_status dt_cudnn_status(struct cuda_backend *cb, cudnnStatus_t st, const char *op,
                          const char *fmt, ...)
{
    if (st == CUDNN_STATUS_SUCCESS)
        return DT_OK;
    /* a CUDA error under it belongs to this failure, not to the next launch */
    (void)cudaGetLastError();
    char shapes[256] = "", detail[512] = "";
    va_list ap;
    va_start(ap, fmt);
    if (fmt)
        vsnprintf(shapes, sizeof shapes, fmt, ap);
    va_end(ap);
    cudnnGetLastErrorString(detail, sizeof detail);
    dt_status code = DT_ERR_CUDA;
    const char *hint = "";
    switch (st) {
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
        code = DT_ERR_NOMEM;
        hint = "; lower train.micro_batch (accumulation makes up the rest of the batch)";
        break;
    case CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED:
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE:
        code = DT_ERR_UNSUPPORTED;
        hint = "; cuDNN's libcudnn_*.so.9 must sit beside libcudnn.so.9, all of one version";
        break;
    default:
        if (st >= CUDNN_STATUS_NOT_SUPPORTED && st < CUDNN_STATUS_INTERNAL_ERROR)
            code = DT_ERR_UNSUPPORTED;
        break;
    }
    return dt_set_error(code, "cuDNN error on cuda:%d in %s%s%s%s: %s%s%s%s%s",
                        cb ? cb->device : -1, op ? op : "?", shapes[0] ? " (" : "", shapes,
                        shapes[0] ? ")" : "", cudnnGetErrorString(st), detail[0] ? " (" : "",
                        detail, detail[0] ? ")" : "", hint);
}

dt_status dt_cuda_dnn(struct cuda_backend *cb, const char *op, cudnnHandle_t *out)
{
    if (!cb->dnn) {
        cudnnHandle_t h = NULL;
        cudnnStatus_t st = cudnnCreate(&h);
        if (st != CUDNN_STATUS_SUCCESS)
            return dt_cudnn_status(cb, st, op, "creating the cuDNN handle");
        st = cudnnSetStream(h, cb->stream);
        if (st != CUDNN_STATUS_SUCCESS) {
            dt_status ds = dt_cudnn_status(cb, st, op, "binding cuDNN to the stream");
            (void)cudnnDestroy(h);
            return ds;
        }
        cb->dnn = h;
        dt_cuda_note_usage(cb);
    }
    *out = cb->dnn;
    return DT_OK;
}

cudnnStatus_t dt_cudnn_tensor4d(cudnnTensorDescriptor_t d, int n, int c, int h, int w)
{
    return cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w);
}

void dt_cuda_dnn_release(struct cuda_backend *cb)
{
    dt_cuda_conv_release(cb);
    if (cb->dnn)
        (void)cudnnDestroy(cb->dnn);
    cb->dnn = NULL;
}

#endif
