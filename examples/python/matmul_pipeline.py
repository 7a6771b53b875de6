"""A pipeline of four matmul stages written in Python, one accelerator each
(as examples/pipeline.textproto and `causeway demo`): stage s computes
x[s+1] = gelu(x[s] @ w[s]), and each edge between stages is a
device-to-device transfer. Eight runs are started at once, so the stages of
different runs overlap; each result is checked against numpy.

    PYTHONPATH=build/python python3 examples/python/matmul_pipeline.py [--connect HOST:PORT,...]

With --connect, the same code runs on island servers (each stage's mesh on
island s % N)."""

import argparse
import sys
import time

import numpy as np

import causeway

ROWS, WIDTH, STAGES, RUNS = 64, 128, 4, 8


def gelu(u):
    return 0.5 * u * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (u + 0.044715 * u ** 3)))


def stage_function():
    """gelu(x @ w) fused into one function: a GEMM, then a bias-GELU with a
    zero bias."""
    f = causeway.FunctionBuilder("stage")
    x, w, bias = f.input((ROWS, WIDTH)), f.input((WIDTH, WIDTH)), f.input((WIDTH,))
    h, y = f.scratch((ROWS, WIDTH)), f.output((ROWS, WIDTH))
    f.add(causeway.ops.gemm(ROWS, WIDTH, WIDTH), [x, w, h])
    f.add(causeway.ops.bias_gelu(ROWS, WIDTH), [h, bias, y])
    return f.build()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", help="island servers, HOST:PORT,... (default: in this process)")
    parser.add_argument("--secret-file")
    args = parser.parse_args(argv)
    if args.connect:
        client = causeway.connect(args.connect.split(","), secret_file=args.secret_file)
    else:
        client = causeway.local(accelerators=STAGES)

    meshes = [client.mesh([1], island=s % client.island_count) for s in range(STAGES)]
    stage = stage_function()
    b = causeway.ProgramBuilder("matmul-pipeline")
    for s in range(STAGES):
        b.mesh(f"s{s}", [1])
        b.parameter(f"w{s}", f"s{s}", (WIDTH, WIDTH))
        b.parameter(f"zero{s}", f"s{s}", (WIDTH,))
    b.parameter("x0", "s0", (ROWS, WIDTH))
    for s in range(STAGES):
        b.call(f"stage{s}", stage, f"s{s}", [f"x{s}", f"w{s}", f"zero{s}"], [f"x{s + 1}"])
    b.output(f"x{STAGES}")
    program = client.load(b.build(), {f"s{s}": meshes[s] for s in range(STAGES)})

    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32) for _ in range(STAGES)]
    held = []
    for s in range(STAGES):
        held += [client.put(weights[s], meshes[s]), client.put(np.zeros(WIDTH, dtype=np.float32), meshes[s])]
    inputs = [rng.standard_normal((ROWS, WIDTH)).astype(np.float32) for _ in range(RUNS)]

    start = time.perf_counter()
    runs = [program(held + [client.put(x, meshes[0])]) for x in inputs]  # all started before any ends
    results = [outputs[0].numpy(timeout=120) for outputs, _ in runs]
    seconds = time.perf_counter() - start

    worst = 0.0
    for x, got in zip(inputs, results):
        want = x.astype(np.float64)
        for w in weights:
            want = gelu(want @ w)
        worst = max(worst, float(np.abs(got - want).max()))
    print(f"{RUNS} runs of {STAGES} stages on {client.kind} islands in {seconds:.3f} s; "
          f"largest difference from numpy {worst:.2e}")
    if worst > 1e-4:
        print("FAILED: results differ from numpy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
