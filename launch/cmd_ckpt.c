/*
 * cmd_ckpt.c - `dtrain ckpt list DIR`, `dtrain ckpt info PATH` and
 * `dtrain ckpt verify PATH|DIR`: a run's checkpoints, looked at from any
 * shell.
 *
 * Every read is serial HDF5 through io/checkpoint.h, so none of these
 * starts MPI. A DIR may be a run directory or its checkpoints/
 * subdirectory. Every listed checkpoint is verified in full (each tensor
 * against its checksum), because a checkpoint is only as good as its last
 * verification. Results go to stdout, errors to stderr; verify exits 0
 * only when everything it looked at is good, 65 when anything is bad.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "io/checkpoint.h"
#include "core/files.h"
#include "core/text.h"
#include "cli.h"

#define DIR_BYTES 4096
#define PATH_BYTES (DIR_BYTES + 272) /* a directory and a name */
#define EXIT_BAD 65                  /* EX_DATAERR */

static const char usage_line[] = "ckpt: expected 'list DIR', 'info PATH' or 'verify PATH|DIR'";

/* ---- helpers ---------------------------------------------------------------- */

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The checkpoint directory a user means: DIR/checkpoints when it exists. */
static void resolve_dir(const char *arg, char *dir, size_t len)
{
    char sub[DIR_BYTES];
    snprintf(sub, sizeof sub, "%s/checkpoints", arg);
    snprintf(dir, len, "%s", is_dir(sub) ? sub : arg);
}

static void format_time(double t, char *buf, size_t len)
{
    time_t s = (time_t)t;
    struct tm tm;
    if (t <= 0 || !localtime_r(&s, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm))
        snprintf(buf, len, "-");
}

/* The last error without its leading "checkpoint <path>: " or
 * "checkpoint <path> is ", which the listing already shows. */
static const char *reason(const char *path)
{
    const char *msg = dt_last_error();
    size_t pl = strlen(path);
    if (strncmp(msg, "checkpoint ", 11) != 0 || strncmp(msg + 11, path, pl) != 0)
        return msg;
    const char *rest = msg + 11 + pl;
    if (!strncmp(rest, ": ", 2))
        return rest + 2; /* "checkpoint X: why" -> "why" */
    if (!strncmp(rest, " is ", 4))
        return rest + 4; /* "checkpoint X is damaged: why" -> "damaged: why" */
    return msg;
}

static int64_t size_of(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
}

/* Every committed checkpoint of dir, newest first, in *names (malloc'd). */
static dt_status list_names(const char *dir, char (**names)[256], int *n)
{
    *names = NULL;
    *n = 0;
    if (!is_dir(dir)) return dt_set_error(DT_ERR_NOT_FOUND, "ckpt: %s is not a directory", dir);
    int count = dt_ckpt_list(dir, NULL, NULL, 0);
    *names = calloc((size_t)count + 1, sizeof **names);
    if (!*names) return dt_set_error(DT_ERR_NOMEM, "ckpt: out of memory listing %s", dir);
    int again = dt_ckpt_list(dir, *names, NULL, count); /* a file may go meanwhile */
    *n = again < count ? again : count;
    return DT_OK;
}

/* ---- list --------------------------------------------------------------------- */

static void list_row(const char *dir, const char *name, const char *latest,
                     struct dt_ckpt_info *info)
{
    char path[PATH_BYTES], when[32], size[32];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    dt_status st = dt_ckpt_verify(path, info);
    int64_t bytes = size_of(path);
    if (bytes < 0)
        snprintf(size, sizeof size, "-");
    else
        dt_format_bytes((uint64_t)bytes, size, sizeof size);
    const char *mark = strcmp(name, latest) ? "" : ", latest";
    if (st != DT_OK) {
        printf("%-20s %10s %6s %12s %5s %-19s %10s  BAD%s: %s\n", name, "-", "-", "-", "-", "-",
               size, mark, reason(path));
        return;
    }
    format_time(info->meta.created, when, sizeof when);
    printf("%-20s %10lld %6lld %12lld %5d %-19s %10s  ok%s\n", name, (long long)info->meta.step,
           (long long)info->meta.epoch, (long long)info->meta.samples, info->meta.world, when, size,
           mark);
    dt_ckpt_info_free(info);
}

