/*
 * supervisor.c - the restart loop behind `dtrain launch`.
 *
 * Signals: SIGTERM, SIGINT, SIGUSR1 and SIGCHLD stay blocked for the whole
 * supervision and are taken synchronously with sigwaitinfo/sigtimedwait.
 * A signal that arrives between fork and wait, or while the supervisor
 * decides whether to restart, stays pending instead of being lost, and no
 * handler ever runs. The child puts itself in its own process group,
 * unblocks those signals, restores their default actions and execs; an exec
 * failure comes back as an errno through a close-on-exec pipe, so "mpirun
 * is not installed" is the supervisor's own error (exit 66), not a
 * restartable child exit.
 *
 * When a child ends, its process group gets SIGKILL before the child is
 * reaped: nothing of a finished attempt (a rank that ignored SIGTERM, a
 * helper a script left behind) outlives it to hold a GPU or a port the
 * next attempt needs, and the unreaped child keeps the group id from being
 * reused by an unrelated process meanwhile.
 *
 * Output: the supervisor's own log lines go to stderr (its stdout is
 * pointed at stderr while it runs) and each child keeps the original
 * stdout, so training results can still be redirected on their own. The
 * child's stdin is /dev/null: it runs in a background process group, and
 * reading the terminal (mpirun forwards stdin) would stop it.
 */
#define _GNU_SOURCE /* pipe2 */
#include "supervisor.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/text.h"

#define LOG_SUBSYS "launch"
#define EXIT_TEMPFAIL 75 /* stopped cleanly or restartable */
#define CMDLINE_MAX 3072 /* longest command shown in a log line */

static const int forwarded_sigs[] = {SIGTERM, SIGINT, SIGUSR1};
#define N_FORWARDED ((int)(sizeof forwarded_sigs / sizeof forwarded_sigs[0]))

/* State of one supervision. */
struct sup {
    const struct dt_launch_opts *o;
    sigset_t set;        /* signals taken synchronously */
    sigset_t old_mask;   /* the caller's mask, restored at the end */
    sigset_t child_mask; /* old_mask without `set`: the child's mask */
    struct sigaction old_act[N_FORWARDED + 1];
    int child_out; /* the original stdout, for children; -1: none */
    int as_root;
};

const char *dt_launcher_name(enum dt_launcher l)
{
    switch (l) {
    case DT_LAUNCHER_MPIRUN:
        return "mpirun";
    case DT_LAUNCHER_SRUN:
        return "srun";
    case DT_LAUNCHER_NONE:
        return "none";
    }
    return "?";
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGTERM:
        return "SIGTERM";
    case SIGINT:
        return "SIGINT";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGKILL:
        return "SIGKILL";
    }
    return "signal";
}

/* ---- the command line of an attempt --------------------------------- */

struct argvec {
    char **v;
    int n, cap;
};

static dt_status av_push(struct argvec *a, const char *s)
{
    DT_ASSERT(a->n + 1 < a->cap);
    if ((a->v[a->n] = strdup(s)) == NULL)
        return dt_set_error(DT_ERR_NOMEM, "launch: out of memory building the command line");
    a->n++;
    return DT_OK;
}

/* How many words train_args[i] spans if it is a --resume option (1 or 2),
 * else 0. */
static int resume_words(char **args, int n, int i)
{
    if (!strncmp(args[i], "--resume=", 9)) return 1;
    if (strcmp(args[i], "--resume") != 0) return 0;
    return i + 1 < n ? 2 : 1;
}

/* Words of train_args[i] that belong together: a --set and its value are
 * one unit, so a value that happens to read "--resume" stays a value. */
static int unit_words(char **args, int n, int i)
{
    if (!strcmp(args[i], "--set") && i + 1 < n) return 2;
    int r = resume_words(args, n, i);
    return r ? r : 1;
}

static int has_resume(const struct dt_launch_opts *o)
{
    for (int i = 0; i < o->n_train_args; i += unit_words(o->train_args, o->n_train_args, i))
        if (resume_words(o->train_args, o->n_train_args, i)) return 1;
    return 0;
}

