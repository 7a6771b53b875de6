"""causeway.lazy against numpy: each operation's values, gradients by
reverse mode against finite differences of a float64 numpy model, one
program per sync, the trace cache reused by a second step, and a small
training loop whose loss falls."""

import numpy as np
import pytest

import causeway
from causeway import lazy


@pytest.fixture(autouse=True)
def target():
    lazy.use(causeway.local(accelerators=1, name="lazy-test"))


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def gelu(u):
    return 0.5 * u * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (u + 0.044715 * u ** 3)))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, gamma, beta, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(axis=-1, keepdims=True) + eps) * gamma + beta


def cross_entropy(logits, targets):
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def close(got, want, tol=1e-4):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_elementwise_operations_broadcast_as_numpy():
    a, b, c = rand(6, 5, seed=1), rand(5, seed=2), rand(6, 1, seed=3)
    x, y, z = lazy.array(a), lazy.array(b), lazy.array(c)
    close((x + y).numpy(), a + b)
    close((x - z).numpy(), a - c)
    close((x * y * 2.0 - 1.0).numpy(), a * b * 2 - 1)
    close((x / (lazy.exp(z) + 1.0)).numpy(), a / (np.exp(c) + 1))
    close((3.0 / (lazy.exp(x) + 1.0)).numpy(), 3 / (np.exp(a) + 1))
    close((1.0 - x).numpy(), 1 - a)
    close(lazy.maximum(x, y).numpy(), np.maximum(a, b))
    close(lazy.relu(x).numpy(), np.maximum(a, 0))
    close(lazy.tanh(x).numpy(), np.tanh(a))
    close(lazy.gelu(x).numpy(), gelu(a.astype(np.float64)))
    close(lazy.log(lazy.exp(x) + 1.0).numpy(), np.log(np.exp(a) + 1))
    close((x ** 2).numpy(), a ** 2)
    close((-x).numpy(), -a)
    with pytest.raises(ValueError, match=r"shapes \[6, 5\] and \[4\] do not broadcast"):
        x + lazy.array(rand(4))


def test_reductions_shapes_and_the_kernel_library_operations():
    a = rand(4, 6, 8, seed=4)
    x = lazy.array(a)
    close(x.sum().numpy(), a.sum(), tol=1e-3)
    close(x.sum(axis=1).numpy(), a.sum(axis=1))
    close(x.sum(axis=-1, keepdims=True).numpy(), a.sum(axis=-1, keepdims=True))
    close(x.mean(axis=0).numpy(), a.mean(axis=0))
    close(lazy.array(rand(300, 40, seed=9)).mean().numpy(), rand(300, 40, seed=9).mean())
    close(x.reshape(24, 8).numpy(), a.reshape(24, 8))
    close(x.reshape(-1).numpy(), a.reshape(-1))
    close(x.transpose(0, 2, 1).numpy(), a.transpose(0, 2, 1))
    close(lazy.array(a[0]).T.numpy(), a[0].T)
    q = rand(2, 3, 4, 5, seed=5)
    close(lazy.array(q).transpose(0, 2, 1, 3).numpy(), q.transpose(0, 2, 1, 3))
    with pytest.raises(NotImplementedError, match="transpose"):
        lazy.array(q).transpose(3, 2, 1, 0)
    close(lazy.softmax(x).numpy(), softmax(a))
    w = rand(8, 3, seed=6)
    close((x @ lazy.array(w)).numpy(), a @ w)
    bw = rand(4, 8, 2, seed=7)
    close((x @ lazy.array(bw)).numpy(), a @ bw)
    gamma, beta = rand(8, seed=8), rand(8, seed=9)
    close(lazy.layer_norm(x, lazy.array(gamma), lazy.array(beta)).numpy(),
          layer_norm(a.astype(np.float64), gamma, beta), tol=1e-3)
    ids = np.array([[1, 0, 3], [2, 2, 1]], dtype=np.int32)
    table = rand(4, 5, seed=10)
    close(lazy.embedding(lazy.array(ids), lazy.array(table)).numpy(), table[ids])
    logits, targets = rand(6, 7, seed=11), np.array([0, 6, 3, 3, 1, 2], dtype=np.int32)
    close(lazy.cross_entropy(lazy.array(logits), lazy.array(targets)).numpy(), cross_entropy(logits, targets))
    with pytest.raises(ValueError, match="int32"):
        lazy.embedding(lazy.array(table), lazy.array(table))


