/*
 * cuda_launch.h - the one way dtrain's kernels are launched:
 *
 *     DT_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, args...);
 *
 * With nvcc it is kernel<<<grid, block, shared_bytes, stream>>>(args...).
 * In the host emulation build (DT_CUDA_EMU, kernels/cuda/emu/) the same
 * source is compiled by the host C++ compiler and the launch runs every
 * thread of every block on the CPU (kernels/cuda/emu/emu.h says how), so
 * the kernels' index arithmetic, barriers and warp exchanges are tested
 * in the ordinary test suite. Check the launch with cudaGetLastError
 * (DT_CUDA_LAUNCHED) as after any launch.
 */
#ifndef DT_CUDA_LAUNCH_H
#define DT_CUDA_LAUNCH_H

#ifdef DT_CUDA_EMU
#include "kernels/cuda/emu/emu.h"
#define DT_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                             \
    dt_emu::launch(                                                                                \
        []() -> dt_emu::site & {                                                                   \
            static dt_emu::site s_{#kernel, __FILE__, __LINE__};                                   \
            return s_;                                                                             \
        }(),                                                                                       \
        (grid), (block), (shared_bytes), (stream), kernel, __VA_ARGS__)
#else
#define DT_CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                             \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#endif

#endif
