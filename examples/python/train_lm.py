"""The benchmark language model's training step written in Python with
causeway.lazy, started from the C++ trainer's initial weights and fed its
batches, then measured against the C++ trainer (causeway/models/) in the
same process: steps alternate between the two in blocks, and each prints its
losses and tokens/s.

    PYTHONPATH=build/python python3 examples/python/train_lm.py [--steps 50] [--block 10]

The model (as causeway/models/transformer.h): token and position embeddings,
pre-norm blocks of causal multi-head attention and a GELU MLP with
residuals, a final layer norm, logits, mean cross-entropy; Adam. Exits 1 if
the first step's loss differs from the C++ trainer's by more than 1e-4, or
the last step's by more than 1e-2."""

import argparse
import pathlib
import sys
import time

import numpy as np

import causeway
from causeway import lazy

ROOT = pathlib.Path(__file__).resolve().parents[2]


def layer_norm(x, g, b):
    return lazy.layer_norm(x, g, b, eps=1e-5)


def heads(x, batch, seq, h, hd):
    """[batch * seq, d] to [batch, h, seq, hd]."""
    return x.reshape(batch, seq, h, hd).transpose(0, 2, 1, 3)


def forward(p, ids, targets, config):
    """The mean per-token loss of a batch (p: the tensors by name)."""
    batch, seq = ids.shape
    d, h, layers = config["d_model"], config["heads"], config["layers"]
    hd = d // h
    x = (lazy.embedding(ids, p["tok_emb"]) + p["pos_emb"]).reshape(batch * seq, d)
    for l in range(layers):
        t = lambda name: p[f"layer{l}.{name}"]  # noqa: E731
        h1 = layer_norm(x, t("ln1_g"), t("ln1_b"))
        q, k, v = (heads(h1 @ t(w), batch, seq, h, hd) for w in ("wq", "wk", "wv"))
        o = lazy.attention(q, k, v).transpose(0, 2, 1, 3).reshape(batch * seq, d)
        x2 = x + o @ t("wo")
        h2 = layer_norm(x2, t("ln2_g"), t("ln2_b"))
        x = x2 + lazy.gelu(h2 @ t("w1") + t("b1")) @ t("w2")
    logits = layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["w_out"]
    return lazy.mean(lazy.cross_entropy(logits, targets.reshape(batch * seq)))


class PythonTrainer:
    def __init__(self, corpus, config, batch, seed, lr):
        self.names, self.params = [], []
        for name, value in causeway.models.initial_parameters(corpus.vocab_size, config["d_model"],
                                                               config["heads"], config["d_ff"], config["layers"],
                                                               config["seq_len"], seed):
            self.names.append(name)
            self.params.append(lazy.array(value))
        self.m = [lazy.zeros(p.shape) for p in self.params]
        self.v = [lazy.zeros(p.shape) for p in self.params]
        self.sampler = causeway.models.BatchSampler(corpus, batch, config["seq_len"], seed)
        self.config, self.lr, self.step_count = config, lr, 0
        self.loss_and_grads = lazy.value_and_grad(self._loss)

    def _loss(self, ids, targets, *params):
        return forward(dict(zip(self.names, params)), ids, targets, self.config)

    def train(self, steps):
        """Runs `steps` steps; their losses. Each step (forward, backward and
        Adam) is one program, the same one from the second step on; step
        t + 1 is queued before step t's loss is read, as the C++ trainer
        does."""
        losses, pending = [], None
        for _ in range(steps):
            inputs, targets = self.sampler.next()
            self.step_count += 1
            loss, grads = self.loss_and_grads(lazy.array(inputs), lazy.array(targets), *self.params)
            step = lazy.array(np.array([self.step_count], dtype=np.float32))
            updated = [lazy.adam(p, g, m, v, step, lr=self.lr)
                       for p, g, m, v in zip(self.params, grads[2:], self.m, self.v)]
            self.params = [u[0] for u in updated]
            self.m = [u[1] for u in updated]
            self.v = [u[2] for u in updated]
            lazy.sync(loss, *self.params, *self.m, *self.v)
            if pending is not None:
                losses.append(float(pending.numpy()))
            pending = loss
        losses.append(float(pending.numpy()))
        return losses


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--block", type=int, default=10, help="steps each trainer runs before the other")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--corpus", default=str(ROOT / "data" / "kjv-genesis-exodus.txt"))
    args = parser.parse_args(argv)
    config = {"d_model": 64, "heads": 4, "d_ff": 256, "layers": 2, "seq_len": 64}
    lr = 1e-3

    corpus = causeway.models.TextCorpus.load(args.corpus)
    client = causeway.local(accelerators=1, name="train-lm")
    lazy.use(client, client.mesh([1]))
    python = PythonTrainer(corpus, config, args.batch, args.seed, lr)
    cpp = causeway.models.Trainer(client, corpus, config["d_model"], config["heads"], config["d_ff"],
                                  config["layers"], config["seq_len"], args.batch, seed=args.seed, lr=lr)
    tokens = args.batch * config["seq_len"]
    # The first block of each builds and loads its programs: timed apart.
    losses = {"python": python.train(1), "c++": cpp.train(1)}
    seconds = {"python": 0.0, "c++": 0.0}
    done = 1
    while done < args.steps:
        n = min(args.block, args.steps - done)
        for name, trainer in (("python", python), ("c++", cpp)):
            start = time.perf_counter()
            losses[name] += trainer.train(n)
            seconds[name] += time.perf_counter() - start
        done += n
    timed = (args.steps - 1) * tokens
    rate = {name: timed / s if s > 0 else float("nan") for name, s in seconds.items()}
    for name in ("python", "c++"):
        print(f"{name:6s} losses: first {losses[name][0]:.6f}, step {args.steps} {losses[name][-1]:.6f}; "
              f"{rate[name]:.0f} tokens/s over steps 2-{args.steps}")
    first = abs(losses["python"][0] - losses["c++"][0])
    last = abs(losses["python"][-1] - losses["c++"][-1])
    print(f"difference: first step {first:.2e}, step {args.steps} {last:.2e}; "
          f"python/c++ tokens/s {rate['python'] / rate['c++']:.3f}")
    if first > 1e-4 or last > 1e-2:
        print("FAILED: the Python step does not follow the C++ trainer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
