// The Transformer LM as Causeway programs on lavapipe: its gradient against
// finite differences of its loss at a tiny size, data-parallel and pipeline
// layouts against one accelerator step by step, the loss falling on the
// shipped corpus, and bad configurations refused.
#include "causeway/models/transformer.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/client/local_client.h"
#include "causeway/kernels/nn_ops.h"
#include "causeway/kernels/reference.h"
#include "causeway/models/text_data.h"
#include "causeway/models/trainer.h"
#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway::models {
namespace {

using ::causeway::testing::MakeRuntime;

const std::string kCorpus = std::string(::causeway::testing::DataDir()) + "/kjv-genesis-exodus.txt";

TransformerConfig Tiny(uint32_t vocab) {
  TransformerConfig c;
  c.vocab = vocab;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.layers = 2;
  c.seq_len = 8;
  return c;
}

class TransformerTest : public ::testing::Test {
 protected:
  void Start(int accelerators) {
    rt_ = MakeRuntime(accelerators);
    ASSERT_NE(rt_, nullptr);
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get()));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("transformer_test"));
    ASSERT_OK_AND_ASSIGN(local_, client::LocalClient::Connect(island_.get(), "trainer"));
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;         // the scheduler's, for programs built here
  std::unique_ptr<client::Client> local_;  // the client API's, for trainers
};

// Runs the gradient program once on `weights` and returns the mean loss and
// (if `grads` is given) the gradients.
class GradientProgram {
 public:
  GradientProgram(Client* client, TransformerConfig config, uint32_t batch, std::vector<int32_t> ids,
                  std::vector<int32_t> targets)
      : client_(client), config_(config), batch_(batch), ids_(std::move(ids)), targets_(std::move(targets)) {}

  absl::Status Load() {
    CAUSEWAY_ASSIGN_OR_RETURN(mesh_, client_->AllocateMesh({1}));
    AdamSettings settings;
    settings.update = false;
    CAUSEWAY_ASSIGN_OR_RETURN(step_, BuildTrainStep(config_, TrainLayout{batch_, 1}, {mesh_}, settings));
    CAUSEWAY_ASSIGN_OR_RETURN(executable_, client_->Load(step_.program));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Run(const std::vector<std::vector<float>>& weights,
                             std::vector<std::vector<float>>* grads = nullptr, std::vector<float>* per_token = nullptr) {
    std::vector<ArrayRef> inputs;
    for (const std::vector<int32_t>* tokens : {&ids_, &targets_}) {
      CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef a, client_->CreateArray(mesh_, {batch_, config_.seq_len},
                                                                 DType::kI32, Sharding::Split(0)));
      CAUSEWAY_RETURN_IF_ERROR(a->Upload(tokens->data(), tokens->size() * 4));
      inputs.push_back(std::move(a));
    }
    const std::vector<ParameterInfo> params = Parameters(config_);
    for (size_t i = 0; i < params.size(); ++i) {
      CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef a, client_->CreateArray(mesh_, params[i].shape, DType::kF32));
      CAUSEWAY_RETURN_IF_ERROR(a->Upload(weights[i].data(), weights[i].size() * 4));
      inputs.push_back(std::move(a));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(Execution run, client_->Execute(executable_, inputs));
    std::vector<float> loss(uint64_t{batch_} * config_.seq_len);
    CAUSEWAY_RETURN_IF_ERROR(run.outputs[0]->Download(loss.data(), loss.size() * 4));
    if (grads != nullptr) {
      grads->clear();
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<float> g(NumElements(params[i].shape));
        CAUSEWAY_RETURN_IF_ERROR(run.outputs[1 + i]->Download(g.data(), g.size() * 4));
        grads->push_back(std::move(g));
      }
    }
    double sum = 0;
    for (float l : loss) sum += l;
    if (per_token != nullptr) *per_token = loss;
    return sum / static_cast<double>(loss.size());
  }

 private:
  Client* client_;
  TransformerConfig config_;
  uint32_t batch_;
  std::vector<int32_t> ids_, targets_;
  std::shared_ptr<Mesh> mesh_;
  TrainStep step_;
  std::shared_ptr<Executable> executable_;
};

