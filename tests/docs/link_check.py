#!/usr/bin/env python3
"""Checks README.md and docs/*.md as a reader follows them.

  link_check.py SOURCE_DIR [DTRAIN]

- Every relative link resolves: the file (or folder) exists, and a #anchor
  names a heading of the Markdown file it points into, by GitHub's rule
  (lower case; letters, digits, spaces, '-' and '_' kept, other characters
  dropped; spaces become '-'; a repeated heading gets -1, -2, ...).
- README.md is at most 12,288 bytes.
- Every row of README's command table links a page that exists and whose
  linked section (the whole file without an anchor) mentions `dtrain CMD`.
- With DTRAIN: every command `DTRAIN --help` lists is in that table.

Prints one line per problem and exits 1 when there is any; links to other
sites (http, https, mailto) are not followed.
"""
import os
import re
import subprocess
import sys

README_MAX = 12288
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def strip_code(text):
    """The text with fenced blocks and inline code blanked (lines kept)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            out.append("")
            continue
        if m:
            fence = m.group(1)
            out.append("")
            continue
        out.append(re.sub(r"`[^`]*`", lambda c: "`" + "x" * (len(c.group(0)) - 2) + "`", line))
    return "\n".join(out)


def headings(text):
    """(level, title, line index) of every ATX heading outside code blocks."""
    res = []
    for i, line in enumerate(strip_code(text).split("\n")):
        if re.match(r"^#{1,6} ", line):
            raw = text.split("\n")[i]
            level = len(raw) - len(raw.lstrip("#"))
            res.append((level, raw[level:].strip().rstrip("#").strip(), i))
    return res


def slug(title):
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text only
    t = t.lower()
    t = "".join(ch for ch in t if ch.isalnum() or ch in " -_")
    return t.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for _, title, _ in headings(text):
        s = slug(title)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def section(text, anchor):
    """The lines under the heading `anchor`, up to the next heading of its level or above."""
    lines = text.split("\n")
    hs = headings(text)
    seen = {}
    for k, (level, title, i) in enumerate(hs):
        s = slug(title)
        n = seen.get(s, 0)
        seen[s] = n + 1
        if (s if n == 0 else "%s-%d" % (s, n)) == anchor:
            end = len(lines)
            for level2, _, j in hs[k + 1:]:
                if level2 <= level:
                    end = j
                    break
            return "\n".join(lines[i:end])
    return None


def check_links(root, files, problems):
    cache = {}

    def read(p):
        if p not in cache:
            with open(p, encoding="utf-8") as f:
                cache[p] = f.read()
        return cache[p]

    for f in files:
        text = read(f)
        rel = os.path.relpath(f, root)
        for n, line in enumerate(strip_code(text).split("\n"), 1):
            for m in LINK.finditer(line):
                target = m.group(2)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                where = "%s:%d: link '%s'" % (rel, n, target)
                if not os.path.exists(dest):
                    problems.append("%s: %s does not exist" % (where, os.path.relpath(dest, root)))
                    continue
                if anchor:
                    if not dest.endswith(".md") or os.path.isdir(dest):
                        problems.append("%s: an anchor into a file that is not Markdown" % where)
                    elif anchor not in anchors(read(dest)):
                        problems.append("%s: %s has no heading with anchor #%s" %
                                        (where, os.path.relpath(dest, root), anchor))


def readme_commands(root, text, problems):
    """{command: (link target)} from the table under README's '## Commands'."""
    sec = section(text, "commands")
    if sec is None:
        problems.append("README.md: no '## Commands' section")
        return {}
    cmds = {}
    for line in sec.split("\n"):
        m = re.match(r"^\|\s*\[`([a-z][a-z-]*)`\]\(([^)]+)\)\s*\|", line)
        if m:
            cmds[m.group(1)] = m.group(2)
    if not cmds:
        problems.append("README.md: the Commands section has no table of [`command`](page) rows")
    return cmds


def check_command_pages(root, cmds, problems):
    for cmd, target in sorted(cmds.items()):
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(root, path))
        if not os.path.isfile(dest):
            problems.append("README.md: command '%s' links %s, which does not exist" % (cmd, path))
            continue
        with open(dest, encoding="utf-8") as f:
            text = f.read()
        part = section(text, anchor) if anchor else text
        if part is None:
            problems.append("README.md: command '%s' links %s, which has no #%s" % (cmd, path, anchor))
            continue
        if not re.search(r"dtrain %s\b" % re.escape(cmd), part):
            problems.append("README.md: command '%s' links %s, which never mentions 'dtrain %s'" %
                            (cmd, target, cmd))


def help_commands(dtrain):
    out = subprocess.run([dtrain, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit("%s --help exited %d" % (dtrain, out.returncode))
    # command lines are indented by exactly two spaces; continuations by more
    return sorted({m.group(1) for m in re.finditer(r"^  ([a-z][a-z-]*)\b", out.stdout, re.M)})


def main():
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    root = os.path.abspath(sys.argv[1])
    readme = os.path.join(root, "README.md")
    docs = os.path.join(root, "docs")
    files = [readme] + sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    problems = []
    size = os.path.getsize(readme)
    if size > README_MAX:
        problems.append("README.md: %d bytes, more than %d" % (size, README_MAX))
    check_links(root, files, problems)
    with open(readme, encoding="utf-8") as f:
        cmds = readme_commands(root, f.read(), problems)
    check_command_pages(root, cmds, problems)
    if len(sys.argv) == 3:
        listed = help_commands(sys.argv[2])
        if not listed:
            problems.append("dtrain --help lists no commands (its format changed?)")
        for c in listed:
            if c not in cmds:
                problems.append("README.md: 'dtrain --help' lists '%s', which the Commands table lacks" % c)
    for p in problems:
        print(p)
    print("%d files, README %d bytes, %d commands: %s" %
          (len(files), size, len(cmds), "%d problems" % len(problems) if problems else "ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
