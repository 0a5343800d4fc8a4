#!/usr/bin/env python3
"""Checks that the SDK headers in CURRENT only grow from those in RELEASED (docs/PLUGINS.md, Stability).

A plugin built against RELEASED must run in a host built against CURRENT. The compiler lays out
both (g++ -fdump-lang-class) and, for every class of the released SDK:
  - it still exists, with the same size and alignment (plugins and host share these objects;
    SparsebitPluginDescriptor alone may grow, the host reads it up to descriptor_size);
  - its virtual table is unchanged: the host calls plugins' objects through it, and an old
    plugin's table has no slot for a new virtual. New optional roles are new interfaces
    (Note [Capabilities]). Interfaces the host implements and plugins only call (Registrar,
    QuantState, LayerState) may add virtuals at the end, each with a body (a plugin's test double
    implementing one must keep compiling). The test kit's classes (sparsebit::testing, header only,
    compiled into each test program) are not checked.

  check-sdk-growth.py --cxx g++ --released DIR --current DIR [-I INCLUDE]...
DIR holds sparsebit/sdk/*.h. Exits 1 naming each difference.
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

HOST_IMPLEMENTED = {"sparsebit::Registrar", "sparsebit::QuantState", "sparsebit::LayerState", "sparsebit::LiftContext"}
GROWS_AT_THE_END = {"SparsebitPluginDescriptor"}
# The test kit is compiled into each test program whole: its classes never cross between a plugin
# and a host (and its Registrar double would stop compiling before a pure virtual could be named).
TEST_KIT_HEADER = "testing.h"


def layout(cxx, include_dir, includes):
    """{class: (size, align, [vtable entries] or None)} for the SDK's classes."""
    include_dir = pathlib.Path(include_dir).resolve()
    headers = sorted(p.name for p in (include_dir / "sparsebit" / "sdk").glob("*.h") if p.name != TEST_KIT_HEADER)
    with tempfile.TemporaryDirectory() as work:
        tu = pathlib.Path(work) / "sdk.cpp"
        tu.write_text("".join(f'#include "sparsebit/sdk/{h}"\n' for h in headers))
        cmd = [cxx, "-std=c++17", "-fdump-lang-class", "-S", "-o", "/dev/null", f"-I{include_dir}"]
        cmd += [f"-isystem{i}" for i in includes] + [str(tu)]
        run = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"compiling the headers of {include_dir} failed:\n{run.stderr[-4000:]}")
        dumps = list(pathlib.Path(work).glob("sdk.cpp.*.class"))
        if not dumps:
            sys.exit(f"{cxx} wrote no class layout (needs g++ and -fdump-lang-class)")
        text = dumps[0].read_text(errors="replace")
    ours = lambda name: name.startswith("sparsebit::") or name in GROWS_AT_THE_END
    classes, vtables = {}, {}
    blocks = text.split("\n\n")
    for block in blocks:
        lines = block.strip("\n").split("\n")
        head = lines[0]
        if head.startswith("Vtable for ") and ours(head[len("Vtable for "):]):
            # "16    (int (*)(...))sparsebit::Quantizer::parameters": the slot's function.
            vtables[head[len("Vtable for "):]] = [re.sub(r"^\d+\s+", "", l) for l in lines[2:]]
        elif head.startswith("Class ") and ours(head[len("Class "):]):
            m = re.search(r"size=(\d+) align=(\d+)", lines[1])
            classes[head[len("Class "):]] = (int(m.group(1)), int(m.group(2)))
    return {c: (s, a, vtables.get(c)) for c, (s, a) in classes.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default="g++")
    ap.add_argument("--released", required=True)
    ap.add_argument("--current", required=True)
    ap.add_argument("-I", dest="includes", action="append", default=[])
    args = ap.parse_args()
    old = layout(args.cxx, args.released, args.includes)
    new = layout(args.cxx, args.current, args.includes)
    problems = []
    for name, (size, align, table) in sorted(old.items()):
        if name not in new:
            problems.append(f"{name} was removed")
            continue
        nsize, nalign, ntable = new[name]
        if name in GROWS_AT_THE_END:
            if nsize < size:
                problems.append(f"{name} shrank from {size} to {nsize} bytes")
        elif (nsize, nalign) != (size, align):
            problems.append(f"{name} changed size or alignment: {size}/{align} -> {nsize}/{nalign} bytes")
        table, ntable = table or [], ntable or []
        if name in HOST_IMPLEMENTED:
            if ntable[: len(table)] != table:
                problems.append(f"{name}: its virtual functions changed; the host's own interfaces may only "
                                f"add virtuals at the end")
            elif any("__cxa_pure_virtual" in slot for slot in ntable[len(table):]):
                problems.append(f"{name}: a virtual added at its end is pure; give it a body, or implementations "
                                f"outside the host (a plugin's test double) stop compiling")
        elif ntable != table:
            problems.append(f"{name}: its virtual table changed ({len(table)} -> {len(ntable)} slots); a plugin "
                            f"built before implements the old one: add a new interface instead "
                            f"(Note [Capabilities] in sparsebit/sdk/quantizer.h)")
    if problems:
        print(f"the SDK headers in {args.current} do not only grow from {args.released}:")
        for p in problems:
            print("  " + p)
        print("make it an addition (a new interface, a new Registrar method at the end), or bump kAbiVersion "
              "and the major version (docs/PLUGINS.md, Stability)")
        return 1
    print(f"check passed: {len(old)} classes of {args.released} keep their layout and virtual tables in "
          f"{args.current} ({len(new) - len(old)} new)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
