/*
 * fuzz_bpe.c - fuzz target: GPT-2's byte-level BPE (io/bpe.h:
 * dt_bpe_load_mem, dt_bpe_encode, dt_bpe_token_bytes).
 *
 * With the input's first byte 0, a well-formed vocabulary (the 256 byte
 * symbols, <|endoftext|>, and merges whose pairs come from the input)
 * and merges.txt, either of which the input may then damage; otherwise
 * both files are the input's bytes. The rest of the input is the text.
 * Besides "no crash, no leak", the target checks what bpe.h promises: a
 * failure says why; a tokenizer that loads encodes any bytes, and the
 * tokens decode to exactly those bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fz_util.h"
#include "io/bpe.h"

#define MAX_MERGES 64

/* The UTF-8 of GPT-2's byte symbol for byte b. */
static int symbol(unsigned b, char *out)
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = b;
    if (!printable) {
        cp = 256;
        for (unsigned x = 0; x < b; x++)
            cp += !((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE);
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A JSON string of s[0..n) (escaping quotes and backslashes). */
static size_t json_str(char *out, const char *s, size_t n)
{
    size_t k = 0;
    out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\')
            out[k++] = '\\';
        out[k++] = s[i];
    }
    out[k++] = '"';
    return k;
}

static void make_files(struct fz_in *in, char *vocab, size_t *vlen, char *merges, size_t *mlen)
{
    char tok[MAX_MERGES + 256][16];
    int tlen[MAX_MERGES + 256];
    size_t v = 0, m = 0;
    vocab[v++] = '{';
    for (unsigned b = 0; b < 256; b++) {
        tlen[b] = symbol(b, tok[b]);
        v += (size_t)sprintf(vocab + v, "%s", b ? "," : "");
        v += json_str(vocab + v, tok[b], (size_t)tlen[b]);
        v += (size_t)sprintf(vocab + v, ":%u", b);
    }
    int ntok = 256;
    m += (size_t)sprintf(merges, "#version: 0.2\n");
    unsigned nm = fz_pick(in, MAX_MERGES);
    for (unsigned i = 0; i < nm; i++) {
        int a = (int)(fz_u16(in) % (unsigned)ntok), c = (int)(fz_u16(in) % (unsigned)ntok);
        if (tlen[a] + tlen[c] >= 16)
            continue;
        memcpy(tok[ntok], tok[a], (size_t)tlen[a]);
        memcpy(tok[ntok] + tlen[a], tok[c], (size_t)tlen[c]);
        tlen[ntok] = tlen[a] + tlen[c];
        int dup = 0;
        for (int j = 0; j < ntok && !dup; j++)
            dup = tlen[j] == tlen[ntok] && !memcmp(tok[j], tok[ntok], (size_t)tlen[j]);
        if (dup)
            continue;
        memcpy(merges + m, tok[a], (size_t)tlen[a]);
        m += (size_t)tlen[a];
        merges[m++] = ' ';
        memcpy(merges + m, tok[c], (size_t)tlen[c]);
        m += (size_t)tlen[c];
        merges[m++] = '\n';
        vocab[v++] = ',';
        v += json_str(vocab + v, tok[ntok], (size_t)tlen[ntok]);
        v += (size_t)sprintf(vocab + v, ":%d", ntok);
        ntok++;
    }
    v += (size_t)sprintf(vocab + v, ",\"<|endoftext|>\":%d}", ntok);
    if (fz_pick(in, 8) == 1 && v)
        vocab[fz_u16(in) % v] = (char)fz_u8(in);
    if (fz_pick(in, 8) == 1 && m)
        merges[fz_u16(in) % m] = (char)fz_u8(in);
    *vlen = v;
    *mlen = m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    static char vocab[65536], merges[8192];
    size_t vlen, mlen;
    const uint8_t *p;
    fz_quiet();
    if (fz_u8(&in) == 0)
        make_files(&in, vocab, &vlen, merges, &mlen);
    else {
        vlen = fz_blob(&in, sizeof vocab, &p);
        memcpy(vocab, p, vlen);
        mlen = fz_blob(&in, sizeof merges, &p);
        memcpy(merges, p, mlen);
    }
    dt_bpe_t *b = NULL;
    dt_status st = dt_bpe_load_mem(vocab, vlen, merges, mlen, "fuzz", &b);
    fz_note("dt_bpe_load_mem", st);
    if (st != DT_OK) {
        fz_check_error(st, "dt_bpe_load_mem");
        FZ_REQUIRE(b == NULL, "a failed load returned a tokenizer");
        return 0;
    }
    const char *text = (const char *)in.p;
    size_t n = in.n, count = 0, cap = 0, at = 0;
    int32_t *ids = NULL;
    st = dt_bpe_encode(b, text, n, &ids, &count, &cap);
    FZ_REQUIRE(st == DT_OK, "encoding %zu bytes failed: %s", n, dt_last_error());
    for (size_t i = 0; i < count; i++) {
        const char *bytes;
        size_t k = dt_bpe_token_bytes(b, ids[i], &bytes);
        FZ_REQUIRE(k > 0 && at + k <= n && !memcmp(text + at, bytes, k),
                   "token %zu (id %d) does not decode to the text's bytes at %zu", i, ids[i], at);
        at += k;
    }
    FZ_REQUIRE(at == n, "the tokens decode to %zu of the %zu bytes", at, n);
    free(ids);
    dt_bpe_free(b);
    return 0;
}
