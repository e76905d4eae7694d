"""Counting checks and collecting failures, and the helpers every part of the check uses.

Part of check_manifests.py, whose header says what is checked.
"""
import json

import yaml

PROG = "check_manifests"


class Checker:
    """Counts checks and collects failures as `file: field: expected X, found Y`."""

    def __init__(self):
        self.checks = 0
        self.failures = []

    def fail(self, file, field, expected, found):
        message = f"{file}: {field}: expected {expected}, found {found}"
        if message not in self.failures:  # e.g. the Dockerfile's ENV, read for compose and k8s
            self.failures.append(message)

    def expect(self, ok, file, field, expected, found):
        self.checks += 1
        if not ok:
            self.fail(file, field, expected, found)
        return ok

    def equal(self, file, field, expected, found, why=""):
        suffix = f" ({why})" if why else ""
        return self.expect(expected == found, file, field, f"{expected!r}{suffix}", repr(found))


def get(node, *path):
    """node[path[0]][path[1]]..., or None as soon as a step is missing."""
    for key in path:
        if isinstance(node, dict):
            node = node.get(key)
        elif isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
            node = node[key]
        else:
            return None
    return node


def walk(node):
    """Every mapping in node (node first, then depth first)."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def whole(number):
    """2.0 → 2, so that messages show numbers as they are written."""
    return int(number) if number is not None and float(number).is_integer() else number


# ------------------------------------------------------------------------------------------------
# Parsing every file.


def load_files(root, check):
    """{relative path: [documents]} for every YAML under deploy/ and deploy/grafana/*.json."""
    docs = {}
    deploy = root / "deploy"
    paths = sorted(p for p in deploy.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".json" and path.parent != deploy / "grafana":
            continue
        check.checks += 1
        try:
            text = path.read_text(encoding="utf-8")
            docs[rel] = [json.loads(text)] if path.suffix == ".json" else [
                d for d in yaml.safe_load_all(text) if d is not None]
        except (OSError, ValueError, yaml.YAMLError) as error:
            check.fail(rel, "parse", "valid " + path.suffix[1:].upper(), parse_error(error))
    return docs


def parse_error(error):
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return str(error)
    return f"{error.problem} at line {mark.line + 1}, column {mark.column + 1}"
