#!/usr/bin/env python3
"""Checks that the core's includes run one way (Note [Core subsystems] in core/CMakeLists.txt).

Each sparsebit_core_subsystem(NAME DEPENDS ... SOURCES ... HEADERS ...) call there declares a
subsystem: its folder core/src/NAME/, its public headers under core/include/sparsebit/core/, and
the subsystems it builds on. A file may include the headers of its own subsystem and of those it
depends on, directly or through them; an include of any other core header is an error, as are a
core file outside every subsystem and a public header no subsystem owns.

The hosts (the CLI in core/cli/, the Python module in core/python/, the programs in examples/)
build on the library as any application does, through one header (Note [Session]): of the core
they include sparsebit/core/session.h and the few utilities HOST_UTILITIES names, besides the
SDK's headers (sparsebit/sdk/) and their own folder's; never another core header (session.h
brings those) nor a subsystem's internals.

    check-core-layers.py ROOT
"""
import pathlib
import re
import sys

CALL = re.compile(r"sparsebit_core_subsystem\((.*?)\)", re.S)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
KEYWORDS = {"SOURCES", "DEPENDS", "HEADERS"}
HOST_API = "sparsebit/core/session.h"
# What a host needs beside the Session: output files written whole, the launch of a distributed
# run, the process's allocator, and `sparsebit inspect`'s drawings and range checks.
HOST_UTILITIES = {f"sparsebit/core/{h}" for h in
                  ("atomic_file.h", "distributed.h", "cpu_allocator.h", "graph_dump.h", "saturation.h")}


def subsystems(cmake_text):
    """name -> {"DEPENDS": [...], "SOURCES": [...], "HEADERS": [...]}, in declaration order."""
    out = {}
    for body in CALL.findall(cmake_text):
        words = re.sub(r"#[^\n]*", "", body).split()
        if not words or words[0] == "name":  # the function's own definition
            continue
        fields, key = {k: [] for k in KEYWORDS}, None
        for w in words[1:]:
            if w in KEYWORDS:
                key = w
            elif key:
                fields[key].append(w)
        out[words[0]] = fields
    return out


def allowed(subs):
    """name -> the subsystems its files may include: itself and what it depends on, transitively."""
    reach = {}

    def visit(name, path):
        if name in path:
            raise SystemExit("error: the subsystems depend on each other in a cycle: " + " -> ".join(path + [name]))
        if name not in reach:
            below = {name}
            for dep in subs[name]["DEPENDS"]:
                if dep not in subs:
                    raise SystemExit(f"error: subsystem {name} depends on {dep}, which is not declared")
                below |= visit(dep, path + [name])
            reach[name] = below
        return reach[name]

    for name in subs:
        visit(name, [])
    return reach


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    core = root / "core"
    subs = subsystems((core / "CMakeLists.txt").read_text())
    if not subs:
        print("error: no sparsebit_core_subsystem() calls in core/CMakeLists.txt", file=sys.stderr)
        return 1
    reach = allowed(subs)
    public = core / "include" / "sparsebit" / "core"
    owner = {}  # "sparsebit/core/x.h" or "sub/x.h" -> subsystem
    errors = []
    for name, fields in subs.items():
        for h in fields["HEADERS"]:
            if not (public / h).is_file():
                errors.append(f"core/CMakeLists.txt: subsystem {name} lists header {h}, which is not in {public}")
            owner["sparsebit/core/" + h] = name
        folder = core / "src" / name
        listed = set(fields["SOURCES"])
        for f in sorted(folder.glob("*")):
            if f.suffix == ".h":
                owner[f"{name}/{f.name}"] = name
            elif f.suffix == ".cpp" and f.name not in listed:
                errors.append(f"{f.relative_to(root)}: not in the SOURCES of subsystem {name} (it is not built)")
    files = []  # (path, subsystem)
    for h in sorted(public.glob("*.h")):
        key = "sparsebit/core/" + h.name
        if key not in owner:
            errors.append(f"{h.relative_to(root)}: no subsystem lists it in HEADERS (core/CMakeLists.txt)")
        else:
            files.append((h, owner[key]))
    for f in sorted((core / "src").rglob("*")):
        if f.suffix not in (".cpp", ".h"):
            continue
        parts = f.relative_to(core / "src").parts
        if len(parts) != 2 or parts[0] not in subs:
            errors.append(f"{f.relative_to(root)}: outside every subsystem folder (core/src/<subsystem>/)")
            continue
        files.append((f, parts[0]))
    checked = 0
    for f, sub in files:
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            target = owner.get(inc)
            if target is None:
                if inc.startswith("sparsebit/core/") or inc.split("/")[0] in subs:
                    errors.append(f"{f.relative_to(root)}: includes \"{inc}\", which no subsystem owns")
                continue
            checked += 1
            if target not in reach[sub]:
                may = ", ".join(s for s in subs if s in reach[sub])
                errors.append(f"{f.relative_to(root)} ({sub}) includes \"{inc}\" ({target}): {sub} may include {may}")
    hosts = [core / "cli", core / "python"] + sorted(p for p in (root / "examples").glob("*") if p.is_dir())
    host_files = 0
    for folder in hosts:
        for f in sorted(folder.rglob("*")):
            if f.suffix not in (".cpp", ".h"):
                continue
            host_files += 1
            for inc in INCLUDE.findall(f.read_text(errors="replace")):
                if inc == HOST_API or inc in HOST_UTILITIES or inc.startswith("sparsebit/sdk/") or \
                        (f.parent / inc).is_file():
                    checked += 1
                    continue
                why = (f"include \"{HOST_API}\" instead (the Session's header brings the library's API)"
                       if inc.startswith("sparsebit/core/") else
                       "hosts include the Session's header, the SDK's and their own folder's only")
                errors.append(f"{f.relative_to(root)} (a host) includes \"{inc}\": {why}")
    for e in errors:
        print("error: " + e, file=sys.stderr)
    if errors:
        print(f"{len(errors)} problem(s); the order is declared in core/CMakeLists.txt (Note [Core subsystems])",
              file=sys.stderr)
        return 1
    order = " < ".join(subs)
    print(f"core layers check passed: {checked} includes in {len(files)} files follow {order}, "
          f"and {host_files} host files include only the Session's header, the SDK's and host utilities")
    return 0


if __name__ == "__main__":
    sys.exit(main())