static dt_status push_train_args(struct argvec *a, const struct dt_launch_opts *o, int attempt)
{
    dt_status st = DT_OK;
    char **args = o->train_args;
    int n = o->n_train_args, given = has_resume(o);
    for (int i = 0; i < n;) {
        int w = unit_words(args, n, i);
        int drop = attempt > 0 && resume_words(args, n, i);
        for (int k = 0; k < w && !drop; k++)
            DT_CHECK(av_push(a, args[i + k]));
        i += w;
    }
    if (attempt > 0 || !given) {
        DT_CHECK(av_push(a, "--resume"));
        DT_CHECK(av_push(a, "auto"));
    }
out:
    return st;
}

static dt_status push_launcher(struct argvec *a, const struct dt_launch_opts *o, int as_root)
{
    dt_status st = DT_OK;
    char np[16];
    snprintf(np, sizeof np, "%d", o->nprocs);
    if (o->launcher == DT_LAUNCHER_MPIRUN) {
        DT_CHECK(av_push(a, "mpirun"));
        if (as_root) DT_CHECK(av_push(a, "--allow-run-as-root"));
        for (int i = 0; i < o->n_launcher_args; i++)
            DT_CHECK(av_push(a, o->launcher_args[i]));
        DT_CHECK(av_push(a, "-np"));
        DT_CHECK(av_push(a, np));
    } else if (o->launcher == DT_LAUNCHER_SRUN) {
        DT_CHECK(av_push(a, "srun"));
        DT_CHECK(av_push(a, "--mpi=pmix"));
        DT_CHECK(av_push(a, "-n"));
        DT_CHECK(av_push(a, np));
        for (int i = 0; i < o->n_launcher_args; i++)
            DT_CHECK(av_push(a, o->launcher_args[i]));
    }
out:
    return st;
}

dt_status dt_launch_argv(const struct dt_launch_opts *o, int attempt, int as_root, char ***out)
{
    dt_status st;
    struct argvec a = {NULL, 0, o->n_launcher_args + o->n_train_args + 8};
    *out = NULL;
    DT_CHECK(dt_calloc((size_t)a.cap, sizeof *a.v, "the launch command line", (void **)&a.v));
    DT_CHECK(push_launcher(&a, o, as_root));
    DT_CHECK(av_push(&a, o->exec));
    DT_CHECK(push_train_args(&a, o, attempt));
    *out = a.v;
out:
    if (st != DT_OK) dt_launch_argv_free(a.v);
    return st;
}

void dt_launch_argv_free(char **argv)
{
    for (int i = 0; argv && argv[i]; i++)
        free(argv[i]);
    free(argv);
}

/* ---- showing a command line ------------------------------------------ */

struct qbuf {
    char *p;
    size_t len, pos;
};

static void put(struct qbuf *b, const char *s)
{
    while (*s && b->pos + 1 < b->len)
        b->p[b->pos++] = *s++;
    b->p[b->pos] = '\0';
}

static int plain_byte(unsigned char c)
{
    return isalnum(c) || (c != '\0' && strchr("@%+=:,./_-", c) != NULL);
}

static int control_byte(unsigned char c)
{
    return c < 0x20 || c == 0x7f;
}

/* $'...' form, for words with control characters (a newline would split
 * the log line). */
static void put_ansi_c(struct qbuf *b, const char *w)
{
    put(b, "$'");
    for (const unsigned char *c = (const unsigned char *)w; *c; c++) {
        char one[8];
        if (*c == '\n')
            snprintf(one, sizeof one, "\\n");
        else if (*c == '\t')
            snprintf(one, sizeof one, "\\t");
        else if (*c == '\\' || *c == '\'')
            snprintf(one, sizeof one, "\\%c", *c);
        else if (control_byte(*c))
            snprintf(one, sizeof one, "\\x%02x", *c);
        else
            snprintf(one, sizeof one, "%c", *c);
        put(b, one);
    }
    put(b, "'");
}

