// Training checkpoints: everything a trainer needs to go on as if it had
// never stopped (the model's tensors, Adam's moments, the step, the data
// position), written to a directory so that a crash at any moment leaves the
// last complete checkpoint readable.
//
// A directory holds checkpoint files "step-00000050.ckpt" and a text
// MANIFEST naming the newest. Each file is written to a temporary name,
// flushed to disk and renamed into place; only then is a new MANIFEST
// written the same way, and only then are files older than the previous one
// removed. A file is a text header (the same lines as the manifest: model,
// vocabulary, layout, step, data position, tensors), the tensors (f32,
// little-endian: every weight, then every m, then every v, in Parameters()
// order) and a CRC-32C of all that came before.
//
// Tensors are whole (not sharded), so a checkpoint written by one layout
// loads onto any other: single, SPMD, pipeline, replicas, islands.
//
// Example:
//   CAUSEWAY_RETURN_IF_ERROR(WriteCheckpoint("ckpt", state));
//   CAUSEWAY_ASSIGN_OR_RETURN(CheckpointState back, ReadCheckpoint("ckpt"));   // the newest in ckpt/
#ifndef CAUSEWAY_MODELS_CHECKPOINT_H_
#define CAUSEWAY_MODELS_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "causeway/kernels/nn_ops.h"
#include "causeway/models/transformer.h"

namespace causeway::models {

struct CheckpointState {
  TransformerConfig config;
  // The corpus's characters (CharVocab::chars()): token i is vocabulary[i].
  std::string vocabulary;
  ops::AdamConfig adam;
  uint64_t seed = 0;        // of the initial weights
  uint64_t step = 0;        // steps done
  uint64_t data_state = 0;  // BatchSampler::state() after `step` batches
  uint32_t batch = 0;       // global batch (sequences per step)
  // How it was trained, for people ("2 replicas of stages {1, 1}, 4
  // micro-batches"); any layout may load it.
  std::string layout;
  // Parameters(config) order.
  std::vector<std::vector<float>> weights, m, v;

  // InvalidArgument unless the tensors are as many and as large as
  // Parameters(config) says.
  absl::Status CheckTensors() const;
};

// Writes `state` into `dir` (made if missing) as its newest checkpoint and
// keeps the one before it. Errors name the file and the cause; on an error
// the directory's previous checkpoint is untouched and readable.
absl::Status WriteCheckpoint(const std::string& dir, const CheckpointState& state);

// The newest checkpoint of a directory `path` (its MANIFEST's), or the
// checkpoint file `path`. NotFound for a missing directory or manifest;
// DataLoss, naming the file, for a truncated or corrupt one (size or
// checksum) or one whose header does not match its manifest; InvalidArgument
// for sizes outside the model's bounds.
absl::StatusOr<CheckpointState> ReadCheckpoint(const std::string& path);

// CRC-32C (Castagnoli) of `data`, continuing from `crc` (0 to start).
uint32_t Crc32c(absl::Span<const uint8_t> data, uint32_t crc = 0);

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_CHECKPOINT_H_
