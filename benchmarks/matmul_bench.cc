// GEMM throughput on the device against OpenBLAS on the host, in the same
// binary and run, on Transformer-sized shapes.
//
//   gemm:   ops::Gemm (causeway/shaders/gemm.comp), C = A * B, one dispatch per
//           product (a batch is one dispatch over workgroup z).
//   matmul: ops::Matmul (causeway/shaders/matmul.comp), the older kernel, one
//           dispatch per product (a batch is `batch` dispatches).
//   OpenBLAS: cblas_sgemm on as many threads as this process may use (its
//           CPU affinity: the cores lavapipe runs on), one call per product,
//           with the kernels for the CPU's vector width (see main: OpenBLAS
//           0.3.21 mistakes some CPUs for SSE3 ones); for a batch, also the
//           products side by side, one single-threaded call per thread, and
//           the better of the two is the baseline. The core OpenBLAS runs
//           is in the JSON.
//
// Then the attention kernels (ops::AttentionForward, ops::AttentionBackward:
// causeway/shaders/attention*.comp, causal, fused, T x T never in memory) on
// the demo's and the models benchmark's shapes [batch, heads, T, head_dim],
// against the GEMMs an unfused attention runs for the same products, on the
// same device in the same run: S = Q K^T and O = P V forward; dP = dO V^T,
// dV = P^T dO, dQ = dS K and dK = dS^T Q backward, each a batched ops::Gemm
// over batch * heads. Attention's GFLOP/s count the causal products it does
// (T (T + 1) / 2 query-key pairs of the T^2), the GEMMs' the full ones they
// do; the ratio of the two rates is how near attention runs to the GEMM
// kernel's efficiency (the aim: at least 0.5).
//
// Then the memory-bound kernels a training step runs (layer_norm and its
// backward, permute_0213, add, bias_gelu and its backward, cross_entropy
// and its backward, embedding and its backward, adam_update and
// adam_update_multi) at the demo's shapes, in GB/s of the
// bytes each must move at least (every input read once, every output written
// once), against the device copying the same number of bytes (half read,
// half written) between two buffers: the better of vkCmdCopyBuffer and the
// copy kernel, alternated with the kernel sample by sample. The ratio is how
// near each runs to the device's copy bandwidth.
//
// Each sample runs `reps` products back to back (so that one sample does at
// least ~1 GFLOP: small shapes are not dominated by submission cost) and
// times them with the wall clock; the three alternate sample by sample, and
// the medians of `--samples` samples are printed in GFLOP/s, with the ratio
// against OpenBLAS. Both device results are checked once against OpenBLAS's.
//
//   causeway_matmul_bench [--shapes=[Bx]MxNxK,...] [--attention=BxHxTxD,...]
//                         [--rows=ROWSxCOLS] [--samples=5]
//                         [--quick] [--json=FILE]
// --quick: 2 samples of two small shapes (seconds, for tests); the common
// flags: bench_main.h.
#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/kernels/attention_ops.h"
#include "causeway/kernels/attention_reference.h"
#include "causeway/kernels/nn_ops.h"
#include "causeway/kernels/ops.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/runtime.h"

