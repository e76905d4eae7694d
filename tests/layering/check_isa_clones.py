#!/usr/bin/env python3
"""The ISA-clones check: every function compiled per ISA level (ATTNSERVE_PER_ISA_CLONES, from
core/util/per_isa_clones.h) must have no earlier declaration, so its name may appear in no header
and nowhere in its own file before the definition. Clang 14 compiles a target_clones function
that was declared before without the attribute as a single AVX-512 function with no dispatch
(SIGILL on AVX2 CPUs), and calls from other files to a declaration that carries the attribute go
to its resolver; the cloned function is therefore internal, and the public one calls it.

Usage: check_isa_clones.py [ROOT]       (ROOT: the repository, default: two folders up)
       check_isa_clones.py --self-test  (plants violations in a temporary tree; they must be found)
Fails naming file:line for each violation.
"""
import pathlib
import re
import sys
import tempfile

MACRO = "ATTNSERVE_PER_ISA_CLONES"
DEFINITION = re.compile(MACRO + r"\s+[^;{(]*?\b(\w+)\s*\(")
FOLDERS = ("core", "server", "client", "tests", "tools")
HEADER = "core/util/per_isa_clones.h"


def sources(root):
    for folder in FOLDERS:
        base = root / folder
        if base.is_dir():
            yield from sorted(p for p in base.rglob("*") if p.suffix in (".h", ".cc"))


def violations(root):
    root = pathlib.Path(root)
    files = {p.relative_to(root).as_posix(): p.read_text(errors="replace") for p in sources(root)}
    found = []
    for path, text in files.items():
        if path == HEADER:
            continue
        for match in DEFINITION.finditer(text):
            name = match.group(1)
            line = text.count("\n", 0, match.start()) + 1
            if path.endswith(".h"):
                found.append(f"{path}:{line}: {name} is compiled per ISA level in a header")
                continue
            call = re.compile(r"\b" + name + r"\s*\(")
            if call.search(text, 0, match.start()):
                found.append(f"{path}:{line}: {name} is declared before its per-ISA definition")
            for other, other_text in files.items():
                if other.endswith(".h") and call.search(other_text):
                    found.append(f"{path}:{line}: {name} is compiled per ISA level but {other} "
                                 "declares it; clone an internal function that it calls")
    return found


def self_test():
    planted = {
        "core/a.h": "int Shared(int x);\n",
        "core/a.cc": f"#include \"core/a.h\"\n{MACRO} int Shared(int x) {{ return x; }}\n",
        "core/b.cc": f"int Early(int);\n{MACRO} int Early(int x) {{ return x; }}\n",
        "core/c.h": f"{MACRO} inline int InHeader(int x) {{ return x; }}\n",
        "core/fine.cc": (f"namespace {{\n{MACRO} int FineClones(int x) {{ return x; }}\n}}\n"
                         "int Fine(int x) { return FineClones(x); }\n"),
    }
    expected = ["core/a.cc:2:", "core/b.cc:2:", "core/c.h:1:"]
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for name, text in planted.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        found = violations(root)
    reported = sorted({v.split(" ", 1)[0] for v in found})
    if reported != expected:
        print(f"self-test: expected {expected}, got {found}")
        return 1
    print("self-test: every planted violation found, and only those")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    found = violations(root)
    for violation in found:
        print(violation)
    if not found:
        print(f"{MACRO}: every cloned function is internal and undeclared before its definition")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
