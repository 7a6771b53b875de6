// A decoder-only Transformer language model (GPT-2's layout: pre-norm
// blocks of causal self-attention and a GELU MLP, learned position
// embeddings, a final layer norm and an untied output projection) built as
// Causeway programs: one program runs a whole training step, forward,
// backward and Adam update, laid out on accelerators as TrainLayout says.
//
// Example (one accelerator):
//   TransformerConfig config{.vocab = 72, .d_model = 64, .heads = 4, .d_ff = 256, .layers = 2, .seq_len = 64};
//   TrainLayout layout{.batch = 8};
//   ASSIGN_OR_RETURN(TrainStep step, BuildTrainStep(config, layout, {mesh}, AdamSettings{}));
//   // step.program's parameters: step.parameters (see TrainStep), in order.
#ifndef CAUSEWAY_MODELS_TRANSFORMER_H_
#define CAUSEWAY_MODELS_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/nn_ops.h"
#include "scheduler/array.h"
#include "scheduler/function.h"
#include "scheduler/mesh.h"
#include "scheduler/program.h"

namespace causeway::models {

struct TransformerConfig {
  uint32_t vocab = 0;
  uint32_t d_model = 64;
  uint32_t heads = 4;  // d_model / heads is the head size, at most 128
  uint32_t d_ff = 256;
  uint32_t layers = 2;
  uint32_t seq_len = 64;
  float ln_eps = 1e-5f;

  uint32_t head_dim() const { return heads == 0 ? 0 : d_model / heads; }
  // InvalidArgument naming the field for sizes that are 0, a d_model that
  // heads does not divide, or a head size over 128.
  absl::Status Validate() const;
  // Trainable floats.
  uint64_t ParameterCount() const;
};

// One trainable tensor: its name ("tok_emb", "layer1.wq", ...), shape and
// initialization.
struct ParameterInfo {
  enum class Init { kNormal, kOnes, kZeros };
  std::string name;
  Shape shape;
  Init init = Init::kNormal;
  float stddev = 0.0f;  // kNormal
  int layer = -1;       // its block, or -1 (embeddings, final norm, output)
};

// The model's tensors in a fixed order: tok_emb [vocab, d], pos_emb [T, d];
// per layer ln1_g, ln1_b, wq, wk, wv, wo, ln2_g, ln2_b, w1 [d, ff], b1 [ff],
// w2 [ff, d]; then lnf_g, lnf_b, w_out [d, vocab]. Weights are N(0, 0.02),
// the residual projections wo and w2 N(0, 0.02 / sqrt(2 layers)) (GPT-2).
std::vector<ParameterInfo> Parameters(const TransformerConfig& config);
// Initial values of Parameters(config), the same for a seed on any machine.
std::vector<std::vector<float>> InitialParameters(const TransformerConfig& config, uint64_t seed);

// How a step is laid out. `batch` is the global batch (sequences per step).
// Stages hold consecutive layers (the first also the embeddings, the last
// the output); each stage runs on its own mesh, whose accelerators split
// every micro-batch between them (data parallelism). So:
//   one accelerator:       1 mesh of 1
//   data parallel (SPMD):  1 mesh of N
//   pipeline (GPipe):      S meshes of 1, micro_batches M
// batch must divide by micro_batches times each mesh's size.
struct TrainLayout {
  uint32_t batch = 8;
  uint32_t micro_batches = 1;
};

struct AdamSettings {
  ops::AdamConfig adam;
  // Whether the step program updates the weights (Adam) or only outputs
  // the gradients (for checks).
  bool update = true;
};

// A training-step program and the order of its parameters and outputs.
//
// Parameters: for each micro-batch m, "ids.m" and "targets.m" (i32 [batch /
// micro_batches, seq_len], split over the first / last stage's mesh); then
// "step" (f32 [1], the Adam step counting from 1, on every stage's mesh as
// "step.s"); then every model tensor, then (update) its Adam moments
// "m.NAME" and "v.NAME", each replicated on its stage's mesh.
// Outputs: "loss.m" per micro-batch (f32 [tokens], the per-token
// cross-entropy), then (update) each tensor's new value "NAME'" and moments,
// or (no update) each tensor's gradient "grad.NAME" (the mean over the
// global batch), in Parameters() order.
struct TrainStep {
  std::shared_ptr<const Program> program;
  std::vector<std::string> parameters;
  std::vector<std::string> outputs;
  // For each model tensor, the stage that holds it.
  std::vector<int> stage_of;
};

// Builds the step on `meshes` (one per stage, all of one island; stages
// split the layers as evenly as they can, earlier stages taking the extra).
absl::StatusOr<TrainStep> BuildTrainStep(const TransformerConfig& config, const TrainLayout& layout,
                                         const std::vector<std::shared_ptr<Mesh>>& meshes,
                                         const AdamSettings& settings = {});

// A forward-only program for evaluation, laid out like the training step
// (stages on `meshes`, each splitting the batch over its accelerators):
// parameters "ids", "targets" (i32 [batch, seq_len], on the first / last
// mesh), then every model tensor on its stage's mesh; output "loss" (f32
// [batch * seq_len], per token).
absl::StatusOr<std::shared_ptr<const Program>> BuildEvalProgram(const TransformerConfig& config, uint32_t batch,
                                                                const std::vector<std::shared_ptr<Mesh>>& meshes);

// The layers each of `stages` stages holds: [first, end) per stage.
std::vector<std::pair<uint32_t, uint32_t>> StageLayers(uint32_t layers, int stages);

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_TRANSFORMER_H_