// The model's per-token loss computed on the CPU in double, written out
// from the architecture (not from the kernels' references).
std::vector<double> ReferenceLoss(const TransformerConfig& c, const std::vector<std::vector<float>>& w,
                                  const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                                  uint32_t batch) {
  const size_t T = c.seq_len, d = c.d_model, H = c.heads, hd = c.head_dim(), ff = c.d_ff, V = c.vocab;
  using Matrix = std::vector<std::vector<double>>;
  auto layer_norm = [&](const Matrix& x, const std::vector<float>& g, const std::vector<float>& b) {
    Matrix y = x;
    for (auto& row : y) {
      double mean = 0, var = 0;
      for (double v : row) mean += v / d;
      for (double v : row) var += (v - mean) * (v - mean) / d;
      const double rstd = 1.0 / std::sqrt(var + c.ln_eps);
      for (size_t j = 0; j < d; ++j) row[j] = (row[j] - mean) * rstd * g[j] + b[j];
    }
    return y;
  };
  auto matmul = [](const Matrix& x, const std::vector<float>& m, size_t k, size_t n) {
    Matrix y(x.size(), std::vector<double>(n, 0.0));
    for (size_t r = 0; r < x.size(); ++r) {
      for (size_t i = 0; i < k; ++i) {
        for (size_t j = 0; j < n; ++j) y[r][j] += x[r][i] * m[i * n + j];
      }
    }
    return y;
  };
  std::vector<double> losses;
  for (uint32_t s = 0; s < batch; ++s) {
    Matrix x(T, std::vector<double>(d));
    for (size_t t = 0; t < T; ++t) {
      for (size_t j = 0; j < d; ++j) x[t][j] = double{w[0][ids[s * T + t] * d + j]} + w[1][t * d + j];
    }
    for (uint32_t l = 0; l < c.layers; ++l) {
      const auto* p = &w[2 + 11 * l];  // ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1, b1, w2
      const Matrix h = layer_norm(x, p[0], p[1]);
      const Matrix q = matmul(h, p[2], d, d), k = matmul(h, p[3], d, d), v = matmul(h, p[4], d, d);
      Matrix o(T, std::vector<double>(d, 0.0));
      for (size_t head = 0; head < H; ++head) {
        for (size_t i = 0; i < T; ++i) {
          std::vector<double> score(i + 1);
          double top = -1e300, total = 0;
          for (size_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (size_t e = 0; e < hd; ++e) dot += q[i][head * hd + e] * k[j][head * hd + e];
            score[j] = dot / std::sqrt(static_cast<double>(hd));
            top = std::max(top, score[j]);
          }
          for (double& sc : score) total += sc = std::exp(sc - top);
          for (size_t j = 0; j <= i; ++j) {
            for (size_t e = 0; e < hd; ++e) o[i][head * hd + e] += score[j] / total * v[j][head * hd + e];
          }
        }
      }
      const Matrix a = matmul(o, p[5], d, d);
      for (size_t t = 0; t < T; ++t) {
        for (size_t j = 0; j < d; ++j) x[t][j] += a[t][j];
      }
      Matrix u = matmul(layer_norm(x, p[6], p[7]), p[8], d, ff);
      for (auto& row : u) {
        for (size_t j = 0; j < ff; ++j) {
          const double z = row[j] + p[9][j];
          row[j] = 0.5 * z * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z)));
        }
      }
      const Matrix m = matmul(u, p[10], ff, d);
      for (size_t t = 0; t < T; ++t) {
        for (size_t j = 0; j < d; ++j) x[t][j] += m[t][j];
      }
    }
    const size_t last = w.size() - 3;
    const Matrix logits = matmul(layer_norm(x, w[last], w[last + 1]), w[last + 2], d, V);
    for (size_t t = 0; t < T; ++t) {
      double top = -1e300, total = 0;
      for (double z : logits[t]) top = std::max(top, z);
      for (double z : logits[t]) total += std::exp(z - top);
      losses.push_back(top + std::log(total) - logits[t][targets[s * T + t]]);
    }
  }
  return losses;
}

