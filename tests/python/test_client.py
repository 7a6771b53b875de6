"""The causeway Python package against lavapipe: arrays in and out for every
dtype, programs built in Python and from files, custom kernels, collectives
and reshards checked against numpy, futures (blocking, with timeouts, from
asyncio), the GIL released while waiting, traces, errors as exceptions, and
the same code on island servers, one of them killed."""

import asyncio
import json
import struct
import threading
import time

import numpy as np
import pytest

import causeway
from conftest import source_dir


def saxpy_source():
    return (source_dir() / "examples" / "saxpy.comp").read_text()


# ---- arrays -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("shape", [(7,), (4, 6), (2, 3, 4)])
def test_put_and_numpy_give_back_the_same_array(local, dtype, shape):
    mesh = local.mesh([2])
    rng = np.random.default_rng(3)
    data = (rng.standard_normal(shape) * 100).astype(dtype)
    replicated = local.put(data, mesh)
    assert replicated.shape == shape
    assert replicated.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(replicated.numpy(), data)
    if shape[0] % 2 == 0:
        split = local.put(data, mesh, causeway.split(0))
        np.testing.assert_array_equal(split.numpy(timeout=10), data)
    # A strided view goes as its row-major copy.
    view = data[..., ::-1]
    np.testing.assert_array_equal(local.put(view, mesh).numpy(), view)


def test_every_sharding_of_a_2d_mesh_round_trips():
    client = causeway.local(accelerators=4, name="mesh2d")
    mesh = client.mesh([2, 2])
    data = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    for sharding in [causeway.replicated(), causeway.split(0), causeway.split(1), causeway.split(0, mesh_axis=1),
                     causeway.split(1, mesh_axis=1)]:
        np.testing.assert_array_equal(client.put(data, mesh, sharding).numpy(), data, err_msg=repr(sharding))
    with pytest.raises(ValueError):
        client.put(data, mesh, causeway.split(0, mesh_axis=2))


def test_bad_arrays_are_refused_naming_what_is_wrong(local):
    mesh = local.mesh([2])
    with pytest.raises(ValueError, match="dtype float64 is not one of Causeway's"):
        local.put(np.zeros(4), mesh)
    with pytest.raises(causeway.InvalidArgumentError, match="int64"):
        local.put(np.zeros(4, dtype=np.int64), mesh)
    with pytest.raises(ValueError, match="at least one dimension"):
        local.put(np.float32(1.0), mesh)
    with pytest.raises(ValueError) as error:
        local.put(np.zeros(5, dtype=np.float32), mesh, causeway.split(0))
    assert error.value.code == "INVALID_ARGUMENT"
    assert "5" in str(error.value)
    x = local.put(np.zeros(4, dtype=np.float32), mesh)
    with pytest.raises(ValueError, match=r"shape is \[4\], given \[5\]"):
        x.upload(np.zeros(5, dtype=np.float32))
    with pytest.raises(ValueError, match="holds f32"):
        x.upload(np.zeros(4, dtype=np.int32))
    x.release()
    with pytest.raises(causeway.FailedPreconditionError, match="released"):
        x.numpy()
    other = causeway.local(accelerators=1, name="other")
    with pytest.raises(ValueError, match="another client"):
        other.put(np.zeros(4, dtype=np.float32), mesh)


def test_devices_of_the_machine_and_of_a_client(local):
    machine = causeway.devices()
    assert machine and all({"index", "name", "kind", "heaps"} <= set(d) for d in machine)
    devices = local.devices()
    assert [(d.island, d.index) for d in devices] == [(0, 0), (0, 1)]
    assert all(d.healthy and d.health == "ok" for d in devices)
    assert devices[0].name in {d["name"] for d in machine}
    assert devices[0].max_workgroup_invocations >= 128
    assert devices[0].max_storage_buffers == 32  # lavapipe's pushed set


# ---- programs ---------------------------------------------------------------


