/*
 * colsum.cu - column sums of row-major (rows, cols) matrices on the GPU:
 * the bias gradient of linear (sum of dout), layer norm's dgamma and dbeta
 * (sums of dy*xhat and of dy) and RMS norm's dgamma (sum of dy*x*rstd).
 *
 * One thread per column would give a 768-wide layer three blocks, so the
 * sum is split in two fixed passes:
 *   1. a grid of (column tiles x row tiles) blocks; a block of COL_TILE x
 *      ROW_LANES threads takes COL_TILE neighbouring columns (a warp reads
 *      one row's COL_TILE floats at once) of one tile of rows. Thread
 *      (tx, ty) adds rows ty, ty + ROW_LANES, ... of its tile for column
 *      tx, in double; thread (tx, 0) then adds the ROW_LANES sums of its
 *      column in lane order (after a barrier, through shared memory) into
 *      one partial, partials[row tile][column];
 *   2. one thread per column adds its row tiles' partials in tile order and
 *      adds the result, rounded to fp32, to the output (+=).
 * The tile sizes are constants and the number of row tiles is a function
 * of rows alone (rows_per_tile), never of the device, so the order of
 * every addition, and with it every bit of the result, is the same on
 * every run and on every GPU. No atomics. The sums are in double, so they
 * differ from the CPU's fp32 or double sums in another order by far less
 * than fp32 resolution.
 *
 * The partials live in the backend's scratch (dt_cuda_scratch: sized when
 * the model is built from dt_cuda_colsum_scratch, kept, shared with the
 * GEMM operands, sumsq's partials and the loss's rows), which is safe
 * because every user runs in stream order on the one stream and is done
 * with it when its op's kernels end. The scratch synchronises the stream
 * only when a call outgrows it; nothing else here waits.
 *
 * Outputs are parameter gradients: they ACCUMULATE (+=).
 */
#include <cuda_runtime.h>

#include "cuda_impl.h"

#define COL_TILE 32     /* columns per block, one warp wide */
#define ROW_LANES 8     /* threads per column in a block */
#define TILE_ROWS 128   /* rows per row tile while rows <= TILE_ROWS * MAX_ROW_TILES */
#define MAX_ROW_TILES 64 /* beyond that, tiles grow by TILE_ROWS rows at a time */
#define MAX_SUMS 2       /* column sums one pass computes (layer norm: dgamma, dbeta) */

static_assert(COL_TILE * ROW_LANES == DT_CUDA_THREADS, "a column tile is one ordinary block");
static_assert(TILE_ROWS % ROW_LANES == 0, "every lane gets the same number of rows of a full tile");

/* Rows per row tile: TILE_ROWS, or the least multiple of it that keeps the
 * tiles at most MAX_ROW_TILES (a function of rows only). */
static size_t rows_per_tile(int rows)
{
    const size_t span = (size_t)TILE_ROWS * MAX_ROW_TILES;
    return (size_t)TILE_ROWS * (((size_t)rows + span - 1) / span);
}

/* Pass 1: block (blockIdx.x, blockIdx.y) writes the sums over rows
 * [blockIdx.y * tile, +tile) of columns [blockIdx.x * COL_TILE, +COL_TILE)
 * to part[(k * gridDim.y + blockIdx.y) * cols + column], k = 0 (and k = 1
 * for layer norm's dbeta). */
