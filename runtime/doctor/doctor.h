/*
 * doctor.h - `dtrain doctor`: checks that this machine or cluster can run
 * dtrain, and says what to fix when it cannot.
 *
 * Every rank gathers what it runs on (host, GPU, driver and library
 * versions, threads, Slurm task), runs live checks (a kernel and a GEMM
 * on its GPU against the CPU, the BLAS GEMM against the C reference, an
 * all-reduce over all ranks, an HDF5 file written and read where the run
 * directory lives), and rank 0 prints one table row per rank, the checks
 * and one line per problem with its cause and fix.
 */
#ifndef DT_DOCTOR_H
#define DT_DOCTOR_H

#include <stdio.h>

#include "collectives/comm.h"
#include "core/status.h"

struct dt_doctor_opts {
    /* The directory whose file system is checked. With dir_explicit
     * (--dir) it must exist; otherwise it is output.dir, and when that
     * does not exist yet its nearest existing parent is checked (dtrain
     * train creates the rest). Nothing is created in it but a temporary
     * file per rank, removed again. */
    const char *dir;
    int dir_explicit;
    const char *dir_origin; /* for the report: "--dir", "output.dir" */
    long threads;           /* runtime.threads (0: the cores available to the rank) */
};

/* Collective: every rank calls it with the same options. Rank 0 writes the
 * report to out (other ranks may pass NULL). *problems gets the number of
 * problems found, the same on every rank. A status other than DT_OK means
 * the doctor itself could not finish (a collective failed, memory); the
 * ranks may then be out of step and the caller should abort. */
dt_status dt_doctor_run(dt_comm_t *c, const struct dt_doctor_opts *o, FILE *out, int *problems);

#endif
