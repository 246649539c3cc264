"""sources.py - the C, CUDA and header files of the source tree, for the
layout checks (include_check.py, name_check.py): each one once, in sorted
order, with build trees (folders holding a CMakeCache.txt) left out."""
import os

EXTS = (".c", ".h", ".cu", ".cuh")


def source_files(root, tops):
    """(path relative to root with '/', full path, text) of every source file
    under the folders `tops` of root."""
    for top in sorted(tops):
        path = os.path.join(root, top)
        if not os.path.isdir(path) or os.path.exists(os.path.join(path, "CMakeCache.txt")):
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames
                                 if not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt")))
            for name in sorted(filenames):
                if not name.endswith(EXTS):
                    continue
                full = os.path.join(dirpath, name)
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                yield os.path.relpath(full, root).replace(os.sep, "/"), full, text