namespace causeway {
namespace {

using bench::Median;
using bench::Must;

struct Shape {
  uint32_t m, n, k, batch = 1;
  std::string Name() const {
    return batch == 1 ? absl::StrCat(m, "x", n, "x", k) : absl::StrCat(batch, "x", m, "x", n, "x", k);
  }
  double Flops() const { return 2.0 * batch * m * n * k; }
};

// Parses "MxNxK" or "BxMxNxK".
bool ParseShape(absl::string_view s, Shape* out) {
  std::vector<std::string> parts = absl::StrSplit(s, 'x');
  std::vector<uint32_t> v;
  for (const std::string& p : parts) {
    uint32_t x;
    if (!absl::SimpleAtoi(p, &x) || x == 0) return false;
    v.push_back(x);
  }
  if (v.size() == 3) *out = {v[0], v[1], v[2], 1};
  else if (v.size() == 4) *out = {v[1], v[2], v[3], v[0]};
  else return false;
  return true;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// max |x - y| / max(1, |y|) over the elements.
double MaxError(const std::vector<float>& x, const std::vector<float>& y) {
  return reference::MaxRelativeError(x, y);
}

// [batch, heads, T, head_dim] of an attention row.
struct AttentionRow {
  AttentionShape shape;
  std::string Name() const {
    return absl::StrCat(shape.batch, "x", shape.heads, "x", shape.seq_len, "x", shape.head_dim);
  }
  uint64_t Matrices() const { return uint64_t{shape.batch} * shape.heads; }
  // One T x T x head_dim product over every matrix: 2 T^2 D each, and the
  // causal part of it (the pairs j <= i).
  double FullProduct() const { return 2.0 * Matrices() * shape.seq_len * shape.seq_len * shape.head_dim; }
  double CausalProduct() const {
    return 2.0 * Matrices() * shape.seq_len * (shape.seq_len + 1) / 2 * shape.head_dim;
  }
};

bool ParseAttention(absl::string_view s, AttentionRow* out) {
  std::vector<std::string> parts = absl::StrSplit(s, 'x');
  if (parts.size() != 4) return false;
  uint32_t v[4];
  for (int i = 0; i < 4; ++i) {
    if (!absl::SimpleAtoi(parts[i], &v[i]) || v[i] == 0) return false;
  }
  out->shape = AttentionShape{v[0], v[1], v[2], v[3]};
  return true;
}

// The attention rows: forward and backward, each against the batched GEMMs
// of the same products, alternated sample by sample.
void BenchAttention(Accelerator* acc, const std::vector<AttentionRow>& rows, int runs,
                    double min_sample_flops, bench::Report& report) {
  std::printf("\n%-18s %10s %9s %9s %9s %9s %5s\n", "attention", "pass", "kernel", "tiles", "GEMMs",
              "kernel/G", "reps");
  for (const AttentionRow& row : rows) {
    const AttentionShape& s = row.shape;
    const uint64_t n = s.elements(), t = s.seq_len, d = s.head_dim, bh = row.Matrices();
    auto floats = [&](uint64_t count, uint32_t seed) {
      auto buffer = Must(acc->CreateBuffer(count * 4), "CreateBuffer");
      std::vector<float> h = reference::RandomFloats(count, seed);
      CHECK_OK(acc->UploadSync(buffer, h.data(), count * 4));
      return std::make_pair(buffer, h);
    };
    auto [q, qh] = floats(n, 11);
    auto [k, kh] = floats(n, 12);
    auto [v, vh] = floats(n, 13);
    auto [d_out, dh] = floats(n, 14);
    auto out = Must(acc->CreateBuffer(n * 4), "CreateBuffer");
    auto lse = Must(acc->CreateBuffer(s.rows() * 4), "CreateBuffer");
    auto delta = Must(acc->CreateBuffer(s.rows() * 4), "CreateBuffer");
    auto dq = Must(acc->CreateBuffer(n * 4), "CreateBuffer");
    auto dk = Must(acc->CreateBuffer(n * 4), "CreateBuffer");
    auto dv = Must(acc->CreateBuffer(n * 4), "CreateBuffer");
    // The unfused GEMMs' T x T scores and their gradient.
    auto scores = Must(acc->CreateBuffer(bh * t * t * 4), "CreateBuffer");
    auto d_scores = Must(acc->CreateBuffer(bh * t * t * 4), "CreateBuffer");

    // Check the kernels once against the CPU reference.
    {
      auto list = Must(acc->CreateCommandList("attention check"), "CreateCommandList");
      CHECK_OK(ops::AttentionForward(*list, q, k, v, out, lse, s));
      CHECK_OK(ops::AttentionBackward(*list, q, k, v, out, d_out, lse, delta, dq, dk, dv, s));
      CHECK_OK(acc->Submit(list).Await());
      const reference::AttentionDims dims{s.batch, s.heads, s.seq_len, s.head_dim,
                                          1.0f / std::sqrt(static_cast<float>(s.head_dim))};
      const auto fwd = reference::AttentionForward(qh, kh, vh, dims);
      const auto grads = reference::AttentionBackward(qh, kh, vh, dh, dims);
      std::vector<float> got(n);
      const std::pair<const std::shared_ptr<Buffer>*, const std::vector<float>*> checks[] = {
          {&out, &fwd.out}, {&dq, &grads.dq}, {&dk, &grads.dk}, {&dv, &grads.dv}};
      for (const auto& [buffer, want] : checks) {
        CHECK_OK(acc->DownloadSync(*buffer, got.data(), n * 4));
        const double err = MaxError(got, *want);
        if (!(err < 1e-3)) bench::Die(absl::StrCat("attention ", row.Name(), ": max relative error ", err));
      }
    }

    auto gemm = [&](CommandList& list, const std::shared_ptr<Buffer>& a, const std::shared_ptr<Buffer>& b,
                    const std::shared_ptr<Buffer>& c, uint64_t m, uint64_t nn, uint64_t kk, bool ta,
                    bool tb) {
      ops::GemmOptions o;
      o.batch = static_cast<uint32_t>(bh);
      o.transpose_a = ta;
      o.transpose_b = tb;
      CHECK_OK(ops::Gemm(list, a, b, c, static_cast<uint32_t>(m), static_cast<uint32_t>(nn),
                         static_cast<uint32_t>(kk), o));
    };
    const double fwd_full = 2 * row.FullProduct(), bwd_full = 4 * row.FullProduct();
    const double fwd_causal = 2 * row.CausalProduct(), bwd_causal = 4 * row.CausalProduct();
    const int reps = static_cast<int>(std::max(1.0, std::ceil(min_sample_flops / bwd_full)));
    auto list_of = [&](const char* name, const std::function<void(CommandList&)>& record) {
      auto list = Must(acc->CreateCommandList(name), "CreateCommandList");
      for (int r = 0; r < reps; ++r) record(*list);
      return list;
    };
    // The shared-tiles kernels (the GPU path) on this device too.
    const auto tiles_forward =
        Must(ops::PlanAttentionForward(s, nullptr, ops::AttentionPath::kSharedTiles), "plan");
    const auto tiles_backward =
        Must(ops::PlanAttentionBackward(s, nullptr, ops::AttentionPath::kSharedTiles), "plan");
    std::shared_ptr<CommandList> lists[] = {
        list_of("attention forward",
                [&](CommandList& l) { CHECK_OK(ops::AttentionForward(l, q, k, v, out, lse, s)); }),
        list_of("attention forward tiles",
                [&](CommandList& l) {
                  CHECK_OK(ops::Record(l, tiles_forward, {q, k, v, out, lse}));
                }),
        list_of("attention forward GEMMs",
                [&](CommandList& l) {
                  gemm(l, q, k, scores, t, t, d, false, true);     // S = Q K^T
                  gemm(l, scores, v, out, t, d, t, false, false);  // O = P V
                }),
        list_of("attention backward",
                [&](CommandList& l) {
                  CHECK_OK(ops::AttentionBackward(l, q, k, v, out, d_out, lse, delta, dq, dk, dv, s));
                }),
        list_of("attention backward tiles",
                [&](CommandList& l) {
                  CHECK_OK(ops::Record(l, tiles_backward, {q, k, v, out, d_out, lse, delta, dq, dk, dv}));
                }),
        list_of("attention backward GEMMs",
                [&](CommandList& l) {
                  gemm(l, d_out, v, d_scores, t, t, d, false, true);  // dP = dO V^T
                  gemm(l, scores, d_out, dv, t, d, t, true, false);   // dV = P^T dO
                  gemm(l, d_scores, k, dq, t, d, t, false, false);    // dQ = dS K
                  gemm(l, d_scores, q, dk, t, d, t, true, false);     // dK = dS^T Q
                }),
    };
    for (auto& list : lists) CHECK_OK(acc->Submit(list).Await());  // warm up: pipelines
    const double flops[] = {fwd_causal, fwd_causal, fwd_full, bwd_causal, bwd_causal, bwd_full};
    std::vector<std::function<double()>> cases;
    for (int i = 0; i < 6; ++i) {
      cases.push_back([&, i] {
        auto t0 = std::chrono::steady_clock::now();
        CHECK_OK(acc->Submit(lists[i]).Await());
        return flops[i] * reps / Seconds(t0) / 1e9;
      });
    }
    std::vector<std::vector<double>> samples = bench::Alternate(runs, cases);
    for (int pass = 0; pass < 2; ++pass) {
      const double kernel = Median(samples[3 * pass]), tiles = Median(samples[3 * pass + 1]),
                   gemms = Median(samples[3 * pass + 2]);
      const char* name = pass == 0 ? "forward" : "backward";
      std::printf("%-18s %10s %9.2f %9.2f %9.2f %9.3f %5d\n", row.Name().c_str(), name, kernel, tiles, gemms,
                  kernel / gemms, reps);
      std::fflush(stdout);
      report.Add(absl::StrCat("attention ", name), row.Name(), "GFLOP/s")
          .Value(kernel)
          .Baseline("GEMMs of the same products", gemms)
          .Extra("shared_tiles_gflops", tiles)
          .Samples(runs)
          .Param("batch", s.batch)
          .Param("heads", s.heads)
          .Param("seq_len", s.seq_len)
          .Param("head_dim", s.head_dim)
          .Extra("reps", reps);
    }
  }
}

// The memory-bound kernels of a training step on [rows, cols] activations
// (the demo: 1024 x 64), each in GB/s of the bytes it must move, against the
// device's copy of as many bytes, alternated sample by sample.
void BenchMemoryKernels(Accelerator* acc, uint32_t rows, uint32_t cols, uint32_t heads, int runs,
                        double min_sample_bytes, bench::Report& report) {
  const uint64_t n = uint64_t{rows} * cols;
  auto floats = [&](uint64_t count, uint32_t seed) {
    auto buffer = Must(acc->CreateBuffer(count * 4), "CreateBuffer");
    std::vector<float> h = reference::RandomFloats(count, seed, 0.5f, 1.5f);
    CHECK_OK(acc->UploadSync(buffer, h.data(), count * 4));
    return buffer;
  };
  auto x = floats(n, 1), dy = floats(n, 2), y = floats(n, 3), dx = floats(n, 4);
  auto gamma = floats(cols, 5), beta = floats(cols, 6), dgamma = floats(cols, 7), dbeta = floats(cols, 8);
  auto mean = floats(rows, 9), rstd = floats(rows, 10);
  auto m = floats(n, 11), v = floats(n, 12), step = floats(1, 13);
  // [batch, T, heads, head_dim] of the demo's attention: rows = batch * T.
  const uint32_t head_dim = cols / heads, t = std::min<uint32_t>(rows, 64), batch = rows / t;
  // The MLP's hidden width (4 cols, as the demo's d_ff) and a vocabulary of
  // 64 (the demo's corpus has 65 characters).
  const uint32_t ff = 4 * cols, vocab = 64;
  const uint64_t hidden = uint64_t{rows} * ff;
  auto u = floats(hidden, 15), du = floats(hidden, 16), g = floats(hidden, 17), bias = floats(ff, 18);
  auto dbias = floats(ff, 19), logits = floats(uint64_t{rows} * vocab, 20);
  auto dlogits = floats(uint64_t{rows} * vocab, 21), loss = floats(rows, 22);
  auto table = floats(uint64_t{vocab} * cols, 23), dtable = floats(uint64_t{vocab} * cols, 24);
  auto pos = floats(uint64_t{t} * cols, 25);
  auto ids = Must(acc->CreateBuffer(uint64_t{rows} * 4), "CreateBuffer");
  {
    std::vector<int32_t> h(rows);
    for (uint32_t i = 0; i < rows; ++i) h[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
    CHECK_OK(acc->UploadSync(ids, h.data(), h.size() * 4));
  }
  struct Kernel {
    std::string name;
    std::string shape;
    double bytes;  // the least each call must move
    std::function<absl::Status(CommandList&)> record;
  };
  const std::string rc = absl::StrCat(rows, "x", cols), rf = absl::StrCat(rows, "x", ff),
                    rv = absl::StrCat(rows, "x", vocab);
  ops::AdamConfig adam;
  const std::vector<Kernel> kernels = {
      {"layer_norm", rc, 4.0 * (2 * n + 2 * cols + 2 * rows),
       [&](CommandList& l) { return ops::LayerNorm(l, x, gamma, beta, y, mean, rstd, rows, cols); }},
      {"layer_norm_backward", rc, 4.0 * (3 * n + 3 * cols + 2 * rows),
       [&](CommandList& l) {
         return ops::LayerNormBackward(l, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols);
       }},
      {"permute_0213", absl::StrCat(batch, "x", t, "x", heads, "x", head_dim), 4.0 * 2 * batch * t * cols,
       [&](CommandList& l) { return ops::Permute0213(l, x, y, batch, t, heads, head_dim); }},
      {"add", rc, 4.0 * 3 * n,
       [&](CommandList& l) { return ops::Add(l, x, dy, y, static_cast<uint32_t>(n)); }},
      {"bias_gelu", rf, 4.0 * (2 * hidden + ff),
       [&](CommandList& l) { return ops::BiasGelu(l, u, bias, g, rows, ff); }},
      {"bias_gelu_backward", rf, 4.0 * (3 * hidden + 2 * ff),
       [&](CommandList& l) { return ops::BiasGeluBackward(l, g, u, bias, du, dbias, rows, ff); }},
      {"cross_entropy", rv, 4.0 * (uint64_t{rows} * vocab + 2 * rows),
       [&](CommandList& l) { return ops::CrossEntropy(l, logits, ids, loss, rows, vocab); }},
      {"cross_entropy_backward", rv, 4.0 * (2 * uint64_t{rows} * vocab + rows),
       [&](CommandList& l) { return ops::CrossEntropyBackward(l, logits, ids, dlogits, rows, vocab); }},
      // Token and position embeddings, as the demo's first layer.
      {"embedding", rc, 4.0 * (2 * n + uint64_t{t} * cols + rows),
       [&](CommandList& l) { return ops::Embedding(l, ids, table, pos, y, rows, cols, vocab, t); }},
      {"embedding_backward", rc, 4.0 * (n + uint64_t{vocab} * cols + rows),
       [&](CommandList& l) { return ops::EmbeddingBackward(l, ids, dy, dtable, rows, cols, vocab); }},
      {"adam_update", absl::StrCat(n), 4.0 * 7 * n,
       [&](CommandList& l) {
         return ops::AdamUpdate(l, y, dy, m, v, step, y, m, v, static_cast<uint32_t>(n), adam);
       }},
      // The same elements as four tensors in one fused dispatch.
      {"adam_update_multi", absl::StrCat("4x", n / 4), 4.0 * 7 * n,
       [&](CommandList& l) {
         const uint64_t q = n / 4, bytes = q * 4;
         std::vector<ops::AdamTensor> tensors;
         for (uint64_t i = 0; i < 4; ++i) {
           const BufferArg py(y, i * bytes, bytes), pm(m, i * bytes, bytes), pv(v, i * bytes, bytes);
           tensors.push_back(
               {py, BufferArg(dy, i * bytes, bytes), pm, pv, py, pm, pv, static_cast<uint32_t>(q)});
         }
         return ops::AdamUpdateMulti(l, tensors, step, adam);
       }},
  };
  std::printf("\n%-22s %10s %9s %9s %9s %5s\n", "memory-bound", "shape", "kernel", "copy", "kernel/c",
              "reps");
  for (const Kernel& kernel : kernels) {
    const int reps = static_cast<int>(std::max(1.0, std::ceil(min_sample_bytes / kernel.bytes)));
    // The copy moves as many bytes: half of them read, half written.
    const uint64_t copy_bytes = static_cast<uint64_t>(kernel.bytes / 2) / 4 * 4;
    auto src = Must(acc->CreateBuffer(copy_bytes), "CreateBuffer");
    auto dst = Must(acc->CreateBuffer(copy_bytes), "CreateBuffer");
    CHECK_OK(acc->UploadSync(src, reference::RandomFloats(copy_bytes / 4, 14).data(), copy_bytes));
    auto list_of = [&](const char* name, const std::function<absl::Status(CommandList&)>& record) {
      auto list = Must(acc->CreateCommandList(name), "CreateCommandList");
      for (int r = 0; r < reps; ++r) CHECK_OK(record(*list));
      return list;
    };
    std::shared_ptr<CommandList> lists[] = {
        list_of(kernel.name.c_str(), kernel.record),
        list_of("vkCmdCopyBuffer", [&](CommandList& l) { return l.Copy(src, dst); }),
        list_of("copy kernel",
                [&](CommandList& l) {
                  return ops::CopyWords(l, src, dst, static_cast<uint32_t>(copy_bytes / 4));
                }),
    };
    for (auto& list : lists) CHECK_OK(acc->Submit(list).Await());  // warm up: pipelines
    std::vector<std::function<double()>> cases;
    for (int i = 0; i < 3; ++i) {
      cases.push_back([&, i] {
        auto t0 = std::chrono::steady_clock::now();
        CHECK_OK(acc->Submit(lists[i]).Await());
        return kernel.bytes * reps / Seconds(t0) / 1e9;
      });
    }
    std::vector<std::vector<double>> samples = bench::Alternate(runs, cases);
    const double got = Median(samples[0]), copy_cmd = Median(samples[1]), copy_kernel = Median(samples[2]);
    const double copy = std::max(copy_cmd, copy_kernel);
    const std::string& shape = kernel.shape;
    std::printf("%-22s %10s %9.2f %9.2f %9.3f %5d%s\n", kernel.name.c_str(), shape.c_str(), got, copy,
                got / copy, reps,
                copy_cmd >= copy_kernel ? "  (copy: vkCmdCopyBuffer)" : "  (copy: copy kernel)");
    std::fflush(stdout);
    report.Add(kernel.name, shape, "GB/s")
        .Value(got)
        .Baseline(
            copy_cmd >= copy_kernel ? "vkCmdCopyBuffer of as many bytes" : "copy kernel of as many bytes",
            copy)
        .Samples(runs)
        // The step's activations the case's shape comes from (the shape
        // itself is the case's name).
        .Param("activation_rows", rows)
        .Param("activation_cols", cols)
        .Extra("reps", reps);
  }
}

int Main(int argc, char** argv) {
  const bench::CommonFlags common = bench::StartBenchmark("causeway_matmul_bench", argc, argv);
  const int runs = common.SamplesOr(common.quick ? 2 : 5);
  std::vector<Shape> shapes = {{256, 256, 256},    {512, 512, 512},   {1024, 1024, 1024},
                               {512, 2048, 512},   {2048, 512, 2048}, {128, 128, 64, 16}};
  // The demo's attention (README's first command: batch 16, 4 heads of 16,
  // context 64) and the models benchmark's (batch 32, 4 heads of 32).
  std::vector<AttentionRow> attention = {{{16, 4, 64, 16}}, {{32, 4, 64, 32}}};
  double min_sample_flops = 1e9;
  // The memory-bound kernels' activations [rows, cols] (the demo's: batch 16
  // times context 64, d_model 64, 4 heads), and the bytes a sample moves at
  // least.
  uint32_t mem_rows = 1024, mem_cols = 64;
  double min_sample_bytes = 2e8;
  if (common.quick) {
    shapes = {{128, 128, 128}, {64, 64, 32, 4}};
    attention = {{{2, 2, 32, 16}}};
    min_sample_flops = 2e7;
    mem_rows = 128;
    min_sample_bytes = 4e6;
  }
  bench::BenchFlags flags;
  flags.Text(
      "shapes", "[Bx]MxNxK,...",
      [&shapes](absl::string_view list) {
        std::vector<Shape> parsed;
        for (absl::string_view s : absl::StrSplit(list, ',')) {
          Shape shape;
          if (!ParseShape(s, &shape)) return absl::StrCat("takes [Bx]MxNxK,...; '", s, "' is not one");
          parsed.push_back(shape);
        }
        shapes = std::move(parsed);
        return std::string();
      },
      "the products to time (B: a batch)");
  flags.Text(
      "attention", "BxHxTxD,...",
      [&attention](absl::string_view list) {
        std::vector<AttentionRow> parsed;
        for (absl::string_view s : absl::StrSplit(list, ',')) {
          AttentionRow row;
          if (!ParseAttention(s, &row)) return absl::StrCat("takes BxHxTxD,...; '", s, "' is not one");
          parsed.push_back(row);
        }
        attention = std::move(parsed);
        return std::string();
      },
      "the attention shapes to time ([batch, heads, T, head_dim])");
  flags.Text(
      "rows", "ROWSxCOLS",
      [&mem_rows, &mem_cols](absl::string_view text) {
        std::vector<std::string> parts = absl::StrSplit(text, 'x');
        uint32_t r = 0, c = 0;
        if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r) || !absl::SimpleAtoi(parts[1], &c) ||
            r == 0 || c == 0 || c % 4 != 0 || uint64_t{r} * c > (uint64_t{1} << 28)) {
          return absl::StrCat("takes ROWSxCOLS (COLS a multiple of 4 heads, at most 2^28 elements); '", text,
                              "' is not one");
        }
        mem_rows = r;
        mem_cols = c;
        return std::string();
      },
      "the memory-bound kernels' activations [batch * context, d_model]");
  flags.Parse(argc, argv);

  RuntimeOptions options;
  options.accelerators = 1;
  options.device = EnvString("CAUSEWAY_DEVICE").empty() ? "cpu" : "";
  auto rt = Must(Runtime::Create(options), "Runtime::Create");
  Accelerator* acc = rt->accelerator(0);
  // OpenBLAS's threads: the CPUs this process may run on (under taskset,
  // fewer than the machine's cores; more threads would only oversubscribe).
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int threads = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                          ? std::max(1, CPU_COUNT(&cpus))
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads);
  const std::string core = openblas_get_corename() != nullptr ? openblas_get_corename() : "unknown";
  std::printf("device: %s; OpenBLAS %s (core %s) on %d threads\n", acc->info().name.c_str(),
              openblas_get_config(), core.c_str(), threads);
  std::printf("%-18s %9s %9s %9s %8s %8s %5s\n", "shape", "gemm", "matmul", "OpenBLAS", "gemm/B", "matmul/B",
              "reps");

