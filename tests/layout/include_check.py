#!/usr/bin/env python3
"""include_check.py - the source folders are layers; fail when one reaches up.

Usage: include_check.py [ROOT]   (ROOT: the source tree, default: this tree)

Every `#include "..."` in a C, CUDA or header file under ROOT is resolved
(beside the file first, then from ROOT, as the build's include path does)
and the folder it names must be the file's own folder or one below it:

    core < kernels < collectives < io < runtime < launch < bench, tests

and inside runtime/, whose rooms are layers of their own:

    config < monitor < model < train < generate, doctor

Two more rules keep the interfaces the only way in. A compute backend's
sources (kernels/cpu/, kernels/cuda/) and a communicator's (collectives/mpi/,
collectives/nccl/) are private to their folder: other folders include
kernels/*.h and collectives/*.h, and backends never include each other. A
header named *_impl.h is private to the folder it sits in and the folders
under it. tests/ and bench/ sit on top and may include anything.

The build's object libraries (CMakeLists.txt) follow the same order: a
target_link_libraries() of one of them names only libraries below it.

Prints one line per offending include or link (file:line, what it includes, the
rule) and exits 1 when there is any, 0 when there is none.
"""
import os
import re
import sys

from sources import source_files

LEVELS = {"core": 0, "kernels": 1, "collectives": 2, "io": 3, "runtime": 4,
          "launch": 5, "bench": 6, "tests": 6}
ROOMS = {"config": 0, "monitor": 1, "model": 2, "train": 3, "generate": 4, "doctor": 4}
TOP_FREE = {"bench", "tests"}
BACKENDS = {("kernels", "cpu"), ("kernels", "cuda"), ("collectives", "mpi"),
            ("collectives", "nccl")}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def parts(path):
    return path.split("/")


def rule_broken(src, dst):
    """Why src may not include dst (paths relative to the root), or None."""
    s, d = parts(src), parts(dst)
    st, dt = s[0], d[0]
    if st not in LEVELS or dt not in LEVELS:
        return None
    if st in TOP_FREE:
        return None
    if LEVELS[dt] > LEVELS[st] or (LEVELS[dt] == LEVELS[st] and dt != st):
        return "%s/ may include only itself and the folders below it " \
               "(core < kernels < collectives < io < runtime < launch < bench, tests)" % st
    if st == "runtime" == dt and len(s) > 2 and len(d) > 2:
        sr, dr = s[1], d[1]
        if sr in ROOMS and dr in ROOMS and sr != dr and ROOMS[dr] >= ROOMS[sr]:
            return "runtime/%s/ may include only its own room and the rooms below it " \
                   "(config < monitor < model < train < generate, doctor)" % sr
    if len(d) > 2 and (d[0], d[1]) in BACKENDS:
        if len(s) < 3 or (s[0], s[1]) != (d[0], d[1]):
            if not (len(s) == 2 and s[0] == d[0]):
                return "%s/%s/ is a backend's own folder: other folders use %s/*.h" % (
                    d[0], d[1], d[0])
    if os.path.basename(dst).endswith("_impl.h"):
        ddir = os.path.dirname(dst)
        if not (os.path.dirname(src) + "/").startswith(ddir + "/"):
            return "%s is private to %s/ and the folders under it" % (dst, ddir)
    return None


# The object libraries of CMakeLists.txt, by the layer they build.
LIBS = {"dt_core": 0, "dt_kernels": 1, "dt_cuda": 1, "dt_comm": 2, "dt_nccl": 2, "dt_io": 3,
        "dt_config": 4.0, "dt_engine": 4.1}
LINK = re.compile(r"target_link_libraries\(\s*(dt_\w+)([^)]*)\)", re.S)


def check_links(root):
    """Lines naming each object library that links one at or above its layer."""
    path = os.path.join(root, "CMakeLists.txt")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    bad = []
    for m in LINK.finditer(text):
        lib = m.group(1)
        if lib not in LIBS:
            continue
        line = text.count("\n", 0, m.start()) + 1
        for dep in re.findall(r"\bdt_\w+", m.group(2)):
            if dep in LIBS and LIBS[dep] >= LIBS[lib]:
                bad.append("CMakeLists.txt:%d: %s links %s, which is not below it "
                           "(dt_core < dt_kernels, dt_cuda < dt_comm, dt_nccl < dt_io < "
                           "dt_config < dt_engine)" % (line, lib, dep))
    return bad


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    bad = 0
    checked = 0
    for src, path, text in source_files(root, LEVELS):
        checked += 1
        for no, line in enumerate(text.split("\n"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            here = os.path.normpath(os.path.join(os.path.dirname(path), inc))
            if not os.path.isfile(here):
                here = os.path.normpath(os.path.join(root, inc))
                if not os.path.isfile(here):
                    continue  # a generated or system header
            dst = os.path.relpath(here, root)
            why = rule_broken(src, dst)
            if why:
                print("%s:%d: includes %s: %s" % (src, no, dst, why))
                bad += 1
    for line in check_links(root):
        print(line)
        bad += 1
    if checked == 0:
        print("include_check: no source files under %s" % root, file=sys.stderr)
        return 2
    if bad:
        print("include_check: %d include(s) or link(s) break the layering in %d files checked"
              % (bad, checked), file=sys.stderr)
        return 1
    print("include_check: %d files, every include stays in its layer or below" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
