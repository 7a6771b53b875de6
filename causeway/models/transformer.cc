#include "causeway/models/transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/kernels/attention_ops.h"
#include "causeway/kernels/ops.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/accelerator.h"

namespace causeway::models {
namespace {

TensorSpec F32(Shape shape) { return {std::move(shape), DType::kF32}; }
TensorSpec I32(Shape shape) { return {std::move(shape), DType::kI32}; }

// out = a + b over `count` floats (the built-in `add` kernel).
absl::StatusOr<ops::OpPlan> PlanAdd(uint64_t count) {
  if (count == 0 || count > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("add of ", count, " floats"));
  }
  const uint32_t n = static_cast<uint32_t>(count);
  ops::OpPlan plan{absl::StrCat("add ", n), {{"a", count * 4}, {"b", count * 4}, {"out", count * 4}}, {}};
  plan.launches.push_back({"add", {0, 1, 2}, ops::PushBytes(n), Groups1D(n, 256), {}});
  return plan;
}

ops::GemmOptions Gemm(bool transpose_a, bool transpose_b, float beta = 0.0f) {
  ops::GemmOptions o;
  o.transpose_a = transpose_a;
  o.transpose_b = transpose_b;
  o.beta = beta;
  return o;
}

// The per-layer tensors, in Parameters() order.
constexpr const char* kLayerTensors[] = {"ln1_g", "ln1_b", "wq",    "wk", "wv", "wo",
                                         "ln2_g", "ln2_b", "w1",    "b1", "w2"};
// What layer_forward saves for layer_backward, in its output order after y.
constexpr const char* kSaved[] = {"h1", "mean1", "rstd1", "qh",    "kh",    "vh", "oh", "lse",
                                  "o",  "x2",    "h2",    "mean2", "rstd2", "u",  "g"};
constexpr int kSavedCount = 15;

// Sizes of one micro-batch on one accelerator.
struct Dims {
  uint32_t b, t, d, h, hd, f, v;
  const DeviceCapabilities* device;  // where it runs (null: any device)
  uint32_t n() const { return b * t; }
  uint64_t nd() const { return uint64_t{n()} * d; }
  AttentionShape attention() const { return {b, h, t, hd}; }
};

Dims MakeDims(const TransformerConfig& c, uint32_t batch, const DeviceCapabilities* device) {
  return {batch, c.seq_len, c.d_model, c.heads, c.head_dim(), c.d_ff, c.vocab, device};
}

// The functions of one micro-batch size.
struct Functions {
  std::shared_ptr<const Function> embed, embed_backward, layer_forward, layer_backward, head, head_loss;
};

absl::StatusOr<std::shared_ptr<const Function>> Embed(const Dims& x) {
  FunctionBuilder f("embed");
  const int ids = f.Input(I32({x.b, x.t})), tok = f.Input(F32({x.v, x.d})), pos = f.Input(F32({x.t, x.d}));
  const int out = f.Output(F32({x.n(), x.d}));
  f.Add(ops::PlanEmbedding(x.n(), x.d, x.v, x.t, /*with_positions=*/true), {ids, tok, pos, out});
  return f.Build();
}

absl::StatusOr<std::shared_ptr<const Function>> EmbedBackward(const Dims& x) {
  FunctionBuilder f("embed_backward");
  const int ids = f.Input(I32({x.b, x.t})), dx = f.Input(F32({x.n(), x.d}));
  const int dtok = f.Output(F32({x.v, x.d})), dpos = f.Output(F32({x.t, x.d}));
  f.Add(ops::PlanEmbeddingBackward(x.n(), x.d, x.v), {ids, dx, dtok});
  f.Add(ops::PlanPositionEmbeddingBackward(x.n(), x.d, x.t), {dx, dpos});
  return f.Build();
}

// y = x + attention(ln1(x)) ... + mlp(ln2(x2)); outputs y then kSaved.
absl::StatusOr<std::shared_ptr<const Function>> LayerForward(const Dims& x, float eps) {
  FunctionBuilder f("layer_forward");
  const uint32_t n = x.n(), d = x.d, ff = x.f;
  const int in = f.Input(F32({n, d}));
  const int ln1_g = f.Input(F32({d})), ln1_b = f.Input(F32({d}));
  const int wq = f.Input(F32({d, d})), wk = f.Input(F32({d, d})), wv = f.Input(F32({d, d}));
  const int wo = f.Input(F32({d, d}));
  const int ln2_g = f.Input(F32({d})), ln2_b = f.Input(F32({d}));
  const int w1 = f.Input(F32({d, ff})), b1 = f.Input(F32({ff})), w2 = f.Input(F32({ff, d}));
  const Shape heads{x.b, x.h, x.t, x.hd};
  const int y = f.Output(F32({n, d}));
  const int h1 = f.Output(F32({n, d})), mean1 = f.Output(F32({n})), rstd1 = f.Output(F32({n}));
  const int qh = f.Output(F32(heads)), kh = f.Output(F32(heads)), vh = f.Output(F32(heads));
  const int oh = f.Output(F32(heads)), lse = f.Output(F32({int64_t{n} * x.h}));
  const int o = f.Output(F32({n, d})), x2 = f.Output(F32({n, d})), h2 = f.Output(F32({n, d}));
  const int mean2 = f.Output(F32({n})), rstd2 = f.Output(F32({n}));
  const int u = f.Output(F32({n, ff})), g = f.Output(F32({n, ff}));
  const int q = f.Scratch(F32({n, d})), k = f.Scratch(F32({n, d})), v = f.Scratch(F32({n, d}));
  const int a = f.Scratch(F32({n, d})), m = f.Scratch(F32({n, d}));

  f.Add(ops::PlanLayerNorm(n, d, eps), {in, ln1_g, ln1_b, h1, mean1, rstd1});
  for (auto [w, proj, split] : {std::tuple{wq, q, qh}, std::tuple{wk, k, kh}, std::tuple{wv, v, vh}}) {
    f.Add(ops::PlanGemm(n, d, d, Gemm(false, false), x.device), {h1, w, proj});
    f.Add(ops::PlanPermute0213(x.b, x.t, x.h, x.hd), {proj, split});
  }
  f.Add(ops::PlanAttentionForward(x.attention(), x.device), {qh, kh, vh, oh, lse});
  f.Add(ops::PlanPermute0213(x.b, x.h, x.t, x.hd), {oh, o});
  f.Add(ops::PlanGemm(n, d, d, Gemm(false, false), x.device), {o, wo, a});
  f.Add(PlanAdd(x.nd()), {in, a, x2});
  f.Add(ops::PlanLayerNorm(n, d, eps), {x2, ln2_g, ln2_b, h2, mean2, rstd2});
  f.Add(ops::PlanGemm(n, ff, d, Gemm(false, false), x.device), {h2, w1, u});
  f.Add(ops::PlanBiasGelu(n, ff), {u, b1, g});
  f.Add(ops::PlanGemm(n, d, ff, Gemm(false, false), x.device), {g, w2, m});
  f.Add(PlanAdd(x.nd()), {x2, m, y});
  return f.Build();
}

// dx and the layer's gradients (kLayerTensors order) from dy, the layer's
// input x, what the forward saved, and the weights it needs.
absl::StatusOr<std::shared_ptr<const Function>> LayerBackward(const Dims& x) {
  FunctionBuilder f("layer_backward");
  const uint32_t n = x.n(), d = x.d, ff = x.f;
  const Shape heads{x.b, x.h, x.t, x.hd};
  const int dy = f.Input(F32({n, d})), in = f.Input(F32({n, d}));
  const int h1 = f.Input(F32({n, d})), mean1 = f.Input(F32({n})), rstd1 = f.Input(F32({n}));
  const int qh = f.Input(F32(heads)), kh = f.Input(F32(heads)), vh = f.Input(F32(heads));
  const int oh = f.Input(F32(heads)), lse = f.Input(F32({int64_t{n} * x.h}));
  const int o = f.Input(F32({n, d})), x2 = f.Input(F32({n, d})), h2 = f.Input(F32({n, d}));
  const int mean2 = f.Input(F32({n})), rstd2 = f.Input(F32({n}));
  const int u = f.Input(F32({n, ff})), g = f.Input(F32({n, ff}));
  const int ln1_g = f.Input(F32({d}));
  const int wq = f.Input(F32({d, d})), wk = f.Input(F32({d, d})), wv = f.Input(F32({d, d}));
  const int wo = f.Input(F32({d, d}));
  const int ln2_g = f.Input(F32({d}));
  const int w1 = f.Input(F32({d, ff})), b1 = f.Input(F32({ff})), w2 = f.Input(F32({ff, d}));

  const int dx = f.Output(F32({n, d}));
  const int dln1_g = f.Output(F32({d})), dln1_b = f.Output(F32({d}));
  const int dwq = f.Output(F32({d, d})), dwk = f.Output(F32({d, d})), dwv = f.Output(F32({d, d}));
  const int dwo = f.Output(F32({d, d}));
  const int dln2_g = f.Output(F32({d})), dln2_b = f.Output(F32({d}));
  const int dw1 = f.Output(F32({d, ff})), db1 = f.Output(F32({ff})), dw2 = f.Output(F32({ff, d}));

  const int dg = f.Scratch(F32({n, ff})), du = f.Scratch(F32({n, ff}));
  const int dh2 = f.Scratch(F32({n, d})), dx2ln = f.Scratch(F32({n, d})), dx2 = f.Scratch(F32({n, d}));
  const int d_o = f.Scratch(F32({n, d})), doh = f.Scratch(F32(heads)), delta = f.Scratch(F32({int64_t{n} * x.h}));
  const int dqh = f.Scratch(F32(heads)), dkh = f.Scratch(F32(heads)), dvh = f.Scratch(F32(heads));
  const int dq = f.Scratch(F32({n, d})), dk = f.Scratch(F32({n, d})), dv = f.Scratch(F32({n, d}));
  const int dh1 = f.Scratch(F32({n, d})), dxln = f.Scratch(F32({n, d}));

  // MLP: m = gelu(h2 w1 + b1) w2.
  f.Add(ops::PlanGemm(n, ff, d, Gemm(false, true), x.device), {dy, w2, dg});
  f.Add(ops::PlanGemm(ff, d, n, Gemm(true, false), x.device), {g, dy, dw2});
  f.Add(ops::PlanBiasGeluBackward(n, ff), {dg, u, b1, du, db1});
  f.Add(ops::PlanGemm(n, d, ff, Gemm(false, true), x.device), {du, w1, dh2});
  f.Add(ops::PlanGemm(d, ff, n, Gemm(true, false), x.device), {h2, du, dw1});
  f.Add(ops::PlanLayerNormBackward(n, d), {dh2, x2, ln2_g, mean2, rstd2, dx2ln, dln2_g, dln2_b});
  f.Add(PlanAdd(x.nd()), {dy, dx2ln, dx2});
  // Attention: a = merge(attention(split(h1 wq), ...)) wo.
  f.Add(ops::PlanGemm(n, d, d, Gemm(false, true), x.device), {dx2, wo, d_o});
  f.Add(ops::PlanGemm(d, d, n, Gemm(true, false), x.device), {o, dx2, dwo});
  f.Add(ops::PlanPermute0213(x.b, x.t, x.h, x.hd), {d_o, doh});
  f.Add(ops::PlanAttentionBackward(x.attention(), x.device),
        {qh, kh, vh, oh, doh, lse, delta, dqh, dkh, dvh});
  bool first = true;
  for (auto [dsplit, dproj, w, dw] :
       {std::tuple{dqh, dq, wq, dwq}, std::tuple{dkh, dk, wk, dwk}, std::tuple{dvh, dv, wv, dwv}}) {
    f.Add(ops::PlanPermute0213(x.b, x.h, x.t, x.hd), {dsplit, dproj});
    f.Add(ops::PlanGemm(n, d, d, Gemm(false, true, first ? 0.0f : 1.0f), x.device), {dproj, w, dh1});
    f.Add(ops::PlanGemm(d, d, n, Gemm(true, false), x.device), {h1, dproj, dw});
    first = false;
  }
  f.Add(ops::PlanLayerNormBackward(n, d), {dh1, in, ln1_g, mean1, rstd1, dxln, dln1_g, dln1_b});
  f.Add(PlanAdd(x.nd()), {dx2, dxln, dx});
  return f.Build();
}

// The output layer, the loss and their backward: loss per token, dx and the
// gradients of lnf_g, lnf_b, w_out. `loss_scale` is 1 / the tokens of the
// global batch (the loss is their mean).
absl::StatusOr<std::shared_ptr<const Function>> Head(const Dims& x, float eps, float loss_scale) {
  FunctionBuilder f("head");
  const uint32_t n = x.n(), d = x.d, v = x.v;
  const int in = f.Input(F32({n, d})), lnf_g = f.Input(F32({d})), lnf_b = f.Input(F32({d}));
  const int w_out = f.Input(F32({d, v})), targets = f.Input(I32({x.b, x.t}));
  const int loss = f.Output(F32({n})), dx = f.Output(F32({n, d}));
  const int dlnf_g = f.Output(F32({d})), dlnf_b = f.Output(F32({d})), dw_out = f.Output(F32({d, v}));
  const int hf = f.Scratch(F32({n, d})), mean = f.Scratch(F32({n})), rstd = f.Scratch(F32({n}));
  const int logits = f.Scratch(F32({n, v})), dlogits = f.Scratch(F32({n, v})), dhf = f.Scratch(F32({n, d}));
  f.Add(ops::PlanLayerNorm(n, d, eps), {in, lnf_g, lnf_b, hf, mean, rstd});
  f.Add(ops::PlanGemm(n, v, d, Gemm(false, false), x.device), {hf, w_out, logits});
  f.Add(ops::PlanCrossEntropy(n, v), {logits, targets, loss});
  f.Add(ops::PlanCrossEntropyBackward(n, v, loss_scale), {logits, targets, dlogits});
  f.Add(ops::PlanGemm(d, v, n, Gemm(true, false), x.device), {hf, dlogits, dw_out});
  f.Add(ops::PlanGemm(n, d, v, Gemm(false, true), x.device), {dlogits, w_out, dhf});
  f.Add(ops::PlanLayerNormBackward(n, d), {dhf, in, lnf_g, mean, rstd, dx, dlnf_g, dlnf_b});
  return f.Build();
}

// The output layer and the loss only (evaluation).
absl::StatusOr<std::shared_ptr<const Function>> HeadLoss(const Dims& x, float eps) {
  FunctionBuilder f("head_loss");
  const uint32_t n = x.n(), d = x.d, v = x.v;
  const int in = f.Input(F32({n, d})), lnf_g = f.Input(F32({d})), lnf_b = f.Input(F32({d}));
  const int w_out = f.Input(F32({d, v})), targets = f.Input(I32({x.b, x.t}));
  const int loss = f.Output(F32({n}));
  const int hf = f.Scratch(F32({n, d})), mean = f.Scratch(F32({n})), rstd = f.Scratch(F32({n}));
  const int logits = f.Scratch(F32({n, v}));
  f.Add(ops::PlanLayerNorm(n, d, eps), {in, lnf_g, lnf_b, hf, mean, rstd});
  f.Add(ops::PlanGemm(n, v, d, Gemm(false, false), x.device), {hf, w_out, logits});
  f.Add(ops::PlanCrossEntropy(n, v), {logits, targets, loss});
  return f.Build();
}

// Adam for a group of tensors: inputs p, g, m, v per tensor then the step;
// outputs p', m', v' per tensor. One fused update per four tensors where
// `device` binds its buffers, else one adam_update each (bit for bit the
// same results).
absl::StatusOr<std::shared_ptr<const Function>> Optimizer(const std::string& name,
                                                          const std::vector<const ParameterInfo*>& tensors,
                                                          const ops::AdamConfig& adam,
                                                          const DeviceCapabilities* device) {
  FunctionBuilder f(name);
  std::vector<std::array<int, 4>> in;
  for (const ParameterInfo* t : tensors) {
    in.push_back({f.Input(F32(t->shape)), f.Input(F32(t->shape)), f.Input(F32(t->shape)), f.Input(F32(t->shape))});
  }
  const int step = f.Input(F32({1}));
  std::vector<int> out;
  for (const ParameterInfo* t : tensors) {
    for (int k = 0; k < 3; ++k) out.push_back(f.Output(F32(t->shape)));
  }
  if (device == nullptr || device->max_storage_buffers < ops::kAdamUpdateMultiBuffers) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      f.Add(ops::PlanAdamUpdate(static_cast<uint32_t>(NumElements(tensors[i]->shape)), adam),
            {in[i][0], in[i][1], in[i][2], in[i][3], step, out[3 * i], out[3 * i + 1], out[3 * i + 2]});
    }
    return f.Build();
  }
  std::vector<uint32_t> counts;
  std::vector<int> operands;
  for (size_t i = 0; i < tensors.size(); ++i) {
    counts.push_back(static_cast<uint32_t>(NumElements(tensors[i]->shape)));
    operands.insert(operands.end(), in[i].begin(), in[i].end());
  }
  operands.push_back(step);
  operands.insert(operands.end(), out.begin(), out.end());
  f.Add(ops::PlanAdamUpdateMulti(counts, adam), operands);
  return f.Build();
}

