#!/usr/bin/env python3
"""Counts the string literals in the core's code that are an operator's name ("Conv",
"BatchNormalization"): knowledge about ops that lives in the core instead of with the op, where a
third party's op can never supply it. The op names are those the built plugins register
(`sparsebit plugins --json`) and the control-flow ops the core runs itself; comments do not count,
nor do longer strings that mention an op.

    count-op-literals.py SPARSEBIT ROOT [--check LIMIT_FILE] [--files]

--check fails when the count exceeds the number in LIMIT_FILE (the count may only go down: lower
the file when it does), --files lists the count per file.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

CONTROL_FLOW = {"If", "Loop", "Scan"}
COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', re.S)
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def op_names(binary):
    out = subprocess.run([binary, "plugins", "--json"], check=True, capture_output=True, text=True).stdout
    names = set(CONTROL_FLOW)
    for plugin in json.loads(out)["plugins"]:
        for entry in plugin.get("registered", []):
            kind, _, name = entry.partition(":")
            if kind == "op":
                names.add(name.rpartition(":")[2])  # "com.microsoft:Gelu" -> "Gelu"
    return names


def code_without_comments(text):
    # Comments go, string literals stay (a "//" inside a literal is not a comment).
    return COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ", text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("binary")
    p.add_argument("root")
    p.add_argument("--check", metavar="LIMIT_FILE")
    p.add_argument("--files", action="store_true")
    a = p.parse_args()
    names = op_names(a.binary)
    root = pathlib.Path(a.root)
    per_file = {}
    for path in sorted(list((root / "core").rglob("*.cpp")) + list((root / "core").rglob("*.h"))):
        if "tests" in path.relative_to(root).parts:
            continue
        n = sum(1 for lit in LITERAL.findall(code_without_comments(path.read_text())) if lit in names)
        if n:
            per_file[str(path.relative_to(root))] = n
    total = sum(per_file.values())
    if a.files:
        for f, n in sorted(per_file.items(), key=lambda kv: -kv[1]):
            print(f"{n:5d}  {f}")
    print(f"op-name literals in core/: {total} in {len(per_file)} files ({len(names)} op names)")
    if a.check:
        limit_file = pathlib.Path(a.check)
        limit = int(limit_file.read_text().split()[0])
        if total > limit:
            print(f"error: the core names ops {total} times, more than the {limit} of {limit_file}: ask the op "
                  "(its plugin's traits) instead of naming it in the core", file=sys.stderr)
            return 1
        if total < limit:
            print(f"note: {total} is below the limit {limit}: lower {limit_file} to {total}")
        print("check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
