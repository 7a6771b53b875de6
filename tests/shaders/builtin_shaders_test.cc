#include "causeway/shaders/builtin_shaders.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spirv-tools/libspirv.hpp"

namespace causeway {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

constexpr uint32_t kSpirvMagic = 0x07230203;
constexpr uint32_t kSpirvVersion1_5 = 0x00010500;
constexpr size_t kSpirvHeaderWords = 5;

// SPIR-V opcodes and enumerants the checks below look for.
constexpr uint32_t kOpEntryPoint = 15;
constexpr uint32_t kOpDecorate = 71;
constexpr uint32_t kOpMemberDecorate = 72;
constexpr uint32_t kExecutionModelGLCompute = 5;
constexpr uint32_t kDecorationSpecId = 1;
constexpr uint32_t kDecorationNonWritable = 24;
constexpr uint32_t kDecorationNonReadable = 25;
constexpr uint32_t kDecorationBinding = 33;
constexpr uint32_t kDecorationDescriptorSet = 34;

// What the runtime relies on in one module, read from its instructions.
struct ModuleFacts {
  int glcompute_entry_points_named_main = 0;
  std::set<uint32_t> spec_ids;
  std::set<uint32_t> descriptor_sets;
  std::multiset<uint32_t> bindings;
  int non_writable_members = 0;
  int non_readable_members = 0;
};

// Walks the instruction stream of a module that has already been validated.
ModuleFacts ReadFacts(absl::Span<const uint32_t> spirv) {
  ModuleFacts facts;
  size_t i = kSpirvHeaderWords;
  while (i < spirv.size()) {
    const uint32_t opcode = spirv[i] & 0xffff;
    const uint32_t word_count = spirv[i] >> 16;
    if (word_count == 0 || i + word_count > spirv.size()) break;
    absl::Span<const uint32_t> operands = spirv.subspan(i + 1, word_count - 1);
    if (opcode == kOpEntryPoint && operands.size() >= 3 && operands[0] == kExecutionModelGLCompute) {
      // operands[2..] is the nul-terminated name packed little-endian.
      const char* name = reinterpret_cast<const char*>(&operands[2]);
      if (absl::string_view(name) == "main") {
        ++facts.glcompute_entry_points_named_main;
      }
    } else if (opcode == kOpDecorate && operands.size() >= 3) {
      switch (operands[1]) {
        case kDecorationSpecId:
          facts.spec_ids.insert(operands[2]);
          break;
        case kDecorationDescriptorSet:
          facts.descriptor_sets.insert(operands[2]);
          break;
        case kDecorationBinding:
          facts.bindings.insert(operands[2]);
          break;
      }
    } else if (opcode == kOpMemberDecorate && operands.size() >= 3) {
      if (operands[2] == kDecorationNonWritable) ++facts.non_writable_members;
      if (operands[2] == kDecorationNonReadable) ++facts.non_readable_members;
    }
    i += word_count;
  }
  return facts;
}

std::vector<std::string> Names(absl::Span<const BuiltinShader> shaders) {
  std::vector<std::string> names;
  for (const BuiltinShader& shader : shaders) {
    names.emplace_back(shader.name);
  }
  return names;
}

// Tests that every kernel is listed exactly once, sorted by name.
TEST(BuiltinShadersTest, ListsEveryKernelSortedByName) {
  EXPECT_THAT(
      Names(BuiltinShaders()),
      ElementsAre("adam", "adam_update", "adam_update_multi", "add", "attention", "attention_backward",
                  "attention_backward_dot", "attention_backward_lanes", "attention_lanes", "bias_gelu",
                  "bias_gelu_backward", "combine", "combine4", "combine_n", "copy", "cross_entropy",
                  "cross_entropy_backward", "embedding", "embedding_backward", "fill", "gemm", "layer_norm",
                  "layer_norm_backward", "matmul", "mul", "permute_0213", "reduce_sum", "scale", "sgd",
                  "softmax_causal", "softmax_causal_backward"));
}

// Tests that each module has a SPIR-V 1.5 header with a plausible id bound.
TEST(BuiltinShadersTest, ModulesHaveSpirv15Header) {
  for (const BuiltinShader& shader : BuiltinShaders()) {
    SCOPED_TRACE(shader.name);
    ASSERT_GT(shader.spirv.size(), kSpirvHeaderWords);
    EXPECT_EQ(shader.spirv[0], kSpirvMagic);
    EXPECT_EQ(shader.spirv[1], kSpirvVersion1_5);
    EXPECT_GT(shader.spirv[3], 1u) << "id bound";
    EXPECT_EQ(shader.spirv[4], 0u) << "reserved schema word";
  }
}

// Tests that each module passes the SPIR-V validator for Vulkan 1.2.
TEST(BuiltinShadersTest, ModulesValidateForVulkan12) {
  for (const BuiltinShader& shader : BuiltinShaders()) {
    SCOPED_TRACE(shader.name);
    spvtools::SpirvTools tools(SPV_ENV_VULKAN_1_2);
    std::string messages;
    tools.SetMessageConsumer(
        [&messages](spv_message_level_t, const char*, const spv_position_t& position, const char* message) {
          messages += "word " + std::to_string(position.index) + ": " + message + "\n";
        });
    EXPECT_TRUE(tools.Validate(shader.spirv.data(), shader.spirv.size())) << messages;
  }
}

// Tests the interface conventions the runtime depends on: a GLCompute "main",
// everything in descriptor set 0 with bindings 0..n-1, inputs NonWritable,
// outputs NonReadable, and the workgroup-size specialization constants.
TEST(BuiltinShadersTest, ModulesFollowInterfaceConventions) {
  struct Expected {
    int bindings;
    int readonly_bindings;
    int writeonly_bindings;
    std::set<uint32_t> spec_ids;
  };
  const std::map<std::string, Expected> expected = {
      {"add", {3, 2, 1, {0}}},
      {"combine", {3, 2, 1, {0, 1, 2}}},
      {"combine4", {3, 2, 1, {0, 1, 2}}},
      // Operands 0..7 and the result declared twice (as uints and as uvec4s);
      // the result is read when accumulating.
      {"combine_n", {9, 16, 0, {0, 1, 2, 3, 4, 5, 6}}},
      {"copy", {2, 1, 1, {0}}},
      {"fill", {1, 0, 1, {0}}},
      {"matmul", {3, 2, 1, {0, 1}}},
      {"mul", {3, 2, 1, {0}}},
      {"reduce_sum", {2, 1, 1, {0}}},
      {"scale", {2, 1, 1, {0}}},
      // The model kernels (read-write bindings count as neither).
      {"adam", {4, 1, 0, {0}}},
      {"adam_update", {8, 5, 3, {0}}},
      {"adam_update_multi", {29, 17, 12, {0}}},
      {"permute_0213", {2, 1, 1, {0, 1}}},
      {"attention", {5, 3, 2, {0, 1}}},
      {"attention_backward", {9, 6, 3, {0, 1, 2}}},
      {"attention_backward_dot", {3, 2, 1, {0}}},
      {"attention_lanes", {5, 3, 2, {0, 1, 2}}},
      {"attention_backward_lanes", {9, 6, 3, {0, 1, 2, 3}}},
      {"bias_gelu", {3, 2, 1, {0}}},
      {"bias_gelu_backward", {5, 3, 2, {0}}},
      {"cross_entropy", {3, 2, 1, {0, 1}}},
      {"cross_entropy_backward", {3, 2, 1, {0, 1}}},
      {"embedding", {4, 3, 1, {0}}},
      // A and B are declared twice, at bindings 0 and 1 (as floats and as vec4s).
      {"gemm", {3, 4, 0, {0, 1, 2, 3, 4, 5, 6}}},
      {"embedding_backward", {3, 2, 0, {0}}},
      {"layer_norm", {6, 3, 3, {0, 1}}},
      {"layer_norm_backward", {8, 5, 3, {0, 1, 2}}},
      {"sgd", {3, 1, 0, {0}}},
      {"softmax_causal", {2, 1, 1, {0}}},
      {"softmax_causal_backward", {3, 2, 1, {0}}},
  };
  for (const BuiltinShader& shader : BuiltinShaders()) {
    SCOPED_TRACE(shader.name);
    auto it = expected.find(std::string(shader.name));
    ASSERT_NE(it, expected.end()) << "no expectations for this kernel";
    const Expected& want = it->second;
    const ModuleFacts facts = ReadFacts(shader.spirv);

    EXPECT_EQ(facts.glcompute_entry_points_named_main, 1);
    EXPECT_THAT(facts.descriptor_sets, ElementsAre(0u));
    std::vector<uint32_t> want_bindings;
    for (int b = 0; b < want.bindings; ++b) want_bindings.push_back(b);
    // Distinct bindings: a buffer may be declared twice at one binding.
    EXPECT_THAT(std::set<uint32_t>(facts.bindings.begin(), facts.bindings.end()), ElementsAreArray(want_bindings));
    EXPECT_EQ(facts.non_writable_members, want.readonly_bindings);
    EXPECT_EQ(facts.non_readable_members, want.writeonly_bindings);
    EXPECT_EQ(facts.spec_ids, want.spec_ids);
  }
}

// Tests that lookup finds each listed kernel's own module.
TEST(BuiltinShadersTest, FindReturnsTheListedModule) {
  for (const BuiltinShader& shader : BuiltinShaders()) {
    SCOPED_TRACE(shader.name);
    std::optional<absl::Span<const uint32_t>> found = FindBuiltinShader(shader.name);
    ASSERT_TRUE(found.has_value());
    EXPECT_EQ(found->data(), shader.spirv.data());
    EXPECT_EQ(found->size(), shader.spirv.size());
  }
}

// Tests that lookup is exact: unknown, empty, differently cased and prefix
// names are not found.
TEST(BuiltinShadersTest, FindRejectsUnknownNames) {
  EXPECT_EQ(FindBuiltinShader("softmax"), std::nullopt);
  EXPECT_EQ(FindBuiltinShader(""), std::nullopt);
  EXPECT_EQ(FindBuiltinShader("Add"), std::nullopt);
  EXPECT_EQ(FindBuiltinShader("reduce"), std::nullopt);
  EXPECT_EQ(FindBuiltinShader("scale2"), std::nullopt);
  EXPECT_EQ(FindBuiltinShader("zzz"), std::nullopt);
}

}  // namespace
}  // namespace causeway
