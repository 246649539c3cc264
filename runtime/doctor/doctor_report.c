/*
 * doctor_report.c - the report of `dtrain doctor`, made on rank 0 from
 * every rank's record: the table (one row per rank), the libraries (once
 * when every rank agrees, else per rank), the live checks, and one line
 * per problem with its cause and its fix.
 *
 * Problems are collected while the checks are printed and listed at the
 * end, so the last lines a user sees say what to do. A problem that would
 * repeat for every rank of a node or of the job (a driver, a shared GPU)
 * is said once, naming the first rank it concerns.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "doctor_impl.h"
#include "core/text.h"

struct problems {
    int n;
    FILE *f; /* the lines, printed after the checks */
};

static void problem(struct problems *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void problem(struct problems *p, const char *fmt, ...)
{
    va_list ap;
    p->n++;
    if (!p->f)
        return;
    fprintf(p->f, "PROBLEM: ");
    va_start(ap, fmt);
    vfprintf(p->f, fmt, ap);
    va_end(ap);
    fputc('\n', p->f);
}

static void cuda_version(int v, char *buf, size_t len)
{
    if (v > 0)
        snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10);
    else
        snprintf(buf, len, "-");
}

static int count_hosts(const struct facts *f, int n)
{
    int hosts = 0;
    for (int r = 0; r < n; r++) {
        int seen = 0;
        for (int q = 0; q < r && !seen; q++)
            seen = !strcmp(f[q].host, f[r].host);
        hosts += !seen;
    }
    return hosts;
}

/* ---- the table ------------------------------------------------------------- */

/* The table's columns after rank, host and gpu (whose widths follow the
 * longest entry). */
struct row {
    char local[16], slurm[48], gpu[48], mem[32], cc[16], kern[24], drv[16], rt[16];
    const char *ok;
};

static void make_row(const struct facts *f, struct row *w)
{
    snprintf(w->local, sizeof w->local, "%d/%d", f->local_rank, f->local_size);
    if (f->slurm_job[0])
        snprintf(w->slurm, sizeof w->slurm, "%.16s/%.8s.%.8s", f->slurm_job,
                 f->slurm_procid[0] ? f->slurm_procid : "?",
                 f->slurm_localid[0] ? f->slurm_localid : "?");
    else
        snprintf(w->slurm, sizeof w->slurm, "-");
    snprintf(w->gpu, sizeof w->gpu, "none");
    snprintf(w->mem, sizeof w->mem, "-");
    snprintf(w->cc, sizeof w->cc, "-");
    snprintf(w->kern, sizeof w->kern, "-");
    if (f->gpu_described) {
        snprintf(w->gpu, sizeof w->gpu, "%d:%.40s", f->device, f->gpu.name);
        dt_format_bytes(f->gpu.mem_bytes, w->mem, sizeof w->mem);
        snprintf(w->cc, sizeof w->cc, "%d.%d", f->gpu.cc_major, f->gpu.cc_minor);
        if (f->gpu.has_kernels)
            snprintf(w->kern, sizeof w->kern, "sm_%d", f->gpu.kernel_binary);
        else
            snprintf(w->kern, sizeof w->kern, "%s", f->gpu_usable ? "yes" : "NONE");
    }
    cuda_version(f->gpu.driver_version, w->drv, sizeof w->drv);
    cuda_version(f->gpu.runtime_version, w->rt, sizeof w->rt);
    w->ok = !f->cuda_built || !f->gpu.driver_version ? "-" : f->gpu.driver_ok ? "yes" : "NO";
}

static void print_table(const struct doctor_run *r, FILE *out)
{
    int hw = 4, gw = 4;
    for (int i = 0; i < r->world; i++) {
        struct row w;
        make_row(&r->facts[i], &w);
        int h = (int)strlen(r->facts[i].host), g = (int)strlen(w.gpu);
        hw = h > hw ? h : hw;
        gw = g > gw ? g : gw;
    }
    fprintf(out, "%-4s %-*s %-5s %-7s %-14s %-*s %-9s %-4s %-7s %-11s %-8s %-7s %s\n", "rank", hw,
            "host", "local", "threads", "slurm job/task", gw, "gpu", "memory", "cc", "kernels",
            "driver", "drv-cuda", "rt-cuda", "drv-ok");
    for (int i = 0; i < r->world; i++) {
        const struct facts *f = &r->facts[i];
        struct row w;
        make_row(f, &w);
        fprintf(out, "%-4d %-*s %-5s %-7d %-14s %-*s %-9s %-4s %-7s %-11s %-8s %-7s %s\n", f->rank,
                hw, f->host, w.local, f->threads, w.slurm, gw, w.gpu, w.mem, w.cc, w.kern,
                f->nvidia_module[0] ? f->nvidia_module : "-", w.drv, w.rt, w.ok);
    }
}

