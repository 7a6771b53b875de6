#!/usr/bin/env python3
"""Tests of scripts/run-tests.py, the sanitizer suites' runner, against a fake
GoogleTest binary: what it reports for each outcome, and which processes it
starts. A runner that passed a failed case would pass a red suite."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

RUNNER = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "run-tests.py")

# Behaves as a GoogleTest binary for --gtest_filter=A:B:...; what each case
# does follows its name. Every start is logged with its filter.
FAKE = textwrap.dedent("""\
    import os, sys, time
    names = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--gtest_filter=")][0].split(":")
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(":".join(names) + "\\n")
    leak = False
    for n in names:
        print(f"[ RUN      ] {n}", flush=True)
        if "Crash" in n:
            print("AddressSanitizer: heap-use-after-free", flush=True)
            os._exit(1)
        if "Hang" in n:
            time.sleep(60)
        if "Fail" in n or ("Env" in n and os.environ.get("FAKE_SETTING") != "on"):
            print(f"fake.cc:1: Failure in {n}")
            print(f"[  FAILED  ] {n} (1 ms)")
        elif "Slow" in n:
            print(f"[       OK ] {n} (1234 ms)")
        elif "Skip" in n:
            print(f"[  SKIPPED ] {n} (0 ms)")
        else:
            print(f"[       OK ] {n} (1 ms)")
        leak = leak or "Leak" in n
    if leak:
        print("LeakSanitizer: detected memory leaks")
        sys.exit(23)
    """)


class RunTestsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.fake = os.path.join(self.dir.name, "fake_test.py")
        with open(self.fake, "w") as f:
            f.write(FAKE)
        self.log = os.path.join(self.dir.name, "starts.log")

    def tearDown(self):
        self.dir.cleanup()

    def run_cases(self, names, batch=16, timeout=300, extra=(), environment=None):
        tests = [{
            "name": n,
            "command": [sys.executable, self.fake, f"--gtest_filter={n}", "--gtest_also_run_disabled_tests"],
            "properties": [{"name": "TIMEOUT", "value": timeout},
                           {"name": "WORKING_DIRECTORY", "value": self.dir.name}] +
                          ([{"name": "ENVIRONMENT", "value": environment}] if environment else []),
        } for n in names]
        listing = os.path.join(self.dir.name, "listing.json")
        with open(listing, "w") as f:
            json.dump({"tests": tests}, f)
        proc = subprocess.run([sys.executable, RUNNER, self.dir.name, "-j", "2", "--batch", str(batch),
                               "--listing", listing, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=dict(os.environ, FAKE_LOG=self.log), timeout=120)
        with open(self.log) as f:
            starts = [line.strip() for line in f]
        return proc.returncode, proc.stdout, starts

    def test_passing_cases_share_processes_up_to_the_batch(self):
        names = [f"S.Pass{i}" for i in range(5)]
        code, out, starts = self.run_cases(names, batch=2)
        self.assertEqual(code, 0, out)
        self.assertIn("5 passed, 0 skipped, 0 failed of 5", out)
        self.assertEqual(sorted(starts), sorted(["S.Pass0:S.Pass1", "S.Pass2:S.Pass3", "S.Pass4"]))

    def test_a_failed_case_fails_the_run_with_its_output_and_is_not_retried(self):
        code, out, starts = self.run_cases(["S.Pass0", "S.Fail1", "S.Pass2"])
        self.assertEqual(code, 1)
        self.assertIn("2 passed, 0 skipped, 1 failed of 3", out)
        self.assertIn("FAILED: S.Fail1", out)
        self.assertIn("fake.cc:1: Failure in S.Fail1", out)
        self.assertEqual(starts, ["S.Pass0:S.Fail1:S.Pass2"])

    def test_a_crash_fails_its_case_and_the_rest_run_in_a_new_process(self):
        code, out, starts = self.run_cases(["S.Pass0", "S.Crash1", "S.Pass2", "S.Pass3"])
        self.assertEqual(code, 1)
        self.assertIn("S.Crash1", out)
        self.assertIn("***Crashed", out)
        self.assertIn("heap-use-after-free", out)
        self.assertIn("3 passed, 0 skipped, 1 failed of 4", out)
        self.assertEqual(starts, ["S.Pass0:S.Crash1:S.Pass2:S.Pass3", "S.Pass2:S.Pass3"])

    def test_a_failure_after_every_case_passed_is_pinned_on_its_case(self):
        code, out, starts = self.run_cases(["S.Pass0", "S.Leak1", "S.Pass2"])
        self.assertEqual(code, 1)
        self.assertIn("2 passed, 0 skipped, 1 failed of 3", out)
        self.assertIn("FAILED: S.Leak1", out)
        self.assertEqual(starts[0], "S.Pass0:S.Leak1:S.Pass2")
        self.assertEqual(sorted(starts[1:]), ["S.Leak1", "S.Pass0", "S.Pass2"])

    def test_a_hung_case_times_out_and_the_rest_still_run(self):
        code, out, starts = self.run_cases(["S.Hang0", "S.Pass1"], timeout=2)
        self.assertEqual(code, 1)
        self.assertIn("***Timeout", out)
        self.assertIn("1 passed, 0 skipped, 1 failed of 2", out)
        self.assertEqual(starts, ["S.Hang0:S.Pass1", "S.Pass1"])

    def test_each_case_reports_its_own_time_not_the_process_average(self):
        # A batch's time is shared out only for cases GoogleTest gave no time
        # for: the slow case is named as slow, the fast ones as fast.
        code, out, _ = self.run_cases(["S.Pass0", "S.Slow1", "S.Pass2"])
        self.assertEqual(code, 0, out)
        self.assertRegex(out, r"S\.Slow1 \.+ Passed +1\.23 sec")
        self.assertRegex(out, r"S\.Pass0 \.+ Passed +0\.00 sec")

    def test_costs_pack_processes_and_are_written_back(self):
        # Known costs pack each binary's cases longest first into processes
        # of about --chunk-seconds; the run's own times are written back.
        costs = os.path.join(self.dir.name, "costs.json")
        with open(costs, "w") as f:
            json.dump({"S.Pass0": 15, "S.Pass1": 1, "S.Pass2": 15, "S.Pass3": 1, "Other.Case": 7}, f)
        code, out, starts = self.run_cases(["S.Pass0", "S.Pass1", "S.Pass2", "S.Pass3", "S.Slow4"],
                                           extra=["--costs", costs, "--chunk-seconds", "20"])
        self.assertEqual(code, 0, out)
        # Sorted by cost (ties in listing order): 0 (15) alone, then 2 (15)
        # with the unknown Slow4 (1) and Pass1 and Pass3 (1 each): 18 s.
        self.assertEqual(sorted(starts), sorted(["S.Pass0", "S.Pass2:S.Pass1:S.Pass3:S.Slow4"]))
        with open(costs) as f:
            written = json.load(f)
        self.assertEqual(written["S.Slow4"], 1.234)
        self.assertEqual(written["S.Pass0"], 0.001)
        self.assertEqual(written["Other.Case"], 7)  # not run: kept

    def test_a_case_runs_with_its_environment_property(self):
        code, out, _ = self.run_cases(["S.Env0"])
        self.assertEqual(code, 1)  # the control: without the setting it fails
        code, out, _ = self.run_cases(["S.Env0"], environment=["FAKE_SETTING=on"])
        self.assertEqual(code, 0, out)

    def test_skipped_cases_are_counted_as_skipped(self):
        code, out, _ = self.run_cases(["S.Skip0", "S.Pass1"])
        self.assertEqual(code, 0, out)
        self.assertIn("1 passed, 1 skipped, 0 failed of 2", out)

    def test_a_case_the_binary_never_runs_fails(self):
        # A process that exits cleanly without running a selected case (a
        # filter that matched nothing) must not pass it.
        names = ["S.Pass0", "S.Pass1"]
        code, out, _ = self.run_cases(names)
        self.assertEqual(code, 0, out)  # the control: the whole fake runs both
        fake_skipping = FAKE.replace("for n in names:", "for n in names[:1]:")
        with open(self.fake, "w") as f:
            f.write(fake_skipping)
        code, out, _ = self.run_cases(names)
        self.assertEqual(code, 1)
        self.assertIn("***NotRun", out)
        self.assertIn("FAILED: S.Pass1", out)


if __name__ == "__main__":
    unittest.main()
