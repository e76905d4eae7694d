#!/usr/bin/python3
"""round_phases.py on canned `perf script -F time,event` output."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import round_phases  # noqa: E402

# One round of 2,000 µs: parse 100, queue 40, loop 60, set-up 20, forward 900, answer 80,
# write 100, client 700 (to the next message).
ROUND = [(0, "onmsg"), (100, "append"), (140, "append_r"), (200, "run"), (220, "fwd"),
         (1120, "fwd_r"), (1200, "ans"), (1300, "ans_r")]


def lines(start_us, events, extra=()):
    out = [f"  {(start_us + t) * 1e-6 + 100:.6f}:   attnserve_round:{name}: (55fa9fdd4540)"
           for t, name in list(events) + list(extra)]
    return sorted(out, key=lambda line: float(line.split(":")[0]))


class RoundPhasesTest(unittest.TestCase):
    def test_phases_of_complete_rounds(self):
        text = lines(0, ROUND) + lines(2000, ROUND) + lines(4000, ROUND[:1])
        complete = round_phases.rounds(text)
        self.assertEqual(len(complete), 2)
        table = round_phases.table(complete)
        self.assertIn("2 rounds", table)
        self.assertIn("| forward pass | 900 | 900 |", table)
        self.assertIn("| the loop picks them up | 60 | 60 |", table)
        self.assertIn("| client and loopback, to the next message | 700 | 700 |", table)
        self.assertIn("| round | 2000 | 2000 |", table)

    def test_a_round_missing_a_probe_or_out_of_order_is_left_out(self):
        missing = [e for e in ROUND if e[1] != "fwd_r"]
        swapped = ROUND[:3] + [(190, "fwd"), (200, "run")] + ROUND[5:]  # Forward before the run.
        text = lines(0, missing) + lines(2000, swapped) + lines(4000, ROUND) + lines(6000, ROUND[:1])
        complete = round_phases.rounds(text)
        self.assertEqual(len(complete), 1)
        self.assertAlmostEqual(complete[0][1] - complete[0][0]["onmsg"], 2000e-6, places=9)

    def test_other_events_are_ignored(self):
        text = lines(0, ROUND, extra=[(50, "onmsg_r"), (1250, "qans")]) + lines(2000, ROUND[:1])
        self.assertEqual(len(round_phases.rounds(text)), 1)


if __name__ == "__main__":
    unittest.main()