std::string Layer(uint32_t l, absl::string_view tensor) { return absl::StrCat("layer", l, ".", tensor); }

}  // namespace

absl::Status TransformerConfig::Validate() const {
  for (auto [name, value] : {std::pair{"vocab", vocab}, std::pair{"d_model", d_model}, std::pair{"heads", heads},
                             std::pair{"d_ff", d_ff}, std::pair{"layers", layers}, std::pair{"seq_len", seq_len}}) {
    if (value == 0) return absl::InvalidArgumentError(absl::StrCat("model: ", name, " must be > 0"));
  }
  if (d_model % heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: heads (", heads, ") must divide d_model (", d_model, ")"));
  }
  if (head_dim() > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("model: the head size d_model / heads = ", head_dim(),
                                                   " exceeds ", kMaxAttentionHeadDim));
  }
  if (!(ln_eps > 0.0f)) return absl::InvalidArgumentError("model: ln_eps must be > 0");
  return absl::OkStatus();
}

uint64_t TransformerConfig::ParameterCount() const {
  uint64_t count = 0;
  for (const ParameterInfo& p : Parameters(*this)) count += NumElements(p.shape);
  return count;
}

std::vector<ParameterInfo> Parameters(const TransformerConfig& c) {
  using Init = ParameterInfo::Init;
  const float std = 0.02f;
  const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(std::max(c.layers, 1u)));
  const int64_t d = c.d_model, ff = c.d_ff;
  std::vector<ParameterInfo> params = {{"tok_emb", {c.vocab, d}, Init::kNormal, std, -1},
                                       {"pos_emb", {c.seq_len, d}, Init::kNormal, std, -1}};
  for (uint32_t l = 0; l < c.layers; ++l) {
    const int layer = static_cast<int>(l);
    params.push_back({Layer(l, "ln1_g"), {d}, Init::kOnes, 0, layer});
    params.push_back({Layer(l, "ln1_b"), {d}, Init::kZeros, 0, layer});
    params.push_back({Layer(l, "wq"), {d, d}, Init::kNormal, std, layer});
    params.push_back({Layer(l, "wk"), {d, d}, Init::kNormal, std, layer});
    params.push_back({Layer(l, "wv"), {d, d}, Init::kNormal, std, layer});
    params.push_back({Layer(l, "wo"), {d, d}, Init::kNormal, residual, layer});
    params.push_back({Layer(l, "ln2_g"), {d}, Init::kOnes, 0, layer});
    params.push_back({Layer(l, "ln2_b"), {d}, Init::kZeros, 0, layer});
    params.push_back({Layer(l, "w1"), {d, ff}, Init::kNormal, std, layer});
    params.push_back({Layer(l, "b1"), {ff}, Init::kZeros, 0, layer});
    params.push_back({Layer(l, "w2"), {ff, d}, Init::kNormal, residual, layer});
  }
  params.push_back({"lnf_g", {d}, Init::kOnes, 0, -1});
  params.push_back({"lnf_b", {d}, Init::kZeros, 0, -1});
  params.push_back({"w_out", {d, c.vocab}, Init::kNormal, std, -1});
  return params;
}

