/*
 * doctor_impl.h - internal to runtime/doctor*.c: the per-rank records
 * `dtrain doctor` gathers, and the report made from them. The records are
 * sent as bytes between ranks of one binary, so they hold fixed-size text.
 */
#ifndef DT_DOCTOR_IMPL_H
#define DT_DOCTOR_IMPL_H

#include <stdio.h>

#include "kernels/backend.h"
#include "doctor.h"

#define DOCTOR_PATH 1024

/* What one rank runs on, and its own checks. */
struct facts {
    char host[80];
    int rank, local_rank, local_size, threads;
    int other_host; /* DTRAIN_FAULT otherhost: acting as another node */
    char slurm_job[32], slurm_procid[16], slurm_localid[16];
    int expected_tasks;     /* what a launcher's variables announce; 0: none */
    char expected_from[64]; /* "SLURM_NTASKS=2" */
    char nvidia_module[32]; /* /proc/driver/nvidia/version; "" without a driver */
    int cuda_built;
    int gpu_count, device; /* visible GPUs; the one this rank would use */
    int gpu_described, gpu_usable;
    char gpu_why[512]; /* why not usable, or its description */
    struct dt_gpu_info gpu;
    char mpi[256], nccl[128], hdf5[96], blas[384];
    int hdf5_parallel;
    int cpu_gemm_ok;
    double cpu_gemm_err;
    char cpu_gemm_msg[256];
    int gpu_checked, gpu_kernel_ok, gpu_gemm_ok;
    double gpu_gemm_err;
    char gpu_msg[512];
};

/* The run-directory check of one rank. */
struct dirfacts {
    char dir[DOCTOR_PATH]; /* the directory checked; "" when there was none */
    char note[DOCTOR_PATH + 64];
    int written, ok;
    char msg[768]; /* why the write or read failed */
    int looked;    /* other hosts whose file was looked for */
    int missing_n, missing_rank;
    int unreadable_n, unreadable_rank;
    char unreadable_msg[512];
};

struct allreduce_result {
    int ran, ok;
    double busbw, seconds;
    char msg[512];
};

struct doctor_run {
    int world;
    const struct facts *facts;   /* world records */
    const struct dirfacts *dirs; /* world records */
    const struct dt_doctor_opts *opts;
    struct allreduce_result mpi, nccl;
};

/* Prints the report to out (nothing when NULL) and returns the number of
 * problems found. */
int doctor_report(const struct doctor_run *r, FILE *out);

#endif
