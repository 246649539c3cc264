/*
 * cuda_fp16.h (host emulation): __half and its conversions, in
 * kernels/cuda/emu/emu.h.
 */
#include <cuda_runtime.h>
