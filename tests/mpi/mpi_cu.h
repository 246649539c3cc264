/*
 * mpi_cu.h - the harness shared by the multi-rank CUnit programs: starts
 * MPI and a communicator, runs the suites on every rank (rank 0 prints the
 * CUnit report, the others print only their own failures, tagged with the
 * rank), and makes every rank exit non-zero when any rank failed.
 */
#ifndef DT_MPI_CU_H
#define DT_MPI_CU_H

#include <mpi.h>
#include <stdio.h>

#include "collectives/comm.h"
#include "core/log.h"
#include "tests/unit/cu_util.h"

static void mpi_cu_print_failures(int rank)
{
    for (CU_pFailureRecord f = CU_get_failure_list(); f; f = f->pNext)
        fprintf(stderr, "[rank %d] %s:%u: %s: %s\n", rank, f->strFileName ? f->strFileName : "?",
                f->uiLineNumber, f->pTest ? f->pTest->pName : "?",
                f->strCondition ? f->strCondition : "?");
}

static int mpi_cu_run(int rank, void (*add_suites)(void))
{
    add_suites();
    if (rank == 0) {
        CU_basic_set_mode(CU_BRM_VERBOSE);
        CU_basic_run_tests();
    } else {
        CU_run_all_tests(); /* no report */
    }
    int failed = (int)(CU_get_number_of_failures() + CU_get_number_of_suites_failed());
    if (rank != 0)
        mpi_cu_print_failures(rank);
    return failed;
}

/* The whole main of a multi-rank suite program. */
static int mpi_cu_main(int argc, char **argv, const char *name, dt_comm_t **comm, int *rank,
                       int *size, void (*add_suites)(void))
{
    int provided = 0, failed = 1, total = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    dt_log_set_rank(*rank);
    if (dt_comm_create("mpi", comm) != DT_OK)
        fprintf(stderr, "[rank %d] %s: %s\n", *rank, name, dt_last_error());
    else if (CU_initialize_registry() == CUE_SUCCESS) {
        failed = mpi_cu_run(*rank, add_suites);
        CU_cleanup_registry();
    }
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (*rank == 0)
        printf("%s: %d failure(s) over %d ranks\n", name, total, *size);
    dt_comm_destroy(*comm);
    MPI_Finalize();
    return total ? 1 : 0;
}

#endif
