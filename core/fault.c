/*
 * fault.c - parses DTRAIN_FAULT once; the table is process-global (a
 * testing aid, written before any thread starts, read-only afterwards).
 */
#include "fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULT_MAX 16

struct fault {
    int rank;
    char event[16];
    int64_t step; /* -1: any */
};

static struct fault faults[FAULT_MAX];
static int nfaults;

static const char *const known[] = {"open",     "nomem", "read",     "kill",      "bgkill",
                                    "ckptkill", "hang",  "nan",      "overflow",  "otherhost",
                                    "oom",      "slowdata", "slowckpt"};

static int known_event(const char *e)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(e, known[i]) == 0)
            return 1;
    return 0;
}

dt_status dt_fault_init(void)
{
    nfaults = 0;
    const char *env = getenv("DTRAIN_FAULT");
    const char *attempt = getenv("DTRAIN_LAUNCH_ATTEMPT");
    if (!env || !*env)
        return DT_OK;
    if (attempt && atoi(attempt) > 1) /* a restart by dtrain launch: the fault has happened */
        return DT_OK;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        struct fault f = {.step = -1};
        char ev[16] = "";
        long long step = -1;
        int n = sscanf(tok, "%d:%15[a-z]:%lld", &f.rank, ev, &step);
        if (n < 2 || !known_event(ev) || nfaults == FAULT_MAX)
            return dt_set_error(DT_ERR_USAGE,
                                "DTRAIN_FAULT entry '%s': expected RANK:EVENT[:STEP] with EVENT "
                                "one of open, nomem, read, kill, bgkill, ckptkill, hang, nan, "
                                "overflow, otherhost, oom, slowdata, slowckpt",
                                tok);
        if ((strcmp(ev, "slowdata") == 0 || strcmp(ev, "slowckpt") == 0) && (n < 3 || step <= 0))
            return dt_set_error(DT_ERR_USAGE,
                                "DTRAIN_FAULT entry '%s': expected RANK:%s:MS with MS the "
                                "milliseconds (at least 1) to add to every %s",
                                tok, ev,
                                ev[4] == 'd' ? "batch read" : "background checkpoint write");
        memcpy(f.event, ev, sizeof f.event);
        f.step = n == 3 ? step : -1;
        faults[nfaults++] = f;
    }
    return DT_OK;
}

int dt_fault_armed(const char *event, int rank, int64_t step)
{
    for (int i = 0; i < nfaults; i++)
        if (faults[i].rank == rank && strcmp(faults[i].event, event) == 0 &&
            (faults[i].step < 0 || faults[i].step == step))
            return 1;
    return 0;
}

int dt_fault_value(const char *event, int rank, int64_t *value)
{
    for (int i = 0; i < nfaults; i++)
        if (faults[i].rank == rank && strcmp(faults[i].event, event) == 0 && faults[i].step >= 0) {
            *value = faults[i].step;
            return 1;
        }
    return 0;
}
