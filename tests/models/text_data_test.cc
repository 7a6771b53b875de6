// The language model's data path: the shipped corpus loads and splits at a
// line, the vocabulary round-trips, batches are next-character windows that
// repeat from a seed, evaluation windows tile the held-out text, and bad
// files and sizes are clear errors.
#include "causeway/models/text_data.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway::models {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kCorpus = std::string(::causeway::testing::DataDir()) + "/kjv-genesis-exodus.txt";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

fs::path WriteTemp(const std::string& name, const std::string& bytes) {
  fs::path path = fs::temp_directory_path() / absl::StrCat("text_data_test_", getpid(), "_", name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Tests that the shipped corpus is a few hundred KB of text with a small
// vocabulary, split 90/10 after a line break, and decodes back to the file.
TEST(TextDataTest, ShippedCorpusLoadsAndSplitsAtALine) {
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  const std::string text = ReadAll(kCorpus);
  EXPECT_GT(text.size(), 200'000u);
  EXPECT_LT(text.size(), 1'000'000u);
  EXPECT_EQ(corpus.bytes(), text.size());
  EXPECT_GT(corpus.vocab().size(), 40);
  EXPECT_LT(corpus.vocab().size(), 100);
  const double held = static_cast<double>(corpus.held_out().size()) / text.size();
  EXPECT_NEAR(held, 0.1, 0.01);
  // The training part ends with a newline; the two parts are the file.
  const std::string train = corpus.vocab().Decode(corpus.train());
  EXPECT_EQ(train.back(), '\n');
  EXPECT_EQ(train + corpus.vocab().Decode(corpus.held_out()), text);
}

TEST(TextDataTest, VocabularyIsSortedAndRoundTrips) {
  CharVocab vocab = CharVocab::FromText("hello, world\n");
  EXPECT_EQ(vocab.chars(), std::string("\n ,dehlorw"));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> tokens, vocab.Encode("world, hello"));
  EXPECT_EQ(tokens[0], 9);  // 'w'
  EXPECT_EQ(vocab.Decode(tokens), "world, hello");
  EXPECT_EQ(vocab.Decode(std::vector<int32_t>{-1, 3, 99}), "?d?");
  EXPECT_ERROR(vocab.Encode("hello!"), absl::StatusCode::kInvalidArgument, "'!' at offset 5",
               "vocabulary of 10 characters");
  EXPECT_ERROR(vocab.Encode(std::string("he\x01")), absl::StatusCode::kInvalidArgument, "byte 0x01 at offset 2");
}

// Tests that every row of a batch is a window of the training text and its
// targets are the next characters; that a seed repeats its batches and
// another seed does not; and that starts cover the text.
TEST(TextDataTest, BatchesAreNextCharacterWindowsFromASeed) {
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  const std::string train = corpus.vocab().Decode(corpus.train());
  BatchSampler a(corpus.train(), 8, 32, 42), b(corpus.train(), 8, 32, 42), c(corpus.train(), 8, 32, 43);
  std::set<size_t> starts;
  for (int step = 0; step < 50; ++step) {
    ASSERT_OK_AND_ASSIGN(TokenBatch x, a.Next());
    ASSERT_OK_AND_ASSIGN(TokenBatch y, b.Next());
    ASSERT_OK_AND_ASSIGN(TokenBatch z, c.Next());
    ASSERT_EQ(x.inputs.size(), 8u * 32);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_NE(x.inputs, z.inputs);
    for (uint32_t row = 0; row < 8; ++row) {
      std::vector<int32_t> in(x.inputs.begin() + row * 32, x.inputs.begin() + (row + 1) * 32);
      std::vector<int32_t> out(x.targets.begin() + row * 32, x.targets.begin() + (row + 1) * 32);
      const std::string window = corpus.vocab().Decode(in) + corpus.vocab().Decode(out).back();
      const size_t at = train.find(window);
      ASSERT_NE(at, std::string::npos) << window;
      EXPECT_EQ(corpus.vocab().Decode(out), window.substr(1));
      starts.insert(at / (train.size() / 10));
    }
  }
  EXPECT_EQ(starts.size(), 10u) << "400 windows should start in every tenth of the text";
}

TEST(TextDataTest, EvaluationBatchesTileTheHeldOutText) {
  ASSERT_OK_AND_ASSIGN(TextCorpus corpus, TextCorpus::Load(kCorpus));
  ASSERT_OK_AND_ASSIGN(std::vector<TokenBatch> batches, EvaluationBatches(corpus.held_out(), 4, 64, 5));
  ASSERT_EQ(batches.size(), 5u);
  std::vector<int32_t> joined;
  for (const TokenBatch& b : batches) joined.insert(joined.end(), b.inputs.begin(), b.inputs.end());
  EXPECT_TRUE(std::equal(joined.begin(), joined.end(), corpus.held_out().begin()));
  EXPECT_EQ(batches[4].targets.back(), corpus.held_out()[5 * 4 * 64]);
  // Asking for more than the text holds gives what it holds.
  ASSERT_OK_AND_ASSIGN(batches, EvaluationBatches(corpus.held_out(), 4, 64, 1'000'000));
  EXPECT_EQ(batches.size(), (corpus.held_out().size() - 1) / 64 / 4);
}

TEST(TextDataTest, BadFilesAndSizesAreClearErrors) {
  EXPECT_ERROR(TextCorpus::Load("/nonexistent/corpus.txt"), absl::StatusCode::kNotFound,
               "cannot read corpus /nonexistent/corpus.txt");
  const fs::path empty = WriteTemp("empty", "");
  EXPECT_ERROR(TextCorpus::Load(empty.string()), absl::StatusCode::kInvalidArgument, "is empty");
  const fs::path binary = WriteTemp("binary", std::string("abc\0def\n", 8));
  EXPECT_ERROR(TextCorpus::Load(binary.string()), absl::StatusCode::kInvalidArgument,
               "NUL byte at offset 3: not a text file");
  const fs::path tiny = WriteTemp("tiny", "ab");
  EXPECT_ERROR(TextCorpus::Load(tiny.string()), absl::StatusCode::kInvalidArgument, "too short to split");
  EXPECT_ERROR(TextCorpus::FromText("hello\nworld\n", 0.9), absl::StatusCode::kInvalidArgument,
               "held-out fraction must be in (0, 0.5]");
  fs::remove(empty);
  fs::remove(binary);
  fs::remove(tiny);

  ASSERT_OK_AND_ASSIGN(TextCorpus small, TextCorpus::FromText(std::string(100, 'a') + "\n" + std::string(20, 'b')));
  BatchSampler too_long(small.held_out(), 2, 64, 1);
  EXPECT_ERROR(too_long.Next(), absl::StatusCode::kInvalidArgument, "needs 65 tokens; the text has");
  BatchSampler zero(small.train(), 0, 4, 1);
  EXPECT_ERROR(zero.Next(), absl::StatusCode::kInvalidArgument, "batch (0)");
  EXPECT_ERROR(EvaluationBatches(small.held_out(), 8, 4, 1), absl::StatusCode::kInvalidArgument,
               "one batch needs 8");
}

}  // namespace
}  // namespace causeway::models
