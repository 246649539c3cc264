/*
 * host.h - what a process learns about the machine it runs on: the CPUs
 * it may use, the threads a training rank takes, and whether a person
 * watches its standard output.
 */
#ifndef DT_HOST_H
#define DT_HOST_H

/* CPUs this process may run on (sched affinity), at least 1. */
int dt_cpu_count(void);

/* The threads a training rank uses: runtime.threads when > 0; else every
 * core it is bound to when the launcher bound it; when nothing bound it,
 * the CPUs Slurm gave the task (SLURM_CPUS_PER_TASK: with
 * TaskPlugin=task/none nothing binds), else an equal share of the node
 * among its `local_size` ranks. At least 1. */
int dt_rank_threads(long job_threads, int local_size);

/* Whether stdout reaches a person's terminal. Under Open MPI's mpirun a
 * rank's stdout is a pseudo-terminal that mpirun creates whatever its own
 * stdout is (a batch job's output file, say), so there the launcher's own
 * stdout decides: mpirun is the rank's parent on its node. */
int dt_stdout_is_terminal(void);

#endif
