#!/usr/bin/env python3
"""Turns a Dockerfile into the shell steps that build its image in chroots.

debootstrap_test.sh has no container engine, so it runs the Dockerfile's
own instructions itself: this script reads the real file (not a copy of its
commands) and writes a bash script of calls to the test's functions, one per
instruction, in order:

  stage_new NAME IMAGE          FROM an image: a fresh copy of the Debian root
  stage_copy NAME PARENT        FROM an earlier stage
  copy_context STAGE SRC DST LIST   COPY from the build context (LIST: the
                                files under SRC that .dockerignore lets in)
  copy_stage FROM SRC TO DST    COPY --from=FROM
  mkdir_in STAGE DIR            WORKDIR
  run_in STAGE WORKDIR ENV... -- ARGV...   RUN (/bin/sh -c, as docker does)

and last FINAL_STAGE, FINAL_WORKDIR, FINAL_ENV and FINAL_ARGV (ENTRYPOINT
followed by CMD) for the image's default command.

Only what a Dockerfile for this project needs is understood: FROM, ARG, ENV,
COPY (with --from), WORKDIR, RUN, ENTRYPOINT, CMD, and LABEL, EXPOSE,
VOLUME and STOPSIGNAL as metadata. Anything else (ADD, USER, SHELL, heredocs,
.dockerignore exceptions) stops with a message, so a changed Dockerfile
never passes by being half understood.

  dockerfile_steps.py DOCKERFILE CONTEXT OUTDIR [NAME=VALUE ...]   (build args)
"""
import fnmatch
import json
import os
import re
import shlex
import sys

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
METADATA = {"LABEL", "EXPOSE", "VOLUME", "STOPSIGNAL", "MAINTAINER"}


class Unsupported(Exception):
    pass


def instructions(text):
    """Yields (line number, keyword, arguments) with continuations joined."""
    buf, start = "", 0
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and buf):
            continue  # comments (also inside a continued instruction)
        if not buf:
            start = no
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        if buf.strip():
            word, _, rest = buf.strip().partition(" ")
            yield start, word.upper(), rest.strip()
        buf = ""
    if buf.strip():
        raise Unsupported(f"line {start}: the file ends inside a continued instruction")


def substitute(text, scope, where):
    """Docker's ${VAR}, ${VAR:-word}, ${VAR:+word} and $VAR in FROM, ENV, COPY..."""

    def one(m):
        name = m.group(1) or m.group(4)
        op, word = m.group(2), m.group(3)
        value = scope.get(name)
        if op == ":-":
            return value if value else word
        if op == ":+":
            return word if value else ""
        if op:
            raise Unsupported(f"{where}: ${{{name}{op}...}} is not understood by this test")
        return value or ""

    return re.sub(r"\$\{(\w+)(?:(:[-+]|[^}]+)([^}]*))?\}|\$(\w+)", one, text)


def exec_form(args):
    if args.startswith("["):
        return json.loads(args)
    return ["/bin/sh", "-c", args]


def context_files(context, src):
    """Files and folders under CONTEXT/SRC that .dockerignore lets in."""
    patterns = []
    ignore = os.path.join(context, ".dockerignore")
    if os.path.exists(ignore):
        for line in open(ignore):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("!"):
                raise Unsupported(".dockerignore exceptions (!) are not understood by this test")
            patterns.append(line.strip("/"))

    def ignored(rel):
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            for p in patterns:
                if fnmatch.fnmatchcase(prefix, p):
                    return True
                if p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:]):
                    return True
        return False

    root = os.path.normpath(os.path.join(context, src))
    out = []
    for d, dirs, files in os.walk(root):
        for name in sorted(dirs) + sorted(files):
            full = os.path.join(d, name)
            rel = os.path.relpath(full, context)
            if ignored(rel):
                if name in dirs:
                    dirs.remove(name)
                continue
            if os.path.isfile(full) or os.path.islink(full):
                out.append(os.path.relpath(full, root))
    return out


