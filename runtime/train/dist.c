/*
 * dist.c - agreement between ranks. Each check is a small allgather of
 * fixed-size records, so every rank sees every other rank's outcome and
 * takes the same branch: no rank is left waiting in a collective that
 * others skipped.
 */
#define _GNU_SOURCE
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

struct outcome {
    int32_t status;
    char msg[DT_DIST_MSG];
};

dt_status dt_dist_agree(dt_comm_t *c, dt_status mine)
{
    int n = dt_comm_size(c);
    if (n == 1)
        return mine;
    struct outcome me = {.status = (int32_t)mine};
    if (mine != DT_OK)
        snprintf(me.msg, sizeof me.msg, "%s", dt_last_error());
    struct outcome *all = calloc((size_t)n, sizeof *all);
    if (!all)
        return dt_set_error(DT_ERR_NOMEM, "out of memory agreeing on a result across %d ranks", n);
    dt_status st = dt_comm_allgather(c, &me, all, sizeof me);
    if (st != DT_OK) {
        free(all);
        return dt_error_context(st, "agreeing on a result across ranks");
    }
    st = DT_OK;
    for (int r = 0; r < n && st == DT_OK; r++) {
        if (all[r].status == DT_OK)
            continue;
        st = (dt_status)all[r].status;
        if (st <= DT_OK || st >= DT_STATUS_COUNT)
            st = DT_ERR_INTERNAL;
        dt_set_error(st, "rank %d: %s", r, all[r].msg[0] ? all[r].msg : dt_status_str(st));
    }
    free(all);
    return st;
}

/* The job as YAML text, data.path blanked, comment lines dropped. */
static char *job_text(const struct dt_job *job)
{
    struct dt_job *copy = malloc(sizeof *copy);
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = copy ? open_memstream(&buf, &len) : NULL;
    if (fp) {
        *copy = *job;
        snprintf(copy->data.path, sizeof copy->data.path, "-");
        memset(copy->source, 0, sizeof copy->source);
        dt_job_write_yaml(copy, fp);
        fclose(fp);
    }
    free(copy);
    return buf;
}

#define YAML_DEPTH 8

/* Dotted key and value of one line of dt_job_write_yaml's output, keeping
 * the enclosing section names (two spaces of indent per level) in path. */
static void yaml_key(const char *line, size_t len, char path[YAML_DEPTH][64], char *key,
                     size_t keylen, const char **value)
{
    size_t indent = 0;
    while (indent < len && line[indent] == ' ')
        indent++;
    size_t level = indent / 2 < YAML_DEPTH ? indent / 2 : YAML_DEPTH - 1;
    const char *colon = memchr(line, ':', len);
    size_t nlen = colon ? (size_t)(colon - line) - indent : len - indent;
    snprintf(path[level], 64, "%.*s", (int)nlen, line + indent);
    size_t k = 0;
    key[0] = '\0';
    for (size_t i = 0; i <= level && k < keylen; i++)
        k += (size_t)snprintf(key + k, keylen - k, "%s%s", i ? "." : "", path[i]);
    *value = colon && colon + 2 <= line + len ? colon + 2 : line + len;
}

/* "key=value (rank 0: value)" for each line of b that differs from a. */
static void describe_diff(const char *a, const char *b, char *out, size_t len)
{
    char path_a[YAML_DEPTH][64] = {{0}}, path_b[YAML_DEPTH][64] = {{0}};
    out[0] = '\0';
    size_t used = 0;
    const char *pa = a, *pb = b;
    while (*pa && *pb) {
        const char *ea = strchr(pa, '\n'), *eb = strchr(pb, '\n');
        size_t la = ea ? (size_t)(ea - pa) : strlen(pa), lb = eb ? (size_t)(eb - pb) : strlen(pb);
        char ka[256], kb[256];
        const char *va, *vb;
        yaml_key(pa, la, path_a, ka, sizeof ka, &va);
        yaml_key(pb, lb, path_b, kb, sizeof kb, &vb);
        if ((la != lb || strncmp(pa, pb, la) != 0) && pa[0] != '#' && used + 8 < len) {
            int k = snprintf(out + used, len - used, "%s%s=%.*s (rank 0: %.*s)", used ? ", " : "",
                             kb, (int)(pb + lb - vb), vb, (int)(pa + la - va), va);
            used += k > 0 ? (size_t)k : 0;
        }
        pa = ea ? ea + 1 : pa + la;
        pb = eb ? eb + 1 : pb + lb;
    }
}

/* Sends rank 0's text (length first) to every rank; *out is malloc'd. */
static dt_status broadcast_text(dt_comm_t *c, const char *mine, char **out)
{
    uint64_t len = dt_comm_rank(c) == 0 ? strlen(mine) + 1 : 0;
    dt_status st = dt_comm_broadcast(c, &len, sizeof len, 0);
    if (st != DT_OK)
        return st;
    char *buf = malloc(len ? len : 1);
    if (!buf)
        return dt_set_error(DT_ERR_NOMEM, "out of memory receiving %llu bytes from rank 0",
                            (unsigned long long)len);
    if (dt_comm_rank(c) == 0)
        memcpy(buf, mine, len);
    st = dt_comm_broadcast(c, buf, len, 0);
    if (st != DT_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    return DT_OK;
}

dt_status dt_dist_check_job(dt_comm_t *c, const struct dt_job *job)
{
    if (dt_comm_size(c) == 1)
        return DT_OK;
    char *mine = job_text(job), *root = NULL;
    if (!mine)
        return dt_set_error(DT_ERR_NOMEM, "out of memory printing the job");
    dt_status st = broadcast_text(c, mine, &root);
    if (st != DT_OK) {
        free(mine);
        return dt_error_context(st, "sending the job from rank 0");
    }
    dt_status local = DT_OK;
    if (strcmp(root, mine) != 0) {
        char diff[DT_DIST_MSG - 96];
        describe_diff(root, mine, diff, sizeof diff);
        local = dt_set_error(DT_ERR_USAGE, "the job differs from rank 0's: %s", diff);
    }
    free(mine);
    free(root);
    return dt_dist_agree(c, local);
}

dt_status dt_dist_check_same(dt_comm_t *c, const char *what, const char *mine, dt_status code)
{
    if (dt_comm_size(c) == 1)
        return DT_OK;
    char *root = NULL;
    dt_status st = broadcast_text(c, mine, &root);
    if (st != DT_OK)
        return dt_error_context(st, "sending %s from rank 0", what);
    dt_status local = DT_OK;
    if (strcmp(root, mine) != 0)
        local = dt_set_error(code, "%s differs from rank 0's: here %s, rank 0 has %s", what, mine,
                             root);
    free(root);
    return dt_dist_agree(c, local);
}

dt_status dt_dist_log_lines(dt_comm_t *c, const char *subsys, const char *line)
{
    int n = dt_comm_size(c);
    char *all = calloc((size_t)n, DT_DIST_MSG);
    if (!all)
        return dt_set_error(DT_ERR_NOMEM, "out of memory gathering start-up lines");
    char mine[DT_DIST_MSG];
    snprintf(mine, sizeof mine, "%s", line);
    dt_status st = n == 1 ? (memcpy(all, mine, sizeof mine), DT_OK)
                          : dt_comm_allgather(c, mine, all, sizeof mine);
    if (st == DT_OK)
        for (int r = 0; r < n; r++)
            DT_LOG_INFO(subsys, "%s", all + (size_t)r * DT_DIST_MSG);
    free(all);
    return st;
}

uint64_t dt_hash64(const void *data, size_t bytes)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