// Random tokens and weights larger than the initialization's (so that every
// path of the model matters).
struct TinyProblem {
  std::vector<int32_t> ids, targets;
  std::vector<std::vector<float>> weights;
};
TinyProblem MakeTinyProblem(const TransformerConfig& config, uint32_t batch) {
  TinyProblem p;
  for (size_t i = 0; i < size_t{batch} * config.seq_len; ++i) {
    p.ids.push_back(static_cast<int32_t>(reference::SplitMix64(3, i) % config.vocab));
    p.targets.push_back(static_cast<int32_t>(reference::SplitMix64(4, i) % config.vocab));
  }
  p.weights = InitialParameters(config, 7);
  const std::vector<ParameterInfo> params = Parameters(config);
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < p.weights[i].size(); ++j) {
      const float noise = static_cast<float>(reference::SplitMix64(9 + i, j) >> 40) * 0x1p-24f - 0.5f;
      p.weights[i][j] =
          params[i].init == ParameterInfo::Init::kNormal ? p.weights[i][j] * 10.0f : p.weights[i][j] + 0.2f * noise;
    }
  }
  return p;
}

// Tests the forward pass (embeddings, two blocks, output layer, loss) token
// by token against the CPU.
TEST_F(TransformerTest, ForwardMatchesCpuReference) {
  Start(1);
  const TransformerConfig config = Tiny(11);
  const uint32_t batch = 3;
  const TinyProblem p = MakeTinyProblem(config, batch);
  GradientProgram program(client_.get(), config, batch, p.ids, p.targets);
  ASSERT_OK(program.Load());
  std::vector<float> got;
  ASSERT_OK(program.Run(p.weights, nullptr, &got).status());
  const std::vector<double> want = ReferenceLoss(config, p.weights, p.ids, p.targets, batch);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + want[i])) << "token " << i;
}

// Tests the whole model's gradient (every tensor: embeddings, each block's
// norms, projections and MLP, the output layer) against central finite
// differences of the program's own loss: for each tensor its three entries
// of largest gradient (one under a sanitizer) and one more at random.
TEST_F(TransformerTest, GradientMatchesFiniteDifferences) {
  constexpr int kLargest = testing::Repeats(3, 1);
  Start(1);
  const TransformerConfig config = Tiny(11);
  const uint32_t batch = 2;
  TinyProblem p = MakeTinyProblem(config, batch);
  GradientProgram program(client_.get(), config, batch, p.ids, p.targets);
  ASSERT_OK(program.Load());
  const std::vector<std::vector<float>>& weights = p.weights;
  const std::vector<ParameterInfo> params = Parameters(config);
  std::vector<std::vector<float>> grads;
  ASSERT_OK_AND_ASSIGN(double loss, program.Run(weights, &grads));
  EXPECT_GT(loss, 1.0);
  int checked = 0;
  double worst = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i].name);
    std::vector<size_t> order(grads[i].size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + std::min<size_t>(kLargest, order.size()), order.end(),
                      [&](size_t a, size_t b) { return std::abs(grads[i][a]) > std::abs(grads[i][b]); });
    order.resize(std::min<size_t>(kLargest, order.size()));
    order.push_back(reference::SplitMix64(11, i) % grads[i].size());
    for (size_t j : order) {
      const float h = 1e-2f;
      std::vector<std::vector<float>> plus = weights, minus = weights;
      plus[i][j] += h;
      minus[i][j] -= h;
      ASSERT_OK_AND_ASSIGN(double lp, program.Run(plus));
      ASSERT_OK_AND_ASSIGN(double lm, program.Run(minus));
      const double fd = (lp - lm) / (2.0 * h);
      const double g = grads[i][j];
      const double err = std::abs(fd - g) / std::max(1e-2, std::abs(g));
      worst = std::max(worst, err);
      EXPECT_NEAR(fd, g, 2e-3 + 3e-2 * std::abs(g)) << "entry " << j;
      ++checked;
    }
  }
  std::printf("gradient check: %d entries, worst error relative to max(|g|, 0.01) %.3g\n", checked, worst);
  EXPECT_EQ(checked, (kLargest + 1) * static_cast<int>(params.size()));
}

// Steps each layout trains for and is compared over: every step runs the
// same host code, so fewer under a sanitizer (sanitizers.h).
constexpr int kCompareSteps = testing::Repeats(6, 2);