static void put_word(struct qbuf *b, const char *w)
{
    int plain = w[0] != '\0', ctrl = 0;
    for (const unsigned char *c = (const unsigned char *)w; *c; c++) {
        plain &= plain_byte(*c);
        ctrl |= control_byte(*c);
    }
    if (plain) {
        put(b, w);
    } else if (ctrl) {
        put_ansi_c(b, w);
    } else {
        put(b, "'");
        for (const char *c = w; *c; c++) {
            char one[2] = {*c, '\0'};
            put(b, *c == '\'' ? "'\\''" : one);
        }
        put(b, "'");
    }
}

void dt_launch_quote_argv(char *const *argv, char *buf, size_t len)
{
    struct qbuf b = {buf, len, 0};
    if (len == 0) return;
    buf[0] = '\0';
    for (int i = 0; argv[i]; i++) {
        if (i) put(&b, " ");
        put_word(&b, argv[i]);
    }
    if (b.pos + 1 >= len && len > 4) memcpy(buf + len - 4, "...", 4);
}

/* ---- how an attempt ended -------------------------------------------- */

double dt_launch_backoff(const struct dt_launch_opts *o, int restart)
{
    double d = o->backoff_s;
    for (int i = 1; i < restart && d < o->max_backoff_s; i++)
        d *= 2;
    return d < o->max_backoff_s ? d : o->max_backoff_s;
}

/* "1", "0.5", "0.125": seconds without trailing zeros. */
static void fmt_seconds(double s, char *buf, size_t len)
{
    snprintf(buf, len, "%.3f", s);
    char *end = buf + strlen(buf) - 1;
    while (end > buf && *end == '0')
        *end-- = '\0';
    if (*end == '.') *end = '\0';
}

static const char *exit_meaning(int code)
{
    switch (code) {
    case 0:
        return "done";
    case 64:
        return "usage or job error";
    case 65:
        return "bad data";
    case 66:
        return "missing input";
    case 70:
        return "internal error";
    case 74:
        return "I/O error";
    case EXIT_TEMPFAIL:
        return "stopped, restartable";
    }
    return "failed";
}

/* The exit code the supervisor ends with for a child status. */
static int end_code(int ws)
{
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* "exit 75 (stopped, restartable)", "signal 9 (Killed)", and for mpirun's
 * way of reporting a rank killed by a signal, "exit 137 (a process ended by
 * signal 9, Killed)". */
static void describe_end(int ws, char *buf, size_t len)
{
    if (!WIFEXITED(ws)) {
        snprintf(buf, len, "signal %d (%s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
        return;
    }
    int c = WEXITSTATUS(ws);
    if (c > 128 && c < 128 + NSIG)
        snprintf(buf, len, "exit %d (a process ended by signal %d, %s)", c, c - 128,
                 strsignal(c - 128));
    else
        snprintf(buf, len, "exit %d (%s)", c, exit_meaning(c));
}

static int is_final_failure(int ws)
{
    int c = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    return c == 64 || c == 65 || c == 66;
}

/* ---- signals and output ---------------------------------------------- */

static dt_status signals_begin(struct sup *s)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&s->set);
    for (int i = 0; i < N_FORWARDED; i++)
        sigaddset(&s->set, forwarded_sigs[i]);
    sigaddset(&s->set, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &s->set, &s->old_mask) != 0)
        return dt_set_error(DT_ERR_INTERNAL, "launch: cannot block signals: %s", strerror(errno));
    s->child_mask = s->old_mask;
    for (int i = 0; i < N_FORWARDED; i++)
        sigdelset(&s->child_mask, forwarded_sigs[i]);
    sigdelset(&s->child_mask, SIGCHLD);
    /* Default actions, not an inherited SIG_IGN (a script's `cmd &`
     * ignores SIGINT), so that blocked signals stay pending for us. */
    for (int i = 0; i < N_FORWARDED; i++)
        sigaction(forwarded_sigs[i], &dfl, &s->old_act[i]);
    sigaction(SIGCHLD, &dfl, &s->old_act[N_FORWARDED]);
    return DT_OK;
}

