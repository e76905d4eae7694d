#!/usr/bin/env python3
"""The layering check: fails, naming the file and the include, when a lower layer includes a
higher one, or when generated protobuf, gRPC or Prometheus headers appear outside the layers
allowed to see them.

Usage: check_layering.py [ROOT]      (ROOT: the repository, default: two folders up)
       check_layering.py --self-test (plants violations in a temporary tree; they must be found)
"""
import pathlib
import re
import sys
import tempfile

# Each folder and the project folders its files may include (its own always). A file belongs to
# the longest folder that prefixes its path; an include is located the same way.
BELOW_RUNTIME = ["server/repository", "server/batching", "core/model", "core/forward", "core/util"]
ALLOWED = {
    "core/util": [],
    "core/forward": ["core/util"],
    "core/model": ["core/forward", "core/util"],
    "core/kv_cache": ["core/forward", "core/util"],
    "server/batching": ["core/util"],
    "server/metrics": ["core/util"],
    "server/repository": ["core/model", "core/forward", "core/util"],
    "server/runtime": BELOW_RUNTIME,
    # Decoding sessions: the KV cache and the iteration scheduler, below any wire API.
    "server/decoding": ["server/batching", "core/kv_cache", "core/model", "core/forward",
                        "core/util"],
    "server/conversion": ["server/runtime"] + BELOW_RUNTIME,
    # One folder per wire protocol. The Open Inference Protocol reuses attnserve.v1's attention
    # validation; attnserve.v1 knows nothing of it.
    # attnserve.v1's Decode stream converts to the decoding runtime's plain types.
    "server/conversion/attnserve_v1": ["server/conversion", "server/runtime", "server/decoding",
                                       "server/batching", "core/kv_cache"] + BELOW_RUNTIME,
    "server/conversion/oip": ["server/conversion/attnserve_v1", "server/conversion",
                              "server/runtime"] + BELOW_RUNTIME,
    # The REST binding turns JSON into the protocol's messages and hands them to oip/.
    "server/conversion/oip_rest": ["server/conversion/oip", "server/conversion",
                                   "server/runtime"] + BELOW_RUNTIME,
    "server/service": ["server/conversion", "server/conversion/attnserve_v1",
                       "server/conversion/oip", "server/runtime", "server/decoding",
                       "server/metrics", "core/kv_cache"]
    + BELOW_RUNTIME,
    "server/http": ["server/service", "server/conversion", "server/conversion/oip",
                    "server/conversion/oip_rest", "server/runtime", "server/metrics"]
    + BELOW_RUNTIME,
    "server/app": ["server/http", "server/service", "server/conversion", "server/conversion/attnserve_v1",
                   "server/conversion/oip", "server/runtime", "server/decoding", "server/metrics",
                   "core/kv_cache"] + BELOW_RUNTIME,
    "client": ["core/util"],
}
# Third-party headers by prefix, and the folders that may include them.
RESTRICTED = {
    "generated protobuf": (re.compile(r"\.pb\.h$"), ["server/conversion", "server/service", "client"]),
    "gRPC": (re.compile(r"^(grpcpp|grpc)/"), ["server/conversion", "server/service", "server/app",
                                             "server/metrics", "client"]),
    "Prometheus": (re.compile(r"^prometheus/"), ["server/metrics"]),
    "cpp-httplib": (re.compile(r"^httplib\.h$"), ["server/http", "client"]),
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def folder_of(path):
    """The longest folder of ALLOWED that prefixes `path`, or None."""
    best = None
    for folder in ALLOWED:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def violations(root, counted=None):
    found = []
    for source in sorted(root.rglob("*")):
        if source.suffix not in (".h", ".cc") or not source.is_file():
            continue
        path = source.relative_to(root).as_posix()
        layer = folder_of(path)
        if layer is None:
            continue
        if counted is not None:
            counted.append(path)
        for number, line in enumerate(source.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            header = match.group(1)
            target = folder_of(header)
            if target is not None and target != layer and target not in ALLOWED[layer]:
                found.append(f"{path}:{number}: includes {header}: {layer}/ may include only "
                             f"{', '.join(ALLOWED[layer]) or 'itself'}")
            for what, (pattern, allowed) in RESTRICTED.items():
                if pattern.search(header) and folder_of_any(path, allowed) is None:
                    found.append(f"{path}:{number}: includes {header}: {what} headers belong in "
                                 f"{', '.join(allowed)} only")
    return found


def folder_of_any(path, folders):
    return next((f for f in folders if path == f or path.startswith(f + "/")), None)


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        planted = {
            "server/runtime/bad.h": '#include "server/service/attention_service.h"\n',
            "core/forward/bad.cc": '#include "attnserve/v1/attention.pb.h"\n',
            "server/batching/bad.h": '#include <grpcpp/grpcpp.h>\n',
            "core/model/bad.cc": '#include "server/repository/model_repository.h"\n',
            "server/decoding/bad.cc": '#include <prometheus/counter.h>\n'
                                      '#include "server/runtime/model_router.h"\n',
            "server/service/good.cc": '#include "server/runtime/model_router.h"\n'
                                      '#include "attnserve/v1/attention.grpc.pb.h"\n',
        }
        for name, text in planted.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        found = violations(root)
        expected = ["server/runtime/bad.h:1: includes server/service/attention_service.h",
                    "core/forward/bad.cc:1: includes attnserve/v1/attention.pb.h",
                    "server/batching/bad.h:1: includes grpcpp/grpcpp.h",
                    "core/model/bad.cc:1: includes server/repository/model_repository.h",
                    "server/decoding/bad.cc:1: includes prometheus/counter.h",
                    "server/decoding/bad.cc:2: includes server/runtime/model_router.h"]
        missed = [e for e in expected if not any(f.startswith(e) for f in found)]
        wrong = [f for f in found if f.startswith("server/service/good.cc")]
        if missed or wrong:
            print("self-test failed:\n  missed: %s\n  wrongly reported: %s" % (missed, wrong))
            return 1
        print(f"self-test: all {len(expected)} planted violations reported, the good file not")
        return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).parents[2])
    counted = []
    found = violations(root, counted)
    if not counted:
        print(f"layering: no source file found under {root}")
        return 1
    for line in found:
        print(line)
    if found:
        print(f"layering: {len(found)} include(s) cross the layers (see tests/layering)")
        return 1
    print(f"layering: every include of {len(counted)} files points down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
