"""The Dockerfile, final stage only: its ENV (under every place's flags) and EXPOSE.

Part of check_manifests.py, whose header says what is checked.
"""
import re
import shlex


def read_dockerfile(root, check):
    path = root / "Dockerfile"
    if not check.expect(path.is_file(), "Dockerfile", "file", "the image's Dockerfile",
                        "no such file"):
        return None
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    stage = []
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        if words[0].upper() == "FROM":
            stage = []
        stage.append((words[0].upper(), words[1] if len(words) > 1 else ""))
    return stage


def dockerfile_env(stage):
    env = {}
    for instruction, rest in stage or []:
        if instruction != "ENV":
            continue
        words = shlex.split(rest)
        if words and "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
        else:
            env.update(w.split("=", 1) for w in words if "=" in w)
    return env


def dockerfile_exposed(stage):
    ports = []
    for instruction, rest in stage or []:
        if instruction == "EXPOSE":
            ports += [int(p.split("/")[0]) for p in rest.split() if p.split("/")[0].isdigit()]
    return ports


def check_dockerfile(stage, image_ports, check):
    if stage is None:
        return
    exposed = dockerfile_exposed(stage)
    check.equal("Dockerfile", "EXPOSE", sorted(p for p in image_ports if p), sorted(exposed),
                "the gRPC, metrics and REST ports of --help's defaults and the Dockerfile's ENV")
