#!/usr/bin/python3
"""Guards attnserve.v1's compatibility promise: fields are only added, numbers never reused.

The proto is compiled with protoc into a descriptor set and flattened into one line per service
method, message field and enum value: its full name, number, name and type. The committed
snapshot (attnserve_v1_api.txt beside this file) must be a subset of the current lines: a line
that disappears is a removed, renumbered, renamed or retyped element — a break for clients built
against an earlier release — and fails the check. Lines the snapshot lacks are additions: the
check fails until they are recorded with --update, so every addition is seen in review.
--update appends new lines only; it never drops one, so a break cannot be recorded away.

  check_api_snapshot.py PROTOC PROTO_ROOT [--update]
  check_api_snapshot.py --self-test PROTOC
"""
import os
import subprocess
import sys
import tempfile

from google.protobuf import descriptor_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOT = os.path.join(HERE, "attnserve_v1_api.txt")
PROTO = "attnserve/v1/attention.proto"

LABELS = {v: k[len("LABEL_"):].lower() for k, v in descriptor_pb2.FieldDescriptorProto.Label.items()}
TYPES = {v: k[len("TYPE_"):].lower() for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()}


def api_lines(protoc, proto_root, proto=PROTO):
    """The proto's API, one sorted line per method, field and enum value."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "api.pb")
        subprocess.run([protoc, f"-I{proto_root}", f"--descriptor_set_out={out}", proto],
                       check=True)
        files = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            files.ParseFromString(f.read())
    lines = []
    for file in files.file:
        prefix = file.package
        for service in file.service:
            for method in service.method:
                lines.append(
                    f"rpc {prefix}.{service.name}.{method.name}"
                    f"({'stream ' if method.client_streaming else ''}{method.input_type.lstrip('.')})"
                    f" returns ({'stream ' if method.server_streaming else ''}"
                    f"{method.output_type.lstrip('.')})")
        for enum in file.enum_type:
            lines += enum_lines(f"{prefix}.{enum.name}", enum)
        for message in file.message_type:
            lines += message_lines(f"{prefix}.{message.name}", message)
    return sorted(lines)


def enum_lines(name, enum):
    return [f"enum {name} = {value.number} {value.name}" for value in enum.value]


def message_lines(name, message):
    lines = []
    for field in message.field:
        kind = field.type_name.lstrip(".") if field.type_name else TYPES[field.type]
        oneof = (f" oneof {message.oneof_decl[field.oneof_index].name}"
                 if field.HasField("oneof_index") and not field.proto3_optional else "")
        lines.append(f"field {name} = {field.number} {field.name} {LABELS[field.label]} {kind}"
                     f"{oneof}")
    for enum in message.enum_type:
        lines += enum_lines(f"{name}.{enum.name}", enum)
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += message_lines(f"{name}.{nested.name}", nested)
    return lines


def read_snapshot(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


def compare(snapshot, current):
    """(removed, added): snapshot lines missing from the proto, and its lines the snapshot lacks."""
    now = set(current)
    recorded = set(snapshot)
    return sorted(recorded - now), sorted(now - recorded)


def check(protoc, proto_root, update):
    current = api_lines(protoc, proto_root)
    snapshot = read_snapshot(SNAPSHOT)
    removed, added = compare(snapshot, current)
    for line in removed:
        print(f"BREAKING: {line}\n  is in the released API (tests/proto/attnserve_v1_api.txt) but "
              "not in the proto: fields and values are only ever added, never renumbered, "
              "renamed, retyped or removed (mark a retired number `reserved` and keep its line)")
    if update and not removed:
        with open(SNAPSHOT, "a") as f:
            for line in added:
                f.write(line + "\n")
        print(f"recorded {len(added)} new line(s) in {SNAPSHOT}")
        return 0
    for line in added:
        print(f"NEW: {line}\n  not yet in the snapshot: record it with "
              "tests/proto/check_api_snapshot.py PROTOC proto --update")
    if removed or added:
        return 1
    print(f"attnserve.v1 API matches its snapshot ({len(current)} lines)")
    return 0


def self_test(protoc):
    """A renumbered field, a renamed value and a removed method must be reported; an added field
    must be reported as new only."""
    proto = """syntax = "proto3";
package t;
service S { rpc A(M) returns (M); %s }
enum E { E_ZERO = 0; %s = 1; }
message M { int32 a = 1; %s }
"""
    with tempfile.TemporaryDirectory() as tmp:
        def lines(*parts):
            with open(os.path.join(tmp, "t.proto"), "w") as f:
                f.write(proto % parts)
            return api_lines(protoc, tmp, "t.proto")
        base = lines("rpc B(M) returns (stream M);", "E_ONE", "string b = 2;")
        assert "rpc t.S.B(t.M) returns (stream t.M)" in base, base
        assert "field t.M = 2 b optional string" in base, base
        removed, added = compare(base, lines("rpc B(M) returns (stream M);", "E_ONE",
                                             "string b = 2; int64 c = 3;"))
        assert not removed and added == ["field t.M = 3 c optional int64"], (removed, added)
        removed, _ = compare(base, lines("rpc B(M) returns (stream M);", "E_ONE", "string b = 3;"))
        assert removed == ["field t.M = 2 b optional string"], removed
        removed, _ = compare(base, lines("rpc B(M) returns (stream M);", "E_UNO", "string b = 2;"))
        assert removed == ["enum t.E = 1 E_ONE"], removed
        removed, _ = compare(base, lines("", "E_ONE", "string b = 2;"))
        assert removed == ["rpc t.S.B(t.M) returns (stream t.M)"], removed
        removed, _ = compare(base, lines("rpc B(M) returns (stream M);", "E_ONE", "bytes b = 2;"))
        assert removed == ["field t.M = 2 b optional string"], removed
    print("self-test passed")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--self-test":
        sys.exit(self_test(args[1]))
    if len(args) in (2, 3) and (len(args) == 2 or args[2] == "--update"):
        sys.exit(check(args[0], args[1], update=len(args) == 3))
    sys.exit(__doc__)
