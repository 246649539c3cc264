/*
 * ranks.c - how a dtrain process starts as one of the ranks of a job, the
 * same way for every command that starts MPI (train, eval, generate,
 * doctor, bench, find-batch's trials):
 *
 *   1. Before MPI_Init, what would leave MPI and dtrain unable to use the
 *      files they create, and can be known for certain without MPI
 *      (dt_cli_check_env): a umask that takes the owner's own read, write
 *      or search permission away; a temporary directory (TMPDIR, which
 *      Open MPI keeps its session directory in) that does not exist or
 *      that this user cannot create files in; and Open MPI's session
 *      directory for this user and host, left unusable by an earlier run.
 *      Each is refused with one message (64) before anything is created,
 *      instead of Open MPI's pages of errors and a mode-000 session
 *      directory that breaks the user's later runs.
 *   2. MPI_Init_thread and the mpi communicator: the same collectives for
 *      every command, so ranks started on different commands reach them
 *      alike. A job that may write checkpoints in the background
 *      (checkpoint.async not off) asks for MPI_THREAD_MULTIPLE, since its
 *      writer thread runs parallel HDF5's collectives beside training's;
 *      anything else asks for MPI_THREAD_FUNNELED.
 *   3. The start-up agreement, before anything else collective: every
 *      rank compares its command (the subcommand and the options that
 *      change what it does) and then its job with rank 0's. A rank started
 *      on another subcommand (mpirun -np 1 dtrain eval ... : -np 1 dtrain
 *      train ...) or with another job makes every rank fail at once with
 *      one message naming the rank and what differs (64), instead of
 *      hanging in collectives that do not match.
 *
 * A rank that ends without starting MPI while its peers start it (one
 * that only printed its usage or a checkpoint list) would leave them
 * waiting in MPI_Init for ever. Where peers can run other programs (an
 * Open MPI launch of several, mpirun -np 1 A : -np 1 B), main() has such a
 * process take part in the agreement on its way out (dt_cli_ranks_join),
 * so its peers learn that it runs something else.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "core/log.h"
#include "runtime/train/dist.h"
#include "cli.h"

#define EXIT_SOFTWARE 70 /* EX_SOFTWARE */
#define CMDLINE_MAX 1024 /* of a command quoted in the agreement */

/* ---- before MPI ----------------------------------------------------------- */

static int check_umask(void)
{
    static const struct {
        mode_t bit;
        const char *name;
    } perms[] = {{S_IRUSR, "read"}, {S_IWUSR, "write"}, {S_IXUSR, "search"}};
    mode_t mask = umask(0);
    umask(mask);
    if (!(mask & S_IRWXU)) return 0;
    char taken[32] = "";
    int n = 0, left = 0;
    for (int i = 0; i < 3; i++)
        left += (mask & perms[i].bit) != 0;
    for (int i = 0; i < 3; i++) {
        if (!(mask & perms[i].bit)) continue;
        size_t at = strlen(taken);
        snprintf(taken + at, sizeof taken - at, "%s%s",
                 n == 0          ? ""
                 : n == left - 1 ? " and "
                                 : ", ",
                 perms[i].name);
        n++;
    }
    return dt_cli_fail(dt_set_error(
        DT_ERR_USAGE,
        "the umask %04o takes the owner's own %s permission%s away from every file and directory "
        "dtrain and Open MPI create, so the run could not use them (and a session directory "
        "left that way breaks later runs): set a umask that keeps them, such as 022 (umask 022), "
        "and run again",
        (unsigned)mask, taken, left > 1 ? "s" : ""));
}

/* Where Open MPI puts its session directory: its MCA setting, else the
 * first of TMPDIR, TEMP and TMP, else /tmp; *name says which. */
static const char *session_base(const char **name)
{
    static const char *const vars[] = {"OMPI_MCA_orte_tmpdir_base", "TMPDIR", "TEMP", "TMP"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) {
            *name = vars[i];
            return v;
        }
    }
    *name = NULL;
    return "/tmp";
}

static int check_tmpdir(const char *dir, const char *name)
{
    struct stat sb;
    const char *why = NULL;
    if (!dir[0])
        why = "it is empty";
    else if (stat(dir, &sb) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(sb.st_mode))
        why = "it is not a directory";
    else if (access(dir, W_OK | X_OK) != 0)
        why = strerror(errno);
    if (!why) return 0;
    char where[600];
    if (name)
        snprintf(where, sizeof where, "%s=%s", name, dir);
    else
        snprintf(where, sizeof where, "%s (no TMPDIR set)", dir);
    return dt_cli_fail(dt_set_error(DT_ERR_USAGE,
                                    "the temporary directory %s cannot take new files (%s): Open "
                                    "MPI creates its session directory there; point %s at a "
                                    "directory this user can write (export %s=/tmp) and run again",
                                    where, why, name ? name : "TMPDIR", name ? name : "TMPDIR"));
}

/* Open MPI 4's session directory for this user on this host
 * (<base>/ompi.<host>.<uid>, the host name without its domain), when an
 * earlier run left it without its owner's permissions. */