static int cmd_list(const char *arg)
{
    char dir[DIR_BYTES], latest[256] = "", (*names)[256];
    int n;
    resolve_dir(arg, dir, sizeof dir);
    dt_status st = list_names(dir, &names, &n);
    struct dt_ckpt_info *info = st == DT_OK ? malloc(sizeof *info) : NULL;
    if (st == DT_OK && !info) st = dt_set_error(DT_ERR_NOMEM, "ckpt: out of memory");
    if (st != DT_OK) {
        free(names);
        return dt_cli_fail(st);
    }
    dt_ckpt_latest(dir, latest, sizeof latest);
    printf("checkpoints in %s: %d\n", dir, n);
    if (n > 0)
        printf("%-20s %10s %6s %12s %5s %-19s %10s  %s\n", "NAME", "STEP", "EPOCH", "SAMPLES",
               "WORLD", "CREATED", "SIZE", "STATUS");
    for (int i = 0; i < n; i++)
        list_row(dir, names[i], latest, info);
    if (latest[0]) {
        char p[PATH_BYTES];
        snprintf(p, sizeof p, "%s/%s", dir, latest);
        if (size_of(p) < 0) printf("note: latest names %s, which does not exist\n", latest);
    }
    free(info);
    free(names);
    return 0;
}

/* ---- info ---------------------------------------------------------------------- */

/* PATH itself, or for a directory the checkpoint latest names (else the
 * newest). */
static dt_status resolve_file(const char *arg, char *path, size_t len)
{
    char dir[DIR_BYTES], name[1][256] = {""};
    if (!is_dir(arg)) {
        snprintf(path, len, "%s", arg);
        return DT_OK;
    }
    resolve_dir(arg, dir, sizeof dir);
    if (dt_ckpt_latest(dir, name[0], sizeof name[0]) != DT_OK &&
        dt_ckpt_list(dir, name, NULL, 1) < 1)
        return dt_set_error(DT_ERR_NOT_FOUND, "ckpt: no checkpoints in %s", dir);
    snprintf(path, len, "%s/%s", dir, name[0]);
    return DT_OK;
}

static void print_meta(const char *path, const struct dt_ckpt_info *info)
{
    const struct dt_ckpt_meta *m = &info->meta;
    char when[32], size[32];
    format_time(m->created, when, sizeof when);
    dt_format_bytes((uint64_t)info->file_bytes, size, sizeof size);
    printf("checkpoint  %s\n", path);
    printf("  status      verified ok (%s)\n", size);
    printf("  step        %lld\n  epoch       %lld\n  batch       %lld\n", (long long)m->step,
           (long long)m->epoch, (long long)m->batch);
    printf("  samples     %lld\n  seed        %llu\n  world       %d\n", (long long)m->samples,
           (unsigned long long)m->seed, m->world);
    printf("  loss_scale  %g\n  optim_t     %lld\n  optimizer   %s\n", m->loss_scale,
           (long long)m->optim_t, m->optimizer);
    printf("  bad_steps   %lld\n  rollbacks   %lld\n", (long long)m->bad_steps,
           (long long)m->rollbacks);
    printf("  created     %s\n  version     %s\n", when, m->version);
    printf("  format      %d\n", info->format_version);
}

static void print_tensors(const struct dt_ckpt_info *info)
{
    int64_t total = 0;
    for (int i = 0; i < info->ntensors; i++)
        total += info->numel[i];
    printf("tensors (%d, %lld values):\n", info->ntensors, (long long)total);
    for (int i = 0; i < info->ntensors; i++) {
        char shape[DT_MAX_DIMS * 21 + 8];
        printf("  %-40s %s\n", info->names[i],
               dt_shape_format(&info->shape[i], shape, sizeof shape));
    }
}

static void print_job(const char *yaml)
{
    printf("job:\n");
    for (const char *line = yaml; line && *line;) {
        size_t n = strcspn(line, "\n");
        printf("  %.*s\n", (int)n, line);
        line += n + (line[n] == '\n');
    }
}

static int cmd_info(const char *arg)
{
    char path[PATH_BYTES];
    dt_status st = resolve_file(arg, path, sizeof path);
    struct dt_ckpt_info *info = st == DT_OK ? malloc(sizeof *info) : NULL;
    if (st == DT_OK && !info) st = dt_set_error(DT_ERR_NOMEM, "ckpt: out of memory");
    if (st == DT_OK) st = dt_ckpt_verify(path, info);
    if (st == DT_OK) {
        print_meta(path, info);
        print_tensors(info);
        print_job(info->job_yaml);
        dt_ckpt_info_free(info);
    }
    free(info);
    return st == DT_OK ? 0 : dt_cli_fail(st);
}

/* ---- verify -------------------------------------------------------------------- */