  bench::Report report("matmul");
  for (const Shape& s : shapes) {
    const size_t a_n = size_t{s.batch} * s.m * s.k, b_n = size_t{s.batch} * s.k * s.n, c_n = size_t{s.batch} * s.m * s.n;
    const int reps = static_cast<int>(std::max(1.0, std::ceil(min_sample_flops / s.Flops())));
    std::vector<float> a = reference::RandomFloats(a_n, 1), b = reference::RandomFloats(b_n, 2);
    std::vector<float> c_blas(c_n);

    auto product = [&](uint32_t i) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f,
                  a.data() + size_t{i} * s.m * s.k, s.k, b.data() + size_t{i} * s.k * s.n, s.n, 0.0f,
                  c_blas.data() + size_t{i} * s.m * s.n, s.n);
    };
    // The products one after another, each on OpenBLAS's threads.
    auto blas = [&] {
      for (uint32_t i = 0; i < s.batch; ++i) product(i);
    };
    // A batch's products side by side, one single-threaded sgemm per thread
    // (OpenBLAS 0.3.21 has no batched sgemm): small products gain more from
    // running at once than from threads inside each.
    auto blas_side_by_side = [&] {
      openblas_set_num_threads(1);
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
          for (uint32_t i = t; i < s.batch; i += threads) product(i);
        });
      }
      for (auto& w : workers) w.join();
      openblas_set_num_threads(threads);
    };
    const bool batched = s.batch > 1 && threads > 1;

    auto a_buf = Must(acc->CreateBuffer(a_n * 4), "CreateBuffer");
    auto b_buf = Must(acc->CreateBuffer(b_n * 4), "CreateBuffer");
    auto c_buf = Must(acc->CreateBuffer(c_n * 4), "CreateBuffer");
    CHECK_OK(acc->UploadSync(a_buf, a.data(), a_n * 4));
    CHECK_OK(acc->UploadSync(b_buf, b.data(), b_n * 4));

    // One list of `count` products for each kernel.
    auto gemm_list = [&](int count) {
      auto list = Must(acc->CreateCommandList("gemm"), "CreateCommandList");
      ops::GemmOptions o;
      o.batch = s.batch;
      for (int r = 0; r < count; ++r) CHECK_OK(ops::Gemm(*list, a_buf, b_buf, c_buf, s.m, s.n, s.k, o));
      return list;
    };
    auto matmul_list = [&](int count) {
      auto list = Must(acc->CreateCommandList("matmul"), "CreateCommandList");
      for (int r = 0; r < count; ++r) {
        for (uint32_t i = 0; i < s.batch; ++i) {
          const uint64_t as = uint64_t{s.m} * s.k * 4, bs = uint64_t{s.k} * s.n * 4, cs = uint64_t{s.m} * s.n * 4;
          CHECK_OK(ops::Matmul(*list, BufferArg(a_buf, i * as, as), BufferArg(b_buf, i * bs, bs),
                               BufferArg(c_buf, i * cs, cs), s.m, s.n, s.k));
        }
      }
      return list;
    };

    // Check both kernels once against OpenBLAS.
    blas();
    for (auto& [name, list] : {std::pair{"gemm", gemm_list(1)}, std::pair{"matmul", matmul_list(1)}}) {
      CHECK_OK(acc->Submit(list).Await());
      std::vector<float> got(c_n);
      CHECK_OK(acc->DownloadSync(c_buf, got.data(), c_n * 4));
      const double err = MaxError(got, c_blas);
      if (!(err < 1e-3)) bench::Die(absl::StrCat(name, " ", s.Name(), ": max relative error ", err, " against OpenBLAS"));
    }

    std::shared_ptr<CommandList> gemm = gemm_list(reps), matmul = matmul_list(reps);
    // Warm up: pipelines, recordings, OpenBLAS's threads.
    CHECK_OK(acc->Submit(gemm).Await());
    CHECK_OK(acc->Submit(matmul).Await());
    blas();
    if (batched) blas_side_by_side();
    auto time_list = [&](const std::shared_ptr<CommandList>& list) {
      return [&acc, list, &s, reps] {
        auto t0 = std::chrono::steady_clock::now();
        CHECK_OK(acc->Submit(list).Await());
        return s.Flops() * reps / Seconds(t0) / 1e9;
      };
    };
    auto time_host = [&](const std::function<void()>& run) {
      return [&s, reps, run] {
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) run();
        return s.Flops() * reps / Seconds(t0) / 1e9;
      };
    };
    std::vector<std::function<double()>> cases = {time_list(gemm), time_list(matmul), time_host(blas)};
    if (batched) cases.push_back(time_host(blas_side_by_side));
    std::vector<std::vector<double>> samples = bench::Alternate(runs, cases);
    const double g = Median(samples[0]), mm = Median(samples[1]);
    // The baseline: the better of the two ways OpenBLAS can run a batch.
    const double threaded = Median(samples[2]), side_by_side = batched ? Median(samples[3]) : 0;
    const double bl = std::max(threaded, side_by_side);
    std::printf(
        "%-18s %9.2f %9.2f %9.2f %8.3f %8.3f %5d%s\n", s.Name().c_str(), g, mm, bl, g / bl, mm / bl, reps,
        batched ? (side_by_side > threaded ? "  (B: products side by side)" : "  (B: threaded sgemm)") : "");
    std::fflush(stdout);
    for (auto [group, value] : {std::pair{"gemm", g}, std::pair{"matmul", mm}}) {
      report.Add(group, s.Name(), "GFLOP/s")
          .Value(value)
          .Baseline("OpenBLAS", bl)
          .Samples(runs)
          .Param("m", s.m)
          .Param("n", s.n)
          .Param("k", s.k)
          .Param("batch", s.batch)
          .Param("threads", threads)
          .Param("openblas_core", core)
          .Param("openblas_batch", !batched                  ? "threaded sgemm"
                                   : side_by_side > threaded ? "side by side"
                                                             : "threaded sgemm")
          .Extra("reps", reps);
    }
  }
  std::printf("GFLOP/s are medians of %d samples (wall clock, submit to completion); B = OpenBLAS sgemm.\n", runs);
  BenchAttention(acc, attention, runs, min_sample_flops, report);
  std::printf("attention GFLOP/s: the causal products the kernel does; GEMMs: the full products they do.\n");
  BenchMemoryKernels(acc, mem_rows, mem_cols, /*heads=*/4, runs, min_sample_bytes, report);
  std::printf("memory-bound GB/s: the bytes each kernel must move; copy: the device copying as many.\n");
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) {
  // A baseline at its best: OpenBLAS 0.3.21 (Debian 12) does not recognise
  // some recent CPUs and falls back to its SSE3 (Prescott) kernels, at a
  // quarter of its speed on an AVX-512 machine. Unless the user chose a core
  // type, run again with the one the CPU's features call for (OpenBLAS reads
  // OPENBLAS_CORETYPE when it loads, before main).
  const char* core = openblas_get_corename();
  const bool generic = core != nullptr && (std::string(core) == "Prescott" || std::string(core) == "Core2" ||
                                           std::string(core) == "Nehalem");
  if (generic && !causeway::EnvValue("OPENBLAS_CORETYPE").has_value() &&
      (__builtin_cpu_supports("avx512f") || __builtin_cpu_supports("avx2"))) {
    setenv("OPENBLAS_CORETYPE", __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell", 1);
    execv("/proc/self/exe", argv);
    std::fprintf(stderr, "matmul_bench: could not run again with OPENBLAS_CORETYPE=%s\n",
                 causeway::EnvString("OPENBLAS_CORETYPE").c_str());
  }
  return causeway::Main(argc, argv);
}