/* Drops what is still pending (a signal after the last child ended has
 * nothing left to stop) and gives the caller its signal state back. */
static void signals_end(struct sup *s)
{
    struct timespec zero = {0, 0};
    while (sigtimedwait(&s->set, NULL, &zero) > 0)
        ;
    for (int i = 0; i < N_FORWARDED; i++)
        sigaction(forwarded_sigs[i], &s->old_act[i], NULL);
    sigaction(SIGCHLD, &s->old_act[N_FORWARDED], NULL);
    sigprocmask(SIG_SETMASK, &s->old_mask, NULL);
}

static void output_begin(struct sup *s)
{
    fflush(stdout);
    s->child_out = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    if (s->child_out >= 0 && dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        close(s->child_out);
        s->child_out = -1;
    }
}

static void output_end(struct sup *s)
{
    fflush(stdout);
    if (s->child_out >= 0) {
        dup2(s->child_out, STDOUT_FILENO);
        close(s->child_out);
    }
}

/* ---- one attempt ------------------------------------------------------ */

/* In the child, between fork and exec: only async-signal-safe calls. */
static void child_exec(const struct sup *s, char **argv, int errfd)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    setpgid(0, 0);
    for (int i = 0; i < N_FORWARDED; i++)
        sigaction(forwarded_sigs[i], &dfl, NULL);
    sigprocmask(SIG_SETMASK, &s->child_mask, NULL);
    int fd = open("/dev/null", O_RDONLY);
    if (fd > STDIN_FILENO) {
        dup2(fd, STDIN_FILENO);
        close(fd);
    }
    if (s->child_out >= 0) dup2(s->child_out, STDOUT_FILENO);
    execvp(argv[0], argv);
    int err = errno;
    ssize_t w = write(errfd, &err, sizeof err);
    (void)w;
    _exit(127);
}

static dt_status exec_failed(const struct sup *s, const char *prog, int err)
{
    if (s->o->launcher == DT_LAUNCHER_NONE)
        return dt_set_error(DT_ERR_NOT_FOUND, "launch: cannot run '%s': %s", prog, strerror(err));
    return dt_set_error(DT_ERR_NOT_FOUND,
                        "launch: cannot start the launcher '%s': %s (is it installed and on PATH? "
                        "--launcher picks mpirun, srun or none)",
                        prog, strerror(err));
}

/* Forks and execs argv; returns once the exec has succeeded or failed. */
static dt_status spawn(const struct sup *s, char **argv, pid_t *out)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0)
        return dt_set_error(DT_ERR_INTERNAL, "launch: cannot create a pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        close(pfd[0]);
        close(pfd[1]);
        return dt_set_error(DT_ERR_NOMEM, "launch: cannot fork: %s", strerror(err));
    }
    if (pid == 0) child_exec(s, argv, pfd[1]);
    close(pfd[1]);
    setpgid(pid, pid); /* also done in the child; whichever runs first wins */
    int err = 0;
    ssize_t r;
    do
        r = read(pfd[0], &err, sizeof err);
    while (r < 0 && errno == EINTR);
    close(pfd[0]);
    if (r == (ssize_t)sizeof err) {
        waitpid(pid, NULL, 0);
        return exec_failed(s, argv[0], err);
    }
    *out = pid;
    return DT_OK;
}

/* The signal the child's process group gets for the nth (0 = first)
 * signal the supervisor received. Through a launcher the first one goes on
 * as SIGUSR1: mpirun ends the job on SIGTERM or SIGINT (each rank gets
 * SIGTERM and, a second later, SIGKILL: no time to checkpoint) and srun
 * only prints task states on a single SIGINT, but both pass SIGUSR1 to
 * every rank untouched, and dtrain takes SIGUSR1 as it takes SIGTERM:
 * checkpoint at the next step boundary, exit 75. A later signal goes on as
 * received, so a second SIGINT or SIGTERM stops the job at once. */