/* One line per file; returns 1 when it is good. */
static int verify_one(const char *path, const char *label)
{
    struct dt_ckpt_info *info = malloc(sizeof *info);
    dt_status st =
        info ? dt_ckpt_verify(path, info) : dt_set_error(DT_ERR_NOMEM, "ckpt: out of memory");
    if (st == DT_OK)
        printf("%-20s ok (step %lld, %d tensors)\n", label, (long long)info->meta.step,
               info->ntensors);
    else
        printf("%-20s BAD: %s\n", label, reason(path));
    if (info) dt_ckpt_info_free(info);
    free(info);
    return st == DT_OK;
}

/* latest must name a checkpoint that exists; returns 1 when it does (or
 * when there is no latest). */
static int verify_latest(const char *dir)
{
    char latest[256] = "", path[PATH_BYTES];
    dt_status st = dt_ckpt_latest(dir, latest, sizeof latest);
    snprintf(path, sizeof path, "%s/%s", dir, latest);
    if (st == DT_ERR_NOT_FOUND || (st == DT_OK && size_of(path) >= 0)) return 1;
    printf("%-20s BAD: %s\n", "latest",
           st == DT_OK ? "names a checkpoint that does not exist" : dt_last_error());
    return 0;
}

static int verify_dir(const char *arg)
{
    char dir[DIR_BYTES], path[PATH_BYTES], (*names)[256];
    int n, good = 0;
    resolve_dir(arg, dir, sizeof dir);
    dt_status st = list_names(dir, &names, &n);
    if (st == DT_OK && n == 0)
        st = dt_set_error(DT_ERR_NOT_FOUND, "ckpt: no checkpoints in %s", dir);
    if (st != DT_OK) {
        free(names);
        return dt_cli_fail(st);
    }
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        good += verify_one(path, names[i]);
    }
    int latest_ok = verify_latest(dir);
    printf("%d of %d checkpoints in %s verified ok\n", good, n, dir);
    free(names);
    return good == n && latest_ok ? 0 : EXIT_BAD;
}

static int cmd_verify(const char *arg)
{
    if (is_dir(arg))
        return verify_dir(arg);
    dt_status st = dt_input_check(arg, "checkpoint", NULL);
    if (st != DT_OK)
        return dt_cli_fail(st);
    return verify_one(arg, arg) ? 0 : EXIT_BAD;
}

static const char ckpt_usage[] =
    "usage: dtrain ckpt list DIR | info PATH | verify PATH|DIR\n"
    "  DIR is a run directory or its checkpoints/ subdirectory; 'dtrain ckpt list --help'\n"
    "  and so on say more\n";

static const struct {
    const char *name;
    int (*run)(const char *arg);
    const char *usage;
} subcommands[] = {
    {"list", cmd_list,
     "usage: dtrain ckpt list DIR\n"
     "Lists the checkpoints of a run (DIR: the run directory or its checkpoints/\n"
     "subdirectory), newest first, each verified in full (every tensor against its\n"
     "checksum): name, step, epoch, samples, world size, time written, size and status\n"
     "(ok, or BAD with the reason); the one 'latest' names is marked.\n"},
    {"info", cmd_info,
     "usage: dtrain ckpt info PATH\n"
     "Verifies one checkpoint and prints its position (step, epoch, samples), seed, world\n"
     "size, loss scale, optimizer, version, tensors and the job that wrote it. PATH is a\n"
     "checkpoint file, or a run directory for the checkpoint 'latest' names (else the\n"
     "newest). Exit 65 when it is damaged.\n"},
    {"verify", cmd_verify,
     "usage: dtrain ckpt verify PATH|DIR\n"
     "Verifies a checkpoint file, or every checkpoint of a run directory and the 'latest'\n"
     "pointer, each tensor against its checksum; one line per file. Exit 0 when\n"
     "everything looked at is good, 65 when anything is bad.\n"},
};

int dt_cmd_ckpt(int argc, char **argv)
{
    if (argc == 2 && dt_cli_is_help(argv[1])) return fputs(ckpt_usage, stdout), 0;
    for (size_t i = 0; argc >= 2 && i < sizeof subcommands / sizeof subcommands[0]; i++) {
        if (strcmp(argv[1], subcommands[i].name) != 0) continue;
        for (int k = 2; k < argc; k++)
            if (dt_cli_is_help(argv[k])) return fputs(subcommands[i].usage, stdout), 0;
        if (argc != 3) return dt_cli_usage("%s", usage_line);
        return subcommands[i].run(argv[2]);
    }
    return dt_cli_usage("%s", usage_line);
}
