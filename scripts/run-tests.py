#!/usr/bin/env python3
"""Runs the GoogleTest cases ctest selects, several to a process.

ctest starts one process per test case. In a sanitizer build a process costs
about a second before its test begins (a large instrumented binary, a Vulkan
instance), which is most of the time of a pass over the whole suite. This
runner asks ctest which cases a selection holds (the same -L/-LE/-R/-E
arguments, so the selection is ctest's own), runs each test binary's cases in
batches of at most --batch cases per process, JOBS processes at a time, and
reads each case's result from GoogleTest's output.

With --costs FILE (JSON: case name -> seconds, as a previous run wrote it), the
longest work starts first (--costs-from FILE, repeatable, for read-only
sources such as another build's or the repository's tests/test-costs.json):
each binary's cases are packed into processes of at
most --batch cases and about --chunk-seconds, and the processes are started
longest first, so that the run does not end with one job on a long case while
the others sit idle. Cases of unknown cost count as a second. After the run,
FILE holds this run's times of the cases it ran (merged with the rest).

A failed case fails the run and its output is printed; a failure is never
retried. A process that ends before all its cases report (a crash, a
sanitizer's report, a timeout) fails the case that was running, and the cases
it never reached run in a new process. A process that fails after all its
cases passed (a leak report at exit) has its cases run again one to a process,
to name the case that leaked. Tests that are not GoogleTest cases (corpus
replays, the install test) run as ctest would run them.

  scripts/run-tests.py BUILD_DIR [-j JOBS] [--batch N] [ctest selection...]
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time

RESULT = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] ([\w/.]+)(?: \((\d+) ms\))?$")
RUN = re.compile(r"^\[ RUN +\] ([\w/.]+)$")


class Case:
    def __init__(self, test):
        self.name = test["name"]
        self.command = test["command"]
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        self.cwd = props.get("WORKING_DIRECTORY")
        self.timeout = float(props.get("TIMEOUT", 1500))
        if "RESOURCE_LOCK" in props or "RUN_SERIAL" in props:
            raise SystemExit(f"run-tests: {self.name} has properties this runner does not honour")
        # ENVIRONMENT: NAME=VALUE settings on top of the runner's own.
        self.environment = tuple(props.get("ENVIRONMENT", []))
        self.env = dict(os.environ)
        for setting in self.environment:
            name, _, value = setting.partition("=")
            self.env[name] = value
        # ctest's name of a parameterized case carries its parameter after
        # the gtest name; the filter in its command is the gtest name alone.
        filt = [a[len("--gtest_filter="):] for a in self.command[1:] if a.startswith("--gtest_filter=")]
        self.gtest_name = filt[0] if len(filt) == 1 else ""
        self.gtest = bool(self.gtest_name) and re.fullmatch(r"[\w/.]+", self.gtest_name) is not None
        # The binary and every argument but the filter: cases that agree on
        # these can share a process.
        self.key = (self.cwd, self.environment,
                    tuple(a for a in self.command if not a.startswith("--gtest_filter=")))


class Runner:
    def __init__(self, jobs):
        self.jobs = jobs
        self.lock = threading.Lock()
        self.passed = 0
        self.skipped = 0
        self.failed = []  # case names
        self.done = 0
        self.total = 0
        self.times = {}  # case name -> seconds this run

    def report(self, name, status, seconds, output=""):
        with self.lock:
            self.done += 1
            self.times[name] = seconds
            if status == "OK":
                self.passed += 1
            elif status == "SKIPPED":
                self.skipped += 1
            else:
                self.failed.append(name)
            mark = {"OK": "Passed", "SKIPPED": "Skipped"}.get(status, "***" + status)
            print(f"{self.done:4d}/{self.total} {name} {'.' * max(3, 80 - len(name))} {mark}"
                  f" {seconds:6.2f} sec", flush=True)
            if output:
                print(output, end="" if output.endswith("\n") else "\n", flush=True)

    def run_process(self, argv, cwd, env, timeout):
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout, errors="replace")
            return proc.returncode, proc.stdout, time.monotonic() - start
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return None, out + f"\nrun-tests: the process passed its {timeout:.0f} s timeout and was killed\n", \
                time.monotonic() - start

    def run_single(self, case):
        code, out, secs = self.run_process(case.command, case.cwd, case.env, case.timeout)
        status = "OK" if code == 0 else ("Timeout" if code is None else "Failed")
        if code == 0 and case.gtest and re.search(r"\[  SKIPPED \]", out):
            status = "SKIPPED"
        self.report(case.name, status, secs, "" if status in ("OK", "SKIPPED") else out)

    def run_batch(self, cases):
        """Runs cases in one process; returns those it never reached."""
        joined = "--gtest_filter=" + ":".join(c.gtest_name for c in cases)
        argv = [joined if a.startswith("--gtest_filter=") else a for a in cases[0].command]
        timeout = min(sum(c.timeout for c in cases), 1500)
        code, out, secs = self.run_process(argv, cases[0].cwd, cases[0].env, timeout)
        by_name = {c.gtest_name: c for c in cases}
        results, sections, times, running, started_at = {}, {}, {}, None, 0
        lines = out.splitlines(keepends=True)
        for i, line in enumerate(lines):
            m = RUN.match(line.rstrip("\n"))
            if m and m.group(1) in by_name:
                running, started_at = m.group(1), i
                continue
            m = RESULT.match(line.rstrip("\n"))
            if m and m.group(2) == running:
                results[running] = m.group(1)
                if m.group(3) is not None:
                    times[running] = int(m.group(3)) / 1000
                sections[running] = "".join(lines[started_at:i + 1])
                running = None
        # A case's own time is GoogleTest's; the process's start and exit,
        # shared by its cases, is not counted in any case.
        per_case = secs / max(1, len(results) + (running is not None))
        for c in cases:
            if c.gtest_name in results:
                status = results[c.gtest_name]
                self.report(c.name, status, times.get(c.gtest_name, per_case), "" if status != "FAILED" else sections[c.gtest_name])
        if running is not None:
            # The process ended inside this case: a crash, a sanitizer's
            # report or a timeout. Its output from the case's start is the
            # evidence.
            self.report(by_name[running].name, "Timeout" if code is None else "Crashed", per_case,
                        f"exit status {code}\n" + "".join(lines[started_at:]))
            results[running] = "CRASHED"
        unreached = [c for c in cases if c.gtest_name not in results]
        if unreached and running is None:
            # The process ended between cases, or never ran these: nothing
            # says a new process would do better.
            for c in unreached:
                self.report(c.name, "NotRun", per_case, f"exit status {code}, the case never ran\n{out[-4000:]}")
            return []
        if code not in (0, None) and not unreached and running is None and \
                all(s in ("OK", "SKIPPED") for s in results.values()):
            # Every case passed but the process failed after them (a leak
            # report at exit): run each alone to find which.
            print(f"run-tests: {argv[0]} failed after its cases passed (exit status {code});"
                  f" running them one to a process\n{out[-4000:]}", flush=True)
            with self.lock:
                for c in cases:
                    self.done -= 1
                    if results[c.gtest_name] == "OK":
                        self.passed -= 1
                    else:
                        self.skipped -= 1
            for c in cases:
                self.run_single(c)
        return unreached

    def run(self, cases, batch, costs=None, chunk_seconds=20.0):
        self.total = len(cases)
        costs = costs or {}

        def cost(c):
            return costs.get(c.name, 1.0)

        groups = {}
        for c in cases:
            groups.setdefault(c.key if c.gtest else ("single", c.name), []).append(c)
        work = []
        for key, members in groups.items():
            if key[0] == "single":
                work.append(members)
                continue
            # Longest first, each process filled up to the batch or the
            # chunk's seconds (a case longer than that has a process alone).
            chunk, chunk_cost = [], 0.0
            for c in sorted(members, key=cost, reverse=True):
                if chunk and (len(chunk) == batch or chunk_cost + cost(c) > chunk_seconds):
                    work.append(chunk)
                    chunk, chunk_cost = [], 0.0
                chunk.append(c)
                chunk_cost += cost(c)
            if chunk:
                work.append(chunk)
        work.sort(key=lambda chunk: sum(cost(c) for c in chunk), reverse=True)
        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            pending = set()

            def submit(chunk):
                if len(chunk) == 1 and not chunk[0].gtest:
                    pending.add(pool.submit(self.run_single, chunk[0]))
                else:
                    pending.add(pool.submit(lambda ch=chunk: self.run_batch(ch)))

            for chunk in work:
                submit(chunk)
            while pending:
                finished, _ = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for f in finished:
                    pending.discard(f)
                    unreached = f.result()
                    if unreached:
                        submit(unreached)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--batch", type=int, default=16, help="most cases to a process")
    parser.add_argument("--costs", help="JSON of case seconds: read to start the longest work first,"
                        " written back with this run's times")
    parser.add_argument("--costs-from", action="append", default=[],
                        help="JSON of case seconds read for the cases --costs lacks (repeatable: a later"
                        " file wins over an earlier one)")
    parser.add_argument("--chunk-seconds", type=float, default=20.0,
                        help="with costs, the most seconds of cases packed into one process")
    parser.add_argument("--listing", help="read the selection from this file of ctest --show-only=json-v1"
                        " output instead of asking ctest (the runner's own tests)")
    args, selection = parser.parse_known_args()
    if args.listing:
        with open(args.listing) as f:
            listing = f.read()
    else:
        listing = subprocess.run(["ctest", "--test-dir", args.build_dir, "--show-only=json-v1"] + selection,
                                 stdout=subprocess.PIPE, check=True, text=True).stdout
    cases = [Case(t) for t in json.loads(listing)["tests"]]
    if not cases:
        raise SystemExit("run-tests: the selection holds no tests")
    costs = {}
    for path in args.costs_from + [args.costs]:  # later files win; --costs over all
        if path and os.path.exists(path):
            with open(path) as f:
                costs.update(json.load(f))
    runner = Runner(args.jobs)
    start = time.monotonic()
    runner.run(cases, max(1, args.batch), costs, args.chunk_seconds)
    if args.costs:
        saved = {}
        if os.path.exists(args.costs):
            with open(args.costs) as f:
                saved = json.load(f)
        saved.update({name: round(secs, 3) for name, secs in runner.times.items()})
        with open(args.costs + ".tmp", "w") as f:
            json.dump(saved, f, indent=0, sort_keys=True)
        os.replace(args.costs + ".tmp", args.costs)
    failed = sorted(runner.failed)
    print(f"\n{runner.passed} passed, {runner.skipped} skipped, {len(failed)} failed of {len(cases)}"
          f" in {time.monotonic() - start:.0f} s")
    for name in failed:
        print(f"  FAILED: {name}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