def sum_program():
    """p = x + y on a split mesh; q = p gathered whole; s = all-reduced q
    (twice p, every device holding the whole); g = all-gather of p."""
    b = causeway.ProgramBuilder("sums")
    b.mesh("m", [2])
    b.parameter("x", "m", (8,), "f32", causeway.split(0))
    b.parameter("y", "m", (8,), np.float32, causeway.split(0))
    b.call("add", causeway.elementwise("add", (4,)), "m", ["x", "y"], ["p"])
    b.reshard("whole", "m", "p", "q", causeway.replicated())
    b.all_reduce("twice", "m", "q", "s", op="sum")
    b.all_gather("gather", "m", "p", "g")
    b.output("p").output("s").output("g")
    return b.build()


def run_sums(client, island=0):
    mesh = client.mesh([2], island=island)
    program = client.load(sum_program(), {"m": mesh})
    rng = np.random.default_rng(5)
    x = rng.standard_normal(8).astype(np.float32)
    y = rng.standard_normal(8).astype(np.float32)
    outputs, done = program([client.put(x, mesh, causeway.split(0)), client.put(y, mesh, causeway.split(0))])
    done.result(timeout=60)
    p, s, g = (out.numpy() for out in outputs)
    np.testing.assert_array_equal(p, x + y)
    np.testing.assert_array_equal(s, 2 * (x + y))
    np.testing.assert_array_equal(g, x + y)
    return program


def test_built_program_matches_numpy(local):
    program = run_sums(local)
    assert program.name == "sums"
    assert sum_program().parameters == ["x", "y"]
    assert sum_program().outputs == ["p", "s", "g"]
    assert sum_program().meshes == {"m": [2]}


def test_program_def_text_round_trips_and_errors_name_the_node(local):
    text = sum_program().text()
    again = causeway.ProgramDef.from_text(text, "sums.txt")
    assert again.text() == text
    with pytest.raises(ValueError, match=r"bad.txt:1:\d+"):
        causeway.ProgramDef.from_text("name: 'x' nodes {", "bad.txt")
    b = causeway.ProgramBuilder("broken")
    b.mesh("m", [2]).parameter("x", "m", (8,), "f32")
    b.call("add", causeway.elementwise("add", (8,)), "m", ["x", "missing"], ["y"]).output("y")
    with pytest.raises(ValueError, match="node 'add'.*'missing'"):
        local.load(b.build(), {"m": local.mesh([2])})
    with pytest.raises(ValueError, match="takes 2 inputs, given 1"):
        program = local.load(sum_program(), {"m": local.mesh([2])})
        program([local.put(np.zeros(8, dtype=np.float32), local.mesh([2]))])


def test_matmul_matches_numpy(local):
    m, n, k = 48, 40, 64
    mesh = local.mesh([1])
    b = causeway.ProgramBuilder("mm")
    b.mesh("m", [1]).parameter("a", "m", (m, k)).parameter("b", "m", (k, n))
    b.call("mm", causeway.matmul(m, n, k), "m", ["a", "b"], ["c"]).output("c")
    program = local.load(b.build(), {"m": mesh})
    rng = np.random.default_rng(9)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bb = rng.standard_normal((k, n)).astype(np.float32)
    (c,), done = program([local.put(a, mesh), local.put(bb, mesh)])
    np.testing.assert_allclose(c.numpy(timeout=60), a @ bb, rtol=1e-4, atol=1e-4)
    # The output is readable once written; the run's future resolves once
    # the whole run has ended, which may be a moment later.
    assert done.result(timeout=60) is None
    assert done.done()


def saxpy_function(args=(0, 1, 2), count=256, a=2.0):
    kernel = causeway.Kernel.from_glsl("saxpy", saxpy_source())
    step = causeway.Step(kernel, list(args), [1], struct.pack("<If", count, a))
    return causeway.custom("saxpy", inputs=[((count,), "f32"), ((count,), "f32")],
                           outputs=[((count,), "f32")], steps=[step])