static int signal_for_child(const struct sup *s, int sig, int nth)
{
    return s->o->launcher != DT_LAUNCHER_NONE && nth == 0 ? SIGUSR1 : sig;
}

static void forward(const struct sup *s, pid_t pid, int sig, int nth, int attempt)
{
    int to = signal_for_child(s, sig, nth);
    if (to != sig)
        DT_LOG_WARN(LOG_SUBSYS,
                    "launch: got %s: passing it to attempt %d as %s (process group %ld; "
                    "%s hands it to every rank, which checkpoints and stops)",
                    sig_name(sig), attempt + 1, sig_name(to), (long)pid,
                    dt_launcher_name(s->o->launcher));
    else
        DT_LOG_WARN(LOG_SUBSYS, "launch: got %s%s: forwarding it to attempt %d (process group %ld)",
                    sig_name(sig), nth ? " again" : "", attempt + 1, (long)pid);
    kill(-pid, to);
}

/* Waits for the child, forwarding TERM/INT/USR1 to its process group;
 * *forwarded is the last signal received and forwarded (0: none). */
static dt_status wait_child(const struct sup *s, pid_t pid, int attempt, int *ws, int *forwarded)
{
    for (int nth = 0;;) {
        int sig = sigwaitinfo(&s->set, NULL);
        if (sig < 0) continue; /* EINTR: a stopped-and-continued supervisor */
        if (sig != SIGCHLD) {
            forward(s, pid, sig, nth++, attempt);
            *forwarded = sig;
            continue;
        }
        siginfo_t ci;
        memset(&ci, 0, sizeof ci);
        if (waitid(P_PID, (id_t)pid, &ci, WEXITED | WNOHANG | WNOWAIT) != 0)
            return dt_set_error(DT_ERR_INTERNAL, "launch: lost track of attempt %d (pid %ld): %s",
                                attempt + 1, (long)pid, strerror(errno));
        if (ci.si_pid != pid) continue; /* a stop, or a stale SIGCHLD */
        kill(-pid, SIGKILL);            /* leftovers of this attempt, see the top */
        while (waitpid(pid, ws, 0) < 0 && errno == EINTR)
            ;
        return DT_OK;
    }
}

/* Sleeps `delay` seconds unless TERM, INT or USR1 arrives first; returns
 * that signal, or 0 when the time is up. With 0 it only takes what is
 * already pending. */
static int backoff_wait(const struct sup *s, double delay)
{
    double end = dt_now() + delay;
    for (;;) {
        double left = end - dt_now();
        if (left < 0) left = 0;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        int sig = sigtimedwait(&s->set, NULL, &ts);
        if (sig == SIGCHLD || (sig < 0 && errno == EINTR))
            continue; /* a stale SIGCHLD of a finished attempt */
        return sig > 0 ? sig : 0;
    }
}

static dt_status run_attempt(const struct sup *s, int attempt, int *ws, int *forwarded)
{
    char **argv = NULL;
    char line[CMDLINE_MAX];
    pid_t pid = 0;
    dt_status st;
    DT_CHECK(dt_launch_argv(s->o, attempt, s->as_root, &argv));
    dt_launch_quote_argv(argv, line, sizeof line);
    DT_LOG_INFO(LOG_SUBSYS, "launch: attempt %d/%d: %s", attempt + 1, s->o->max_restarts + 1, line);
    char num[16];
    snprintf(num, sizeof num, "%d", attempt + 1);
    setenv("DTRAIN_LAUNCH_ATTEMPT", num, 1); /* inherited by the attempt (see DTRAIN_FAULT) */
    DT_CHECK(spawn(s, argv, &pid));
    DT_CHECK(wait_child(s, pid, attempt, ws, forwarded));
out:
    dt_launch_argv_free(argv);
    return st;
}