std::vector<std::vector<float>> InitialParameters(const TransformerConfig& config, uint64_t seed) {
  std::vector<std::vector<float>> values;
  uint64_t counter = 0;
  for (const ParameterInfo& p : Parameters(config)) {
    std::vector<float> v(NumElements(p.shape));
    switch (p.init) {
      case ParameterInfo::Init::kOnes:
        std::fill(v.begin(), v.end(), 1.0f);
        break;
      case ParameterInfo::Init::kZeros:
        std::fill(v.begin(), v.end(), 0.0f);
        break;
      case ParameterInfo::Init::kNormal:
        // Box-Muller on two SplitMix64 uniforms per value.
        for (float& x : v) {
          const double u1 = (static_cast<double>(reference::SplitMix64(seed, counter++) >> 11) + 1.0) * 0x1p-53;
          const double u2 = static_cast<double>(reference::SplitMix64(seed, counter++) >> 11) * 0x1p-53;
          x = static_cast<float>(p.stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
        }
        break;
    }
    values.push_back(std::move(v));
  }
  return values;
}

std::vector<std::pair<uint32_t, uint32_t>> StageLayers(uint32_t layers, int stages) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t first = 0;
  for (int s = 0; s < stages; ++s) {
    const uint32_t count = layers / stages + (static_cast<uint32_t>(s) < layers % stages ? 1 : 0);
    out.push_back({first, first + count});
    first += count;
  }
  return out;
}