def test_custom_kernel_from_glsl_matches_numpy_and_bad_steps_are_refused(local):
    mesh = local.mesh([2])
    b = causeway.ProgramBuilder("saxpy")
    b.mesh("m", [2]).parameter("x", "m", (512,), sharding=causeway.split(0))
    b.parameter("y", "m", (512,), sharding=causeway.split(0))
    b.call("saxpy", saxpy_function(), "m", ["x", "y"], ["z"]).output("z")
    program = local.load(b.build(), {"m": mesh})
    x = np.arange(512, dtype=np.float32)
    y = np.full(512, 1.5, dtype=np.float32)
    (z,), _ = program([local.put(x, mesh, causeway.split(0)), local.put(y, mesh, causeway.split(0))])
    np.testing.assert_array_equal(z.numpy(), 2 * x + y)

    # The kernel writes binding 2; given input 0 there, it would write the
    # caller's array: refused when the function is made.
    with pytest.raises(ValueError, match="may write binding 2, given input 0"):
        saxpy_function(args=(0, 1, 0))
    with pytest.raises(ValueError, match="groups"):
        causeway.Step(causeway.Kernel.from_glsl("saxpy", saxpy_source()), [0, 1, 2], [])
    with pytest.raises(ValueError):
        causeway.Kernel.from_spirv("junk", b"\x03\x02\x23\x07" + b"\x00" * 17)
    with pytest.raises(ValueError, match="saxpy"):
        causeway.Kernel.from_glsl("saxpy", saxpy_source().replace("result[i]", "nothing[i]"))
    spirv_kernel = causeway.Kernel.from_glsl("saxpy", saxpy_source())
    assert spirv_kernel.name == "saxpy"


def test_program_file_runs_with_its_inputs(local):
    file = causeway.ProgramFile.read(str(source_dir() / "examples" / "custom_kernel.textproto"))
    definition = file.definition
    meshes = {name: local.mesh(dims) for name, dims in definition.meshes.items()}
    program = local.load(definition, meshes)
    inputs = [local.put(file.inputs[name], meshes["m"], causeway.split(0)) for name in definition.parameters]
    (out,), done = program(inputs)
    done.result(timeout=60)
    np.testing.assert_array_equal(out.numpy(), 3 * np.arange(512, dtype=np.float32) + 1)
    with pytest.raises(causeway.NotFoundError):
        causeway.ProgramFile.read(str(source_dir() / "examples" / "no-such-file.textproto"))


# ---- futures ----------------------------------------------------------------


def slow_function(groups):
    """Each workgroup mixes integers for a while: a kernel that takes a
    noticeable time on a CPU driver (many workgroups, each loop well under
    llvmpipe's iteration limit)."""
    source = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) readonly buffer In { uint seed[]; };
