"""Fixtures of the Python package's tests: a local client, island servers in
processes of their own, and the paths ctest gives (CAUSEWAY_CLI,
CAUSEWAY_SOURCE_DIR)."""

import os
import pathlib
import signal
import subprocess

import pytest

import causeway


def source_dir():
    return pathlib.Path(os.environ.get("CAUSEWAY_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture
def local():
    client = causeway.local(accelerators=2, name="pytest")
    yield client
    del client


class Island:
    """A `causeway island` process on a free loopback port."""

    def __init__(self, name, accelerators=2):
        cli = os.environ.get("CAUSEWAY_CLI")
        if not cli:
            pytest.fail("CAUSEWAY_CLI is not set: ctest sets it to the causeway binary")
        self.process = subprocess.Popen(
            [cli, "island", "--listen", "127.0.0.1:0", "--name", name, f"--accelerators={accelerators}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline().split()
        if len(line) != 3 or line[0] != "island":
            self.process.kill()
            pytest.fail(f"island {name} did not start: {line} {self.process.stderr.read()}")
        self.name = name
        self.address = line[2]

    def kill(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def islands():
    started = [Island("east"), Island("west")]
    yield started
    for island in started:
        island.stop()