// Trains `steps` steps of the tiny model in `stages` with the same seed and
// global batch, returning the losses and the final weights.
struct TrainRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> weights;
  // Every other replica's weights, which must be the same bits.
  std::vector<std::vector<std::vector<float>>> other_replicas;
};
TrainRun TrainTiny(client::Client* client, const TextCorpus& corpus, std::vector<int> stages, uint32_t micro,
                   int steps, uint32_t replicas = 1) {
  TrainOptions options;
  options.config = Tiny(0);
  options.config.layers = 4;
  options.layout = TrainLayout{8, micro, replicas};
  options.stages = std::move(stages);
  options.adam.lr = 3e-3f;
  auto trainer = Trainer::Create(client, corpus, options);
  EXPECT_OK(trainer.status());
  if (!trainer.ok()) return {};
  auto losses = (*trainer)->Train(steps);
  EXPECT_OK(losses.status());
  auto weights = (*trainer)->Weights();
  EXPECT_OK(weights.status());
  if (!losses.ok() || !weights.ok()) return {};
  TrainRun run{*losses, *weights, {}};
  for (uint32_t r = 1; r < replicas; ++r) {
    auto other = (*trainer)->Weights(static_cast<int>(r));
    EXPECT_OK(other.status());
    if (other.ok()) run.other_replicas.push_back(*std::move(other));
  }
  return run;
}

void ExpectSameTrajectory(const TrainRun& want, const TrainRun& got) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-4 * std::abs(want.losses[i])) << "step " << i + 1;
  }
  ASSERT_EQ(got.weights.size(), want.weights.size());
  for (size_t i = 0; i < want.weights.size(); ++i) {
    EXPECT_LT(reference::MaxRelativeError(got.weights[i], want.weights[i]), 1e-3) << "tensor " << i;
  }
}

// Tests that data parallelism over 2 and 4 accelerators (gradients
// all-reduced) follows one accelerator's losses and weights step by step.
TEST_F(TransformerTest, DataParallelFollowsOneAccelerator) {
  Start(4);
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  const TrainRun one = TrainTiny(local_.get(), corpus, {1}, 1, kCompareSteps);
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(kCompareSteps));
  // Over six steps the loss falls (over two it may not: each step's batch differs).
  if (kCompareSteps >= 6) {
    EXPECT_LT(one.losses.back(), one.losses.front());
  }
  ExpectSameTrajectory(one, TrainTiny(local_.get(), corpus, {2}, 1, kCompareSteps));
  ExpectSameTrajectory(one, TrainTiny(local_.get(), corpus, {4}, 1, kCompareSteps));
}

// Tests that pipelines of 2 and 4 stages with 2 and 4 micro-batches
// (gradients accumulated over them) follow one accelerator.
TEST_F(TransformerTest, PipelineFollowsOneAccelerator) {
  Start(4);
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  const TrainRun one = TrainTiny(local_.get(), corpus, {1}, 1, kCompareSteps);
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(kCompareSteps));
  ExpectSameTrajectory(one, TrainTiny(local_.get(), corpus, {1, 1}, 2, kCompareSteps));
  ExpectSameTrajectory(one, TrainTiny(local_.get(), corpus, {1, 1, 1, 1}, 4, kCompareSteps));
  // Both at once: two stages of two accelerators.
  ExpectSameTrajectory(one, TrainTiny(local_.get(), corpus, {2, 2}, 2, kCompareSteps));
}

// Tests that replicas of the layout on meshes of their own (each with its
// share of the batch, gradients exchanged inside the step) follow one
// accelerator, and that every replica holds the same weights bit for bit.
TEST_F(TransformerTest, ReplicasFollowOneAccelerator) {
  Start(4);
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  const TrainRun one = TrainTiny(local_.get(), corpus, {1}, 1, kCompareSteps);
  ASSERT_EQ(one.losses.size(), static_cast<size_t>(kCompareSteps));
  for (auto [stages, micro, replicas] : {std::tuple{std::vector<int>{1}, 1u, 2u}, std::tuple{std::vector<int>{2}, 1u, 2u},
                                         std::tuple{std::vector<int>{1, 1}, 2u, 2u},
                                         std::tuple{std::vector<int>{1}, 1u, 4u}}) {
    SCOPED_TRACE(absl::StrCat(replicas, " replicas of stages {", absl::StrJoin(stages, ", "), "}, ", micro,
                              " micro-batches"));
    const TrainRun got = TrainTiny(local_.get(), corpus, stages, micro, kCompareSteps, replicas);
    ExpectSameTrajectory(one, got);
    ASSERT_EQ(got.other_replicas.size(), replicas - 1);
    for (const auto& other : got.other_replicas) {
      ASSERT_EQ(other.size(), got.weights.size());
      for (size_t i = 0; i < other.size(); ++i) EXPECT_EQ(other[i], got.weights[i]) << "tensor " << i;
    }
  }
}

