/*
 * test_bpe.c - io/bpe.h on a small byte-level vocabulary built here (the
 * 256 byte symbols, a few merges, <|endoftext|>): merges by rank (the
 * lower rank first, leftmost on ties), pieces that merges never cross
 * (contractions, a space before a word, a run of spaces before a word,
 * digits, punctuation, newlines), special tokens in the text, decoding of
 * any bytes (invalid UTF-8 included) back to themselves, the copy of the
 * files the tokenizer keeps; and every refusal of malformed files as
 * DT_ERR_BAD_DATA naming the file and what was expected.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io_common.h"
#include "io/bpe.h"

/* The UTF-8 of GPT-2's symbol for byte b. */
static int symbol(unsigned b, char *out)
{
    unsigned cp = b;
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
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

/* Merges (in rank order) and the tokens they make, ids from 256; then
 * <|endoftext|>. \u0120 is the space's symbol, \u010a the newline's. */
static const char *const merges[][2] = {
    {"h", "e"},           {"he", "l"},  {"l", "o"},   {"hel", "lo"}, {"\xc4\xa0", "hello"},
    {"\xc4\xa0", "\xc4\xa0"}, {"o", "\xc4\xa0"}, {"'", "s"}, {"1", "2"}, {"!", "!"},
    {"\xc4\x8a", "\xc4\x8a"},
};
#define NMERGES (int)(sizeof merges / sizeof *merges)

static char vocab[16384], merge_text[1024];

static void build(void)
{
    size_t v = 0, m = 0;
    vocab[v++] = '{';
    for (unsigned b = 0; b < 256; b++) {
        char s[4] = {0};
        symbol(b, s);
        const char *esc = b == '"' ? "\\\"" : b == '\\' ? "\\\\" : s;
        v += (size_t)snprintf(vocab + v, sizeof vocab - v, "%s\"%s\":%u", b ? "," : "", esc, b);
    }
    m += (size_t)snprintf(merge_text, sizeof merge_text, "#version: 0.2\n");
    for (int i = 0; i < NMERGES; i++) {
        v += (size_t)snprintf(vocab + v, sizeof vocab - v, ",\"%s%s\":%d", merges[i][0],
                              merges[i][1], 256 + i);
        m += (size_t)snprintf(merge_text + m, sizeof merge_text - m, "%s %s\n", merges[i][0],
                              merges[i][1]);
    }
    snprintf(vocab + v, sizeof vocab - v, ",\"<|endoftext|>\":%d}", 256 + NMERGES);
}

static dt_bpe_t *load(void)
{
    dt_bpe_t *b = NULL;
    build();
    ASSERT_STATUS(dt_bpe_load_mem(vocab, strlen(vocab), merge_text, strlen(merge_text), "test",
                                  &b),
                  DT_OK);
    CU_ASSERT_FATAL(b != NULL);
    return b;
}

/* The tokens of text, as ids; the decoded bytes must be the text's. */
static size_t enc(dt_bpe_t *b, const char *text, size_t len, int32_t *out)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0, at = 0;
    ASSERT_STATUS(dt_bpe_encode(b, text, len, &ids, &n, &cap), DT_OK);
    for (size_t i = 0; i < n; i++) {
        const char *bytes;
        size_t k = dt_bpe_token_bytes(b, ids[i], &bytes);
        CU_ASSERT(k > 0 && at + k <= len && memcmp(text + at, bytes, k) == 0);
        at += k;
        if (out)
            out[i] = ids[i];
    }
    CU_ASSERT_EQUAL(at, len);
    free(ids);
    return n;
}

#define SAME(text, ...)                                                                            \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        int32_t got_[64];                                                                          \
        size_t n_ = enc(b, text, strlen(text), got_);                                              \
        int same_ = n_ == sizeof want_ / sizeof *want_ && !memcmp(got_, want_, sizeof want_);      \
        if (!same_) {                                                                              \
            printf("\n  '%s': %zu tokens:", text, n_);                                             \
            for (size_t i_ = 0; i_ < n_ && i_ < 64; i_++)                                          \
                printf(" %d", got_[i_]);                                                           \
        }                                                                                          \
        CU_ASSERT(same_);                                                                          \
    } while (0)

enum { HE = 256, HEL, LO, HELLO, SPHELLO, SPSP, OSP, APOS_S, N12, BANGS, NLNL, EOT };