def model(params, ids, targets, np_mode=False):
    """A tiny language model: embedding, layer norm, a GELU MLP, a residual,
    logits, mean cross-entropy."""
    table, gamma, beta, w1, b1, w2 = params
    if np_mode:
        h = table[ids]
        n = layer_norm(h, gamma, beta)
        u = gelu(n @ w1 + b1)
        logits = (h + u @ w2) @ table.T
        return cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).mean()
    h = lazy.embedding(ids, table)
    n = lazy.layer_norm(h, gamma, beta)
    u = lazy.gelu(n @ w1 + b1)
    logits = (h + u @ w2) @ table.T
    return lazy.mean(lazy.cross_entropy(logits, targets))


def model_params(seed):
    vocab, dim, hidden = 11, 8, 12
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 0.5).astype(np.float32)
            for s in [(vocab, dim), (dim,), (dim,), (dim, hidden), (hidden,), (hidden, dim)]]


def test_gradients_match_finite_differences_of_numpy():
    host = model_params(21)
    ids = np.random.default_rng(22).integers(0, 11, size=(3, 5)).astype(np.int32)
    targets = np.random.default_rng(23).integers(0, 11, size=(3, 5)).astype(np.int32)
    params = [lazy.array(p) for p in host]
    loss, grads = lazy.value_and_grad(lambda *p: model(p, lazy.array(ids), lazy.array(targets)))(*params)
    h64 = [p.astype(np.float64) for p in host]
    close(loss.numpy(), model(h64, ids, targets, np_mode=True), tol=1e-4)
    rng = np.random.default_rng(24)
    for which, (p, g) in enumerate(zip(h64, grads)):
        got = g.numpy()
        assert got.shape == p.shape
        for _ in range(4):  # a few coordinates of each parameter, by central differences
            i = tuple(rng.integers(0, d) for d in p.shape)
            eps = 1e-5
            plus = [q.copy() for q in h64]
            minus = [q.copy() for q in h64]
            plus[which][i] += eps
            minus[which][i] -= eps
            want = (model(plus, ids, targets, True) - model(minus, ids, targets, True)) / (2 * eps)
            assert abs(got[i] - want) <= 1e-3 * max(1.0, abs(want)), (which, i, got[i], want)


def test_one_program_per_sync_and_the_second_step_reuses_it():
    host = model_params(31)
    ids = lazy.array(np.arange(15, dtype=np.int32).reshape(3, 5) % 11)
    targets = lazy.array((np.arange(15, dtype=np.int32).reshape(3, 5) + 1) % 11)
    params = [lazy.array(p) for p in host]
    step = lazy.value_and_grad(lambda *p: model(p, ids, targets))
    hits, misses, held = lazy.cache_info()
    first_loss, first_grads = step(*params)
    assert lazy.cache_info() == (hits, misses, held)  # recorded, not run
    lazy.sync(first_loss, *first_grads)
    assert lazy.cache_info() == (hits, misses + 1, held + 1)  # forward and backward: one program
    second_loss, second_grads = step(*params)
    lazy.sync(second_loss, *second_grads)
    assert lazy.cache_info() == (hits + 1, misses + 1, held + 1)  # nothing built again
    close(second_loss.numpy(), first_loss.numpy(), tol=0)
    for a, b in zip(first_grads, second_grads):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_training_with_sgd_lowers_the_loss():
    host = model_params(41)
    rng = np.random.default_rng(42)
    ids = lazy.array(rng.integers(0, 11, size=(4, 6)).astype(np.int32))
    targets = lazy.array(rng.integers(0, 11, size=(4, 6)).astype(np.int32))
    params = [lazy.array(p) for p in host]
    step = lazy.value_and_grad(lambda *p: model(p, ids, targets))
    losses = []
    for _ in range(30):
        loss, grads = step(*params)
        params = [p - 0.5 * g for p, g in zip(params, grads)]
        losses.append(float(loss.numpy()))
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(np.isfinite(losses))


