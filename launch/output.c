/*
 * output.c - standard output, checked the same way for every command.
 *
 * main() calls dt_cli_output_begin() before anything else and leaves
 * through dt_cli_output_end(), so no command can forget to check what it
 * printed: a write to standard output that failed or was cut short (a
 * full disk, a file-size limit, a closed descriptor) makes the command
 * exit 74 with one message naming the cause, even when the failure came
 * in a buffer flushed long before the end. For that stdout becomes a
 * stream whose writes go to descriptor 1 and keep the first failure's
 * errno: glibc drops a buffer it could not write and keeps only an error
 * flag, so the cause would be lost by the time the command ends.
 *
 * A standard descriptor that is closed when dtrain starts (`>&-`) is
 * taken by /dev/null opened for the other direction: the next file dtrain
 * or a library opens cannot become descriptor 1 and receive the output,
 * and a write to it still fails with EBADF as on the closed descriptor.
 * So a closed standard output is a write error (74) for a command that
 * prints to it, and nothing for one that does not.
 *
 * The check runs after MPI_Finalize, once the command is done on every
 * rank: a rank whose output failed changes only its own exit code, and no
 * rank waits for it. (Under mpirun or srun a rank's output goes to the
 * launcher, which writes it on; a failure there is the launcher's.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define EXIT_IOERR 74 /* EX_IOERR */

/* The first failed write's errno; 0 while every write succeeded. Writes
 * come through the stream, which holds its lock around them. */
static int out_errno;
static size_t out_bytes;

static ssize_t out_write(void *cookie, const char *buf, size_t n)
{
    size_t done = 0;
    (void)cookie;
    while (done < n) {
        ssize_t w = write(STDOUT_FILENO, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (!out_errno) out_errno = w < 0 ? errno : EIO;
            break;
        }
        done += (size_t)w;
    }
    out_bytes += done;
    return done ? (ssize_t)done : -1;
}

/* Descriptor fd, closed, is given /dev/null opened the other way. */
static void hold_closed(int fd)
{
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) return;
    int got = open("/dev/null", fd == STDIN_FILENO ? O_WRONLY : O_RDONLY);
    if (got > fd) { /* the lower ones are held already, so this is rare */
        dup2(got, fd);
        close(got);
    }
}

void dt_cli_output_begin(void)
{
    for (int fd = STDIN_FILENO; fd <= STDERR_FILENO; fd++)
        hold_closed(fd);
    cookie_io_functions_t io = {.write = out_write};
    FILE *f = fopencookie(NULL, "w", io);
    if (!f) return; /* glibc's stdout stays: failures still give 74, without their cause */
    setvbuf(f, NULL, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
    stdout = f;
}

int dt_cli_output_failed(void)
{
    return out_errno != 0 || ferror(stdout);
}

int dt_cli_output_end(int rc)
{
    if (fflush(stdout) != 0 && !out_errno) out_errno = errno ? errno : EIO;
    if (ferror(stdout) && !out_errno) out_errno = EIO;
    /* a file system that reports a failed write only at close (NFS) */
    if (close(STDOUT_FILENO) != 0 && errno != EINTR && errno != EBADF && out_bytes && !out_errno)
        out_errno = errno;
    if (!out_errno) return rc;
    fprintf(stderr, "dtrain: cannot write to standard output: %s\n", strerror(out_errno));
    return rc ? rc : EXIT_IOERR;
}