// Tests that the step as data (a ProgramDef, as island servers load it)
// survives the text format and builds the same program again.
TEST_F(TransformerTest, StepDefRoundTripsThroughText) {
  Start(2);
  TrainLayout layout{8, 2, 2};
  ASSERT_OK_AND_ASSIGN(TrainStep step,
                       BuildTrainStepDef(Tiny(10), layout, {1}, {}, &rt_->accelerator(0)->capabilities()));
  EXPECT_EQ(step.meshes, (std::vector<std::string>{"r0.stage0", "r1.stage0"}));
  EXPECT_EQ(step.parameters.size(), step.parameter_values.size());
  EXPECT_EQ(step.outputs.size(), step.output_values.size());
  ASSERT_OK_AND_ASSIGN(ProgramDef parsed, ParseProgramDefText(ProgramDefToText(step.def), "step.txt"));
  EXPECT_EQ(parsed.SerializeAsString(), step.def.SerializeAsString());
  ASSERT_OK_AND_ASSIGN(auto a, client_->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto b, client_->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto program, BuildProgram(parsed, {{"r0.stage0", a}, {"r1.stage0", b}}));
  EXPECT_EQ(program->parameters().size(), step.parameters.size());
}

// Tests that the optimizer fuses its updates (adam_update_multi, a launch
// per four tensors) where the device binds that kernel's 29 buffers, and
// takes one adam_update per tensor where it does not or is unknown.
TEST_F(TransformerTest, AdamIsFusedWhereTheDeviceBindsItsBuffers) {
  Start(1);
  DeviceCapabilities device = rt_->accelerator(0)->capabilities();
  ASSERT_GE(device.max_storage_buffers, ops::kAdamUpdateMultiBuffers);  // lavapipe: 32
  auto kernels_of = [](const ProgramDef& def, const std::string& function) {
    std::vector<std::string> kernels;
    for (const auto& f : def.functions()) {
      if (f.name() != function) continue;
      for (const auto& step : f.custom().steps()) kernels.push_back(step.builtin());
    }
    return kernels;
  };
  // A layer's 11 tensors: 3 launches fused, 11 one by one.
  ASSERT_OK_AND_ASSIGN(TrainStep fused, BuildTrainStepDef(Tiny(10), TrainLayout{8, 1, 1}, {1}, {}, &device));
  EXPECT_EQ(kernels_of(fused.def, "adam.layer0"), std::vector<std::string>(3, "adam_update_multi"));
  device.max_storage_buffers = ops::kAdamUpdateMultiBuffers - 1;
  ASSERT_OK_AND_ASSIGN(TrainStep single, BuildTrainStepDef(Tiny(10), TrainLayout{8, 1, 1}, {1}, {}, &device));
  EXPECT_EQ(kernels_of(single.def, "adam.layer0"), std::vector<std::string>(11, "adam_update"));
  ASSERT_OK_AND_ASSIGN(TrainStep any, BuildTrainStepDef(Tiny(10), TrainLayout{8, 1, 1}, {1}, {}, nullptr));
  EXPECT_EQ(kernels_of(any.def, "adam.layer0"), std::vector<std::string>(11, "adam_update"));
}

// Tests that the loss falls clearly on the shipped corpus in a short run,
// on training and held-out text.
TEST_F(TransformerTest, LossFallsOnTheCorpus) {
  Start(1);
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  TrainOptions options;
  options.config.d_model = 32;
  options.config.heads = 2;
  options.config.d_ff = 64;
  options.config.layers = 2;
  options.config.seq_len = 32;
  options.layout.batch = 8;
  options.adam.lr = 1e-2f;
  options.eval_batches = 4;
  ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(local_.get(), corpus, options));
  ASSERT_OK_AND_ASSIGN(double before, trainer->Evaluate());
  // A uniform guess over the vocabulary costs ln(vocab).
  EXPECT_NEAR(before, std::log(static_cast<double>(corpus.vocab().size())), 0.1);
  ASSERT_OK_AND_ASSIGN(std::vector<double> losses, trainer->Train(150));
  ASSERT_OK_AND_ASSIGN(double after, trainer->Evaluate());
  const double first = std::accumulate(losses.begin(), losses.begin() + 10, 0.0) / 10;
  const double last = std::accumulate(losses.end() - 10, losses.end(), 0.0) / 10;
  std::printf("loss: held-out %.3f -> %.3f, training (10-step means) %.3f -> %.3f\n", before, after, first, last);
  EXPECT_LT(last, first - 1.0);
  EXPECT_LT(after, before - 1.0);
}

