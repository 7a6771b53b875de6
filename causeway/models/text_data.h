// Character-level text data for the benchmark language model: a corpus read
// from a file, its vocabulary, a train / held-out split, and batches of
// token windows drawn from either, reproducibly from a seed.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(TextCorpus corpus, TextCorpus::Load("data/kjv-genesis-exodus.txt"));
//   BatchSampler sampler(corpus.train(), /*batch=*/8, /*seq_len=*/64, /*seed=*/1);
//   CAUSEWAY_ASSIGN_OR_RETURN(TokenBatch b, sampler.Next());   // b.inputs, b.targets: [8, 64]
#ifndef CAUSEWAY_MODELS_TEXT_DATA_H_
#define CAUSEWAY_MODELS_TEXT_DATA_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway::models {

// The distinct bytes of a text, sorted; token i is the i-th of them.
class CharVocab {
 public:
  static CharVocab FromText(absl::string_view text);

  int size() const { return static_cast<int>(chars_.size()); }
  // InvalidArgument naming the byte and its offset if the text holds a byte
  // outside the vocabulary.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;
  // Tokens outside [0, size()) decode as '?'.
  std::string Decode(absl::Span<const int32_t> tokens) const;
  const std::string& chars() const { return chars_; }

 private:
  std::string chars_;
  std::array<int16_t, 256> index_{};  // byte -> token, -1 if absent
};

// A corpus as tokens, split into a training part and a held-out part (the
// end of the text, cut at a line break).
class TextCorpus {
 public:
  // Reads `path` whole. `held_out` is the fraction of the text kept out of
  // training, in (0, 0.5]. Errors: the file cannot be read (NotFound or
  // PermissionDenied with the path), is empty, holds a NUL byte (not text),
  // or is too short to split (InvalidArgument).
  static absl::StatusOr<TextCorpus> Load(const std::string& path, double held_out = 0.1);
  // The same from text in memory (`name` appears in errors).
  static absl::StatusOr<TextCorpus> FromText(std::string text, double held_out = 0.1,
                                             std::string name = "text");

  const CharVocab& vocab() const { return vocab_; }
  absl::Span<const int32_t> train() const { return train_; }
  absl::Span<const int32_t> held_out() const { return held_out_; }
  const std::string& name() const { return name_; }
  uint64_t bytes() const { return train_.size() + held_out_.size(); }

 private:
  std::string name_;
  CharVocab vocab_;
  std::vector<int32_t> train_, held_out_;
};

// `batch` windows of `seq_len` tokens: targets are the inputs shifted by one
// (the next character). Row-major [batch, seq_len].
struct TokenBatch {
  uint32_t batch = 0, seq_len = 0;
  std::vector<int32_t> inputs, targets;
};

// Draws batches of windows at uniformly random starts (SplitMix64 from
// `seed`): the same seed gives the same batches on any machine.
class BatchSampler {
 public:
  BatchSampler(absl::Span<const int32_t> tokens, uint32_t batch, uint32_t seq_len, uint64_t seed);
  // InvalidArgument if the tokens are too few for one window of seq_len + 1
  // or batch or seq_len is 0.
  absl::StatusOr<TokenBatch> Next();
  // Where the sampler is in its sequence: a sampler given back the state
  // of another over the same tokens and sizes draws the same batches next.
  uint64_t state() const { return state_; }
  void set_state(uint64_t state) { state_ = state; }

 private:
  absl::Span<const int32_t> tokens_;
  uint32_t batch_, seq_len_;
  uint64_t state_;
};

// The held-out evaluation set: up to `max_batches` batches of consecutive,
// non-overlapping windows from the start of `tokens` (the same every call).
absl::StatusOr<std::vector<TokenBatch>> EvaluationBatches(absl::Span<const int32_t> tokens, uint32_t batch,
                                                          uint32_t seq_len, uint32_t max_batches);

}  // namespace causeway::models

#endif  // CAUSEWAY_MODELS_TEXT_DATA_H_
