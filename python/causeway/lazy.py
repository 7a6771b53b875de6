"""A lazy front end (after LazyTensor): numpy-like operations on
`causeway.lazy` arrays are recorded, define-by-run, and run as one Causeway
program when a value is needed (`.numpy()`, `sync()`).

    import numpy as np
    from causeway import lazy

    lazy.use(causeway.local())                # the client (and a one-device mesh) to run on
    x = lazy.array(np.random.rand(16, 32).astype(np.float32))
    w = lazy.array(np.random.rand(32, 8).astype(np.float32))
    y = lazy.gelu(x @ w).sum(axis=-1)
    print(y.numpy())                          # one program: matmul, gelu, sum

    loss_and_grads = lazy.value_and_grad(lambda w: lazy.mean((x @ w) ** 2))
    loss, (dw,) = loss_and_grads(w)           # reverse mode over the recorded graph

A program is cached by what was recorded (operations, their attributes and
shapes; never the values), so the second step of a training loop reuses the
first step's loaded program without building it again (`cache_info()`).

Values live on the device between programs: a value computed once is an
input of the next program, never copied back unless asked for. Every value is
held flat on the device (its logical shape is kept here), so reshapes cost
nothing. float32 throughout, int32 for token ids and targets.

SPMD over a 1-D mesh (`use(client, client.mesh([n]))`): an array made with
`split=True` has its rows (axis 0) divided among the devices; others are
whole on every device. Row-wise operations keep the split; a reduction over
split rows (a sum over axis 0, a contraction over them in a gradient's
matmul, a layer norm's or embedding's parameter gradients) is a partial sum
on each device followed by an all-reduce, so the gradients of whole
parameters from a split batch come out whole.
"""

import math
import threading

import numpy as np

from . import _causeway as _cw

__all__ = [
    "Array", "array", "use", "sync", "cache_info", "grad", "value_and_grad", "zeros", "ones",
    "matmul", "add", "sub", "mul", "div", "maximum", "neg", "exp", "log", "tanh", "relu", "gelu",
    "softmax", "layer_norm", "sum", "mean", "reshape", "transpose", "embedding", "cross_entropy",
    "attention", "adam",
]

# ---- where programs run ------------------------------------------------------------------------

_state = threading.local()


class _Target:
    def __init__(self, client, mesh):
        self.client = client
        self.mesh = mesh
        self.n = mesh.dims[0]  # devices: a split array holds 1/n of its rows on each
        # Kernels are planned for the mesh's island's device (the GEMM's
        # fastest path there).
        self.device = next(d for d in client.devices() if d.island == mesh.island)
        self.programs = {}  # recorded signature -> (loaded program, output count)
        self.hits = 0
        self.misses = 0


def use(client, mesh=None):
    """Runs this thread's lazy programs on `client`, SPMD over `mesh` (a 1-D
    mesh; by default a new one-device mesh of island 0)."""
    if mesh is None:
        mesh = client.mesh([1])
    elif len(mesh.dims) != 1:
        raise ValueError(f"lazy arrays run on a 1-D mesh, given {mesh}")
    _state.target = _Target(client, mesh)
    return _state.target


def _target():
    target = getattr(_state, "target", None)
    if target is None:
        target = use(_cw.local(accelerators=1, name="lazy"))
    return target


def cache_info():
    """(hits, misses, programs held) of this thread's program cache."""
    t = _target()
    return t.hits, t.misses, len(t.programs)


# ---- kernels -----------------------------------------------------------------------------------

_kernels = {}
_functions = {}


def _kernel(name, source):
    kernel = _kernels.get(source)
    if kernel is None:
        kernel = _kernels[source] = _cw.Kernel.from_glsl(name, source)
    return kernel


_LOCAL = 256
_MAX_GROUPS = 4096
# llvmpipe ends any loop after about 65535 iterations: per-invocation loops
# over one axis stay under this many.
_MAX_LOOP = 65535


