/*
 * text.c - edit distance and the formatting of sizes and durations (see
 * text.h).
 */
#include "text.h"

#include <stdio.h>
#include <string.h>

int dt_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (lb > 255)
        lb = 255;
    int row[256];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

void dt_format_duration(double s, char *buf, size_t len)
{
    if (s < 0 || s != s)
        s = 0;
    if (s < 60) {
        snprintf(buf, len, "%.1fs", s);
        return;
    }
    long t = (long)(s + 0.5);
    if (t < 3600)
        snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, len, "%ldh%02ldm%02lds", t / 3600, (t / 60) % 60, t % 60);
}

void dt_format_bytes(uint64_t b, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (b == UINT64_MAX) {
        snprintf(buf, len, "more than 16 EiB");
        return;
    }
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    int decimals = u == 0 || v >= 100 ? 0 : v >= 10 ? 1 : 2;
    snprintf(buf, len, "%.*f %s", decimals, v, unit[u]);
}
