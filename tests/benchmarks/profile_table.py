#!/usr/bin/python3
"""Reads `perf report --sort comm,dso --stdio -g none -t ';'` on stdin and prints a Markdown table:
the share of all samples by thread (rows) and by the code the samples ran (columns). With
`--symbols N`, reads `--sort comm,dso,sym` instead and prints the N hottest symbols, the copies of
one oneDNN JIT kernel (one per shape) merged into one line.

Used by server_bench_lib.sh's print_profile (profile_server.sh). gRPC's threads (nexting_thread,
default-executor, ...) are one row; attnserve's keep their names: attnserve-batch is a batch thread
or an OpenMP worker it spawned, attnserve the main thread, the decode loop and their OpenMP workers.
"""
import collections
import sys

COLUMNS = ["oneDNN", "attnserve", "gRPC, protobuf", "libc, libstdc++, OpenMP", "kernel", "other"]
GRPC_LIBRARIES = ("libgrpc", "libgpr", "libabsl", "libprotobuf", "libupb", "libaddress_sorting",
                  "libssl", "libcrypto", "libcares", "libre2", "libz.")
RUNTIME_LIBRARIES = ("libc.", "libstdc++", "libgomp", "ld-linux", "libm.")


def column_of(dso):
    if dso.startswith("[JIT]") or dso.startswith("libdnnl"):
        return "oneDNN"
    if dso == "attnserve":
        return "attnserve"
    if dso.startswith(GRPC_LIBRARIES):
        return "gRPC, protobuf"
    if dso.startswith(RUNTIME_LIBRARIES):
        return "libc, libstdc++, OpenMP"
    if dso.startswith("[kernel"):
        return "kernel"
    return "other"


def row_of(comm):
    return comm if comm.startswith("attnserve") else "gRPC and other threads"


def fields(line):
    """The report line's fields, or None for a comment or a blank line."""
    if line.startswith("#") or ";" not in line:
        return None
    values = [field.strip() for field in line.split(";")]
    return [float(values[0].rstrip("%"))] + values[1:]


def print_symbols(top):
    shares = collections.Counter()
    for line in sys.stdin:
        values = fields(line)
        if values is None:
            continue
        overhead, comm, dso, symbol = values[0], values[1], values[2], ";".join(values[3:])
        dso = "[JIT]" if dso.startswith("[JIT]") else dso
        shares[(row_of(comm), dso, symbol.removeprefix("[.] ").removeprefix("[k] "))] += overhead
    print("| thread | object | symbol | samples |")
    print("|---|---|---|---:|")
    for (row, dso, symbol), share in shares.most_common(top):
        print(f"| {row} | {dso} | `{symbol}` | {share:.1f} % |")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--symbols":
        return print_symbols(int(sys.argv[2]))
    shares = collections.defaultdict(collections.Counter)
    for line in sys.stdin:
        values = fields(line)
        if values is not None:
            shares[row_of(values[1])][column_of(values[2])] += values[0]
    if not shares:
        sys.exit("profile_table.py: no samples in the perf report")
    columns = [c for c in COLUMNS if any(row[c] >= 0.05 for row in shares.values())]
    print("| thread | " + " | ".join(columns) + " | all |")
    print("|---|" + "---:|" * (len(columns) + 1))
    totals = collections.Counter()
    for name, row in sorted(shares.items(), key=lambda item: -sum(item[1].values())):
        totals.update(row)
        cells = [f"{row[c]:.1f} %" for c in columns] + [f"{sum(row.values()):.1f} %"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"{totals[c]:.1f} %" for c in columns] + [f"{sum(totals.values()):.1f} %"]
    print("| all | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
