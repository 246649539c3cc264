/*
 * fuzz_config.c - fuzz target: the job-file parser and --set overrides
 * (runtime/config/config.h).
 *
 * The input is split at NUL bytes: the first part is a job file's text,
 * each later part (at most MAX_SETS) one `--set key=value` argument, in the
 * order `dtrain train` applies them. Besides "no crash, no leak", the
 * target checks what config.h promises:
 *   - a load or a --set that fails leaves the job as it was, and says why;
 *   - dt_job_validate either passes or says why;
 *   - the resolved job that dt_job_write_yaml prints (the run directory's
 *     config.yaml) loads back as a job file and prints the same again.
 * The runner caps the input length: libyaml's time grows steeply with
 * nesting depth, and a few kilobytes cover every construct.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fz_util.h"
#include "runtime/config/config.h"

#define MAX_SETS 8
#define JOB_NAME "fuzz.yaml"

/* The resolved job as dt_job_write_yaml prints it. malloc'd. */
static char *print_job(const struct dt_job *job, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    FZ_REQUIRE(f, "open_memstream");
    dt_job_write_yaml(job, f);
    FZ_REQUIRE(fclose(f) == 0, "writing the job to memory");
    return text;
}

/* The text after the first line (which names the job's source). */
static const char *body_of(const char *text)
{
    const char *nl = strchr(text, '\n');
    FZ_REQUIRE(nl, "dt_job_write_yaml printed no header line:\n%s", text);
    return nl + 1;
}

/* config.yaml of a run: printed, written, loaded as a job file, printed
 * again, the same. */
static void check_round_trip(const struct dt_job *job)
{
    char path[1024];
    size_t len = 0, len2 = 0;
    struct dt_job *back = calloc(1, sizeof *back);
    FZ_REQUIRE(back, "out of memory");
    char *text = print_job(job, &len);
    fz_scratch_path(path, sizeof path, "config.yaml");
    fz_write_file(path, text, len);

    dt_status st = dt_job_load(path, back);
    FZ_REQUIRE(st == DT_OK, "the resolved job does not load back: %s\n%s", dt_last_error(), text);
    char *again = print_job(back, &len2);
    FZ_REQUIRE(!strcmp(body_of(text), body_of(again)),
               "the resolved job changed on reloading:\n%s\n---\n%s", text, again);
    dt_status v1 = dt_job_validate(job), v2 = dt_job_validate(back);
    FZ_REQUIRE(v1 == v2, "validation differs after reloading: %s", dt_last_error());
    free(again);
    free(text);
    free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    struct dt_job *job = malloc(sizeof *job), *before = malloc(sizeof *before);
    FZ_REQUIRE(buf && job && before, "out of memory");
    fz_quiet();
    memcpy(buf, data, size);
    buf[size] = '\0';

    /* The parts: buf up to the first NUL, then one per NUL after it. */
    const char *parts[1 + MAX_SETS];
    int nparts = 0;
    for (size_t i = 0; i <= size && nparts < 1 + MAX_SETS;) {
        parts[nparts++] = buf + i;
        i += strlen(buf + i) + 1;
    }

    dt_job_defaults(job);
    memcpy(before, job, sizeof *job);
    dt_status st = dt_job_load_text(JOB_NAME, parts[0], job);
    fz_note("dt_job_load_text", st);
    if (st != DT_OK) {
        fz_check_error(st, "dt_job_load_text");
        FZ_REQUIRE(!memcmp(job, before, sizeof *job), "a failed load changed the job");
        goto out;
    }
    for (int i = 1; i < nparts; i++) {
        memcpy(before, job, sizeof *job);
        st = dt_job_set(job, parts[i]);
        if (st != DT_OK) {
            fz_check_error(st, "dt_job_set");
            FZ_REQUIRE(!memcmp(job, before, sizeof *job), "a failed --set '%s' changed the job",
                       parts[i]);
        }
    }
    st = dt_job_validate(job);
    if (st != DT_OK) fz_check_error(st, "dt_job_validate");
    check_round_trip(job);
out:
    fz_scratch_clear();
    free(before);
    free(job);
    free(buf);
    return 0;
}