layout(set = 0, binding = 1) writeonly buffer Out { uint words[]; };
void main() {
  uint x = seed[0] + gl_WorkGroupID.x;
  for (uint i = 0u; i < 20000u; ++i) {
    for (uint j = 0u; j < 16u; ++j) { x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15; }
  }
  words[gl_WorkGroupID.x] = x;
}
"""
    kernel = causeway.Kernel.from_glsl("slow", source)
    return causeway.custom("slow", inputs=[((1,), "i32")], outputs=[((groups,), "i32")],
                           steps=[causeway.Step(kernel, [0, 1], [groups])])


def slow_program(client, groups=256):
    mesh = client.mesh([1])
    b = causeway.ProgramBuilder("slow")
    b.mesh("m", [1]).parameter("seed", "m", (1,), "i32")
    b.call("slow", slow_function(groups), "m", ["seed"], ["out"]).output("out")
    return client.load(b.build(), {"m": mesh}), client.put(np.array([7], dtype=np.int32), mesh)


def test_future_waits_times_out_and_is_awaitable(local):
    program, seed = slow_program(local)
    outputs, done = program([seed])
    with pytest.raises(TimeoutError, match="not finished within 0"):
        done.result(timeout=0)
    assert done.result(timeout=120) is None
    assert done.done()
    first = outputs[0].numpy()

    async def several():
        runs = [program([seed]) for _ in range(3)]
        await asyncio.gather(*(f for _, f in runs))
        return [outs[0].numpy() for outs, _ in runs]

    for again in asyncio.run(several()):
        np.testing.assert_array_equal(again, first)  # the same kernel on the same seed


def test_gil_is_released_while_a_run_is_awaited(local):
    program, seed = slow_program(local, groups=1024)
    _, done = program([seed])
    waiting = threading.Event()
    finished = threading.Event()

    def wait():
        waiting.set()
        done.result(timeout=300)
        finished.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiting.wait()
    # Python work on this thread goes on while the other one waits in C++;
    # with the GIL held there, none would.
    spins = 0
    while not finished.is_set():
        spins += 1
        time.sleep(0)
    waiter.join()
    assert spins > 100, f"{spins} iterations while the run was awaited: the wait held the GIL"


def test_cancel_ends_a_run_with_cancelled(local):
    program, seed = slow_program(local, groups=1024)
    runs = [program([seed]) for _ in range(4)]
    runs[-1][1].cancel()
    for _, done in runs[:-1]:
        done.result(timeout=300)
    last = runs[-1][1]
    try:
        last.result(timeout=300)  # it may have ended before the cancel came
    except causeway.CancelledError as error:
        assert error.code == "CANCELLED"
        assert "run 4 of program 'slow'" in str(error)
        assert "cancelled by client 'pytest'" in str(error)


# ---- traces -----------------------------------------------------------------


def test_trace_records_host_and_device_spans(local, tmp_path):
    path = tmp_path / "run.json"
    with causeway.trace(path):
        run_sums(local)
    trace = json.loads(path.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "add" in " ".join(n for n in names if n)
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    with pytest.raises(causeway.Error):
        with causeway.trace(tmp_path / "no-such-dir" / "run.json"):
            pass


# ---- islands ----------------------------------------------------------------


def test_the_same_code_runs_on_island_servers(islands):
    client = causeway.connect([island.address for island in islands], name="pytest")
    assert client.kind == "remote"
    assert client.island_count == 2
    assert {d.island_name for d in client.devices()} == {"east", "west"}
    run_sums(client, island=0)
    run_sums(client, island=1)

    # One program over both islands: the sum crosses from east to west.
    east, west = client.mesh([2], island=0), client.mesh([2], island=1)
    b = causeway.ProgramBuilder("across")
    b.mesh("a", [2]).mesh("b", [2])
    b.parameter("x", "a", (8,), sharding=causeway.split(0)).parameter("y", "a", (8,), sharding=causeway.split(0))
    b.call("add", causeway.elementwise("add", (4,)), "a", ["x", "y"], ["p"])
    b.reshard("move", "b", "p", "q", causeway.split(0))
    b.call("double", causeway.scale((4,), 2.0), "b", ["q"], ["r"]).output("r")
    program = client.load(b.build(), {"a": east, "b": west})
    x = np.arange(8, dtype=np.float32)
    y = np.ones(8, dtype=np.float32)
    (r,), done = program([client.put(x, east, causeway.split(0)), client.put(y, east, causeway.split(0))])
    done.result(timeout=60)
    assert r.island == 1
    np.testing.assert_array_equal(r.numpy(), 2 * (x + y))


def test_a_killed_island_is_an_unavailable_error_naming_it(islands):
    client = causeway.connect([island.address for island in islands], name="pytest")
    mesh = client.mesh([2], island=1)
    program = client.load(sum_program(), {"m": mesh})
    x = client.put(np.ones(8, dtype=np.float32), mesh, causeway.split(0))
    islands[1].kill()
    with pytest.raises(ConnectionError) as error:
        _, done = program([x, x])
        done.result(timeout=60)
    assert isinstance(error.value, causeway.UnavailableError)
    assert "west" in str(error.value)
    # The other island serves on.
    run_sums(client, island=0)


# ---- the kernel library -----------------------------------------------------


def gelu(u):
    return 0.5 * u * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (u + 0.044715 * u ** 3)))


def test_functions_of_kernel_library_operations_match_numpy(local):
    rows, d, ff = 16, 32, 48
    # y = gelu(x w + b), then a layer norm of y, in one function.
    f = causeway.FunctionBuilder("mlp_up_norm")
    x, w, b = f.input((rows, d)), f.input((d, ff)), f.input((ff,))
    gamma, beta = f.input((ff,)), f.input((ff,))
    h, y = f.scratch((rows, ff)), f.output((rows, ff))
    z, mean, rstd = f.output((rows, ff)), f.scratch((rows,)), f.scratch((rows,))
    gemm = causeway.ops.gemm(rows, ff, d)
    assert [name for name, _ in gemm.operands] == ["A", "B", "C"]
    f.add(gemm, [x, w, h]).add(causeway.ops.bias_gelu(rows, ff), [h, b, y])
    f.add(causeway.ops.layer_norm(rows, ff, eps=1e-5), [y, gamma, beta, z, mean, rstd])
    function = f.build()

    mesh = local.mesh([1])
    pb = causeway.ProgramBuilder("mlp")
    pb.mesh("m", [1])
    for name, shape in [("x", (rows, d)), ("w", (d, ff)), ("b", (ff,)), ("gamma", (ff,)), ("beta", (ff,))]:
        pb.parameter(name, "m", shape)
    pb.call("mlp", function, "m", ["x", "w", "b", "gamma", "beta"], ["y", "z"]).output("y").output("z")
    program = local.load(pb.build(), {"m": mesh})
    rng = np.random.default_rng(13)
    host = {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in [("x", (rows, d)), ("w", (d, ff)), ("b", (ff,)), ("gamma", (ff,)), ("beta", (ff,))]}
    (gy, gz), done = program([local.put(host[n], mesh) for n in ["x", "w", "b", "gamma", "beta"]])
    done.result(timeout=60)
    want_y = gelu(host["x"].astype(np.float64) @ host["w"] + host["b"])
    np.testing.assert_allclose(gy.numpy(), want_y, rtol=1e-4, atol=1e-4)
    mu = want_y.mean(axis=1, keepdims=True)
    var = want_y.var(axis=1, keepdims=True)
    want_z = (want_y - mu) / np.sqrt(var + 1e-5) * host["gamma"] + host["beta"]
    np.testing.assert_allclose(gz.numpy(), want_z, rtol=1e-3, atol=1e-3)

    with pytest.raises(ValueError, match="bias_gelu"):
        bad = causeway.FunctionBuilder("short")
        a, out = bad.input((4, 4)), bad.output((4, 4))
        bad.add(causeway.ops.bias_gelu(rows, ff), [a, a, out]).build()
    with pytest.raises(ValueError):
        causeway.ops.gemm(0, 4, 4)


def test_trainer_checkpoints_and_resumes_bit_for_bit(local, tmp_path):
    corpus = causeway.models.TextCorpus.load(str(source_dir() / "data" / "kjv-genesis-exodus.txt"))
    model = dict(d_model=16, heads=2, d_ff=32, layers=1, seq_len=8, batch=4)
    plain = causeway.models.Trainer(local, corpus, **model)
    want = plain.train(4)
    writer = causeway.models.Trainer(local, corpus, **model, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    assert writer.train(2) == want[:2]
    assert writer.checkpointed_step == 2
    resumed = causeway.models.Trainer(local, corpus, **model)
    resumed.restore(str(tmp_path))
    assert resumed.steps_done == 2
    assert resumed.train(2) == want[2:]
    # A corrupt checkpoint is refused, naming the file.
    ckpt = tmp_path / "step-00000002.ckpt"
    data = bytearray(ckpt.read_bytes())
    data[-100] ^= 1
    ckpt.write_bytes(bytes(data))
    with pytest.raises(causeway.DataLossError, match="step-00000002.ckpt: corrupt"):
        resumed.restore(str(tmp_path))
    with pytest.raises(causeway.NotFoundError, match="no checkpoint"):
        resumed.restore(str(tmp_path / "missing"))