static __global__ void colsum_tiles(double *part, enum dt_cuda_colsum_kind kind, const float *a,
                                    const float *x, const float *mean, const float *rstd,
                                    size_t tile, int rows, int cols)
{
    __shared__ double sh[MAX_SUMS][ROW_LANES][COL_TILE];
    const unsigned tx = threadIdx.x, ty = threadIdx.y;
    const size_t c = (size_t)blockIdx.x * COL_TILE + tx;
    const size_t r0 = (size_t)blockIdx.y * tile;
    const size_t r1 = r0 + tile < (size_t)rows ? r0 + tile : (size_t)rows;
    double s0 = 0.0, s1 = 0.0;
    if (c < (size_t)cols) {
        for (size_t r = r0 + ty; r < r1; r += ROW_LANES) {
            const size_t e = r * cols + c;
            switch (kind) {
            case DT_CUDA_COLSUM_PLAIN: s0 += a[e]; break;
            case DT_CUDA_COLSUM_LAYERNORM:
                s0 += (double)a[e] * (double)((x[e] - mean[r]) * rstd[r]);
                s1 += a[e];
                break;
            case DT_CUDA_COLSUM_RMSNORM: s0 += (double)a[e] * (double)(x[e] * rstd[r]); break;
            }
        }
    }
    sh[0][ty][tx] = s0;
    sh[1][ty][tx] = s1;
    __syncthreads();
    if (ty == 0 && c < (size_t)cols) {
        double t0 = 0.0, t1 = 0.0;
        for (int k = 0; k < ROW_LANES; k++) {
            t0 += sh[0][k][tx];
            t1 += sh[1][k][tx];
        }
        part[(size_t)blockIdx.y * cols + c] = t0;
        if (kind == DT_CUDA_COLSUM_LAYERNORM)
            part[((size_t)gridDim.y + blockIdx.y) * cols + c] = t1;
    }
}

/* Pass 2: out0[c] += sum over t of part[t][c], out1[c] += sum of
 * part[tiles + t][c], t in order (either output may be NULL; no tiles adds
 * 0). */
static __global__ void colsum_finish(float *out0, float *out1, const double *part, int tiles,
                                     int cols)
{
    for (size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x; c < (size_t)cols;
         c += (size_t)gridDim.x * blockDim.x) {
        double s0 = 0.0, s1 = 0.0;
        for (int t = 0; t < tiles; t++) {
            s0 += part[(size_t)t * cols + c];
            if (out1)
                s1 += part[((size_t)tiles + t) * cols + c];
        }
        if (out0)
            out0[c] += (float)s0;
        if (out1)
            out1[c] += (float)s1;
    }
}

size_t dt_cuda_colsum_scratch(enum dt_cuda_colsum_kind kind, int rows, int cols)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    const size_t tile = rows_per_tile(rows);
    const size_t tiles = ((size_t)rows + tile - 1) / tile;
    return (kind == DT_CUDA_COLSUM_LAYERNORM ? 2 : 1) * tiles * (size_t)cols * sizeof(double);
}

dt_status dt_cuda_colsum(struct cuda_backend *cb, const struct dt_cuda_colsum *s)
{
    if (s->cols <= 0 || (!s->out0 && !s->out1))
        return DT_OK;
    const size_t tile = rows_per_tile(s->rows);
    const int tiles = s->rows > 0 ? (int)(((size_t)s->rows + tile - 1) / tile) : 0;
    const int sums = s->kind == DT_CUDA_COLSUM_LAYERNORM ? 2 : 1;
    void *part = NULL;
    if (tiles > 0) {
        const size_t bytes = dt_cuda_colsum_scratch(s->kind, s->rows, s->cols);
        dt_status st = dt_cuda_scratch(cb, bytes, &part);
        if (st != DT_OK)
            return dt_error_context(st, "cuda %s (rows=%d cols=%d, column sums)", s->op, s->rows,
                                    s->cols);
        const dim3 grid((unsigned)(((size_t)s->cols + COL_TILE - 1) / COL_TILE), (unsigned)tiles);
        const dim3 block(COL_TILE, ROW_LANES);
        DT_CUDA_LAUNCH(colsum_tiles, grid, block, 0, cb->stream, (double *)part, s->kind, s->a,
                       s->x, s->mean, s->rstd, tile, s->rows, s->cols);
        st = DT_CUDA_LAUNCHED(cb, s->op, "rows=%d cols=%d, column sums of %d row tiles", s->rows,
                              s->cols, tiles);
        if (st != DT_OK)
            return st;
    }
    DT_CUDA_LAUNCH(colsum_finish, dt_cuda_blocks((size_t)s->cols), DT_CUDA_THREADS, 0, cb->stream,
                   s->out0, sums == 2 ? s->out1 : NULL, (const double *)part, tiles, s->cols);
    return DT_CUDA_LAUNCHED(cb, s->op, "rows=%d cols=%d, adding %d row tiles", s->rows, s->cols,
                            tiles);
}