def test_split_arrays_run_spmd_and_data_parallel_gradients_equal_one_devices():
    host = model_params(51)
    rng = np.random.default_rng(52)
    ids = rng.integers(0, 11, size=(4, 5)).astype(np.int32)
    targets = rng.integers(0, 11, size=(4, 5)).astype(np.int32)

    def step(split):
        params = [lazy.array(p) for p in host]
        f = lazy.value_and_grad(lambda *p: model(p, lazy.array(ids, split=split), lazy.array(targets, split=split)))
        loss, grads = f(*params)
        return float(loss.numpy()), [g.numpy() for g in grads]

    one_loss, one_grads = step(False)
    client = causeway.local(accelerators=2, name="spmd")
    lazy.use(client, client.mesh([2]))
    two_loss, two_grads = step(True)
    close(two_loss, one_loss, tol=1e-5)
    for a, b in zip(two_grads, one_grads):
        close(a, b, tol=1e-5)

    # Values of split arrays, each device computing its rows.
    a, w = rand(6, 4, seed=53), rand(4, 3, seed=54)
    x = lazy.array(a, split=True)
    y = lazy.softmax(lazy.gelu(x @ lazy.array(w)) + lazy.array(rand(3, seed=55)))
    assert y.split
    close(y.numpy(), softmax(gelu(a.astype(np.float64) @ w) + rand(3, seed=55)))
    close(x.sum(axis=0).numpy(), a.sum(axis=0))
    close(x.mean().numpy(), a.mean())
    close(x.reshape(12, 2).sum(axis=1).numpy(), a.reshape(12, 2).sum(axis=1))
    with pytest.raises(ValueError, match="multiple of the mesh's 2 devices"):
        lazy.array(rand(5, 4), split=True)
    with pytest.raises(ValueError, match="split both or broadcast the whole one"):
        x + lazy.array(a)
    with pytest.raises(NotImplementedError, match="split"):
        x.T


def causal_attention(q, k, v):
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    t = q.shape[2]
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)
    return softmax(scores) @ v


def test_attention_and_its_gradients_match_numpy():
    shape = (2, 3, 8, 4)
    q, k, v, w = (rand(*shape, seed=s) for s in (61, 62, 63, 64))
    close(lazy.attention(lazy.array(q), lazy.array(k), lazy.array(v)).numpy(),
          causal_attention(*(x.astype(np.float64) for x in (q, k, v))))
    f = lazy.grad(lambda q_, k_, v_: lazy.sum(lazy.attention(q_, k_, v_) * lazy.array(w)))
    grads = [g.numpy() for g in f(lazy.array(q), lazy.array(k), lazy.array(v))]
    h64 = [x.astype(np.float64) for x in (q, k, v)]

    def loss(xs):
        return float((causal_attention(*xs) * w).sum())

    rng = np.random.default_rng(65)
    for which in range(3):
        for _ in range(4):
            i = tuple(rng.integers(0, d) for d in shape)
            plus, minus = [x.copy() for x in h64], [x.copy() for x in h64]
            plus[which][i] += 1e-5
            minus[which][i] -= 1e-5
            want = (loss(plus) - loss(minus)) / 2e-5
            assert abs(grads[which][i] - want) <= 1e-3 * max(1.0, abs(want)), (which, i, grads[which][i], want)
    with pytest.raises(ValueError, match="one shape"):
        lazy.attention(lazy.array(q), lazy.array(k[:, :2]), lazy.array(v))