def translate(dockerfile, context, outdir, build_args):
    q = shlex.quote
    lines = []
    global_args = {}
    stages = {}  # name -> state, in order
    stage = None  # the current stage's state
    nlist = 0
    for no, word, args in instructions(open(dockerfile).read()):
        where = f"{os.path.basename(dockerfile)} line {no} ({word})"
        if word == "ARG":
            name, eq, default = args.partition("=")
            default = default.strip('"') if eq else None
            if stage is None:
                value = build_args.get(name, default)
                global_args[name] = substitute(value or "", global_args, where)
            else:
                value = build_args.get(name, default if eq else global_args.get(name))
                stage["args"][name] = substitute(value or "", stage["scope"](), where)
            continue
        if word == "FROM":
            parts = substitute(args, global_args, where).split()
            image = parts[0]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else f"stage{len(stages)}"
            if image in stages:
                parent = stages[image]
                lines.append(f"stage_copy {q(name)} {q(image)}")
                env = dict(parent["env"])
                workdir, entrypoint, cmd = parent["workdir"], parent["entrypoint"], parent["cmd"]
            else:
                lines.append(f"stage_new {q(name)} {q(image)}")
                env, workdir, entrypoint, cmd = {"PATH": DEFAULT_PATH}, "/", [], []
            stage = {"name": name, "env": env, "args": {}, "workdir": workdir,
                     "entrypoint": entrypoint, "cmd": cmd}
            stage["scope"] = (lambda s: lambda: {**s["args"], **s["env"]})(stage)
            stages[name] = stage
            continue
        if stage is None:
            raise Unsupported(f"{where}: an instruction before the first FROM")
        scope = stage["scope"]()
        if word == "ENV":
            text = substitute(args, scope, where)
            if "=" in text.split()[0]:
                for item in shlex.split(text):
                    k, _, v = item.partition("=")
                    stage["env"][k] = v
            else:
                k, _, v = text.partition(" ")
                stage["env"][k] = v.strip()
        elif word == "WORKDIR":
            wd = substitute(args, scope, where)
            stage["workdir"] = os.path.normpath(os.path.join(stage["workdir"], wd))
            lines.append(f"mkdir_in {q(stage['name'])} {q(stage['workdir'])}")
        elif word == "COPY":
            items = shlex.split(substitute(args, scope, where))
            source_stage = None
            while items and items[0].startswith("--"):
                opt = items.pop(0)
                if opt.startswith("--from="):
                    source_stage = opt[len("--from="):]
                else:
                    raise Unsupported(f"{where}: COPY option {opt} is not understood by this test")
            if len(items) != 2:
                raise Unsupported(f"{where}: COPY with {len(items) - 1} sources")
            src, dst = items
            dst = os.path.normpath(os.path.join(stage["workdir"], dst))
            if source_stage is not None:
                if source_stage not in stages:
                    raise Unsupported(f"{where}: COPY --from={source_stage}: no such stage")
                lines.append(f"copy_stage {q(source_stage)} {q(src)} {q(stage['name'])} {q(dst)}")
            else:
                files = context_files(context, src)
                nlist += 1
                listfile = os.path.join(outdir, f"context{nlist}.list")
                with open(listfile, "w") as f:
                    f.write("".join(p + "\0" for p in files))
                lines.append(f"copy_context {q(stage['name'])} "
                             f"{q(os.path.normpath(os.path.join(context, src)))} {q(dst)} {q(listfile)}")
        elif word == "RUN":
            if args.startswith("<<"):
                raise Unsupported(f"{where}: heredocs are not understood by this test")
            env = {"HOME": "/root", **scope}
            envs = " ".join(q(f"{k}={v}") for k, v in env.items())
            argv = " ".join(q(a) for a in exec_form(args))
            lines.append(f"run_in {q(stage['name'])} {q(stage['workdir'])} {envs} -- {argv}")
        elif word == "ENTRYPOINT":
            stage["entrypoint"] = exec_form(args)
            stage["cmd"] = []
        elif word == "CMD":
            stage["cmd"] = exec_form(args)
        elif word in METADATA:
            continue
        else:
            raise Unsupported(f"{where}: {word} is not understood by this test")
    if stage is None:
        raise Unsupported("no FROM in the Dockerfile")
    env = {"HOME": "/root", **stage["env"]}
    lines.append(f"FINAL_STAGE={q(stage['name'])}")
    lines.append(f"FINAL_WORKDIR={q(stage['workdir'])}")
    lines.append("FINAL_ENV=(" + " ".join(q(f"{k}={v}") for k, v in env.items()) + ")")
    argv = stage["entrypoint"] + stage["cmd"]
    lines.append("FINAL_ARGV=(" + " ".join(q(a) for a in argv) + ")")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    dockerfile, context, outdir = sys.argv[1:4]
    build_args = dict(a.split("=", 1) for a in sys.argv[4:])
    try:
        script = translate(dockerfile, context, outdir, build_args)
    except Unsupported as e:
        sys.exit(f"dockerfile_steps: {e}")
    with open(os.path.join(outdir, "steps.sh"), "w") as f:
        f.write(script)


if __name__ == "__main__":
    main()