absl::StatusOr<TrainStep> BuildTrainStepDef(const TransformerConfig& config, const TrainLayout& layout,
                                            const std::vector<int>& stage_sizes, const AdamSettings& settings,
                                            const DeviceCapabilities* device) {
  CAUSEWAY_RETURN_IF_ERROR(config.Validate());
  const int stages = static_cast<int>(stage_sizes.size());
  if (stages == 0) return absl::InvalidArgumentError("train step: no meshes");
  if (static_cast<uint32_t>(stages) > config.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("train step: ", stages, " stages for ", config.layers, " layers (at most one stage per layer)"));
  }
  const uint32_t micro = layout.micro_batches, replicas = layout.replicas;
  if (micro == 0 || layout.batch == 0 || replicas == 0) {
    return absl::InvalidArgumentError("train step: batch, micro_batches and replicas must be > 0");
  }
  for (int s = 0; s < stages; ++s) {
    if (stage_sizes[s] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("train step: stage ", s, " has ", stage_sizes[s], " accelerators"));
    }
    const uint64_t split = uint64_t{replicas} * micro * stage_sizes[s];
    if (layout.batch % split != 0) {
      return absl::InvalidArgumentError(absl::StrCat("train step: batch ", layout.batch, " does not divide into ",
                                                     replicas > 1 ? absl::StrCat(replicas, " replicas of ") : "",
                                                     micro, " micro-batches over stage ", s, "'s ", stage_sizes[s],
                                                     " accelerators"));
    }
  }
  const uint32_t micro_batch = layout.batch / replicas / micro;
  // Every replica's loss and gradients are shares of the global batch's mean.
  const float loss_scale = 1.0f / (static_cast<float>(layout.batch) * static_cast<float>(config.seq_len));
  const auto layers_of = StageLayers(config.layers, stages);

  // Functions per stage (their shapes depend on the stage's mesh size); the
  // replicas share them.
  std::vector<Functions> fns(stages);
  for (int s = 0; s < stages; ++s) {
    const Dims x = MakeDims(config, micro_batch / stage_sizes[s], device);
    if (s == 0) {
      CAUSEWAY_ASSIGN_OR_RETURN(fns[s].embed, Embed(x));
      CAUSEWAY_ASSIGN_OR_RETURN(fns[s].embed_backward, EmbedBackward(x));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(fns[s].layer_forward, LayerForward(x, config.ln_eps));
    CAUSEWAY_ASSIGN_OR_RETURN(fns[s].layer_backward, LayerBackward(x));
    if (s == stages - 1) {
      CAUSEWAY_ASSIGN_OR_RETURN(fns[s].head, Head(x, config.ln_eps, loss_scale));
    }
  }

  const std::vector<ParameterInfo> params = Parameters(config);
  TrainStep step;
  auto stage_of_layer = [&](uint32_t l) {
    for (int s = 0; s < stages; ++s) {
      if (l >= layers_of[s].first && l < layers_of[s].second) return s;
    }
    return stages - 1;
  };
  std::map<std::string, int> stage_of, index_of;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParameterInfo& p = params[i];
    const int s = p.layer >= 0 ? stage_of_layer(p.layer) : (p.name == "tok_emb" || p.name == "pos_emb" ? 0 : stages - 1);
    stage_of[p.name] = s;
    index_of[p.name] = static_cast<int>(i);
    step.stage_of.push_back(s);
  }

  ProgramDefBuilder b("transformer-train");
  const Sharding split = Sharding::Split(0), replicated = Sharding::Replicated();
  using Kind = StepValue::Kind;
  for (uint32_t r = 0; r < replicas; ++r) {
    for (int s = 0; s < stages; ++s) {
      step.meshes.push_back(replicas == 1 ? absl::StrCat("stage", s) : absl::StrCat("r", r, ".stage", s));
      step.mesh_sizes.push_back(stage_sizes[s]);
      b.Mesh(step.meshes.back(), {stage_sizes[s]});
    }
  }
  // Names of replica r's values and nodes, and its meshes.
  std::string prefix;
  auto V = [&prefix](auto&&... parts) { return absl::StrCat(prefix, parts...); };
  auto mesh_of = [&](uint32_t r, int s) { return step.meshes[r * stages + s]; };
  auto parameter = [&](std::string name, int s, const Shape& shape, DType dtype, const Sharding& sharding,
                       StepValue value) {
    b.Parameter(name, mesh_of(value.replica, s), shape, dtype, sharding);
    step.parameters.push_back(std::move(name));
    step.parameter_values.push_back(value);
  };
  auto output = [&](std::string name, StepValue value) {
    b.Output(name);
    step.outputs.push_back(std::move(name));
    step.output_values.push_back(value);
  };

  for (uint32_t r = 0; r < replicas; ++r) {
    const int ri = static_cast<int>(r);
    prefix = replicas == 1 ? "" : absl::StrCat("r", r, ".");
    for (uint32_t m = 0; m < micro; ++m) {
      parameter(V("ids.", m), 0, {micro_batch, config.seq_len}, DType::kI32, split,
                {Kind::kIds, ri, 0, m, -1});
      parameter(V("targets.", m), stages - 1, {micro_batch, config.seq_len}, DType::kI32, split,
                {Kind::kTargets, ri, stages - 1, m, -1});
    }
    if (settings.update) {
      for (int s = 0; s < stages; ++s) parameter(V("step.", s), s, {1}, DType::kF32, replicated, {Kind::kStep, ri, s});
    }
    for (const ParameterInfo& p : params) {
      parameter(V(p.name), stage_of[p.name], p.shape, DType::kF32, replicated,
                {Kind::kTensor, ri, stage_of[p.name], 0, index_of[p.name]});
    }
    if (settings.update) {
      for (Kind kind : {Kind::kM, Kind::kV}) {
        for (const ParameterInfo& p : params) {
          parameter(V(kind == Kind::kM ? "m." : "v.", p.name), stage_of[p.name], p.shape, DType::kF32, replicated,
                    {kind, ri, stage_of[p.name], 0, index_of[p.name]});
        }
      }
    }
  }

  // Values of micro-batch m: activations "x.m.l" (the input of layer l),
  // saved "act.m.l.NAME", gradients "dx.m.l" and "grad.m.NAME".
  auto x_name = [&](uint32_t m, uint32_t l) { return V("x.", m, ".", l); };
  auto dx_name = [&](uint32_t m, uint32_t l) { return V("dx.", m, ".", l); };
  auto saved = [&](uint32_t m, uint32_t l) {
    std::vector<std::string> names;
    for (const char* s : kSaved) names.push_back(V("act.", m, ".", l, ".", s));
    return names;
  };
  auto grad_name = [&](uint32_t m, const std::string& p) { return V("grad.", m, ".", p); };
  const std::vector<Sharding> split_outputs(1 + kSavedCount, split);

  // One "add" per tensor shape, shared by every sum of gradients (the def
  // then holds each once).
  std::map<Shape, std::shared_ptr<const Function>> adds;
  auto add_of = [&adds](const Shape& shape) -> absl::StatusOr<std::shared_ptr<const Function>> {
    auto it = adds.find(shape);
    if (it != adds.end()) return it->second;
    CAUSEWAY_ASSIGN_OR_RETURN(auto add, Function::Elementwise("add", shape));
    return adds.emplace(shape, std::move(add)).first->second;
  };
  // Each replica's gradients of its share of the batch, by tensor.
  std::vector<std::map<std::string, std::string>> grad(replicas);
  for (uint32_t r = 0; r < replicas; ++r) {
    prefix = replicas == 1 ? "" : absl::StrCat("r", r, ".");
    const std::string first = mesh_of(r, 0), last = mesh_of(r, stages - 1);
    // Forward, micro-batch by micro-batch: every stage's accelerators get
    // their micro-batches in order and start on the next as soon as the
    // previous is handed on (GPipe's schedule falls out of the dataflow).
    for (uint32_t m = 0; m < micro; ++m) {
      for (int s = 0; s < stages; ++s) {
        if (s == 0) {
          b.Call(V("embed.", m), fns[0].embed, first, {V("ids.", m), V("tok_emb"), V("pos_emb")}, {x_name(m, 0)},
                 {split});
        }
        for (uint32_t l = layers_of[s].first; l < layers_of[s].second; ++l) {
          std::vector<std::string> inputs = {x_name(m, l)};
          for (const char* t : kLayerTensors) inputs.push_back(V(Layer(l, t)));
          std::vector<std::string> outputs = {x_name(m, l + 1)};
          for (std::string& a : saved(m, l)) outputs.push_back(std::move(a));
          b.Call(V("forward.", m, ".", l), fns[s].layer_forward, mesh_of(r, s), inputs, outputs, split_outputs);
        }
      }
    }
    // Backward, micro-batch by micro-batch, last stage first.
    for (uint32_t m = 0; m < micro; ++m) {
      b.Call(V("head.", m), fns[stages - 1].head, last,
             {x_name(m, config.layers), V("lnf_g"), V("lnf_b"), V("w_out"), V("targets.", m)},
             {V("loss.", m), dx_name(m, config.layers), grad_name(m, "lnf_g"), grad_name(m, "lnf_b"),
              grad_name(m, "w_out")},
             {split, split, replicated, replicated, replicated});
      for (int s = stages - 1; s >= 0; --s) {
        for (uint32_t l = layers_of[s].second; l-- > layers_of[s].first;) {
          std::vector<std::string> inputs = {dx_name(m, l + 1), x_name(m, l)};
          for (std::string& a : saved(m, l)) inputs.push_back(std::move(a));
          for (const char* t : {"ln1_g", "wq", "wk", "wv", "wo", "ln2_g", "w1", "b1", "w2"}) {
            inputs.push_back(V(Layer(l, t)));
          }
          std::vector<std::string> outputs = {dx_name(m, l)};
          std::vector<Sharding> shardings = {split};
          for (const char* t : kLayerTensors) {
            outputs.push_back(grad_name(m, Layer(l, t)));
            shardings.push_back(replicated);
          }
          b.Call(V("backward.", m, ".", l), fns[s].layer_backward, mesh_of(r, s), inputs, outputs, shardings);
        }
        if (s == 0) {
          b.Call(V("embed_backward.", m), fns[0].embed_backward, first, {V("ids.", m), dx_name(m, 0)},
                 {grad_name(m, "tok_emb"), grad_name(m, "pos_emb")}, {replicated, replicated});
        }
      }
    }
    // Gradients: summed over micro-batches, then over each stage's
    // accelerators (their partial sums over their share of the batch).
    for (const ParameterInfo& p : params) {
      const std::string mesh = mesh_of(r, stage_of[p.name]);
      std::string sum = grad_name(0, p.name);
      CAUSEWAY_ASSIGN_OR_RETURN(auto add, add_of(p.shape));
      for (uint32_t m = 1; m < micro; ++m) {
        std::string next = m + 1 == micro ? V("gradsum.", p.name) : V("gradsum.", m, ".", p.name);
        b.Call(V("accumulate.", m, ".", p.name), add, mesh, {sum, grad_name(m, p.name)}, {next}, {replicated});
        sum = std::move(next);
      }
      if (stage_sizes[stage_of[p.name]] > 1) {
        b.AllReduce(V("allreduce.", p.name), mesh, sum, V("grad.", p.name));
        sum = V("grad.", p.name);
      }
      grad[r][p.name] = sum;
    }
  }
  // Across replicas: every replica adds all of them in the same order, so
  // every replica's sum is the same bits and the weights stay identical.
  if (replicas > 1) {
    const std::vector<std::map<std::string, std::string>> own = grad;
    for (uint32_t r = 0; r < replicas; ++r) {
      prefix = absl::StrCat("r", r, ".");
      for (const ParameterInfo& p : params) {
        CAUSEWAY_ASSIGN_OR_RETURN(auto add, add_of(p.shape));
        std::string sum = own[0].at(p.name);
        for (uint32_t q = 1; q < replicas; ++q) {
          std::string next = V("total.", q, ".", p.name);
          b.Call(V("exchange.", q, ".", p.name), add, mesh_of(r, stage_of[p.name]), {sum, own[q].at(p.name)}, {next},
                 {replicated});
          sum = std::move(next);
        }
        grad[r][p.name] = std::move(sum);
      }
    }
  }

  for (uint32_t r = 0; r < replicas; ++r) {
    const int ri = static_cast<int>(r);
    prefix = replicas == 1 ? "" : absl::StrCat("r", r, ".");
    for (uint32_t m = 0; m < micro; ++m) output(V("loss.", m), {Kind::kLoss, ri, stages - 1, m, -1});
    if (!settings.update) {
      // An output is named by its value; a gradient that needed no sum
      // keeps its micro-batch name.
      for (const ParameterInfo& p : params) {
        output(grad[r][p.name], {Kind::kGrad, ri, stage_of[p.name], 0, index_of[p.name]});
      }
      continue;
    }
    // Adam, one function per layer and one per stage for the rest.
    std::map<std::string, std::vector<const ParameterInfo*>> groups;
    for (const ParameterInfo& p : params) {
      groups[p.layer >= 0 ? absl::StrCat("adam.layer", p.layer) : absl::StrCat("adam.stage", stage_of[p.name])]
          .push_back(&p);
    }
    for (const auto& [name, tensors] : groups) {
      const int s = stage_of[tensors.front()->name];
      CAUSEWAY_ASSIGN_OR_RETURN(auto adam, Optimizer(name, tensors, settings.adam, device));
      std::vector<std::string> inputs, outputs;
      for (const ParameterInfo* t : tensors) {
        for (std::string in : {V(t->name), grad[r][t->name], V("m.", t->name), V("v.", t->name)}) {
          inputs.push_back(std::move(in));
        }
        for (std::string out : {V(t->name, "'"), V("m.", t->name, "'"), V("v.", t->name, "'")}) {
          outputs.push_back(std::move(out));
        }
      }
      inputs.push_back(V("step.", s));
      b.Call(V(name), adam, mesh_of(r, s), inputs, outputs, std::vector<Sharding>(3 * tensors.size(), replicated));
    }
    for (Kind kind : {Kind::kTensor, Kind::kM, Kind::kV}) {
      for (const ParameterInfo& p : params) {
        output(V(kind == Kind::kTensor ? "" : kind == Kind::kM ? "m." : "v.", p.name, "'"),
               {kind, ri, stage_of[p.name], 0, index_of[p.name]});
      }
    }
  }
  CAUSEWAY_ASSIGN_OR_RETURN(step.def, b.Build());
  return step;
}

