/*
 * make_lm_h5.c - writes a small language-model dataset for the
 * command-line tests: the bytes of a text file as uint16 tokens, the
 * first 90% in split "train", the rest in "val", under the tokenizer and
 * vocabulary size given (a "gpt2" file of byte tokens is valid data that
 * dtrain trains on but cannot decode, which is what a test of the refusal
 * needs).
 *
 *   make_lm_h5 OUT.h5 TOKENIZER VOCAB_SIZE TEXT_FILE
 */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRAIN_SHARE 0.9

static int put_attr(hid_t f, const char *name, hid_t type, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
    int ok = a >= 0 && H5Awrite(a, type, v) >= 0;
    H5Aclose(a);
    H5Sclose(s);
    return ok;
}

static int put_str(hid_t f, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    int ok = put_attr(f, name, t, v);
    H5Tclose(t);
    return ok;
}

static int write_split(hid_t f, const char *name, const uint16_t *tok, hsize_t n)
{
    hid_t g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t s = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(g, "tokens", H5T_STD_U16LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int ok =
        g >= 0 && d >= 0 && H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, tok) >= 0;
    H5Dclose(d);
    H5Sclose(s);
    H5Gclose(g);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: make_lm_h5 OUT.h5 TOKENIZER VOCAB_SIZE TEXT_FILE\n");
        return 2;
    }
    FILE *in = fopen(argv[4], "rb");
    if (!in) {
        perror(argv[4]);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint16_t *tok = malloc(cap * sizeof *tok);
    int c;
    while (tok && (c = fgetc(in)) != EOF) {
        if (n == cap && !(tok = realloc(tok, (cap *= 2) * sizeof *tok)))
            break;
        tok[n++] = (uint16_t)c;
    }
    fclose(in);
    if (!tok || n < 64) {
        fprintf(stderr, "make_lm_h5: %s: too short or out of memory\n", argv[4]);
        return 1;
    }
    hsize_t ntrain = (hsize_t)((double)n * TRAIN_SHARE);
    int64_t version = 1, vocab = strtoll(argv[3], NULL, 10);
    hid_t f = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int ok = f >= 0 && put_str(f, "dtrain_format", "dataset") &&
             put_attr(f, "format_version", H5T_NATIVE_INT64, &version) &&
             put_str(f, "task", "language_model") && put_str(f, "tokenizer", argv[2]) &&
             put_attr(f, "vocab_size", H5T_NATIVE_INT64, &vocab) &&
             write_split(f, "train", tok, ntrain) &&
             write_split(f, "val", tok + ntrain, n - ntrain);
    if (f >= 0 && H5Fclose(f) < 0)
        ok = 0;
    free(tok);
    if (!ok)
        fprintf(stderr, "make_lm_h5: cannot write %s\n", argv[1]);
    return ok ? 0 : 1;
}
