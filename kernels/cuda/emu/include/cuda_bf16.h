/*
 * cuda_bf16.h (host emulation): __nv_bfloat16 and its conversions, in
 * kernels/cuda/emu/emu.h.
 */
#include <cuda_runtime.h>
