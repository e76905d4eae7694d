#!/usr/bin/python3
"""A decoding round's phases from uprobe events: profile_decode_round.sh's summary.

Reads `perf script -F time,event` output of the uprobes profile_decode_round.sh sets (the event
names below; a name ending in _r is the function's return) and prints, as a Markdown table, the
median and mean of each phase over the rounds that passed every probe once. A round starts when a
Decode message is read (onmsg) and ends when the next one is.

Usage: perf script -i perf.data -F time,event | round_phases.py
"""
import re
import statistics
import sys

# (event, phase that ends at it); the first event starts the round.
PHASES = [
    ("onmsg", None),
    ("append", "message parsed, steps prepared"),
    ("append_r", "steps queued"),
    ("run", "the loop picks them up"),
    ("fwd", "iteration set up"),
    ("fwd_r", "forward pass"),
    ("ans", "outputs split, answer built"),
    ("ans_r", "answer written"),
]
EVENT = re.compile(r"(\d+\.\d+):\s+\S+?:(\w+):")


def rounds(lines):
    """Each complete round as {event: seconds}, in order, and the next round's start."""
    names = [name for name, _ in PHASES]
    current, complete = None, []
    for line in lines:
        match = EVENT.search(line)
        if not match:
            continue
        seconds, name = float(match.group(1)), match.group(2)
        if name == names[0]:
            if current is not None and len(current) == len(names):
                complete.append((current, seconds))
            current = {name: seconds}
        elif current is not None and name in names and name not in current:
            # Only in order: a probe hit out of turn (another stream's message) spoils the round.
            if names.index(name) == len(current):
                current[name] = seconds
    return complete


def table(complete):
    rows = []
    for i in range(1, len(PHASES)):
        name, phase = PHASES[i]
        before = PHASES[i - 1][0]
        rows.append((phase, [(r[name] - r[before]) * 1e6 for r, _ in complete]))
    last = PHASES[-1][0]
    rows.append(("client and loopback, to the next message", [(nxt - r[last]) * 1e6
                                                              for r, nxt in complete]))
    rows.append(("round", [(nxt - r[PHASES[0][0]]) * 1e6 for r, nxt in complete]))
    out = [f"{len(complete)} rounds", "", "| phase | median µs | mean µs |", "|---|---:|---:|"]
    for phase, values in rows:
        out.append(f"| {phase} | {statistics.median(values):.0f} | {statistics.mean(values):.0f} |")
    return "\n".join(out)


def main():
    complete = rounds(sys.stdin)
    if not complete:
        print("round_phases.py: no complete round in the input", file=sys.stderr)
        return 1
    print(table(complete))
    return 0


if __name__ == "__main__":
    sys.exit(main())
