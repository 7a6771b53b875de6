"""Causeway from Python: the client API over islands in this process or behind
island servers, numpy arrays in and out, programs, futures and traces.

    import numpy as np
    import causeway

    client = causeway.local(accelerators=2)          # or causeway.connect(["host:7400", ...])
    mesh = client.mesh([2])
    x = client.put(np.arange(8, dtype=np.float32), mesh, causeway.split(0))

    b = causeway.ProgramBuilder("double")
    b.mesh("m", [2])
    b.parameter("x", "m", (8,), "f32", causeway.split(0))
    b.call("double", causeway.scale((4,), 2.0), "m", ["x"], ["y"])   # per-device shape
    b.output("y")
    double = client.load(b.build(), {"m": mesh})

    (y,), done = double([x])     # returns at once
    done.result(timeout=10)      # or: await done
    print(y.numpy())

Every call that waits releases the GIL. Errors are causeway.Error subclasses
that also derive from the matching builtin (ValueError, TimeoutError,
ConnectionError, ...), with the status message whole and its code in `.code`.
"""

import asyncio as _asyncio
import contextlib as _contextlib

from ._causeway import (  # noqa: F401  (the package's names)
    Array,
    CancelledError,
    DataLossError,
    Client,
    DeadlineExceededError,
    Device,
    Error,
    FailedPreconditionError,
    Function,
    FunctionBuilder,
    Future,
    InternalError,
    InvalidArgumentError,
    Kernel,
    Mesh,
    NotFoundError,
    OpPlan,
    PermissionDeniedError,
    Program,
    ProgramBuilder,
    ProgramDef,
    ProgramFile,
    ResourceExhaustedError,
    Sharding,
    Step,
    UnavailableError,
    UnimplementedError,
    connect,
    custom,
    elementwise,
    local,
    matmul,
    models,
    ops,
    replicated,
    scale,
    split,
)
from ._causeway import physical_devices as _physical_devices
from ._causeway import TraceSession as _TraceSession
from . import lazy  # noqa: E402,F401  (causeway.lazy)

__all__ = [
    "Array", "CancelledError", "Client", "DataLossError", "DeadlineExceededError", "Device", "Error",
    "FailedPreconditionError", "Function", "FunctionBuilder", "Future", "InternalError", "InvalidArgumentError",
    "Kernel", "Mesh", "NotFoundError", "OpPlan", "PermissionDeniedError", "Program", "ProgramBuilder",
    "ProgramDef", "ProgramFile", "ResourceExhaustedError", "Sharding", "Step",
    "UnavailableError", "UnimplementedError", "connect", "custom", "devices", "elementwise",
    "lazy", "local", "matmul", "models", "ops", "replicated", "scale", "split", "trace",
]


def devices():
    """The Vulkan devices of this machine, as dicts (index, name, kind, driver,
    uuid, subgroup_size, max_workgroup_invocations, max_storage_buffers,
    heaps). A client's own accelerators: Client.devices()."""
    return _physical_devices()


def _future_await(self):
    # The wait runs on the loop's executor, not on a runtime thread that would
    # take the GIL to wake the loop: a runtime thread never waits on Python.
    loop = _asyncio.get_running_loop()
    return loop.run_in_executor(None, self.result).__await__()


Future.__await__ = _future_await


@_contextlib.contextmanager
def trace(path):
    """Records a Chrome trace of everything Causeway does inside the block
    (host spans, device spans, flows) and writes it to `path` at its end
    (`causeway trace summarize PATH` reads it). One at a time per process."""
    session = _TraceSession.start(str(path))
    try:
        yield session
    finally:
        session.finish()