def _groups(n):
    return [max(1, min(_MAX_GROUPS, -(-n // _LOCAL)))]


_GELU = "0.5 * u * (1.0 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)))"
_GELU_GRAD = ("(0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * u * u))")

# Elementwise expressions of a (and b), broadcast as numpy does; alpha is a
# push constant (a Python number in an operation with an array).
_UNARY = {
    "neg": "-a", "exp": "exp(a)", "log": "log(a)", "tanh": "tanh(a)", "relu": "max(a, 0.0)",
    "gelu": "gelu(a)", "copy": "a", "scale": "alpha * a", "shift": "a + alpha", "rsub": "alpha - a",
    "rdiv": "alpha / a", "pow": "pow(a, alpha)", "square": "a * a", "step": "(a > 0.0 ? 1.0 : 0.0)",
}
_BINARY = {
    "add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b", "maximum": "max(a, b)",
    "gelu_grad": "b * gelu_grad(a)", "relu_grad": "(a > 0.0 ? b : 0.0)",
    "pow_grad": "b * alpha * pow(a, alpha - 1.0)",
}


def _elementwise_source(expr, binary):
    inputs = "layout(set = 0, binding = 0) readonly buffer A { float av[]; };\n"
    if binary:
        inputs += "layout(set = 0, binding = 1) readonly buffer B { float bv[]; };\n"
    out = 2 if binary else 1
    return f"""#version 450
layout(local_size_x = {_LOCAL}) in;
{inputs}layout(set = 0, binding = {out}) writeonly buffer C {{ float cv[]; }};
layout(push_constant) uniform P {{
  uint n; uint d1, d2, d3;
  uint sa0, sa1, sa2, sa3;
  uint sb0, sb1, sb2, sb3;
  float alpha;
}};
float gelu(float u) {{ return {_GELU}; }}
float gelu_grad(float u) {{ float t = tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)); return {_GELU_GRAD}; }}
void main() {{
  for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * {_LOCAL}u) {{
    uint r = i;
    uint i3 = r % d3; r /= d3;
    uint i2 = r % d2; r /= d2;
    uint i1 = r % d1; uint i0 = r / d1;
    float a = av[i0 * sa0 + i1 * sa1 + i2 * sa2 + i3 * sa3];
    {"float b = bv[i0 * sb0 + i1 * sb1 + i2 * sb2 + i3 * sb3];" if binary else ""}
    cv[i] = {expr};
  }}
}}
"""


def _strides(shape, out_shape):
    """The element strides of `shape` read as `out_shape` (numpy broadcasting,
    padded to 4 axes): 0 along a broadcast axis."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step if dim != 1 else 0)
        step *= dim
    strides = list(reversed(strides))
    return [0] * (4 - len(strides)) + strides


def _push(*values):
    out = bytearray()
    for v in values:
        out += np.array([v], dtype=np.float32 if isinstance(v, float) else np.uint32).tobytes()
    return bytes(out)


def _size(shape):
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def _elementwise_function(op, shapes, out_shape, alpha):
    binary = op in _BINARY
    expr = (_BINARY if binary else _UNARY)[op]
    n = _size(out_shape)
    dims = [1] * (4 - len(out_shape)) + list(out_shape)
    sa = _strides(shapes[0], out_shape)
    sb = _strides(shapes[1], out_shape) if binary else [0, 0, 0, 0]
    push = _push(n, dims[1], dims[2], dims[3], *sa, *sb, float(alpha))
    kernel = _kernel(op, _elementwise_source(expr, binary))
    inputs = [((_size(s),), "f32") for s in shapes]
    args = list(range(len(shapes) + 1))
    return _cw.custom(op, inputs=inputs, outputs=[((n,), "f32")], steps=[_cw.Step(kernel, args, _groups(n), push)])


_REDUCE_SOURCE = f"""#version 450
layout(local_size_x = {_LOCAL}) in;
layout(set = 0, binding = 0) readonly buffer X {{ float x[]; }};
layout(set = 0, binding = 1) writeonly buffer Y {{ float y[]; }};
layout(push_constant) uniform P {{ uint outer; uint len; uint inner; float alpha; }};
void main() {{
  uint n = outer * inner;
  for (uint o = gl_GlobalInvocationID.x; o < n; o += gl_NumWorkGroups.x * {_LOCAL}u) {{
    uint base = (o / inner) * len * inner + o % inner;
    float s = 0.0;
    for (uint a = 0u; a < len; ++a) s += x[base + a * inner];
    y[o] = alpha * s;
  }}
}}
"""

_SOFTMAX_SOURCE = f"""#version 450
layout(local_size_x = {_LOCAL}) in;
layout(set = 0, binding = 0) readonly buffer X {{ float x[]; }};
layout(set = 0, binding = 1) writeonly buffer Y {{ float y[]; }};
layout(push_constant) uniform P {{ uint rows; uint cols; }};
void main() {{
  for (uint r = gl_GlobalInvocationID.x; r < rows; r += gl_NumWorkGroups.x * {_LOCAL}u) {{
    uint base = r * cols;
    float m = x[base];
    for (uint c = 1u; c < cols; ++c) m = max(m, x[base + c]);
    float s = 0.0;
    for (uint c = 0u; c < cols; ++c) s += exp(x[base + c] - m);
    for (uint c = 0u; c < cols; ++c) y[base + c] = exp(x[base + c] - m) / s;
  }}
}}
"""


def _reduce_function(outer, length, inner, alpha):
    if length > _MAX_LOOP:
        raise ValueError(f"a reduction over {length} elements of one axis exceeds {_MAX_LOOP}; "
                         "reshape it into two axes and reduce both")
    push = _push(outer, length, inner, float(alpha))
    n = outer * inner
    return _cw.custom("sum", inputs=[((outer * length * inner,), "f32")], outputs=[((n,), "f32")],
                      steps=[_cw.Step(_kernel("sum", _REDUCE_SOURCE), [0, 1], _groups(n), push)])


def _softmax_function(rows, cols):
    if cols > _MAX_LOOP:
        raise ValueError(f"softmax over {cols} columns exceeds {_MAX_LOOP}")
    return _cw.custom("softmax", inputs=[((rows * cols,), "f32")], outputs=[((rows * cols,), "f32")],
                      steps=[_cw.Step(_kernel("softmax", _SOFTMAX_SOURCE), [0, 1], _groups(rows),
                                      _push(rows, cols))])


def _plan_function(name, plan, inputs, outputs, scratch=()):
    """A function of one kernel-library plan: inputs, then outputs, then
    scratch, bound in the plan's operand order (`order` indexes them)."""
    f = _cw.FunctionBuilder(name)
    handles = [f.input((n,), dt) for n, dt in inputs]
    handles += [f.output((n,), dt) for n, dt in outputs]
    handles += [f.scratch((n,), dt) for n, dt in scratch]
    return f, handles


# ---- the recorded graph ------------------------------------------------------------------------


class _Node:
    """One recorded operation: its inputs (Arrays), attributes, and the
    logical shapes and dtypes of its outputs."""

    __slots__ = ("op", "inputs", "attrs", "out_shapes", "out_dtypes", "out_split", "outputs", "__weakref__")

    def __init__(self, op, inputs, attrs, out_shapes, out_dtypes, out_split):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.out_shapes = out_shapes
        self.out_dtypes = out_dtypes
        self.out_split = out_split
        self.outputs = []


class Array:
    """A lazy array: a recorded value, or one already on the device."""

    __array_priority__ = 1000  # numpy defers to these operators

    def __init__(self, shape, dtype, node=None, index=0, device=None, split=False):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.split = split  # rows (axis 0) split over the mesh; else every device holds it whole
        self._node = node
        self._index = index
        self._device = device  # a causeway.Array, flat, once computed

    @property
    def local(self):
        """The shape of each device's part."""
        if not self.split:
            return self.shape
        return (self.shape[0] // _target().n,) + self.shape[1:]

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return _size(self.shape)

    def numpy(self):
        sync(self)
        return self._device.numpy().reshape(self.shape)

    def __repr__(self):
        state = "computed" if self._device is not None else f"recorded ({self._node.op})"
        where = ", split" if self.split else ""
        return f"lazy.Array({self.dtype.name}{list(self.shape)}{where}, {state})"

    def __array__(self, dtype=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    # numpy-like operators
    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __truediv__(self, other): return div(self, other)
    def __rtruediv__(self, other): return div(other, self)
    def __neg__(self): return neg(self)
    def __pow__(self, exponent): return _pow(self, exponent)
    def __matmul__(self, other): return matmul(self, other)
    def __rmatmul__(self, other): return matmul(other, self)

    def sum(self, axis=None, keepdims=False): return sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return mean(self, axis, keepdims)
    def reshape(self, *shape): return reshape(self, shape[0] if len(shape) == 1 else shape)
    def transpose(self, *axes): return transpose(self, axes[0] if len(axes) == 1 else (axes or None))

    @property
    def T(self):
        return transpose(self)


def _record(op, inputs, attrs, out_shapes, out_dtypes=None, split=None):
    out_dtypes = out_dtypes or ["float32"] * len(out_shapes)
    split = split or [False] * len(out_shapes)
    for shape, s in zip(out_shapes, split):
        _check_split(op, shape, s)
    node = _Node(op, inputs, attrs, out_shapes, out_dtypes, split)
    node.outputs = [Array(s, d, node, i, split=sp) for i, (s, d, sp) in enumerate(zip(out_shapes, out_dtypes, split))]
    return node.outputs if len(node.outputs) > 1 else node.outputs[0]


def _check_split(what, shape, split):
    n = _target().n
    if split and (not shape or shape[0] % n):
        raise ValueError(f"{what}: a split array's first axis must be a multiple of the mesh's {n} devices, "
                         f"given {list(shape)}")


def _summed(x):
    """x, whose per-device parts are partial sums, all-reduced: every device
    holds the whole sum."""
    if _target().n == 1:
        return x
    return _record("all_reduce", [x], {}, [x.shape])


def array(data, dtype=None, split=False):
    """A lazy array holding `data` (a numpy array or anything numpy reads),
    put on the device now: float32, or int32 for ids and targets. `split`:
    its rows (axis 0) divided among the mesh's devices (a batch, for data
    parallelism); else every device holds it whole (parameters)."""
    host = np.asarray(data, dtype=dtype)
    if host.dtype == np.float64:
        host = host.astype(np.float32)
    elif host.dtype == np.int64:
        host = host.astype(np.int32)
    if host.dtype not in (np.float32, np.int32):
        raise ValueError(f"lazy arrays are float32 or int32, given {host.dtype}")
    t = _target()
    _check_split("array", host.shape, split)
    flat = np.ascontiguousarray(host).reshape(-1) if host.ndim else host.reshape(1)
    device = t.client.put(flat, t.mesh, _cw.split(0) if split else None)
    return Array(host.shape, host.dtype, device=device, split=split)


def zeros(shape):
    return array(np.zeros(shape, dtype=np.float32))


def ones(shape):
    return array(np.ones(shape, dtype=np.float32))


def _float(x):
    if not isinstance(x, Array):
        raise TypeError(f"expected a lazy array, given {type(x).__name__}")
    if x.dtype != np.float32:
        raise ValueError(f"operation on a {x.dtype} array: float32 only here")
    return x


def _broadcast_shape(a, b):
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise ValueError(f"shapes {list(a)} and {list(b)} do not broadcast") from None


def _unary(op, x, alpha=0.0):
    _float(x)
    if x.ndim > 4:
        raise ValueError(f"{op}: at most 4 axes, given {list(x.shape)}")
    return _record(op, [x], {"alpha": float(alpha)}, [x.shape], split=[x.split])


def _binary(op, a, b, alpha=0.0):
    _float(a), _float(b)
    shape = _broadcast_shape(a.shape, b.shape)
    if len(shape) > 4:
        raise ValueError(f"{op}: at most 4 axes, given {list(shape)}")
    split = a.split or b.split
    if split:
        # A whole operand may broadcast along the split rows, never span them.
        for x in (a, b):
            spans = len(x.shape) == len(shape) and x.shape[0] == shape[0] and shape[0] > 1
            if not x.split and spans:
                raise ValueError(f"{op}: a split array of rows {list(shape)} with a whole one of "
                                 f"{list(x.shape)}: split both or broadcast the whole one")
            if x.split and len(x.shape) != len(shape):
                raise ValueError(f"{op}: a split array {list(x.shape)} broadcast to {list(shape)}")
    return _record(op, [a, b], {"alpha": float(alpha)}, [shape], split=[split])


def _scalar_or(op_arrays, op_left, op_right, a, b):
    """a op b where either may be a Python number."""
    if isinstance(a, Array) and isinstance(b, Array):
        return _binary(op_arrays, a, b)
    if isinstance(a, Array):
        return op_left(a, float(b))
    if isinstance(b, Array):
        return op_right(float(a), b)
    raise TypeError("at least one operand must be a lazy array")


def add(a, b):
    return _scalar_or("add", lambda x, s: _unary("shift", x, s), lambda s, x: _unary("shift", x, s), a, b)


def sub(a, b):
    return _scalar_or("sub", lambda x, s: _unary("shift", x, -s), lambda s, x: _unary("rsub", x, s), a, b)


def mul(a, b):
    return _scalar_or("mul", lambda x, s: _unary("scale", x, s), lambda s, x: _unary("scale", x, s), a, b)


def div(a, b):
    return _scalar_or("div", lambda x, s: _unary("scale", x, 1.0 / s), lambda s, x: _unary("rdiv", x, s), a, b)


def maximum(a, b):
    return _binary("maximum", a, b)


def neg(x):
    return _unary("neg", x)


def exp(x):
    return _unary("exp", x)


def log(x):
    return _unary("log", x)


def tanh(x):
    return _unary("tanh", x)


def relu(x):
    return _unary("relu", x)


def gelu(x):
    """GELU, tanh form (as the kernel library's)."""
    return _unary("gelu", x)


def _pow(x, exponent):
    if isinstance(exponent, Array):
        raise TypeError("the exponent must be a Python number")
    if exponent == 2:
        return _unary("square", x)
    return _unary("pow", x, float(exponent))


def _axis(axis, ndim):
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {ndim} axes")
    return axis % ndim


def sum(x, axis=None, keepdims=False):
    _float(x)
    if axis is None:
        if x.split and x.ndim > 1:  # each device's rows, then the rows' sums
            out = sum(sum(reshape(x, (x.shape[0], x.size // x.shape[0])), axis=1), axis=0)
        elif x.split:
            out = sum(x, axis=0)
        else:  # in two stages where the array is large: rows in parallel, then their sums
            k = _split_factor(x.size)
            if k is not None:
                out = sum(sum(reshape(x, (x.size // k, k)), axis=1), axis=0)
            else:
                out = _record("sum", [x], {"outer": 1, "len": x.size, "inner": 1, "alpha": 1.0}, [()])
        return reshape(out, (1,) * x.ndim) if keepdims else reshape(out, ())
    axis = _axis(axis, x.ndim)
    local = x.local
    outer = _size(local[:axis])
    inner = _size(local[axis + 1:])
    kept = x.shape[:axis] + ((1,) if keepdims else ()) + x.shape[axis + 1:]
    attrs = {"outer": outer, "len": local[axis], "inner": inner, "alpha": 1.0}
    if x.split and axis == 0:  # over the split rows: each device's part, then all of them
        return _summed(_record("sum", [x], attrs, [kept]))
    return _record("sum", [x], attrs, [kept], split=[x.split])


def _split_factor(n):
    """A factor of n near its square root, for n > 1024 (None otherwise or
    if there is none worth having)."""
    if n <= 1024:
        return None
    for k in range(int(math.isqrt(n)), 15, -1):
        if n % k == 0:
            return k
    return None


def mean(x, axis=None, keepdims=False):
    count = x.size if axis is None else x.shape[_axis(axis, x.ndim)]
    return mul(sum(x, axis, keepdims), 1.0 / count)


def reshape(x, shape):
    shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if -1 in shape:
        known = _size([d for d in shape if d != -1])
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    if _size(shape) != x.size:
        raise ValueError(f"cannot reshape {list(x.shape)} ({x.size} elements) to {list(shape)}")
    if x.split and (not shape or shape[0] % _target().n):
        raise ValueError(f"cannot reshape split {list(x.shape)} to {list(shape)}: the first axis must stay a "
                         f"multiple of the mesh's {_target().n} devices")
    return _record("reshape", [x], {}, [shape], [x.dtype.name], split=[x.split])


def transpose(x, axes=None):
    """Transposes 2 axes, or [a, b, c] by (0, 2, 1), or [a, b, c, d] by
    (0, 2, 1, 3): what the kernel library's 0213 permute does."""
    _float(x)
    axes = tuple(reversed(range(x.ndim))) if axes is None else tuple(_axis(a, x.ndim) for a in axes)
    s = x.local
    if x.split and axes and axes[0] != 0:
        raise NotImplementedError(f"transpose of a split array's rows (by {list(axes)})")
    if x.ndim == 2 and axes == (1, 0):
        dims = (1, s[0], s[1], 1)
    elif x.ndim == 3 and axes == (0, 2, 1):
        dims = (s[0], s[1], s[2], 1)
    elif x.ndim == 4 and axes == (0, 2, 1, 3):
        dims = s
    elif axes == tuple(range(x.ndim)):
        return x
    else:
        raise NotImplementedError(f"transpose of {list(s)} by {list(axes)}: only swaps of two adjacent axes "
                                  "(2-D, [a, b, c] by (0, 2, 1), [a, b, c, d] by (0, 2, 1, 3))")
    return _record("permute", [x], {"dims": dims, "axes": axes}, [tuple(x.shape[a] for a in axes)],
                   split=[x.split])


def matmul(a, b):
    """a @ b: [m, k] @ [k, n], or batched [..., m, k] @ [k, n] (the batch
    folded into m), or [batch, m, k] @ [batch, k, n]."""
    _float(a), _float(b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul needs 2 or more axes, given {list(a.shape)} @ {list(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: {list(a.shape)} @ {list(b.shape)}: inner sizes differ")
    if b.ndim == 2:
        if b.split:
            raise NotImplementedError("matmul by a split right operand (its rows are the contraction)")
        m = _size(a.local[:-1])
        return _record("matmul", [a, b], {"m": m, "n": b.shape[1], "k": a.shape[-1], "batch": 1, "ta": False,
                                          "tb": False}, [a.shape[:-1] + (b.shape[1],)], split=[a.split])
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]:
        if a.split != b.split:
            raise ValueError("a batched matmul's operands must both be split, or both whole")
        return _record("matmul", [a, b], {"m": a.shape[1], "n": b.shape[2], "k": a.shape[2], "batch": a.local[0],
                                          "ta": False, "tb": False}, [(a.shape[0], a.shape[1], b.shape[2])],
                       split=[a.split])
    raise NotImplementedError(f"matmul of {list(a.shape)} @ {list(b.shape)}")


def _matmul_t(a, b, ta, tb, m, n, k):
    """op(a) @ op(b) of 2-D operands stored as given (transposes in the GEMM),
    m, n, k of the whole arrays: for dA = dC B^T (dC's rows split: so are
    dA's) and dB = A^T dC (the contraction over split rows: partial sums on
    each device, then all of them)."""
    per = _target().n if a.split or b.split else 1
    if not ta and not tb:
        raise AssertionError("_matmul_t is for transposed operands")
    if tb:  # op(A) = A, rows of A (and C) split as A's
        if b.split:
            raise NotImplementedError("matmul by a split transposed operand")
        return _record("matmul", [a, b], {"m": m // per if a.split else m, "n": n, "k": k, "batch": 1, "ta": ta,
                                          "tb": tb}, [(m, n)], split=[a.split])
    if a.split != b.split:
        raise NotImplementedError("a contraction over rows split in one operand only")
    out = _record("matmul", [a, b], {"m": m, "n": n, "k": k // per, "batch": 1, "ta": ta, "tb": tb}, [(m, n)])
    return _summed(out) if a.split else out


def softmax(x, axis=-1):
    _float(x)
    if _axis(axis, x.ndim) != x.ndim - 1:
        raise NotImplementedError("softmax over the last axis only")
    return _record("softmax", [x], {"rows": _size(x.local[:-1]), "cols": x.shape[-1]}, [x.shape], split=[x.split])


def layer_norm(x, gamma, beta, eps=1e-5):
    """Per row of the last axis: (x - mean) / sqrt(var + eps) * gamma + beta."""
    _float(x)
    cols = x.shape[-1]
    if gamma.shape != (cols,) or beta.shape != (cols,):
        raise ValueError(f"layer_norm of rows of {cols}: gamma and beta must be [{cols}], given "
                         f"{list(gamma.shape)} and {list(beta.shape)}")
    if gamma.split or beta.split:
        raise ValueError("layer_norm's gamma and beta must be whole, not split")
    rows = _size(x.local[:-1])
    n = _target().n if x.split else 1
    y, _, _ = _record("layer_norm", [x, gamma, beta], {"rows": rows, "cols": cols, "eps": float(eps)},
                      [x.shape, (rows * n,), (rows * n,)], split=[x.split] * 3)
    return y


def embedding(ids, table):
    """table[ids]: ids int32 of any shape, table [vocab, dim]."""
    if ids.dtype != np.int32:
        raise ValueError(f"embedding ids must be int32, given {ids.dtype}")
    _float(table)
    if table.ndim != 2:
        raise ValueError(f"an embedding table is [vocab, dim], given {list(table.shape)}")
    if table.split:
        raise ValueError("an embedding table must be whole, not split")
    tokens = _size(ids.local)
    return _record("embedding", [ids, table], {"tokens": tokens, "dim": table.shape[1], "vocab": table.shape[0]},
                   [ids.shape + (table.shape[1],)], split=[ids.split])


def cross_entropy(logits, targets):
    """Softmax cross-entropy of each row of logits [..., vocab] against int32
    targets [...]: the per-row losses (mean() them for the usual loss)."""
    _float(logits)
    if targets.dtype != np.int32 or targets.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy targets must be int32 of shape {list(logits.shape[:-1])}, given "
                         f"{targets.dtype} {list(targets.shape)}")
    if logits.split != targets.split:
        raise ValueError("cross_entropy's logits and targets must both be split, or both whole")
    rows = _size(logits.local[:-1])
    return _record("cross_entropy", [logits, targets], {"rows": rows, "vocab": logits.shape[-1]},
                   [logits.shape[:-1]], split=[logits.split])


def attention(q, k, v):
    """Causal self-attention of q, k, v [batch, heads, T, head_dim]:
    softmax(q k^T / sqrt(head_dim), causal) v, fused (the kernel library's;
    the T x T scores never in memory). Split arrays split the batch."""
    for x in (q, k, v):
        _float(x)
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"attention takes q, k, v of one shape [batch, heads, T, head_dim], given "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if not q.split == k.split == v.split:
        raise ValueError("attention's q, k and v must all be split, or all whole")
    b, h, t, d = q.local
    out, _ = _record("attention", [q, k, v], {"batch": b, "heads": h, "t": t, "d": d}, [q.shape, q.shape[:3]],
                     split=[q.split] * 2)
    return out


def adam(p, g, m, v, step, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One Adam step (the kernel library's, bias-corrected; `step` a float32
    [1] array counting from 1): the new (p, m, v), out of place."""
    for x in (p, g, m, v, step):
        _float(x)
    if not p.shape == g.shape == m.shape == v.shape or step.shape != (1,):
        raise ValueError(f"adam takes p, g, m, v of one shape and a step of [1], given {list(p.shape)}, "
                         f"{list(g.shape)}, {list(m.shape)}, {list(v.shape)}, {list(step.shape)}")
    if p.split or g.split or m.split or v.split or step.split:
        raise ValueError("adam updates whole arrays (each device the same step)")
    attrs = {"count": p.size, "lr": float(lr), "beta1": float(beta1), "beta2": float(beta2), "eps": float(eps),
             "weight_decay": float(weight_decay)}
    return tuple(_record("adam", [p, g, m, v, step], attrs, [p.shape] * 3))


def _broadcast_to(x, shape, split):
    return _record("copy", [x], {"alpha": 0.0}, [tuple(shape)], split=[split])


# ---- lowering to a program ---------------------------------------------------------------------


def _function(node, in_shapes):
    """The Causeway function of one recorded node (cached by its signature)."""
    out_local = node.outputs[0].local
    device = _target().device
    key = (node.op, tuple(sorted(node.attrs.items())), tuple(in_shapes), out_local, device.name, device.subgroup_size)
    function = _functions.get(key)
    if function is not None:
        return function
    op, at = node.op, node.attrs
    if op in _UNARY or op in _BINARY:
        function = _elementwise_function(op, in_shapes, out_local, at.get("alpha", 0.0))
    elif op == "sum":
        function = _reduce_function(at["outer"], at["len"], at["inner"], at["alpha"])
    elif op == "softmax":
        function = _softmax_function(at["rows"], at["cols"])
    elif op == "matmul":
        m, n, k, batch = at["m"], at["n"], at["k"], at["batch"]
        f = _cw.FunctionBuilder("matmul")
        a = f.input((batch * m * k,))
        b = f.input((k * n,) if batch == 1 else (batch * k * n,))
        c = f.output((batch * m * n,))
        f.add(_cw.ops.gemm(m, n, k, transpose_a=at["ta"], transpose_b=at["tb"], batch=batch, device=device),
              [a, b, c])
        function = f.build()
    elif op == "permute":
        d = at["dims"]
        f = _cw.FunctionBuilder("permute")
        x, y = f.input((_size(d),)), f.output((_size(d),))
        f.add(_cw.ops.permute0213(*d), [x, y])
        function = f.build()
    elif op == "layer_norm":
        rows, cols = at["rows"], at["cols"]
        f = _cw.FunctionBuilder("layer_norm")
        x, g, b = f.input((rows * cols,)), f.input((cols,)), f.input((cols,))
        y, mu, rstd = f.output((rows * cols,)), f.output((rows,)), f.output((rows,))
        f.add(_cw.ops.layer_norm(rows, cols, at["eps"]), [x, g, b, y, mu, rstd])
        function = f.build()
    elif op == "layer_norm_backward":
        rows, cols = at["rows"], at["cols"]
        f = _cw.FunctionBuilder("layer_norm_backward")
        dy, x, g = f.input((rows * cols,)), f.input((rows * cols,)), f.input((cols,))
        mu, rstd = f.input((rows,)), f.input((rows,))
        dx, dg, db = f.output((rows * cols,)), f.output((cols,)), f.output((cols,))
        f.add(_cw.ops.layer_norm_backward(rows, cols), [dy, x, g, mu, rstd, dx, dg, db])
        function = f.build()
    elif op == "adam":
        n = at["count"]
        f = _cw.FunctionBuilder("adam")
        ins = [f.input((n,)) for _ in range(4)] + [f.input((1,))]
        outs = [f.output((n,)) for _ in range(3)]
        f.add(_cw.ops.adam_update(n, at["lr"], at["beta1"], at["beta2"], at["eps"], at["weight_decay"]), ins + outs)
        function = f.build()
    elif op in ("attention", "attention_backward"):
        shape = (at["batch"], at["heads"], at["t"], at["d"])
        elements, rows = _size(shape), _size(shape[:3])
        f = _cw.FunctionBuilder(op)
        if op == "attention":
            q, k, v = f.input((elements,)), f.input((elements,)), f.input((elements,))
            out, lse = f.output((elements,)), f.output((rows,))
            f.add(_cw.ops.attention(*shape, device=device), [q, k, v, out, lse])
        else:
            q, k, v, out, d_out = (f.input((elements,)) for _ in range(5))
            lse = f.input((rows,))
            dq, dk, dv = f.output((elements,)), f.output((elements,)), f.output((elements,))
            delta = f.scratch((rows,))
            f.add(_cw.ops.attention_backward(*shape, device=device), [q, k, v, out, d_out, lse, delta, dq, dk, dv])
        function = f.build()
    elif op == "embedding":
        tokens, dim, vocab = at["tokens"], at["dim"], at["vocab"]
        f = _cw.FunctionBuilder("embedding")
        ids, table, out = f.input((tokens,), "i32"), f.input((vocab * dim,)), f.output((tokens * dim,))
        f.add(_cw.ops.embedding(tokens, dim, vocab, tokens), [ids, table, out])
        function = f.build()
    elif op == "embedding_backward":
        tokens, dim, vocab = at["tokens"], at["dim"], at["vocab"]
        f = _cw.FunctionBuilder("embedding_backward")
        ids, dout, dtable = f.input((tokens,), "i32"), f.input((tokens * dim,)), f.output((vocab * dim,))
        f.add(_cw.ops.embedding_backward(tokens, dim, vocab), [ids, dout, dtable])
        function = f.build()
    elif op == "cross_entropy":
        rows, vocab = at["rows"], at["vocab"]
        f = _cw.FunctionBuilder("cross_entropy")
        logits, targets, loss = f.input((rows * vocab,)), f.input((rows,), "i32"), f.output((rows,))
        f.add(_cw.ops.cross_entropy(rows, vocab), [logits, targets, loss])
        function = f.build()
    elif op == "cross_entropy_backward":
        rows, vocab = at["rows"], at["vocab"]
        f = _cw.FunctionBuilder("cross_entropy_backward")
        logits, targets, d = f.input((rows * vocab,)), f.input((rows,), "i32"), f.output((rows * vocab,))
        f.add(_cw.ops.cross_entropy_backward(rows, vocab, 1.0), [logits, targets, d])
        function = f.build()
    else:
        raise AssertionError(f"no lowering for {op}")
    _functions[key] = function
    return function


def _resolve(x):
    """Follows reshapes (free: every value is flat on the device) to the
    array whose buffer holds x's elements."""
    while x._device is None and x._node.op == "reshape":
        x = x._node.inputs[0]
    return x


def sync(*arrays):
    """Computes every given array not yet on the device, as one program.
    Returns once the program is queued (reading a value waits for it)."""
    wanted = []
    for a in arrays:
        r = _resolve(a)
        if r._device is None and all(r is not w for w in wanted):
            wanted.append(r)
    if wanted:
        _run(wanted)
    for a in arrays:
        if a._device is None:
            a._device = _resolve(a)._device


# What a ProgramDef's custom function may hold (kMaxDefTensors, kMaxDefSteps
# in causeway/scheduler/program_def.h).
_MAX_FUSED_BUFFERS = 64
_MAX_FUSED_STEPS = 256


def _lower_fused(b, order, wanted_refs, ref, name):
    """Adds `order`'s nodes to program builder `b` as few calls as a def
    allows: consecutive nodes fused into one custom function (their kernel
    steps in order, the values that stay inside as scratch) up to 64
    buffers and 256 steps, a collective between segments. A gang call costs
    the same dispatch work whatever it holds, so a step of a hundred
    operations runs as a handful of calls."""
    later = {}  # value -> the last node index that reads it (or len(order) if wanted)
    for i, node in enumerate(order):
        for x in node.inputs:
            later[ref(x)] = i
    for r in wanted_refs:
        later[r] = len(order)
    functions = [None if n.op == "all_reduce" else _function(n, [x.local for x in n.inputs]) for n in order]

    segment = []

    def flush():
        if not segment:
            return
        first, last = segment[0], segment[-1]
        inputs, outputs, scratch, specs = [], [], [], {}
        produced = set()
        for i in segment:
            f = functions[i]
            for x, spec in zip(order[i].inputs, f.inputs):
                r = ref(x)
                if r not in produced and r not in specs:
                    specs[r] = spec
                    inputs.append(r)
            for j, spec in enumerate(f.outputs):
                r = ("node", i, j)
                produced.add(r)
                specs[r] = spec
                (outputs if later.get(r, -1) > last else scratch).append(r)
        index = {r: k for k, r in enumerate(inputs + outputs + scratch)}
        extra = []  # the nodes' own scratch buffers
        steps = []
        for i in segment:
            f = functions[i]
            node_buffers = [index[ref(x)] for x in order[i].inputs]
            node_buffers += [index[("node", i, j)] for j in range(len(f.outputs))]
            for spec in f.scratch:
                node_buffers.append(len(index) + len(extra))
                extra.append(spec)
            for step in f.steps:
                steps.append(_cw.Step(step.kernel, [node_buffers[a] for a in step.args], step.groups,
                                      step.push_constants, step.spec))
        fused = _cw.custom(f"lazy.{first}-{last}", inputs=[specs[r] for r in inputs],
                           outputs=[specs[r] for r in outputs], steps=steps,
                           scratch=[specs[r] for r in scratch] + extra)
        split = [order[r[1]].out_split[r[2]] for r in outputs]
        b.call(f"fused.{first}", fused, "m", [name(r) for r in inputs], [name(r) for r in outputs],
               [_cw.split(0) if sp else _cw.replicated() for sp in split])
        segment.clear()

    def cost(nodes):
        buffers, steps, seen = 0, 0, set()
        for i in nodes:
            f = functions[i]
            for x in order[i].inputs:
                if ref(x) not in seen:
                    seen.add(ref(x))
                    buffers += 1
            buffers += len(f.outputs) + len(f.scratch)
            seen.update(("node", i, j) for j in range(len(f.outputs)))
            steps += len(f.steps)
        return buffers, steps

    for i, node in enumerate(order):
        if node.op == "all_reduce":
            flush()
            b.all_reduce(f"all_reduce.{i}", "m", name(ref(node.inputs[0])), f"n{i}.0")
            continue
        buffers, steps = cost(segment + [i])
        if segment and (buffers > _MAX_FUSED_BUFFERS or steps > _MAX_FUSED_STEPS):
            flush()
        segment.append(i)
    flush()


def _run(wanted):
    t = _target()
    # Topological order of the recorded nodes the wanted arrays need.
    order, seen, leaves, leaf_ids = [], set(), [], {}

    def visit(x):
        x = _resolve(x)
        if x._device is not None:
            if id(x) not in leaf_ids:
                leaf_ids[id(x)] = len(leaves)
                leaves.append(x)
            return
        node = x._node
        if id(node) in seen:
            return
        seen.add(id(node))
        for i in node.inputs:
            visit(i)
        order.append(node)

    for w in wanted:
        visit(w)
    node_ids = {id(n): i for i, n in enumerate(order)}

    def ref(x):
        x = _resolve(x)
        if x._device is not None:
            return ("leaf", leaf_ids[id(x)])
        return ("node", node_ids[id(x._node)], x._index)

    # The signature: operations, attributes, shapes, and how they connect.
    signature = (t.n, tuple((l.size, l.dtype.name, l.split) for l in leaves),
                 tuple((n.op, tuple(sorted(n.attrs.items())), tuple(ref(i) for i in n.inputs),
                        tuple(map(tuple, n.out_shapes)), tuple(n.out_split)) for n in order),
                 tuple(ref(w) for w in wanted))
    cached = t.programs.get(signature)
    if cached is None:
        t.misses += 1
        b = _cw.ProgramBuilder("lazy")
        b.mesh("m", [t.n])
        for i, leaf in enumerate(leaves):
            b.parameter(f"in{i}", "m", (leaf.size,), "i32" if leaf.dtype == np.int32 else "f32",
                        _cw.split(0) if leaf.split else None)

        def name(r):
            return f"in{r[1]}" if r[0] == "leaf" else f"n{r[1]}.{r[2]}"

        _lower_fused(b, order, [ref(w) for w in wanted], ref, name)
        for w in wanted:
            b.output(name(ref(w)))
        program = t.client.load(b.build(), {"m": t.mesh})
        t.programs[signature] = program
    else:
        t.hits += 1
        program = cached
    # Returns at once: the outputs are usable now (what reads them waits for
    # them, and carries the run's error if it fails), so the next program is
    # queued while this one runs.
    outputs, _ = program([leaf._device for leaf in leaves])
    for w, out in zip(wanted, outputs):
        w._device = out
        w._node = None  # computed: the graph behind it can go


# ---- reverse mode ------------------------------------------------------------------------------


def _unbroadcast(g, shape):
    """g summed over the axes broadcasting added to `shape`."""
    if g.shape == tuple(shape):
        return g
    while g.ndim > len(shape):
        g = sum(g, axis=0)
    for axis, dim in enumerate(shape):
        if dim == 1 and g.shape[axis] != 1:
            g = sum(g, axis=axis, keepdims=True)
    return g


def _vjp(node, grads):
    """The gradients of node's inputs from those of its outputs (None: no
    gradient flows there)."""
    op, at, x = node.op, node.attrs, node.inputs
    g = grads[0]
    if op == "add":
        return [_unbroadcast(g, x[0].shape), _unbroadcast(g, x[1].shape)]
    if op == "sub":
        return [_unbroadcast(g, x[0].shape), _unbroadcast(neg(g), x[1].shape)]
    if op == "mul":
        return [_unbroadcast(g * x[1], x[0].shape), _unbroadcast(g * x[0], x[1].shape)]
    if op == "div":
        return [_unbroadcast(g / x[1], x[0].shape), _unbroadcast(neg(g * x[0] / (x[1] * x[1])), x[1].shape)]
    if op == "maximum":
        mask = _unary("step", x[0] - x[1])
        return [_unbroadcast(g * mask, x[0].shape), _unbroadcast(g * (1.0 - mask), x[1].shape)]
    if op == "neg":
        return [neg(g)]
    if op == "shift":
        return [g]
    if op == "scale":
        return [g * at["alpha"]]
    if op == "rsub":
        return [neg(g)]
    if op == "rdiv":
        return [neg(g * at["alpha"] / (x[0] * x[0]))]
    if op == "exp":
        return [g * node.outputs[0]]
    if op == "log":
        return [g / x[0]]
    if op == "tanh":
        y = node.outputs[0]
        return [g * (1.0 - y * y)]
    if op == "relu":
        return [_binary("relu_grad", x[0], g)]
    if op == "gelu":
        return [_binary("gelu_grad", x[0], g)]
    if op == "square":
        return [g * x[0] * 2.0]
    if op == "pow":
        return [_binary("pow_grad", x[0], g, at["alpha"])]
    if op == "copy":
        return [_unbroadcast(g, x[0].shape)]
    if op == "all_reduce":  # each device's part counts once in the sum
        return [g]
    if op == "sum":
        kept, local = list(x[0].shape), x[0].local
        if at["outer"] == 1 and at["inner"] == 1 and at["len"] == x[0].size:
            kept = [1] * x[0].ndim
        else:
            axis = next(a for a in range(x[0].ndim) if _size(local[:a]) == at["outer"] and local[a] == at["len"])
            kept[axis] = 1
        return [_broadcast_to(reshape(g, kept), x[0].shape, x[0].split) * at["alpha"]]
    if op == "reshape":
        return [reshape(g, x[0].shape)]
    if op == "permute":
        return [transpose(g, at["axes"])]  # each supported permutation is its own inverse
    if op == "matmul":
        a, b = x
        if at["batch"] != 1:
            return [matmul(g, transpose(b, (0, 2, 1))), matmul(transpose(a, (0, 2, 1)), g)]
        if at["ta"] or at["tb"]:
            raise NotImplementedError("the gradient of a gradient's matmul (second order)")
        m, n, k = _size(a.shape[:-1]), b.shape[1], a.shape[-1]  # of the whole arrays
        g2, a2 = reshape(g, (m, n)), reshape(a, (m, k))
        # C = A B: dA = dC B^T, dB = A^T dC, the transposes done by the GEMM.
        da = _matmul_t(g2, b, False, True, m, k, n)
        db = _matmul_t(a2, g2, True, False, k, n, m)
        return [reshape(da, a.shape), db]
    if op == "softmax":
        y = node.outputs[0]
        return [y * (g - sum(g * y, axis=-1, keepdims=True))]
    if op == "layer_norm":
        rows, cols = at["rows"], at["cols"]
        _, mu, rstd = node.outputs
        dx, dgamma, dbeta = _record("layer_norm_backward", [g, x[0], x[1], mu, rstd], {"rows": rows, "cols": cols},
                                    [x[0].shape, (cols,), (cols,)], split=[x[0].split, False, False])
        if x[0].split:
            dgamma, dbeta = _summed(dgamma), _summed(dbeta)
        return [dx, dgamma, dbeta]
    if op == "attention":
        out, lse = node.outputs
        return list(_record("attention_backward", [x[0], x[1], x[2], out, g, lse], dict(at), [x[0].shape] * 3,
                            split=[x[0].split] * 3))
    if op == "embedding":
        dtable = _record("embedding_backward", [x[0], g], dict(at), [x[1].shape])
        return [None, _summed(dtable) if x[0].split else dtable]
    if op == "cross_entropy":
        rows, vocab = at["rows"], at["vocab"]
        d = _record("cross_entropy_backward", [x[0], x[1]], dict(at), [x[0].shape], split=[x[0].split])
        return [d * reshape(g, g.shape + (1,)), None]
    raise NotImplementedError(f"no gradient for {op}")


def value_and_grad(f, argnums=None):
    """A function that returns (f(*args), gradients of its scalar result with
    respect to the arguments numbered `argnums` (all, by default)), by
    reverse mode over what f recorded. Nothing runs yet: both, and whatever
    is recorded from them (an optimizer step), run as one program at the
    next sync."""

    def wrapped(*args):
        out = f(*args)
        if not isinstance(out, Array) or out.size != 1:
            raise ValueError("value_and_grad needs a function whose result is one float")
        nums = range(len(args)) if argnums is None else ([argnums] if isinstance(argnums, int) else argnums)
        # Reverse topological order of the recorded nodes from the result,
        # back to the arguments (what made them is not differentiated).
        order, seen = [], set()
        stops = {id(a) for a in args}

        def visit(x):
            node = x._node
            if node is None or id(node) in seen or id(x) in stops:
                return
            seen.add(id(node))
            for i in node.inputs:
                visit(i)
            order.append(node)

        visit(out)
        grads = {id(out): ones(out.shape)}
        for node in reversed(order):
            outs = [grads.get(id(o)) for o in node.outputs]
            if outs[0] is None:
                continue
            for i, gi in zip(node.inputs, _vjp(node, outs)):
                if gi is None:
                    continue
                grads[id(i)] = gi if id(i) not in grads else grads[id(i)] + gi
        results = [grads.get(id(args[n])) for n in nums]
        results = [zeros(args[n].shape) if r is None else r for n, r in zip(nums, results)]
        return out, tuple(results)

    return wrapped


def grad(f, argnums=None):
    """The gradients of f's scalar result (see value_and_grad)."""
    vg = value_and_grad(f, argnums)
    return lambda *args: vg(*args)[1]
