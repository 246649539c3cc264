#!/usr/bin/env python3
"""Checks the manual page docs/dtrain.1 against the program.

  man_check.py SOURCE_DIR DTRAIN [BUILD_DIR WORK_DIR]

- It renders without a warning: `groff -man -Tutf8 -ww -z`, else
  `man --warnings -l` (neither installed: the render check is skipped, and
  said so, while the checks below still run).
- Every command `DTRAIN --help` lists is a tag (.TP) of COMMANDS.
- Every exit code `DTRAIN --help` names, and every code of the exit-code
  table in docs/training.md, is a tag of EXIT STATUS.
- With BUILD_DIR: `cmake --install BUILD_DIR --prefix WORK_DIR/prefix` puts
  the page, unchanged, at share/man/man1/dtrain.1 ($CMAKE names cmake).

Prints one line per problem and exits 1 when there is any.
"""
import filecmp
import os
import re
import shutil
import subprocess
import sys


def sections(src):
    """{name: [lines]} of the page's .SH sections."""
    out, cur = {}, None
    for line in src.split("\n"):
        m = re.match(r'^\.SH\s+"?([^"]*)"?\s*$', line)
        if m:
            cur = m.group(1).strip()
            out[cur] = []
        elif cur:
            out[cur].append(line)
    return out


def tags(lines):
    """The first word of the line after each .TP, font escapes removed."""
    res = []
    for i, line in enumerate(lines[:-1]):
        if line.strip() == ".TP":
            t = re.sub(r"\\f[BIRP]|\\f\(..|\\f\[[^\]]*\]", "", lines[i + 1])
            t = re.sub(r"^\.(B|I|BR|IR|RB|RI|IB|BI)\s+", "", t).replace("\\-", "-")
            res.append(t.split()[0] if t.split() else "")
    return res


def render(page, problems):
    if shutil.which("groff"):
        cmd = ["groff", "-man", "-Tutf8", "-ww", "-z", page]
    elif shutil.which("man"):
        cmd = ["man", "--warnings", "-l", page]
    else:
        print("note: neither groff nor man is installed: the page was not rendered "
              "(install groff-base); the other checks ran")
        return
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0"))
    err = r.stderr.strip()
    if r.returncode != 0 or err:
        problems.append("%s: exit %d, warnings:\n%s" % (" ".join(cmd), r.returncode, err))


def main():
    if len(sys.argv) not in (3, 5):
        raise SystemExit(__doc__)
    root, dtrain = os.path.abspath(sys.argv[1]), sys.argv[2]
    page = os.path.join(root, "docs", "dtrain.1")
    problems = []
    with open(page, encoding="utf-8") as f:
        src = f.read()
    render(page, problems)
    secs = sections(src)
    for name in ("NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "EXIT STATUS", "FILES",
                 "ENVIRONMENT", "SEE ALSO"):
        if name not in secs:
            problems.append("dtrain.1: no .SH %s" % name)

    out = subprocess.run([dtrain, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        problems.append("%s --help exited %d" % (dtrain, out.returncode))
    listed = sorted({m.group(1) for m in re.finditer(r"^  ([a-z][a-z-]*)\b", out.stdout, re.M)})
    if not listed:
        problems.append("dtrain --help lists no commands (its format changed?)")
    cmd_tags = set(tags(secs.get("COMMANDS", [])))
    for c in listed:
        if c not in cmd_tags:
            problems.append("dtrain.1: COMMANDS lacks '%s', which dtrain --help lists" % c)

    codes = set()
    m = re.search(r"Exit codes.*", out.stdout, re.S)
    if m:
        codes |= {int(x) for x in re.findall(r"\b(\d{1,3})\b", m.group(0))}
    else:
        problems.append("dtrain --help names no exit codes (its format changed?)")
    with open(os.path.join(root, "docs", "training.md"), encoding="utf-8") as f:
        table = re.findall(r"^\| (\d+) \|", f.read(), re.M)
    if not table:
        problems.append("docs/training.md: no exit-code table")
    codes |= {int(x) for x in table}
    exit_tags = set(tags(secs.get("EXIT STATUS", [])))
    for c in sorted(codes):
        if str(c) not in exit_tags:
            problems.append("dtrain.1: EXIT STATUS lacks %d" % c)

    if len(sys.argv) == 5:
        build, work = sys.argv[3], os.path.abspath(sys.argv[4])
        shutil.rmtree(work, ignore_errors=True)
        prefix = os.path.join(work, "prefix")
        r = subprocess.run([os.environ.get("CMAKE", "cmake"), "--install", build, "--prefix", prefix],
                           capture_output=True, text=True, timeout=300)
        got = os.path.join(prefix, "share", "man", "man1", "dtrain.1")
        if r.returncode != 0:
            problems.append("cmake --install exited %d: %s" % (r.returncode, r.stderr.strip()))
        elif not os.path.isfile(got):
            problems.append("cmake --install put no share/man/man1/dtrain.1 under %s" % prefix)
        elif not filecmp.cmp(got, page, shallow=False):
            problems.append("the installed %s differs from docs/dtrain.1" % got)
        else:
            shutil.rmtree(work, ignore_errors=True)

    for p in problems:
        print(p)
    print("dtrain.1: %d commands, %d exit codes: %s" %
          (len(listed), len(codes), "%d problems" % len(problems) if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