/* One library line: once when every rank agrees, else one per rank. */
static void print_library(const struct doctor_run *r, FILE *out, const char *name, size_t offset)
{
    const char *first = (const char *)&r->facts[0] + offset;
    int same = 1;
    for (int i = 1; i < r->world && same; i++)
        same = !strcmp(first, (const char *)&r->facts[i] + offset);
    if (same) {
        fprintf(out, "  %-7s %s\n", name, first[0] ? first : "-");
        return;
    }
    for (int i = 0; i < r->world; i++)
        fprintf(out, "  %-7s rank %d: %s\n", name, i, (const char *)&r->facts[i] + offset);
}

static void print_libraries(const struct doctor_run *r, FILE *out)
{
    fprintf(out, "\nlibraries%s:\n", r->world > 1 ? " (once when every rank has the same)" : "");
    print_library(r, out, "MPI", offsetof(struct facts, mpi));
    print_library(r, out, "HDF5", offsetof(struct facts, hdf5));
    int par = 1;
    for (int i = 0; i < r->world; i++)
        par &= r->facts[i].hdf5_parallel;
    fprintf(out, "  %-7s %s\n", "", par ? "parallel (MPI-IO): yes" : "parallel (MPI-IO): NO");
    print_library(r, out, "BLAS", offsetof(struct facts, blas));
    print_library(r, out, "NCCL", offsetof(struct facts, nccl));
    if (r->facts[0].cuda_built) {
        print_library(r, out, "cuBLAS", offsetof(struct facts, gpu.cublas));
        print_library(r, out, "cuDNN", offsetof(struct facts, gpu.cudnn));
    } else {
        fprintf(out, "  %-7s not used (this dtrain has no CUDA backend)\n", "cuDNN");
    }
}

/* ---- GPU problems -------------------------------------------------------------- */

/* 1 when an earlier rank on the same host has the same text at offset. */
static int said_for_host(const struct doctor_run *r, int i)
{
    for (int q = 0; q < i; q++)
        if (!strcmp(r->facts[q].host, r->facts[i].host))
            return 1;
    return 0;
}

static void driver_problems(const struct doctor_run *r, struct problems *p)
{
    for (int i = 0; i < r->world; i++) {
        const struct facts *f = &r->facts[i];
        char drv[16], rt[16];
        cuda_version(f->gpu.driver_version, drv, sizeof drv);
        cuda_version(f->gpu.runtime_version, rt, sizeof rt);
        if (said_for_host(r, i))
            continue;
        if (!f->cuda_built && f->nvidia_module[0])
            problem(p,
                    "%s (rank %d) has the NVIDIA driver %s loaded, but this dtrain was built "
                    "without CUDA, so it trains on the CPU. Fix: rebuild with nvcc on the PATH "
                    "and -DDTRAIN_CUDA=ON",
                    f->host, i, f->nvidia_module);
        else if (f->cuda_built && f->gpu.driver_version > 0 && !f->gpu.driver_ok)
            problem(p,
                    "the NVIDIA driver on %s (rank %d%s%s) supports CUDA %s, older than the CUDA "
                    "%s runtime this dtrain carries. Fix: upgrade the driver to one for CUDA %s "
                    "or newer, or rebuild dtrain with a CUDA toolkit no newer than %s",
                    f->host, i, f->nvidia_module[0] ? ", driver " : "", f->nvidia_module, drv, rt,
                    rt, drv);
        else if (f->cuda_built && f->gpu.driver_version == 0 && f->nvidia_module[0])
            problem(p,
                    "%s (rank %d) has the NVIDIA kernel module %s loaded, but no CUDA driver "
                    "library (libcuda.so.1) answers. Fix: install the driver's user-space "
                    "libraries of version %s, or add their folder to LD_LIBRARY_PATH",
                    f->host, i, f->nvidia_module, f->nvidia_module);
    }
}

