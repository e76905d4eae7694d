#!/usr/bin/env python3
"""The tracker-number check: fails, naming file:line, for every line of a tracked file that cites
an issue of the project's tracker by number: the word "issue" or "issues" (any case), then an
optional space, an optional "#" and digits (PATTERN). Code, docs, tests and scripts say what and
why instead; history belongs in git log. References to other projects' trackers written as
owner/repo#N (grpc/grpc#20418) are not matched.

Usage: check_no_tracker_numbers.py [ROOT]      (ROOT: the repository, default: two folders up)
       check_no_tracker_numbers.py --self-test (plants hits in a temporary tree; they must be found)

The files are those `git ls-files` lists; without git (or outside a work tree) every file under
ROOT, except .git and build trees (folders holding a CMakeCache.txt). Files with a NUL byte are
skipped as binary. This file is skipped too, although its planted examples are assembled at run
time so that it holds no match itself (a plain `git grep` for the pattern finds nothing here).
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

PATTERN = re.compile(r"(?i)\bissues? ?#?[0-9]+")
SELF = "tests/layering/check_no_tracker_numbers.py"


def listed_files(root):
    """Paths relative to root, '/'-separated: git's tracked files, else a walk of the tree."""
    try:
        # safe.directory: CI may run as another user than the checkout's owner.
        out = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(root), "ls-files", "-z"],
                             capture_output=True, check=True).stdout
        files = [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d != ".git"
                               and not os.path.exists(os.path.join(folder, d, "CMakeCache.txt")))
        rel = os.path.relpath(folder, root)
        files += [n if rel == "." else f"{rel}/{n}".replace(os.sep, "/") for n in sorted(names)]
    return files


def hits(root, files):
    found = []
    for path in files:
        if path == SELF:
            continue
        try:
            data = (pathlib.Path(root) / path).read_bytes()
        except OSError:  # listed by git but deleted in the work tree, a dangling symlink, ...
            continue
        if b"\0" in data:
            continue
        text = data.decode("utf-8", "replace")
        for number, line in enumerate(text.splitlines(), 1):
            if PATTERN.search(line):
                shown = line.strip()
                found.append(f"{path}:{number}: {shown[:160]}{'...' if len(shown) > 160 else ''}")
    return found


def self_test():
    i = "issue"  # the citations below are assembled so that this file itself holds none
    planted = {
        "core/a.h": f"// Paged KV cache ({i} 18).\n// fine: a t{i} 5 and an {i} tracker\n",
        "deploy/b.yaml": f"# pods\n# with Prometheus ({i.title()}s 7 and 21).\n",
        "docs/c.md": f"Text.\n\nSee {i.upper()} #5 and {i}#12.\n",
        "tests/d.sh": "# upstream bug grpc/grpc#20418, containers/podman#16636\n",
        "e.bin": f"{i} 3\0binary\n",
        "tests/layering/check_no_tracker_numbers.py": f"{i} 1\n",  # SELF: skipped
    }
    expected = ["core/a.h:1:", "deploy/b.yaml:2:", "docs/c.md:3:"]
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for name, text in planted.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        (root / "build").mkdir()
        (root / "build" / "CMakeCache.txt").write_text(f"{i} 2\n")
        found = hits(root, listed_files(root))
    missed = [e for e in expected if not any(f.startswith(e) for f in found)]
    wrong = [f for f in found if not any(f.startswith(e) for e in expected)]
    if missed or wrong:
        print("self-test failed:\n  missed: %s\n  wrongly reported: %s" % (missed, wrong))
        return 1
    print(f"self-test: all {len(expected)} planted citations reported, nothing else")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).parents[2])
    files = listed_files(root)
    if not files:
        print(f"no_tracker_numbers: no file found under {root}")
        return 1
    found = hits(root, files)
    for line in found:
        print(line)
    if found:
        print(f"no_tracker_numbers: {len(found)} line(s) cite tracker issues by number: say what "
              "and why instead (history belongs in git log)")
        return 1
    print(f"no_tracker_numbers: none of {len(files)} files cites a tracker issue by number")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
