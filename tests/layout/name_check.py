#!/usr/bin/env python3
"""name_check.py - only kernels/ and collectives/ tell backends apart by name.

Usage: name_check.py [ROOT]   (ROOT: the source tree, default: this tree)

What a compute backend or a communicator is (device or host memory, which
communicator serves it, which collectives it has) is asked of its table:
dt_backend_caps, dt_backend_auto, dt_comm_caps, dt_comm_auto, dt_comm_is.
So outside kernels/ and collectives/ (and tests/ and bench/, which may
check anything) no C, CUDA or header file compares a string with "cpu",
"cuda", "mpi" or "nccl": no strcmp, strncmp, strcasecmp, strncasecmp,
strstr or memcmp with one of them as an argument, and no == or != against
one. Creating a backend by name (dt_backend_create("cpu", ...)) or listing
the allowed values of a job key is not a comparison and stays allowed, as
does runtime/config/ comparing a job key's value (j->..., job->...): the
job file's rules between its own keys are checked there before any
backend exists, and the config room links no backend.

Prints one line per comparison (file:line, the code, the rule) and exits 1
when there is any, 0 when there is none, 2 when no source file was found.
"""
import os
import re
import sys

from sources import source_files

NAMES = ("cpu", "cuda", "mpi", "nccl")
LITERAL = re.compile(r'^"(%s)"$' % "|".join(NAMES))
CALL = re.compile(r"\b(strcmp|strncmp|strcasecmp|strncasecmp|strstr|strcasestr|memcmp)\s*\(")
EQUALS = re.compile(r'(?:[=!]=\s*"(?:%s)")|(?:"(?:%s)"\s*[=!]=)' % ("|".join(NAMES),
                                                                  "|".join(NAMES)))
EXEMPT = {"kernels", "collectives", "tests", "bench"}
JOB_FIELD = re.compile(r"^\(?\s*(?:j|job)\s*->")


def blank_comments(text):
    """text with comments replaced by spaces (newlines kept) and string
    literals kept as they are, so offsets and line numbers still match."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_args(text, start):
    """The top-level arguments of the call whose '(' is at text[start]."""
    depth, args, cur, i = 0, [], [], start
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i:j + 1])
            i = j + 1
            continue
        if c == "(":
            depth += 1
            if depth > 1:
                cur.append(c)
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            cur.append(c)
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    return args


def findings(rel, text):
    """(line, code) of each name comparison in one file's text."""
    code = blank_comments(text)
    in_config = rel.startswith("runtime/config/")
    found = []
    for m in CALL.finditer(code):
        args = call_args(code, m.end() - 1)
        if not any(LITERAL.match(a) for a in args):
            continue
        if in_config and any(JOB_FIELD.match(a) for a in args if not LITERAL.match(a)):
            continue
        found.append(m.start())
    for m in EQUALS.finditer(code):
        found.append(m.start())
    out = []
    for pos in sorted(set(found)):
        line = code.count("\n", 0, pos) + 1
        out.append((line, text.splitlines()[line - 1].strip()))
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    bad = checked = 0
    tops = [t for t in os.listdir(root) if t not in EXEMPT and not t.startswith(".")]
    for rel, _, text in source_files(root, tops):
        checked += 1
        for line, src in findings(rel, text):
            print("%s:%d: %s: outside kernels/ and collectives/, ask the table "
                  "(dt_backend_caps, dt_comm_caps, dt_comm_is, ...), not the name"
                  % (rel, line, src))
            bad += 1
    if checked == 0:
        print("name_check: no source files under %s" % root, file=sys.stderr)
        return 2
    if bad:
        print("name_check: %d comparison(s) with a backend's name in %d files checked"
              % (bad, checked), file=sys.stderr)
        return 1
    print("name_check: %d files, no backend or communicator is told apart by its name" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