TEST_F(TransformerTest, RefusesBadConfigurations) {
  Start(2);
  TransformerConfig c = Tiny(10);
  c.heads = 3;
  EXPECT_ERROR(c.Validate(), absl::StatusCode::kInvalidArgument, "heads (3) must divide d_model (16)");
  c = Tiny(10);
  c.layers = 0;
  EXPECT_ERROR(c.Validate(), absl::StatusCode::kInvalidArgument, "layers must be > 0");
  c = Tiny(10);
  c.d_model = 1024;
  c.heads = 4;
  EXPECT_ERROR(c.Validate(), absl::StatusCode::kInvalidArgument, "head size d_model / heads = 256 exceeds 128");
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2}));
  EXPECT_ERROR(BuildTrainStep(Tiny(10), TrainLayout{3, 1}, {mesh}), absl::StatusCode::kInvalidArgument,
               "batch 3 does not divide into 1 micro-batches over stage 0's 2 accelerators");
  ASSERT_OK_AND_ASSIGN(auto a, client_->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto b, client_->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto d, client_->AllocateMesh({1}));
  TransformerConfig two = Tiny(10);
  EXPECT_ERROR(BuildTrainStep(two, TrainLayout{4, 1}, {a, b, d}), absl::StatusCode::kInvalidArgument,
               "3 stages for 2 layers");
  ASSERT_OK_AND_ASSIGN(auto e, client_->AllocateMesh({1}));
  EXPECT_ERROR(BuildTrainStep(Tiny(10), TrainLayout{6, 1, 4}, {a, b, d, e}), absl::StatusCode::kInvalidArgument,
               "batch 6 does not divide into 4 replicas of 1 micro-batches over stage 0's 1 accelerators");
  EXPECT_ERROR(BuildTrainStep(Tiny(10), TrainLayout{8, 1, 2}, {a, b, d}), absl::StatusCode::kInvalidArgument,
               "3 meshes for 2 replicas");
  EXPECT_ERROR(BuildTrainStep(Tiny(10), TrainLayout{8, 1, 2}, {a, mesh}), absl::StatusCode::kInvalidArgument,
               "replica 1 stage 0 has 2 accelerators, replica 0's 1");
}

// The tensors' names in Parameters() order for `layers` layers, written out
// from the documented layout.
std::vector<std::string> TensorNames(uint32_t layers) {
  std::vector<std::string> names = {"tok_emb", "pos_emb"};
  for (uint32_t l = 0; l < layers; ++l) {
    for (const char* t : {"ln1_g", "ln1_b", "wq", "wk", "wv", "wo", "ln2_g", "ln2_b", "w1", "b1", "w2"}) {
      names.push_back(absl::StrCat("layer", l, ".", t));
    }
  }
  for (const char* t : {"lnf_g", "lnf_b", "w_out"}) names.push_back(t);
  return names;
}

// Tests the eval def's layout over two stages (of 2 and 1 accelerators, two
// layers): the meshes, ids on the first stage and targets on the last, both
// split over the batch, each tensor on the stage that holds its layer (the
// embeddings first, the final norm and output last), the calls in order and
// the one output.
TEST(TransformerEvalDefTest, LaysOutStages) {
  const TransformerConfig config = Tiny(11);
  ASSERT_OK_AND_ASSIGN(ProgramDef def, BuildEvalDef(config, 4, {2, 1}));
  ASSERT_EQ(def.meshes_size(), 2);
  EXPECT_EQ(def.meshes(0).name(), "stage0");
  EXPECT_THAT(def.meshes(0).dims(), ::testing::ElementsAre(2));
  EXPECT_EQ(def.meshes(1).name(), "stage1");
  EXPECT_THAT(def.meshes(1).dims(), ::testing::ElementsAre(1));

  const std::vector<std::string> tensors = TensorNames(2);
  ASSERT_EQ(def.parameters_size(), static_cast<int>(2 + tensors.size()));
  for (int i : {0, 1}) {
    const auto& p = def.parameters(i);
    EXPECT_EQ(p.value(), i == 0 ? "ids" : "targets");
    EXPECT_EQ(p.mesh(), i == 0 ? "stage0" : "stage1");
    EXPECT_THAT(p.shape(), ::testing::ElementsAre(4, 8));
    EXPECT_EQ(p.dtype(), I32);
    ASSERT_TRUE(p.sharding().has_split()) << p.value();
    EXPECT_EQ(p.sharding().split().array_axis(), 0);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& p = def.parameters(2 + i);
    EXPECT_EQ(p.value(), tensors[i]);
    // Layer 0 and the embeddings on stage 0; layer 1 and the head on stage 1.
    const bool first = i < 2 + 11;
    EXPECT_EQ(p.mesh(), first ? "stage0" : "stage1") << p.value();
    EXPECT_EQ(p.dtype(), F32);
    EXPECT_FALSE(p.sharding().has_split()) << p.value();
  }
  std::vector<std::string> nodes;
  for (const auto& n : def.nodes()) nodes.push_back(n.name() + "@" + n.call().mesh());
  EXPECT_THAT(nodes,
              ::testing::ElementsAre("embed@stage0", "forward.0@stage0", "forward.1@stage1", "head@stage1"));
  EXPECT_THAT(def.outputs(), ::testing::ElementsAre("loss"));
}