static void device_problems(const struct doctor_run *r, struct problems *p)
{
    for (int i = 0; i < r->world; i++) {
        const struct facts *f = &r->facts[i];
        int cc = f->gpu.cc_major * 10 + f->gpu.cc_minor;
        if (!f->gpu_described || !f->gpu.driver_ok)
            continue;
        if (!f->gpu_usable && !f->gpu.has_kernels)
            problem(p,
                    "this binary has no kernel image for the GPU of rank %d on %s (%s, compute "
                    "capability %d.%d). Fix: rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d-real "
                    "(or 'native' when building on this node)",
                    i, f->host, f->gpu.name, f->gpu.cc_major, f->gpu.cc_minor, cc);
        else if (!f->gpu_usable)
            problem(p,
                    "the GPU of rank %d on %s (%s) cannot be used: %s. Fix: check it with "
                    "nvidia-smi (mode, errors), or run on another node",
                    i, f->host, f->gpu.name, f->gpu_why);
        else if (f->gpu_checked && (!f->gpu_kernel_ok || !f->gpu_gemm_ok))
            problem(p,
                    "the GPU of rank %d on %s (%s) failed its live check: %s%s%.2g. Fix: look "
                    "for ECC errors and retired pages (nvidia-smi -q), run on another node, and "
                    "report it with this output",
                    i, f->host, f->gpu.name, f->gpu_msg[0] ? f->gpu_msg : "",
                    f->gpu_msg[0] ? "; GEMM error " : "GEMM relative error ", f->gpu_gemm_err);
    }
}

static void sharing_problems(const struct doctor_run *r, struct problems *p)
{
    int with = 0, without = -1;
    for (int i = 0; i < r->world; i++) {
        with += r->facts[i].gpu_usable;
        if (!r->facts[i].gpu_usable && without < 0)
            without = i;
    }
    if (with > 0 && without >= 0)
        problem(p,
                "%d rank%s have a usable GPU but rank %d on %s does not (%s): training would "
                "mix devices. Fix: give every rank a GPU (srun --gpus-per-task=1, one rank per "
                "GPU), or set runtime.device=cpu",
                with, with == 1 ? "" : "s", without, r->facts[without].host,
                r->facts[without].gpu_why);
    for (int i = 0; i < r->world; i++)
        for (int j = i + 1; j < r->world; j++) {
            const struct facts *a = &r->facts[i], *b = &r->facts[j];
            if (!a->gpu_described || !a->gpu.uuid[0] || strcmp(a->host, b->host) ||
                strcmp(a->gpu.uuid, b->gpu.uuid))
                continue;
            problem(p,
                    "ranks %d and %d on %s would share one GPU (%s): the node runs %d ranks but "
                    "they see %d GPU%s. Fix: start one rank per GPU, give each rank its own "
                    "(CUDA_VISIBLE_DEVICES, srun --gpus-per-task=1), or set "
                    "runtime.share_gpus: true to share them (slower)",
                    i, j, a->host, a->gpu.uuid, a->local_size, a->gpu_count,
                    a->gpu_count == 1 ? "" : "s");
            return;
        }
}

static void print_gpu_line(const struct doctor_run *r, FILE *out)
{
    int usable = 0;
    for (int i = 0; i < r->world; i++)
        usable += r->facts[i].gpu_usable;
    if (usable || !out)
        return;
    const char *why = r->facts[0].gpu_why;
    int same = 1;
    for (int i = 1; i < r->world && same; i++)
        same = !strcmp(why, r->facts[i].gpu_why);
    if (same)
        fprintf(out, "\ngpu: none%s: %s; the checks below use the CPU path\n",
                r->world > 1 ? " on any rank" : "", why);
    else
        fprintf(out, "\ngpu: none on any rank (rank 0: %s); the checks below use the CPU path\n",
                why);
}

/* ---- checks ----------------------------------------------------------------- */

static void environment_problems(const struct doctor_run *r, struct problems *p)
{
    for (int i = 0; i < r->world; i++) {
        const struct facts *f = &r->facts[i];
        if (f->expected_tasks > 0 && f->expected_tasks != r->world) {
            problem(p,
                    "MPI was not started by a launcher: %s on rank %d (%s) announces %d tasks, "
                    "but this MPI world has %d rank%s (each task started without the launcher's "
                    "MPI wiring runs as its own 1-rank world). Fix: start dtrain with srun "
                    "--mpi=pmix (see srun --mpi=list) or mpirun -np %d, using the MPI dtrain was "
                    "built with",
                    f->expected_from, i, f->host, f->expected_tasks, r->world,
                    r->world == 1 ? "" : "s", f->expected_tasks);
            break;
        }
    }
    for (int i = 0; i < r->world; i++)
        if (!r->facts[i].hdf5_parallel) {
            problem(p,
                    "%s on rank %d (%s) has no parallel (MPI-IO) support, which checkpoints "
                    "written by all ranks together need. Fix: install a parallel HDF5 (Debian: "
                    "libhdf5-openmpi-dev; on a cluster its MPI build, e.g. module load "
                    "hdf5/mpi) and rebuild dtrain against it",
                    r->facts[i].hdf5, i, r->facts[i].host);
            break;
        }
    for (int i = 1; i < r->world; i++)
        if (strcmp(r->facts[i].mpi, r->facts[0].mpi) ||
            strcmp(r->facts[i].hdf5, r->facts[0].hdf5)) {
            problem(p,
                    "ranks run different libraries: rank 0 on %s has %s and %s, rank %d on %s "
                    "has %s and %s. Fix: load the same modules on every node (in the job script, "
                    "before srun) and use one installation of dtrain",
                    r->facts[0].host, r->facts[0].mpi, r->facts[0].hdf5, i, r->facts[i].host,
                    r->facts[i].mpi, r->facts[i].hdf5);
            break;
        }
}

