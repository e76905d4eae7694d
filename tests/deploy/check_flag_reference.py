#!/usr/bin/python3
"""The flag reference in docs/SERVER.md ("## Flags") against `attnserve --help`, so neither can
drift from the other: every flag --help lists has a row in the table, every row names a flag the
binary has, and where --help shows a default, the row's default column starts with it (in
backticks: `0.0.0.0:50051`, `""` for an empty one).

  check_flag_reference.py --attnserve BIN [--root REPO]
"""
import argparse
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from attnserve_flags import Flags, parse_help  # noqa: E402
from checker import Checker  # noqa: E402

DOC = "docs/SERVER.md"
# A table row: | `--name` | `default` ... | meaning |
ROW = re.compile(r"^\| `--(?P<name>[a-z0-9-]+)` \| (?P<default>[^|]*)\|")
# Not in the table: CLI11's own --help.
UNDOCUMENTED = {"help"}


def table_rows(text):
    """{flag name: default cell} of the first table under "## Flags"."""
    section = text.split("\n## Flags\n", 1)
    if len(section) != 2:
        sys.exit(f"check_flag_reference: FAIL: {DOC} has no '## Flags' section")
    rows, started = {}, False
    for line in section[1].splitlines():
        if line.startswith("|"):
            started = True
            match = ROW.match(line)
            if match:
                rows[match["name"]] = match["default"].strip()
        elif started:
            break
    return rows


def documented_default(cell):
    """The first backticked value of a default cell ("" for `""`), or None."""
    match = re.match(r"`([^`]*)`", cell)
    if match is None:
        return None
    return "" if match[1] == '""' else match[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attnserve", required=True)
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parents[2])
    args = parser.parse_args()
    check = Checker()
    flags = parse_help(Flags(args.attnserve), check)
    rows = table_rows((args.root / DOC).read_text())
    for name, flag in sorted(flags.items()):
        if name in UNDOCUMENTED:
            continue
        if not check.expect(name in rows, DOC, f"--{name}", "a row in the Flags table",
                            "none (attnserve --help lists it)"):
            continue
        if flag.default is not None:
            shown = "" if flag.default == '""' else flag.default
            check.equal(DOC, f"--{name} default", shown, documented_default(rows[name]),
                        "attnserve --help")
    for name in sorted(set(rows) - set(flags)):
        check.fail(DOC, f"--{name}", "a flag attnserve --help lists", "a row for no such flag")
    for failure in check.failures:
        print(f"FAIL: {failure}")
    print(f"check_flag_reference: {check.checks} checks, {len(check.failures)} failures "
          f"({len(rows)} rows, {len(flags)} flags)")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
