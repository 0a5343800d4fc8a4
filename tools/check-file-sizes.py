#!/usr/bin/env python3
"""Checks that the project's source files stay short enough to read: a tracked C++ or CUDA file
(.h, .cpp, .cu, .cuh) has at most MAX_LINES lines, except the files long_files.allow lists, each of
which may not grow past the count written beside it (split it, then take it off the list).

    check-file-sizes.py ROOT [--allow FILE]

Prints "check passed" when every file holds; otherwise names each file over its limit.
"""
import argparse
import pathlib
import subprocess
import sys

MAX_LINES = 500
SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}


def tracked_files(root):
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p and pathlib.PurePath(p).suffix in SUFFIXES]


def read_allow(path):
    allowed = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit():
            sys.exit(f"{path}:{number}: expected 'PATH LINES', got '{line}'")
        allowed[fields[0]] = int(fields[1])
    return allowed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=pathlib.Path)
    parser.add_argument("--allow", type=pathlib.Path, help="default: ROOT/tools/long_files.allow")
    args = parser.parse_args()
    allow_path = args.allow or args.root / "tools" / "long_files.allow"
    allowed = read_allow(allow_path)
    problems = []
    files = tracked_files(args.root)
    for rel in files:
        path = args.root / rel
        if not path.is_file():
            continue
        lines = len(path.read_text(errors="replace").splitlines())
        limit = allowed.get(rel, MAX_LINES)
        if lines > limit:
            if rel in allowed:
                problems.append(f"{rel}: {lines} lines, grown past the {limit} that {allow_path.name} allows: split it")
            else:
                problems.append(f"{rel}: {lines} lines, over {MAX_LINES}: split it by role")
        elif rel in allowed and lines <= MAX_LINES:
            problems.append(f"{rel}: {lines} lines, now within {MAX_LINES}: take it off {allow_path.name}")
    for rel in sorted(set(allowed) - set(files)):
        problems.append(f"{rel}: listed in {allow_path.name} but not a tracked source file: take it off")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check passed: {len(files)} files, {len(allowed)} allowed over {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