static void check_compute(const struct doctor_run *r, FILE *out, struct problems *p)
{
    double worst = 0, gworst = 0;
    int bad = -1, gpus = 0, gbad = 0;
    for (int i = 0; i < r->world; i++) {
        const struct facts *f = &r->facts[i];
        if (!f->cpu_gemm_ok && bad < 0)
            bad = i;
        if (f->cpu_gemm_err > worst)
            worst = f->cpu_gemm_err;
        if (f->gpu_checked) {
            gpus++;
            gbad += !f->gpu_kernel_ok || !f->gpu_gemm_ok;
            if (f->gpu_gemm_err > gworst)
                gworst = f->gpu_gemm_err;
        }
    }
    if (bad < 0) {
        if (out)
            fprintf(out,
                    "  ok    CPU GEMM 64x96x80 with BLAS matches the C reference on %s (largest "
                    "relative error %.1e)\n",
                    r->world > 1 ? "every rank" : "this rank", worst);
    } else {
        const struct facts *f = &r->facts[bad];
        if (out)
            fprintf(out, "  FAIL  CPU GEMM with BLAS on rank %d\n", bad);
        problem(p,
                "the BLAS GEMM on rank %d (%s) disagrees with the C reference: %s%.2g. Fix: try "
                "another BLAS build (OPENBLAS_CORETYPE=Haswell, or the reference CBLAS), and "
                "report it with this output",
                bad, f->host, f->cpu_gemm_msg[0] ? f->cpu_gemm_msg : "relative error ",
                f->cpu_gemm_err);
    }
    if (!out)
        return;
    if (gpus == 0)
        fprintf(out, "  skip  GPU kernel and GEMM against the CPU: no usable GPU\n");
    else if (gbad == 0)
        fprintf(out,
                "  ok    GPU kernel (ReLU, exact) and GEMM 64x96x80 (cuBLAS, fp32) match the CPU "
                "on %d GPU%s (largest relative error %.1e)\n",
                gpus, gpus == 1 ? "" : "s", gworst);
    else
        fprintf(out, "  FAIL  GPU kernel or GEMM on %d of %d GPUs (see the problems)\n", gbad,
                gpus);
}

static void check_allreduce(const struct doctor_run *r, FILE *out, struct problems *p,
                            const char *name, const struct allreduce_result *a,
                            const char *skip_why)
{
    int hosts = count_hosts(r->facts, r->world);
    if (!a->ran) {
        if (out)
            fprintf(out, "  skip  %s all-reduce: %s\n", name, skip_why);
        return;
    }
    if (a->ok) {
        if (out)
            fprintf(out,
                    "  ok    %s all-reduce of 4 MiB over %d rank%s on %d host%s: exact on every "
                    "rank; bus bandwidth %.3f GB/s%s\n",
                    name, r->world, r->world == 1 ? "" : "s", hosts, hosts == 1 ? "" : "s",
                    a->busbw, r->world == 1 ? " (one rank: nothing crosses a link)" : "");
        return;
    }
    if (out)
        fprintf(out, "  FAIL  %s all-reduce\n", name);
    problem(p,
            "the %s all-reduce over %d ranks failed: %s. Fix: check the network between the "
            "hosts (for NCCL: NCCL_DEBUG=INFO shows the transport it tried; for MPI: the "
            "launcher's interface settings, e.g. OMPI_MCA_btl_tcp_if_include)",
            name, r->world, a->msg);
}