static int check_session_dir(const char *base)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "", host[256] = "", path[4096];
    int len = 0, major = 0;
    if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS ||
        sscanf(lib, "Open MPI v%d.", &major) != 1 || major > 4 || gethostname(host, sizeof host))
        return 0; /* another library, or another layout */
    host[sizeof host - 1] = '\0';
    host[strcspn(host, ".")] = '\0';
    snprintf(path, sizeof path, "%s/ompi.%s.%lu", base, host, (unsigned long)getuid());
    struct stat sb;
    if (lstat(path, &sb) != 0 || access(path, R_OK | W_OK | X_OK) == 0) return 0;
    return dt_cli_fail(dt_set_error(DT_ERR_USAGE,
                                    "Open MPI's session directory %s, left by an earlier run, is "
                                    "not usable by this user (mode %04o, owner uid %lu): remove it "
                                    "(chmod -R u+rwx %s; rm -rf %s) and run again",
                                    path, (unsigned)(sb.st_mode & 07777), (unsigned long)sb.st_uid,
                                    path, path));
}

int dt_cli_check_env(void)
{
    const char *name;
    const char *base = session_base(&name);
    int rc = check_umask();
    if (rc == 0) rc = check_tmpdir(base, name);
    if (rc == 0) rc = check_session_dir(base);
    return rc;
}

/* ---- MPI and the agreement ------------------------------------------------- */

/* Under MPI_THREAD_MULTIPLE the writer thread's MPI-IO runs while the
 * training thread polls its own requests. Open MPI's own MPI-IO (ompio)
 * hooks a poll of its pending requests into every thread's progress loop
 * without a lock of its own, and a training thread has been seen to crash
 * in it; Open MPI's ROMIO runs each call under a lock and adds nothing to
 * the progress loop. So ROMIO is preferred (its priority raised above
 * ompio's), unless the user chose the component; an Open MPI without it
 * keeps ompio, and other MPIs ignore these variables. */
static void prefer_romio(void)
{
    if (getenv("OMPI_MCA_io")) return;
    setenv("OMPI_MCA_io_romio321_priority", "40", 0);
    setenv("OMPI_MCA_io_romio341_priority", "40", 0);
}

int dt_cli_ranks_start(int *argc, char ***argv, const char *command, const struct dt_job *job,
                       dt_comm_t **comm)
{
    int provided = 0, rc = dt_cli_check_env();
    *comm = NULL;
    if (rc != 0) return rc;
    int level = job && strcmp(job->checkpoint.async, "off") != 0 ? MPI_THREAD_MULTIPLE
                                                                  : MPI_THREAD_FUNNELED;
    if (level == MPI_THREAD_MULTIPLE) prefer_romio();
    if (MPI_Init_thread(argc, argv, level, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dtrain: MPI could not start\n");
        return EXIT_SOFTWARE;
    }
    dt_comm_t *c = NULL;
    dt_status st = dt_comm_create("mpi", &c);
    if (st != DT_OK) { /* the ranks may be out of step: end them all */
        rc = dt_cli_fail(st);
        MPI_Abort(MPI_COMM_WORLD, rc);
        return rc;
    }
    dt_log_set_rank(dt_comm_rank(c));
    st = dt_dist_check_same(c, "the command", command, DT_ERR_USAGE);
    if (st == DT_OK && job) st = dt_dist_check_job(c, job);
    if (st == DT_OK) {
        *comm = c;
        return 0;
    }
    /* agreed: every rank has the same message; rank 0 says it */
    rc = dt_status_exit_code(st);
    if (st == DT_ERR_COMM) {
        fprintf(stderr, "dtrain: rank %d: %s; ending the whole job (exit %d)\n", dt_comm_rank(c),
                dt_last_error(), rc);
        dt_comm_abort(c, rc);
    }
    if (dt_comm_rank(c) == 0) dt_cli_fail(st);
    dt_cli_ranks_end(c);
    return rc;
}

void dt_cli_ranks_end(dt_comm_t *comm)
{
    dt_comm_destroy(comm);
    MPI_Finalize();
}

/* ---- a process that did not start MPI ------------------------------------- */

/* Started by mpirun as one of several programs (mpirun -np 1 A : -np 1 B):
 * Open MPI lists each program's process count. Only there can a peer run
 * another dtrain command; with one program every rank runs the same one,
 * and a script that runs several dtrain commands per rank must find MPI
 * unstarted in each. */
static int several_programs(void)
{
    const char *v = getenv("OMPI_APP_CTX_NUM_PROCS");
    return v && strchr(v, ' ') != NULL;
}

int dt_cli_ranks_join(int argc, char **argv, int rc)
{
    int started = 0;
    if (rc != 0 || !several_programs() || MPI_Initialized(&started) != MPI_SUCCESS || started)
        return rc; /* a failed rank ends the launcher's job itself */
    char cmd[CMDLINE_MAX];
    size_t at = (size_t)snprintf(cmd, sizeof cmd, "'dtrain");
    for (int i = 1; i < argc && at < sizeof cmd; i++) {
        int n = snprintf(cmd + at, sizeof cmd - at, " %s", argv[i]);
        at += n > 0 ? (size_t)n : 0;
    }
    if (at < sizeof cmd)
        snprintf(cmd + at, sizeof cmd - at, "' (which ended without starting MPI)");
    dt_comm_t *c = NULL;
    rc = dt_cli_ranks_start(&argc, &argv, cmd, NULL, &c);
    if (rc == 0) dt_cli_ranks_end(c);
    return rc;
}