namespace {

// The device a program over `meshes` is planned for: the first mesh's.
const DeviceCapabilities* DeviceOf(const std::vector<std::shared_ptr<Mesh>>& meshes) {
  if (meshes.empty() || meshes.front() == nullptr || meshes.front()->size() == 0) return nullptr;
  const Accelerator* device = meshes.front()->device(0);
  return device != nullptr ? &device->capabilities() : nullptr;
}

}  // namespace

absl::StatusOr<TrainStep> BuildTrainStep(const TransformerConfig& config, const TrainLayout& layout,
                                         const std::vector<std::shared_ptr<Mesh>>& meshes,
                                         const AdamSettings& settings) {
  const uint32_t replicas = std::max<uint32_t>(layout.replicas, 1);
  if (meshes.empty() || meshes.size() % replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train step: ", meshes.size(), " meshes for ", replicas, " replicas"));
  }
  const size_t stages = meshes.size() / replicas;
  std::vector<int> sizes;
  for (size_t s = 0; s < stages; ++s) sizes.push_back(meshes[s]->size());
  for (size_t i = 0; i < meshes.size(); ++i) {
    if (meshes[i]->size() != sizes[i % stages]) {
      return absl::InvalidArgumentError(absl::StrCat("train step: replica ", i / stages, " stage ", i % stages,
                                                     " has ", meshes[i]->size(), " accelerators, replica 0's ",
                                                     sizes[i % stages]));
    }
  }
  CAUSEWAY_ASSIGN_OR_RETURN(TrainStep step,
                            BuildTrainStepDef(config, layout, sizes, settings, DeviceOf(meshes)));
  absl::flat_hash_map<std::string, std::shared_ptr<Mesh>> bound;
  for (size_t i = 0; i < meshes.size(); ++i) bound[step.meshes[i]] = meshes[i];
  CAUSEWAY_ASSIGN_OR_RETURN(step.program, BuildProgram(step.def, bound));
  return step;
}

