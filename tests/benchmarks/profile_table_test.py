#!/usr/bin/python3
"""profile_table.py on a canned `perf report -t ';'`: threads grouped into rows, objects into
columns, copies of one JIT kernel merged, shares summed, empty reports refused."""
import pathlib
import subprocess
import sys
import unittest

SCRIPT = pathlib.Path(__file__).with_name("profile_table.py")

BY_OBJECT = """# Samples: 17K of event 'cpu-clock:ppp'
#
# Overhead;Command        ;Shared Object
 60.00% ;attnserve-batch;[JIT] tid 23791
 5.00%  ;attnserve-batch;libdnnl.so.2.6
 4.00%  ;attnserve-batch;[kernel.kallsyms]
 3.00%  ;attnserve-batch;attnserve
 10.00% ;nexting_thread ;[kernel.kallsyms]
 8.00%  ;default-executo;libgrpc.so.29.0.0
 6.00%  ;nexting_thread ;libc.so.6
 4.00%  ;nexting_thread ;libprotobuf.so.32.0.12

"""

BY_SYMBOL = """# Overhead;Command;Shared Object;Symbol
 30.00% ;attnserve-batch;[JIT] tid 23791;[.] jit_brgemm_kernel_t
 25.00% ;attnserve-batch;[JIT] tid 23791;[.] jit_brgemm_kernel_t
 10.00% ;nexting_thread ;[kernel.kallsyms];[k] finish_task_switch.isra.0
 5.00%  ;default-executo;[kernel.kallsyms];[k] finish_task_switch.isra.0
 2.00%  ;attnserve;attnserve;[.] attnserve::core::Foo(int;float)
"""


def run(text, *args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], input=text, text=True,
                          capture_output=True, check=False)


class ProfileTableTest(unittest.TestCase):
    def test_threads_and_objects(self):
        result = run(BY_OBJECT)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                for line in result.stdout.splitlines()[2:]}
        header = [c.strip() for c in result.stdout.splitlines()[0].split("|")[2:-1]]
        # Columns with no samples ("other") are left out.
        self.assertEqual(header, ["oneDNN", "attnserve", "gRPC, protobuf",
                                  "libc, libstdc++, OpenMP", "kernel", "all"])
        self.assertEqual(rows["attnserve-batch"],
                         ["65.0 %", "3.0 %", "0.0 %", "0.0 %", "4.0 %", "72.0 %"])
        self.assertEqual(rows["gRPC and other threads"],
                         ["0.0 %", "0.0 %", "12.0 %", "6.0 %", "10.0 %", "28.0 %"])
        self.assertEqual(rows["all"], ["65.0 %", "3.0 %", "12.0 %", "6.0 %", "14.0 %", "100.0 %"])

    def test_symbols_merge_kernel_copies_and_thread_groups(self):
        result = run(BY_SYMBOL, "--symbols", "2")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(len(lines), 4)  # Header, rule, the two hottest.
        self.assertEqual(lines[2], "| attnserve-batch | [JIT] | `jit_brgemm_kernel_t` | 55.0 % |")
        self.assertEqual(lines[3], "| gRPC and other threads | [kernel.kallsyms] | "
                                   "`finish_task_switch.isra.0` | 15.0 % |")
        # A ';' inside a symbol stays in it.
        self.assertIn("`attnserve::core::Foo(int;float)`", run(BY_SYMBOL, "--symbols", "9").stdout)

    def test_an_empty_report_is_an_error(self):
        result = run("# nothing sampled\n")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no samples", result.stderr)


if __name__ == "__main__":
    unittest.main()
