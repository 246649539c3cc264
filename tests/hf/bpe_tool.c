/*
 * bpe_tool.c - test and benchmark driver for io/bpe.h: encodes a file with
 * the tokenizer of DIR (vocab.json, merges.txt), decodes the tokens and
 * checks that the bytes come back; prints the token count and the best
 * encoding time of ROUNDS rounds, each with a freshly loaded tokenizer
 * (so its word cache starts empty).
 *
 *   bpe_tool DIR FILE [ROUNDS] [IDS.bin]
 *
 * Prints "tokens N seconds S tokens_per_s R"; IDS.bin gets the ids as
 * int32. Exit 0, 1 when the decoded bytes differ from the file's, 2 for
 * other failures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/bpe.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: bpe_tool DIR FILE [ROUNDS] [IDS.bin]\n");
        return 2;
    }
    int rounds = argc > 3 ? atoi(argv[3]) : 1;
    FILE *fp = fopen(argv[2], "rb");
    if (!fp || fseek(fp, 0, SEEK_END) != 0)
        return fprintf(stderr, "bpe_tool: cannot read %s\n", argv[2]), 2;
    long len = ftell(fp);
    char *text = malloc((size_t)len + 1);
    rewind(fp);
    if (!text || fread(text, 1, (size_t)len, fp) != (size_t)len)
        return fprintf(stderr, "bpe_tool: cannot read %s\n", argv[2]), 2;
    fclose(fp);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    double best = 1e30;
    for (int r = 0; r < (rounds > 0 ? rounds : 1); r++) {
        dt_bpe_t *b;
        if (dt_bpe_load_dir(argv[1], &b) != DT_OK)
            return fprintf(stderr, "bpe_tool: %s\n", dt_last_error()), 2;
        n = 0;
        double t0 = now();
        if (dt_bpe_encode(b, text, (size_t)len, &ids, &n, &cap) != DT_OK)
            return fprintf(stderr, "bpe_tool: %s\n", dt_last_error()), 2;
        double s = now() - t0;
        best = s < best ? s : best;
        if (r == 0) { /* decode and compare */
            size_t at = 0;
            int same = 1;
            for (size_t i = 0; i < n && same; i++) {
                const char *bytes;
                size_t k = dt_bpe_token_bytes(b, ids[i], &bytes);
                same = at + k <= (size_t)len && !memcmp(text + at, bytes, k);
                at += k;
            }
            if (!same || at != (size_t)len) {
                fprintf(stderr, "bpe_tool: decoding does not give the text back\n");
                return 1;
            }
        }
        dt_bpe_free(b);
    }
    if (argc > 4) {
        FILE *fo = fopen(argv[4], "wb");
        if (!fo || fwrite(ids, sizeof *ids, n, fo) != n || fclose(fo) != 0)
            return fprintf(stderr, "bpe_tool: cannot write %s\n", argv[4]), 2;
    }
    printf("tokens %zu seconds %.6f tokens_per_s %.0f\n", n, best, (double)n / best);
    free(ids);
    free(text);
    return 0;
}
