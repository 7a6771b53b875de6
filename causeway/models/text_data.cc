#include "causeway/models/text_data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"

namespace causeway::models {
namespace {

std::string Printable(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  return absl::StrFormat("byte 0x%02x", c);
}

}  // namespace

CharVocab CharVocab::FromText(absl::string_view text) {
  std::array<bool, 256> seen{};
  for (unsigned char c : text) seen[c] = true;
  CharVocab vocab;
  vocab.index_.fill(-1);
  for (int c = 0; c < 256; ++c) {
    if (!seen[c]) continue;
    vocab.index_[c] = static_cast<int16_t>(vocab.chars_.size());
    vocab.chars_.push_back(static_cast<char>(c));
  }
  return vocab;
}

absl::StatusOr<std::vector<int32_t>> CharVocab::Encode(absl::string_view text) const {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int16_t token = index_[static_cast<unsigned char>(text[i])];
    if (token < 0) {
      return absl::InvalidArgumentError(absl::StrCat(Printable(static_cast<unsigned char>(text[i])),
                                                     " at offset ", i, " is not in the vocabulary of ",
                                                     chars_.size(), " characters"));
    }
    tokens[i] = token;
  }
  return tokens;
}

std::string CharVocab::Decode(absl::Span<const int32_t> tokens) const {
  std::string text(tokens.size(), '?');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= 0 && tokens[i] < size()) text[i] = chars_[tokens[i]];
  }
  return text;
}

absl::StatusOr<TextCorpus> TextCorpus::Load(const std::string& path, double held_out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot read corpus ", path, ": ", std::strerror(err));
    return err == EACCES ? absl::PermissionDeniedError(why) : absl::NotFoundError(why);
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading corpus ", path, " failed"));
  return FromText(std::move(text).str(), held_out, path);
}

absl::StatusOr<TextCorpus> TextCorpus::FromText(std::string text, double held_out, std::string name) {
  if (!(held_out > 0 && held_out <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("corpus ", name, ": the held-out fraction must be in (0, 0.5], got ", held_out));
  }
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("corpus ", name, " is empty"));
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("corpus ", name, " holds a NUL byte at offset ", nul, ": not a text file"));
  }
  // Cut after the first line break at or past the split point, so that no
  // line is split between training and evaluation.
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - held_out));
  const size_t newline = text.find('\n', cut);
  if (newline != std::string::npos && newline + 1 < text.size()) cut = newline + 1;
  // Each part must hold at least a window of two tokens.
  if (cut < 2 || text.size() - cut < 2) {
    return absl::InvalidArgumentError(absl::StrCat("corpus ", name, " (", text.size(),
                                                   " bytes) is too short to split into training and held-out text"));
  }
  TextCorpus corpus;
  corpus.name_ = std::move(name);
  corpus.vocab_ = CharVocab::FromText(text);
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, corpus.vocab_.Encode(text));
  corpus.train_.assign(tokens.begin(), tokens.begin() + cut);
  corpus.held_out_.assign(tokens.begin() + cut, tokens.end());
  return corpus;
}

BatchSampler::BatchSampler(absl::Span<const int32_t> tokens, uint32_t batch, uint32_t seq_len, uint64_t seed)
    : tokens_(tokens), batch_(batch), seq_len_(seq_len), state_(seed) {}

namespace {

absl::Status CheckWindow(absl::Span<const int32_t> tokens, uint32_t batch, uint32_t seq_len) {
  if (batch == 0 || seq_len == 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch (", batch, ") and sequence length (", seq_len,
                                                   ") must be > 0"));
  }
  if (tokens.size() < uint64_t{seq_len} + 1) {
    return absl::InvalidArgumentError(absl::StrCat("a window of ", seq_len, " tokens and its next token needs ",
                                                   uint64_t{seq_len} + 1, " tokens; the text has ", tokens.size()));
  }
  return absl::OkStatus();
}

void CopyWindow(absl::Span<const int32_t> tokens, uint64_t start, uint32_t row, TokenBatch& out) {
  const uint64_t at = uint64_t{row} * out.seq_len;
  std::copy_n(tokens.begin() + start, out.seq_len, out.inputs.begin() + at);
  std::copy_n(tokens.begin() + start + 1, out.seq_len, out.targets.begin() + at);
}

TokenBatch EmptyBatch(uint32_t batch, uint32_t seq_len) {
  TokenBatch b;
  b.batch = batch;
  b.seq_len = seq_len;
  b.inputs.resize(uint64_t{batch} * seq_len);
  b.targets.resize(uint64_t{batch} * seq_len);
  return b;
}

}  // namespace

absl::StatusOr<TokenBatch> BatchSampler::Next() {
  CAUSEWAY_RETURN_IF_ERROR(CheckWindow(tokens_, batch_, seq_len_));
  TokenBatch b = EmptyBatch(batch_, seq_len_);
  const uint64_t starts = tokens_.size() - seq_len_;  // windows of seq_len + 1 tokens
  for (uint32_t row = 0; row < batch_; ++row) {
    // The top 53 bits, scaled: uniform enough for any corpus that fits memory.
    const uint64_t r = reference::SplitMix64(state_, 0);
    state_ = r;
    const uint64_t start = static_cast<uint64_t>(static_cast<double>(r >> 11) * 0x1p-53 * static_cast<double>(starts));
    CopyWindow(tokens_, std::min(start, starts - 1), row, b);
  }
  return b;
}

absl::StatusOr<std::vector<TokenBatch>> EvaluationBatches(absl::Span<const int32_t> tokens, uint32_t batch,
                                                          uint32_t seq_len, uint32_t max_batches) {
  CAUSEWAY_RETURN_IF_ERROR(CheckWindow(tokens, batch, seq_len));
  const uint64_t windows = (tokens.size() - 1) / seq_len;
  const uint64_t count = std::min<uint64_t>(windows / batch, max_batches);
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the held-out text (", tokens.size(), " tokens) holds ", windows,
                                                   " windows of ", seq_len, "; one batch needs ", batch));
  }
  std::vector<TokenBatch> batches;
  for (uint64_t i = 0; i < count; ++i) {
    TokenBatch b = EmptyBatch(batch, seq_len);
    for (uint32_t row = 0; row < batch; ++row) CopyWindow(tokens, (i * batch + row) * seq_len, row, b);
    batches.push_back(std::move(b));
  }
  return batches;
}

}  // namespace causeway::models
