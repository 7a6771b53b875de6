// A decoder-only Transformer language model (GPT-2's layout: pre-norm
// blocks of causal self-attention and a GELU MLP, learned position
// embeddings, a final layer norm and an untied output projection) built as
// Causeway programs: one program runs a whole training step, forward,
// backward and Adam update, laid out on accelerators as TrainLayout says.
//
// Example (one accelerator):
//   TransformerConfig config{.vocab = 72, .d_model = 64, .heads = 4, .d_ff = 256, .layers = 2, .seq_len =
//   64}; TrainLayout layout{.batch = 8}; CAUSEWAY_ASSIGN_OR_RETURN(TrainStep step, BuildTrainStep(config,
//   layout, {mesh}, AdamSettings{}));
//   // step.program's parameters: step.parameters (see TrainStep), in order.
#ifndef CAUSEWAY_MODELS_TRANSFORMER_H_
#define CAUSEWAY_MODELS_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "causeway/kernels/nn_ops.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/program.h"
#include "causeway/scheduler/program_def.h"

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
// every micro-batch between them (data parallelism). Replicas repeat the
// whole layout on meshes of their own, typically on other islands: each
// takes batch / replicas of the sequences, and they exchange gradients
// (over DCN when on different islands) so that every replica takes the same
// Adam step. So:
//   one accelerator:       1 mesh of 1
//   data parallel (SPMD):  1 mesh of N
//   pipeline (GPipe):      S meshes of 1, micro_batches M
//   two islands:           replicas 2, each 1 mesh of N (or a pipeline)
// batch must divide by replicas times micro_batches times each mesh's size.
struct TrainLayout {
  uint32_t batch = 8;
  uint32_t micro_batches = 1;
  uint32_t replicas = 1;
};

struct AdamSettings {
  ops::AdamConfig adam;
  // Whether the step program updates the weights (Adam) or only outputs
  // the gradients (for checks).
  bool update = true;
};

// What one parameter or output of a step is, for whoever feeds and reads
// the step (a trainer): the role, and where it lives.
struct StepValue {
  enum class Kind {
    kIds,      // i32 [batch / replicas / micro_batches, seq_len], split over the replica's first stage
    kTargets,  // the same, over its last stage
    kStep,     // f32 [1], the Adam step counting from 1, on the stage's mesh
    kTensor,   // the model tensor `tensor` (Parameters() order), replicated on its stage's mesh
    kM,        // its Adam moments (update) ...
    kV,
    kLoss,     // (output) f32 [tokens of the micro-batch], per-token cross-entropy
    kGrad,     // (output, no update) the tensor's gradient, the mean over the global batch
  };
  Kind kind = Kind::kTensor;
  int replica = 0;
  int stage = 0;
  uint32_t micro = 0;  // kIds, kTargets, kLoss
  int tensor = -1;     // kTensor, kM, kV, kGrad
};

// A training-step program and the order of its parameters and outputs.
//
// Parameters, replica by replica: for each micro-batch m, "ids.m" and
// "targets.m"; then (update) "step.s" for each stage s; then every model
// tensor, then (update) its Adam moments "m.NAME" and "v.NAME". Outputs,
// replica by replica: "loss.m" per micro-batch, then (update) each tensor's
// new value "NAME'" and moments, or (no update) each tensor's gradient.
// With several replicas every name has the prefix "rR." (replica R).
struct TrainStep {
  // As data (to load on island servers through a controller), and built over
  // meshes (BuildTrainStep only).
  ProgramDef def;
  std::shared_ptr<const Program> program;
  // The def's meshes, replica by replica, stage by stage, and their sizes.
  std::vector<std::string> meshes;
  std::vector<int> mesh_sizes;
  std::vector<std::string> parameters, outputs;
  std::vector<StepValue> parameter_values, output_values;
  // For each model tensor, the stage that holds it.
  std::vector<int> stage_of;
};

// The step as a def over meshes of `stage_sizes` accelerators (one per
// stage), layout.replicas times, with kernels planned for `device` (null:
// paths that run on any device).
absl::StatusOr<TrainStep> BuildTrainStepDef(const TransformerConfig& config, const TrainLayout& layout,
                                            const std::vector<int>& stage_sizes,
                                            const AdamSettings& settings = {},
                                            const DeviceCapabilities* device = nullptr);

// Builds the step on `meshes` (replicas times one per stage, replica by
// replica; stages split the layers as evenly as they can, earlier stages
// taking the extra), planned for the device of the first mesh.
absl::StatusOr<TrainStep> BuildTrainStep(const TransformerConfig& config, const TrainLayout& layout,
                                         const std::vector<std::shared_ptr<Mesh>>& meshes,
                                         const AdamSettings& settings = {});

// A forward-only program for evaluation as a def, laid out like one replica
// of the training step (meshes "stage0", "stage1", ... of `stage_sizes`,
// each splitting the batch over its accelerators): parameters "ids",
// "targets" (i32 [batch, seq_len], on the first / last mesh), then every
// model tensor on its stage's mesh; output "loss" (f32 [batch * seq_len],
// per token).
absl::StatusOr<ProgramDef> BuildEvalDef(const TransformerConfig& config, uint32_t batch,
                                        const std::vector<int>& stage_sizes,
                                        const DeviceCapabilities* device = nullptr);
// The same built on `meshes` (one per stage).
absl::StatusOr<std::shared_ptr<const Program>> BuildEvalProgram(const TransformerConfig& config, uint32_t batch,
                                                                const std::vector<std::shared_ptr<Mesh>>& meshes);

// The layers each of `stages` stages holds: [first, end) per stage.
std::vector<std::pair<uint32_t, uint32_t>> StageLayers(uint32_t layers, int stages);

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_TRANSFORMER_H_
