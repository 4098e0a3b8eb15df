"""Checks that a source file compiles with one include folder only: the
public API's. Usage: check_include_path.py compile_commands.json SOURCE_SUFFIX INCLUDE_DIR"""
import json
import os
import shlex
import sys


def include_dirs(command):
    args = shlex.split(command)
    dirs = []
    for i, a in enumerate(args):
        for flag in ("-I", "-isystem", "-iquote", "-idirafter"):
            if a == flag:
                dirs.append(args[i + 1])
            elif a.startswith(flag) and len(a) > len(flag) and flag == "-I":
                dirs.append(a[len(flag):])
    return dirs


def main():
    db, suffix, want = sys.argv[1], sys.argv[2], os.path.realpath(sys.argv[3])
    entries = [e for e in json.load(open(db)) if e["file"].endswith(suffix)]
    if not entries:
        sys.exit(f"{suffix}: not in {db}")
    for e in entries:
        dirs = [os.path.realpath(d) for d in include_dirs(e.get("command") or " ".join(e["arguments"]))]
        if dirs != [want]:
            sys.exit(f"{suffix}: include path {dirs}, expected only {want}")
    print(f"{suffix}: include path is {want} alone")


if __name__ == "__main__":
    main()
