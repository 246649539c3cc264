#!/usr/bin/env python3
"""cli_check.py - the dtrain executable's files call downward only.

Usage: cli_check.py OBJECTS   (OBJECTS: the object files of the dtrain
                               executable, separated by ';' or given as
                               several arguments, as $<TARGET_OBJECTS:dtrain>)

launch/ holds three kinds of file, and each may use only what is below it:

    main.c           the dispatch (the command table, main())
    cmd_*.c          one command each
    everything else  the helpers the commands share (cli.c, options.c,
                     ranks.c, output.c, supervisor.c)

So a command never uses a symbol defined in another command's file or in
main.c, and a helper never uses one defined in a command's file or in
main.c; main.c may use both. The objects are read with nm, so what counts
is what the compiler made of the sources (a call through a macro or an
inline function counts too), and a symbol is "used" when it is undefined
in one object and defined in another.

Prints one line per offending use (user, symbol, where it is defined, the
rule) and exits 1 when there is any, 0 when there is none, 2 when the
objects cannot be read or main.c's and a command's are not among them.
"""
import os
import subprocess
import sys


def kind(name):
    """main, cmd or helper for a source file name such as cmd_train.c."""
    stem = name.split(".")[0]
    if stem == "main":
        return "main"
    if stem.startswith("cmd_"):
        return "cmd"
    return "helper"


def source_name(obj):
    """launch/cmd_train.c for .../CMakeFiles/dtrain.dir/launch/cmd_train.c.o."""
    base = os.path.basename(obj)
    if base.endswith(".o"):
        base = base[:-2]
    elif base.endswith(".obj"):
        base = base[:-4]
    return "launch/" + base


def symbols(obj):
    """(defined external symbols, undefined symbols) of one object."""
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, t = f[0], f[1]
        if t == "U":
            undefined.add(name)
        elif t.isupper() and t not in ("U", "W", "V"):
            defined.add(name)
    return defined, undefined


def allowed(user, owner):
    """Whether a file of kind `user` may use a symbol a file of kind `owner` defines."""
    if owner == "helper":
        return True
    return user == "main" and owner == "cmd"


RULES = {
    "cmd": "a command uses only the shared helpers (cli.c, options.c, ranks.c, output.c, ...), "
           "never another command's file or main.c",
    "helper": "a shared helper uses only other helpers, never a command's file or main.c",
}


def main():
    objs = [o for a in sys.argv[1:] for o in a.split(";") if o]
    if not objs:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    table = {}
    try:
        for o in objs:
            table[source_name(o)] = symbols(o)
    except (OSError, subprocess.CalledProcessError) as e:
        print("cli_check: cannot read the objects with nm: %s" % e, file=sys.stderr)
        return 2
    kinds = {src: kind(os.path.basename(src)) for src in table}
    if "main" not in kinds.values() or "cmd" not in kinds.values():
        print("cli_check: main.c's object and at least one command's are needed (got: %s)"
              % ", ".join(sorted(table)), file=sys.stderr)
        return 2
    owner_of = {}
    for src, (defined, _) in table.items():
        for sym in defined:
            owner_of.setdefault(sym, src)
    bad = 0
    for src in sorted(table):
        for sym in sorted(table[src][1]):
            owner = owner_of.get(sym)
            if owner is None or owner == src or allowed(kinds[src], kinds[owner]):
                continue
            print("%s uses %s, defined in %s: %s" % (src, sym, owner, RULES[kinds[src]]))
            bad += 1
    if bad:
        print("cli_check: %d use(s) across launch/'s layers in %d files" % (bad, len(table)),
              file=sys.stderr)
        return 1
    print("cli_check: %d files; the commands use only the shared helpers" % len(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
