/*
 * options.c - what every command's option parsing shares: -h/--help, and
 * numbers read the same way everywhere, with one message that names the
 * option and its real range whatever is wrong with the text (not a
 * number, or a number outside the range however large: strtoll's and
 * strtod's ERANGE is a value outside the range, not a malformed one).
 *
 * A whole number is digits with an optional leading '-'; a number is
 * what strtod reads (decimal or exponent form), finite. Leading blanks,
 * which strtol and strtod would skip, are refused, so " -1" cannot wrap
 * around. A number too small for a double reads as the nearest one (0 for
 * the tiniest), as in job files: it is a value, not an error.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int dt_cli_is_help(const char *arg)
{
    return !strcmp(arg, "-h") || !strcmp(arg, "--help");
}

int dt_cli_asks_help(int n, char **args)
{
    for (int i = 0; i < n; i++)
        if (dt_cli_is_help(args[i])) return 1;
    return 0;
}

int dt_cli_opt_int(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi,
                   const char *note, int64_t *out)
{
    const char *digits = text && text[0] == '-' ? text + 1 : text;
    char *end = NULL;
    errno = 0;
    long long v = digits && isdigit((unsigned char)digits[0]) ? strtoll(text, &end, 10) : 0;
    if (!end || *end || errno == ERANGE || v < lo || v > hi)
        return dt_cli_usage("%s: %s needs a whole number from %lld to %lld%s, not '%s'", cmd, opt,
                            (long long)lo, (long long)hi, note ? note : "", text ? text : "");
    *out = v;
    return 0;
}

int dt_cli_opt_real(const char *cmd, const char *opt, const char *text, double lo, double hi,
                    int hi_open, const char *note, double *out)
{
    char *end = NULL, range[96];
    errno = 0;
    double v = text && text[0] && !isspace((unsigned char)text[0]) ? strtod(text, &end) : NAN;
    int overflow = errno == ERANGE && fabs(v) > 1; /* underflow reads as the nearest double */
    if (end && !*end && !overflow && isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi)) {
        *out = v;
        return 0;
    }
    if (isinf(hi))
        snprintf(range, sizeof range, "of at least %g", lo);
    else
        snprintf(range, sizeof range, "from %g to %s%g", lo, hi_open ? "below " : "", hi);
    return dt_cli_usage("%s: %s needs a number %s%s, not '%s'", cmd, opt, range, note ? note : "",
                        text ? text : "");
}
