/*
 * cmd_version.c - `dtrain version`: the version, the compute backends this
 * build has, the GPU found or why none is usable (a probe of the driver, no
 * backend is created), and the cuDNN and NCCL loaded, each with the version
 * this build was compiled against where that differs, and the CPU BLAS
 * with the kernels it runs. The GPU check's preflight (tests/gpu/check.sh)
 * reads the "cudnn:" and "nccl:" lines; bench/ scripts the "blas:" line.
 */
#include <stdio.h>
#include <string.h>

#include "collectives/comm.h"
#include "kernels/backend.h"
#include "cli.h"

static const char version_usage[] =
    "usage: dtrain version\n"
    "Prints dtrain's version, the compute backends built in, the GPU found (or why\n"
    "none is usable), and the cuDNN and NCCL versions loaded (and built against, where\n"
    "they differ), and the CPU BLAS with the kernels it runs.\n";

int dt_cmd_version(int argc, char **argv)
{
    if (argc >= 2 && dt_cli_is_help(argv[1])) return fputs(version_usage, stdout), 0;
    if (argc >= 2) return dt_cli_usage("version: unexpected argument '%s'", argv[1]);
    char why[512];
    int gpu = dt_cuda_usable(why, sizeof why);
    printf("dtrain %s (backends: %s)\ngpu: %s%s\n", DT_VERSION, dt_backend_list(),
           gpu ? "" : "none; ", why);
    /* device -1: the library versions alone, no device is touched */
    struct dt_gpu_info info;
    char no_device[256], nccl[160];
    dt_cuda_device_info(-1, &info, no_device, sizeof no_device);
    if (info.cudnn[0]) printf("cudnn: %s\n", info.cudnn);
    dt_comm_library_version("nccl", nccl, sizeof nccl);
    if (!strncmp(nccl, "NCCL ", 5)) printf("nccl: %s\n", nccl + 5);
    char blas[512];
    dt_blas_info(blas, sizeof blas);
    printf("blas: %s\n", blas);
    return 0;
}
