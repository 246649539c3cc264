/*
 * replay.c - a fuzz target without libFuzzer: runs its
 * LLVMFuzzerTestOneInput once on every file of the folders (or files) named
 * on the command line, so every build (gcc, the sanitizer build) replays the
 * seed corpus and every crash ever found.
 *
 *   fuzz_<target> [-k KNOWN_OPEN] PATH...
 *
 * KNOWN_OPEN lists inputs that still crash because the bug they found is
 * not fixed yet, one per line: a path relative to tests/fuzz, blanks, and
 * a one-line cause ('#' starts a comment). Those are skipped and named, so
 * switching one on again is deleting its line. A folder that does not
 * exist holds no inputs (git keeps no empty folders). A crash ends the
 * process with the sanitizer's report; the line before it names the input.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_KNOWN 256
#define LINE_MAX_LEN 1024

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct known {
    int n;
    char path[MAX_KNOWN][LINE_MAX_LEN];
    char cause[MAX_KNOWN][LINE_MAX_LEN];
};

static void load_known(const char *file, struct known *k)
{
    char line[LINE_MAX_LEN];
    FILE *f = fopen(file, "r");
    if (!f) {
        fprintf(stderr, "replay: cannot read %s: %s\n", file, strerror(errno));
        exit(2);
    }
    while (fgets(line, sizeof line, f) && k->n < MAX_KNOWN) {
        line[strcspn(line, "\r\n")] = '\0';
        char *p = line + strspn(line, " \t");
        if (!*p || *p == '#') continue;
        size_t plen = strcspn(p, " \t");
        char *cause = p + plen + strspn(p + plen, " \t");
        snprintf(k->path[k->n], LINE_MAX_LEN, "%.*s", (int)plen, p);
        snprintf(k->cause[k->n], LINE_MAX_LEN, "%s", cause);
        k->n++;
    }
    fclose(f);
}

/* The cause when path is listed (it ends with "/" + a listed path). */
static const char *known_cause(const struct known *k, const char *path)
{
    size_t len = strlen(path);
    for (int i = 0; i < k->n; i++) {
        size_t l = strlen(k->path[i]);
        if (len >= l && !strcmp(path + len - l, k->path[i]) &&
            (len == l || path[len - l - 1] == '/'))
            return k->cause[i];
    }
    return NULL;
}

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(errno));
        exit(2);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    printf("replay: %s (%zu bytes)\n", path, n);
    fflush(stdout);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
}

static int visible(const struct dirent *de)
{
    return de->d_name[0] != '.';
}

/* Runs every input under path; returns how many ran, adds skips to *skipped. */
static int run_path(const char *path, const struct known *k, int *skipped)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    if (!S_ISDIR(sb.st_mode)) {
        const char *cause = known_cause(k, path);
        if (cause) {
            printf("replay: %s skipped, known open: %s\n", path, cause);
            (*skipped)++;
            return 0;
        }
        run_file(path);
        return 1;
    }
    struct dirent **list;
    int n = scandir(path, &list, visible, alphasort), ran = 0;
    for (int i = 0; i < n; i++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, list[i]->d_name);
        ran += run_path(sub, k, skipped);
        free(list[i]);
    }
    free(list);
    return ran;
}

int main(int argc, char **argv)
{
    static struct known k;
    int first = 1, ran = 0, skipped = 0;
    if (argc > 2 && !strcmp(argv[1], "-k")) {
        load_known(argv[2], &k);
        first = 3;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: %s [-k KNOWN_OPEN] PATH...\n", argv[0]);
        return 2;
    }
    for (int i = first; i < argc; i++)
        ran += run_path(argv[i], &k, &skipped);
    printf("replay: %d inputs ran, %d skipped as known open\n", ran, skipped);
    if (!ran) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    return 0;
}