absl::StatusOr<ProgramDef> BuildEvalDef(const TransformerConfig& config, uint32_t batch,
                                        const std::vector<int>& stage_sizes,
                                        const DeviceCapabilities* device) {
  CAUSEWAY_RETURN_IF_ERROR(config.Validate());
  const int stages = static_cast<int>(stage_sizes.size());
  if (stages == 0 || static_cast<uint32_t>(stages) > config.layers) {
    return absl::InvalidArgumentError(absl::StrCat("eval: ", stages, " stages for ", config.layers, " layers"));
  }
  const auto layers_of = StageLayers(config.layers, stages);
  const Sharding split = Sharding::Split(0);
  ProgramDefBuilder b("transformer-eval");
  std::vector<std::string> mesh(stages);
  for (int s = 0; s < stages; ++s) {
    if (stage_sizes[s] < 1 || batch == 0 || batch % stage_sizes[s] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval: batch ", batch, " does not divide over ", stage_sizes[s], " accelerators"));
    }
    mesh[s] = absl::StrCat("stage", s);
    b.Mesh(mesh[s], {stage_sizes[s]});
  }
  b.Parameter("ids", mesh.front(), {batch, config.seq_len}, DType::kI32, split);
  b.Parameter("targets", mesh.back(), {batch, config.seq_len}, DType::kI32, split);
  for (const ParameterInfo& p : Parameters(config)) {
    int s = p.name == "tok_emb" || p.name == "pos_emb" ? 0 : stages - 1;
    for (int t = 0; t < stages; ++t) {
      if (p.layer >= 0 && static_cast<uint32_t>(p.layer) >= layers_of[t].first &&
          static_cast<uint32_t>(p.layer) < layers_of[t].second) {
        s = t;
      }
    }
    b.Parameter(p.name, mesh[s], p.shape, DType::kF32);
  }
  for (int s = 0; s < stages; ++s) {
    const Dims x = MakeDims(config, batch / stage_sizes[s], device);
    if (s == 0) {
      CAUSEWAY_ASSIGN_OR_RETURN(auto embed, Embed(x));
      b.Call("embed", embed, mesh[s], {"ids", "tok_emb", "pos_emb"}, {"x.0"}, {split});
    }
    CAUSEWAY_ASSIGN_OR_RETURN(auto forward, LayerForward(x, config.ln_eps));
    for (uint32_t l = layers_of[s].first; l < layers_of[s].second; ++l) {
      std::vector<std::string> inputs = {absl::StrCat("x.", l)};
      for (const char* t : kLayerTensors) inputs.push_back(Layer(l, t));
      std::vector<std::string> outputs = {absl::StrCat("x.", l + 1)};
      for (const char* a : kSaved) outputs.push_back(absl::StrCat("act.", l, ".", a));
      b.Call(absl::StrCat("forward.", l), forward, mesh[s], inputs, outputs,
             std::vector<Sharding>(1 + kSavedCount, split));
    }
    if (s == stages - 1) {
      CAUSEWAY_ASSIGN_OR_RETURN(auto head, HeadLoss(x, config.ln_eps));
      b.Call("head", head, mesh[s], {absl::StrCat("x.", config.layers), "lnf_g", "lnf_b", "w_out", "targets"},
             {"loss"}, {split});
    }
  }
  b.Output("loss");
  return b.Build();
}

absl::StatusOr<std::shared_ptr<const Program>> BuildEvalProgram(const TransformerConfig& config, uint32_t batch,
                                                                const std::vector<std::shared_ptr<Mesh>>& meshes) {
  std::vector<int> sizes;
  absl::flat_hash_map<std::string, std::shared_ptr<Mesh>> bound;
  for (size_t s = 0; s < meshes.size(); ++s) {
    sizes.push_back(meshes[s]->size());
    bound[absl::StrCat("stage", s)] = meshes[s];
  }
  CAUSEWAY_ASSIGN_OR_RETURN(ProgramDef def, BuildEvalDef(config, batch, sizes, DeviceOf(meshes)));
  return BuildProgram(def, bound);
}

}  // namespace causeway::models