static void test_merges_and_pieces(void)
{
    dt_bpe_t *b = load();
    CU_ASSERT_EQUAL(dt_bpe_vocab_size(b), 256 + NMERGES + 1);
    CU_ASSERT_EQUAL(dt_bpe_eot(b), EOT);
    /* "hel" + "lo" though "l o" ranks before "hel lo": h e, he l, then l o */
    SAME("hello", HELLO);
    SAME(" hello", SPHELLO);
    /* a space belongs to the word after it, never to the one before */
    SAME("hello hello", HELLO, SPHELLO);
    /* "o " never merges: the space starts the next piece */
    SAME("lo hello", LO, SPHELLO);
    /* spaces before a word: all but the last are a piece of their own */
    SAME("hello   hello", HELLO, SPSP, SPHELLO);
    /* contractions are pieces */
    SAME("he's", HE, APOS_S);
    /* digits, punctuation and newlines are runs of their own class */
    SAME("12!!", N12, BANGS);
    SAME("hello\n\nhello", HELLO, '\n', '\n', HELLO);
    SAME("hello\n\n", HELLO, NLNL);
    dt_bpe_free(b);
}

static void test_specials_and_bytes(void)
{
    dt_bpe_t *b = load();
    const char t[] = "hello<|endoftext|>hello<|endoftext";
    int32_t got[64];
    size_t n = enc(b, t, strlen(t), got);
    CU_ASSERT(n > 3 && got[0] == HELLO && got[1] == EOT && got[2] == HELLO);
    /* any bytes come back, invalid UTF-8 and NULs included */
    const char bytes[] = "caf\xc3\xa9 \xff\xfe\x80 \xe2\x82 \xf0\x9f\x98\x80 \0tail";
    enc(b, bytes, sizeof bytes - 1, NULL);
    const char *v, *m;
    size_t vl, ml;
    dt_bpe_files(b, &v, &vl, &m, &ml);
    CU_ASSERT(vl == strlen(vocab) && !memcmp(v, vocab, vl) && ml == strlen(merge_text));
    dt_bpe_free(b);
}

static void bad(const char *vocab_text, const char *merges_text, const char *want)
{
    dt_bpe_t *b = (dt_bpe_t *)1;
    ASSERT_STATUS(dt_bpe_load_mem(vocab_text, strlen(vocab_text), merges_text,
                                  strlen(merges_text), "tokenizer t:", &b),
                  DT_ERR_BAD_DATA);
    CU_ASSERT(b == NULL);
    ASSERT_MSG(want);
}

static void test_refusals(void)
{
    build();
    bad("[1]", merge_text, "vocab.json: expected a JSON object");
    bad("{\"a\": ", merge_text, "vocab.json: not valid JSON");
    bad("{\"a\": -1}", merge_text, "token 'a': expected an id");
    bad("{\"a\": \"x\"}", merge_text, "token 'a': expected an id");
    bad("{\"a\": 0, \"b\": 0}", merge_text, "its id is another token's too");
    bad("{\"a\": 0}", "", "has no token for byte 0x00");
    bad(vocab, "#version: 0.2\nh e\nhe\n", "merges.txt: line 3 ('he'): expected two symbols");
    bad(vocab, "h  e\n", "line 1 ('h  e'): expected two symbols");
    bad(vocab, "x q\n", "line 1 ('x q'): a symbol or the merged token is not in vocab.json");
    char missing[16384];
    snprintf(missing, sizeof missing, "%s", vocab);
    char *e = strstr(missing, ",\"<|endoftext|>\"");
    strcpy(e, "}");
    /* a merge whose result the vocabulary lacks: cut the vocabulary's last merge */
    char *last = strstr(missing, ",\"\xc4\x8a\xc4\x8a\"");
    CU_ASSERT_FATAL(last != NULL);
    strcpy(last, "}");
    bad(missing, merge_text, "line 12");
    dt_bpe_t *b = NULL;
    char dir[512];
    tpath(dir, sizeof dir, "no-such-tokenizer");
    ASSERT_STATUS(dt_bpe_load_dir(dir, &b), DT_ERR_NOT_FOUND);
    ASSERT_MSG("vocab.json");
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS)
        return 1;
    CU_pSuite s = CU_add_suite("io_bpe", io_suite_init, NULL);
    CU_ADD(s, test_merges_and_pieces);
    CU_ADD(s, test_specials_and_bytes);
    CU_ADD(s, test_refusals);
    return io_run_all();
}
