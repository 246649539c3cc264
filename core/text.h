/*
 * text.h - words and numbers for people: the edit distance behind "did
 * you mean", and sizes and durations formatted to read at a glance.
 */
#ifndef DT_TEXT_H
#define DT_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* Levenshtein distance between two strings (for "did you mean"). */
int dt_edit_distance(const char *a, const char *b);

/* Formats bytes with three significant digits in powers of 1024: "512 B",
 * "4.00 MiB", "23.5 GiB", "256 KiB"; UINT64_MAX as "more than 16 EiB"
 * (what saturating size arithmetic gives for "too large to count"). */
void dt_format_bytes(uint64_t bytes, char *buf, size_t len);

/* Formats seconds as "1h02m03s" / "2m05s" / "12.3s". */
void dt_format_duration(double seconds, char *buf, size_t len);

#endif
