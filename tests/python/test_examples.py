"""The Python examples (examples/python) run and check their own results,
in this process and on island servers."""

import os
import subprocess
import sys

from conftest import source_dir


def run_example(name, *args):
    path = source_dir() / "examples" / "python" / name
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ))


def test_matmul_pipeline_runs_locally():
    result = run_example("matmul_pipeline.py")
    assert result.returncode == 0, result.stderr
    assert "8 runs of 4 stages on local islands" in result.stdout


def test_matmul_pipeline_runs_on_island_servers(islands):
    result = run_example("matmul_pipeline.py", "--connect", ",".join(i.address for i in islands))
    assert result.returncode == 0, result.stderr
    assert "on remote islands" in result.stdout


def test_python_training_step_follows_the_cpp_trainer():
    # The example exits 1 unless the first step's loss is within 1e-4 of the
    # C++ trainer's and the last step's within 1e-2.
    result = run_example("train_lm.py", "--steps", "8", "--block", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "difference: first step" in result.stdout