/* ---- the loop --------------------------------------------------------- */

/* Logs how an attempt ended and says whether to restart. */
static int report_end(const struct sup *s, int attempt, int ws, int forwarded, double secs)
{
    char how[128], took[32], delay[32];
    describe_end(ws, how, sizeof how);
    dt_format_duration(secs, took, sizeof took);
    int n = attempt + 1;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) {
        DT_LOG_INFO(LOG_SUBSYS, "launch: done after %d attempt%s (last one took %s)", n,
                    n == 1 ? "" : "s", took);
        return 0;
    }
    if (forwarded) {
        DT_LOG_WARN(LOG_SUBSYS,
                    "launch: attempt %d ended with %s after %s: not restarting after %s", n, how,
                    took, sig_name(forwarded));
        return 0;
    }
    if (s->o->slurm_job && WIFEXITED(ws) && WEXITSTATUS(ws) == EXIT_TEMPFAIL) {
        DT_LOG_WARN(LOG_SUBSYS,
                    "launch: attempt %d ended with %s after %s: not restarting inside Slurm job "
                    "%s (a time limit, preemption or requeue stops the ranks directly): exiting "
                    "75 so that the batch script requeues the job, which resumes from the "
                    "checkpoint",
                    n, how, took, s->o->slurm_job);
        return 0;
    }
    if (is_final_failure(ws)) {
        DT_LOG_WARN(LOG_SUBSYS,
                    "launch: attempt %d ended with %s after %s: not restarting "
                    "(a restart cannot fix the job or its data)",
                    n, how, took);
        return 0;
    }
    if (attempt >= s->o->max_restarts) {
        DT_LOG_WARN(LOG_SUBSYS,
                    "launch: attempt %d ended with %s after %s: no restarts left "
                    "(%d used, see --max-restarts)",
                    n, how, took, s->o->max_restarts);
        return 0;
    }
    fmt_seconds(dt_launch_backoff(s->o, attempt + 1), delay, sizeof delay);
    DT_LOG_WARN(LOG_SUBSYS, "launch: attempt %d ended with %s after %s; restarting in %ss", n, how,
                took, delay);
    return 1;
}

/* Exit code when a signal stops the supervisor between attempts. */
static int stopped_between(int sig)
{
    /* SIGUSR1 asks for "checkpoint and stop, resumable": with no attempt
     * running, the last checkpoint already stands. */
    int code = sig == SIGUSR1 ? EXIT_TEMPFAIL : 128 + sig;
    DT_LOG_WARN(LOG_SUBSYS, "launch: got %s while waiting to restart: stopping (exit %d)",
                sig_name(sig), code);
    return code;
}

static dt_status supervise(const struct sup *s, int *exit_code)
{
    dt_status st = DT_OK;
    for (int attempt = 0;; attempt++) {
        int sig = backoff_wait(s, attempt ? dt_launch_backoff(s->o, attempt) : 0);
        if (sig) {
            *exit_code = stopped_between(sig);
            return DT_OK;
        }
        int ws = 0, forwarded = 0;
        double t0 = dt_now();
        if ((st = run_attempt(s, attempt, &ws, &forwarded)) != DT_OK) return st;
        *exit_code = end_code(ws);
        if (!report_end(s, attempt, ws, forwarded, dt_now() - t0)) return DT_OK;
    }
}

dt_status dt_launch_run(const struct dt_launch_opts *o, int *exit_code)
{
    struct sup s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.as_root = geteuid() == 0;
    *exit_code = 70;
    if (o->launcher == DT_LAUNCHER_NONE && o->nprocs != 1)
        return dt_set_error(DT_ERR_USAGE, "launch: --launcher none runs one process; -n must be 1");
    dt_status st = signals_begin(&s);
    if (st != DT_OK) return st;
    output_begin(&s);
    st = supervise(&s, exit_code);
    output_end(&s);
    signals_end(&s);
    return st;
}