// Tests the eval def's errors, each by its own message.
TEST(TransformerEvalDefTest, RefusesBadLayouts) {
  const TransformerConfig config = Tiny(11);
  EXPECT_ERROR(BuildEvalDef(config, 4, {}), absl::StatusCode::kInvalidArgument,
               "eval: 0 stages for 2 layers");
  EXPECT_ERROR(BuildEvalDef(config, 4, {1, 1, 1}), absl::StatusCode::kInvalidArgument,
               "eval: 3 stages for 2 layers");
  EXPECT_ERROR(BuildEvalDef(config, 3, {1, 2}), absl::StatusCode::kInvalidArgument,
               "eval: batch 3 does not divide over 2 accelerators");
  EXPECT_ERROR(BuildEvalDef(config, 0, {1}), absl::StatusCode::kInvalidArgument,
               "eval: batch 0 does not divide over 1 accelerators");
  TransformerConfig bad = config;
  bad.heads = 3;
  EXPECT_ERROR(BuildEvalDef(bad, 4, {1}), absl::StatusCode::kInvalidArgument,
               "heads (3) must divide d_model (16)");
}

// Tests the eval program built on meshes (a stage of 2 accelerators, then
// one of 1) token by token against the CPU's forward.
TEST_F(TransformerTest, EvalProgramMatchesCpuReference) {
  Start(3);
  const TransformerConfig config = Tiny(11);
  const uint32_t batch = 2;
  const TinyProblem p = MakeTinyProblem(config, batch);
  ASSERT_OK_AND_ASSIGN(auto first, client_->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto last, client_->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto program, BuildEvalProgram(config, batch, {first, last}));
  ASSERT_OK_AND_ASSIGN(auto executable, client_->Load(program));
  std::vector<ArrayRef> inputs;
  for (const auto& [tokens, mesh] : {std::pair{&p.ids, first}, std::pair{&p.targets, last}}) {
    ASSERT_OK_AND_ASSIGN(
        ArrayRef a, client_->CreateArray(mesh, {batch, config.seq_len}, DType::kI32, Sharding::Split(0)));
    ASSERT_OK(a->Upload(tokens->data(), tokens->size() * 4));
    inputs.push_back(std::move(a));
  }
  const std::vector<ParameterInfo> params = Parameters(config);
  for (size_t i = 0; i < params.size(); ++i) {
    // Layer 0 and the embeddings on the first stage, the rest on the last.
    const auto& mesh =
        params[i].layer == 0 || params[i].name == "tok_emb" || params[i].name == "pos_emb" ? first : last;
    ASSERT_OK_AND_ASSIGN(ArrayRef a, client_->CreateArray(mesh, params[i].shape, DType::kF32));
    ASSERT_OK(a->Upload(p.weights[i].data(), p.weights[i].size() * 4));
    inputs.push_back(std::move(a));
  }
  ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(executable, inputs));
  ASSERT_EQ(run.outputs.size(), 1u);
  std::vector<float> got(uint64_t{batch} * config.seq_len);
  ASSERT_OK(run.outputs[0]->Download(got.data(), got.size() * 4));
  const std::vector<double> want = ReferenceLoss(config, p.weights, p.ids, p.targets, batch);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + want[i])) << "token " << i;
}

}  // namespace
}  // namespace causeway::models