static void check_dirs(const struct doctor_run *r, FILE *out, struct problems *p)
{
    int bad = -1, nbad = 0;
    for (int i = 0; i < r->world; i++)
        if (!r->dirs[i].ok && nbad++ == 0)
            bad = i;
    const struct dirfacts *d0 = &r->dirs[0];
    if (bad < 0) {
        if (out)
            fprintf(out, "  ok    HDF5 file written, read back and removed in %s%s%s%s on %s\n",
                    d0->dir, d0->note[0] ? " (" : "", d0->note, d0->note[0] ? ")" : "",
                    r->world > 1 ? "every rank" : "this rank");
        return;
    }
    const struct dirfacts *d = &r->dirs[bad];
    if (out)
        fprintf(out, "  FAIL  HDF5 file in the run directory's file system on %d rank%s\n", nbad,
                nbad == 1 ? "" : "s");
    if (!d->dir[0])
        problem(p,
                "rank %d (%s): %s. Fix: create it (mkdir -p), or point %s at an existing "
                "directory on a file system every node shares",
                bad, r->facts[bad].host, d->msg, r->opts->dir_explicit ? "--dir" : "output.dir");
    else
        problem(p,
                "rank %d (%s) cannot write and read an HDF5 file in %s%s: %s. Fix: make %s "
                "writable for this user (and check its free space, df -h), or choose %s on "
                "another file system",
                bad, r->facts[bad].host, d->dir, nbad > 1 ? " (nor can other ranks)" : "", d->msg,
                d->dir, r->opts->dir_explicit ? "--dir" : "output.dir");
}

static void check_shared(const struct doctor_run *r, FILE *out, struct problems *p)
{
    int hosts = count_hosts(r->facts, r->world);
    if (hosts == 1) {
        if (out)
            fprintf(out, "  skip  run directory shared between hosts: %s\n",
                    r->world == 1 ? "one rank" : "every rank is on one host");
        return;
    }
    for (int i = 0; i < r->world; i++) {
        const struct dirfacts *d = &r->dirs[i];
        if (d->missing_n) {
            if (out)
                fprintf(out, "  FAIL  run directory shared between %d hosts\n", hosts);
            problem(p,
                    "the run directory's file system (%s) is not shared between hosts: rank %d "
                    "on %s does not see the file rank %d on %s wrote there. Fix: put output.dir "
                    "on a file system every node mounts at the same path (a parallel file "
                    "system or a shared home), not on node-local storage such as /tmp: "
                    "checkpoints are one file written by every rank",
                    d->dir, i, r->facts[i].host, d->missing_rank, r->facts[d->missing_rank].host);
            return;
        }
        if (d->unreadable_n) {
            if (out)
                fprintf(out, "  FAIL  run directory shared between %d hosts\n", hosts);
            problem(p,
                    "rank %d on %s sees the file rank %d on %s wrote in %s but cannot read it "
                    "back right: %s. Fix: the file system does not give every node the same "
                    "data; ask the cluster's admins, or choose output.dir on another file "
                    "system",
                    i, r->facts[i].host, d->unreadable_rank, r->facts[d->unreadable_rank].host,
                    d->dir, d->unreadable_msg);
            return;
        }
    }
    if (out)
        fprintf(out,
                "  ok    run directory shared between %d hosts: each host read the others' "
                "files\n",
                hosts);
}

/* ---- report ----------------------------------------------------------------- */

int doctor_report(const struct doctor_run *r, FILE *out)
{
    char *text = NULL;
    size_t text_len = 0;
    struct problems p = {0, out ? open_memstream(&text, &text_len) : NULL};
    int hosts = count_hosts(r->facts, r->world);
    if (out) {
        fprintf(out, "dtrain doctor %s: %d rank%s on %d host%s\n\n", DT_VERSION, r->world,
                r->world == 1 ? "" : "s", hosts, hosts == 1 ? "" : "s");
        print_table(r, out);
        print_libraries(r, out);
        print_gpu_line(r, out);
        fprintf(out, "\nchecks:\n");
    }
    environment_problems(r, &p);
    driver_problems(r, &p);
    device_problems(r, &p);
    sharing_problems(r, &p);
    check_compute(r, out, &p);
    check_allreduce(r, out, &p, "MPI", &r->mpi, "");
    check_allreduce(r, out, &p, "NCCL", &r->nccl,
                    r->facts[0].cuda_built ? "not every rank has a working GPU of its own"
                                           : "this dtrain was built without CUDA");
    check_dirs(r, out, &p);
    check_shared(r, out, &p);
    if (p.f)
        fclose(p.f);
    if (out) {
        if (p.n == 0)
            fprintf(out, "\nno problems found: this environment can run dtrain\n");
        else
            fprintf(out, "\n%s%d problem%s found\n", text ? text : "", p.n, p.n == 1 ? "" : "s");
        fflush(out);
    }
    free(text);
    return p.n;
}
