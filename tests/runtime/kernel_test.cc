#include "causeway/runtime/kernel.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <spirv-tools/libspirv.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace causeway {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

// A small, valid kernel: one storage buffer, a push constant, 64 threads.
constexpr absl::string_view kScaleGlsl = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Data { float values[]; } data;
layout(push_constant) uniform Params { float factor; } params;
void main() { data.values[gl_GlobalInvocationID.x] *= params.factor; }
)";

std::vector<uint32_t> MustCompile(absl::string_view source) {
  absl::StatusOr<std::vector<uint32_t>> words = CompileGlsl("test", source);
  EXPECT_TRUE(words.ok()) << words.status();
  return words.ok() ? *std::move(words) : std::vector<uint32_t>();
}

absl::StatusOr<KernelReflection> ReflectGlsl(absl::string_view source) {
  absl::StatusOr<std::vector<uint32_t>> words = CompileGlsl("test", source);
  if (!words.ok()) return words.status();
  return ReflectSpirv(*words);
}

// Assembles SPIR-V text (numeric ids kept), for modules GLSL cannot express.
std::vector<uint32_t> Assemble(absl::string_view text) {
  spvtools::SpirvTools tools(SPV_ENV_UNIVERSAL_1_5);
  std::string errors;
  tools.SetMessageConsumer([&errors](spv_message_level_t, const char*, const spv_position_t& p,
                                     const char* m) { absl::StrAppend(&errors, p.line, ": ", m, "\n"); });
  std::vector<uint32_t> words;
  EXPECT_TRUE(tools.Assemble(std::string(text), &words, SPV_TEXT_TO_BINARY_OPTION_PRESERVE_NUMERIC_IDS))
      << errors;
  return words;
}

std::string AsBytes(const std::vector<uint32_t>& words) {
  std::string bytes(words.size() * 4, '\0');
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return bytes;
}

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// A 5-word header (magic, SPIR-V 1.5, generator 0, `bound`, schema 0).
std::vector<uint32_t> Header(uint32_t bound) { return {kSpirvMagic, 0x00010500, 0, bound, 0}; }

// Tests reflection of storage and uniform buffers: sets, bindings, access
// qualifiers, kinds, minimum sizes, names and the (set, binding) order.
TEST(ReflectSpirvTest, Bindings) {
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
layout(local_size_x = 1) in;
layout(set = 1, binding = 3) buffer Fixed { float values[16]; uvec2 extra; } fixed_buf;
layout(set = 0, binding = 2) buffer Header { uint count; uint flags; vec4 items[]; } header;
layout(set = 0, binding = 1) writeonly buffer Out { float data[]; } out_buf;
layout(set = 0, binding = 0) readonly buffer In { float data[]; } in_buf;
layout(set = 1, binding = 0) uniform Params { vec4 scale; mat4 m; } params;
layout(set = 2, binding = 5) buffer Anonymous { int x; };
void main() {
  uint i = gl_GlobalInvocationID.x;
  out_buf.data[i] = in_buf.data[i] * params.scale.x + params.m[0][0];
  header.items[i] = vec4(header.count + header.flags);
  fixed_buf.values[i] = float(fixed_buf.extra.x);
  x = 1;
}
)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entry_point, "main");
  ASSERT_EQ(r->bindings.size(), 6u);
  using K = BindingKind;
  // {set, binding, kind, read_only, write_only, min_size, name}
  EXPECT_EQ(r->bindings[0], (KernelBinding{0, 0, K::kStorageBuffer, true, false, 0, "in_buf"}));
  EXPECT_EQ(r->bindings[1], (KernelBinding{0, 1, K::kStorageBuffer, false, true, 0, "out_buf"}));
  // count @0, flags @4, items[] @16: the fixed part reaches the array.
  EXPECT_EQ(r->bindings[2], (KernelBinding{0, 2, K::kStorageBuffer, false, false, 16, "header"}));
  // vec4 @0 (16 bytes) + mat4 @16 (64 bytes).
  EXPECT_EQ(r->bindings[3], (KernelBinding{1, 0, K::kUniformBuffer, true, false, 80, "params"}));
  // float[16] with stride 4 @0, uvec2 @64.
  EXPECT_EQ(r->bindings[4], (KernelBinding{1, 3, K::kStorageBuffer, false, false, 72, "fixed_buf"}));
  // An unnamed instance takes the block's name.
  EXPECT_EQ(r->bindings[5], (KernelBinding{2, 5, K::kStorageBuffer, false, false, 4, "Anonymous"}));
  EXPECT_EQ(r->push_constant_size, 0u);
  EXPECT_TRUE(r->spec_constants.empty());
}

// Tests the push-constant size for scalar, vector, matrix, array and nested
// struct layouts, including the padding std430/std140 put before members.
TEST(ReflectSpirvTest, PushConstantSizes) {
  struct Case {
    const char* block;  // members of the push-constant block
    const char* prelude = "";
    uint32_t size;
  };
  const Case cases[] = {
      {"uint a; float b; int c;", "", 12},
      {"float a; vec3 b;", "", 28},  // vec3 aligned to 16
      {"vec3 a; float b;", "", 16},  // float packs into vec3's tail
      {"float a[5]; uint n;", "", 24},
      {"vec2 v[3];", "", 24},
      {"mat4 m;", "", 64},
      {"mat3 m;", "", 48},                      // three vec3 columns with stride 16
      {"layout(row_major) mat2x3 m;", "", 24},  // three rows of vec2, stride 8
      {"mat2x3 m;", "", 32},                    // two vec3 columns, stride 16
      {"float s; Inner inner; Inner arr[2];", "struct Inner { vec2 xy; float z; };",
       56},  // inner @8 (12 bytes), arr @24 with stride 16
      {"uint a; Outer o;", "struct Inner { uint x; }; struct Outer { uint b; Inner i[3]; };",
       20},  // o @4: b @0, i @4 with stride 4 → 16 bytes
  };
  for (const Case& c : cases) {
    const std::string source =
        absl::StrCat("#version 450\nlayout(local_size_x = 1) in;\n", c.prelude,
                     "\nlayout(push_constant) uniform P { ", c.block, " } p;\nvoid main() {}\n");
    absl::StatusOr<KernelReflection> r = ReflectGlsl(source);
    ASSERT_TRUE(r.ok()) << c.block << ": " << r.status();
    EXPECT_EQ(r->push_constant_size, c.size) << c.block;
  }
  // std140 rounds array strides up to 16.
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
layout(local_size_x = 1) in;
layout(push_constant, std140) uniform P { float a[3]; float b; } p;
void main() {}
)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->push_constant_size, 52u);
}

// Tests a fixed workgroup size.
TEST(ReflectSpirvTest, FixedLocalSize) {
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
layout(local_size_x = 8, local_size_y = 4, local_size_z = 2) in;
void main() {}
)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->local_size, ElementsAre(8, 4, 2));
  EXPECT_THAT(r->local_size_spec_id, ElementsAre(std::nullopt, std::nullopt, std::nullopt));
  EXPECT_THAT(ResolveLocalSize(*r, {{0, 99}}), ElementsAre(8, 4, 2));
}

// Tests local_size_*_id: spec ids per dimension, defaults, and resolution.
TEST(ReflectSpirvTest, SpecializedLocalSize) {
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
layout(local_size_x_id = 3, local_size_y = 2, local_size_z_id = 5) in;
void main() {}
)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->local_size, ElementsAre(1, 2, 1));
  EXPECT_THAT(r->local_size_spec_id, ElementsAre(Optional(3u), std::nullopt, Optional(5u)));
  EXPECT_THAT(ResolveLocalSize(*r, {}), ElementsAre(1, 2, 1));
  EXPECT_THAT(ResolveLocalSize(*r, {{3, 64}, {5, 4}, {7, 9}}), ElementsAre(64, 2, 4));
  ASSERT_EQ(r->spec_constants.size(), 2u);
  EXPECT_EQ(r->spec_constants[0].id, 3u);
  EXPECT_EQ(r->spec_constants[0].type, SpecConstantType::kUint32);
  EXPECT_EQ(r->spec_constants[0].default_bits, 1u);
  EXPECT_EQ(r->spec_constants[1].id, 5u);
}

// Tests a workgroup size given by the LocalSizeId execution mode.
TEST(ReflectSpirvTest, LocalSizeIdExecutionMode) {
  absl::StatusOr<KernelReflection> r = ReflectSpirv(Assemble(R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %1 "entry"
OpExecutionModeId %1 LocalSizeId %10 %11 %12
OpName %10 "wg_x"
OpDecorate %10 SpecId 7
%2 = OpTypeVoid
%3 = OpTypeFunction %2
%4 = OpTypeInt 32 0
%10 = OpSpecConstant %4 32
%11 = OpConstant %4 4
%12 = OpConstant %4 1
%1 = OpFunction %2 None %3
%5 = OpLabel
OpReturn
OpFunctionEnd
)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entry_point, "entry");
  EXPECT_THAT(r->local_size, ElementsAre(32, 4, 1));
  EXPECT_THAT(r->local_size_spec_id, ElementsAre(Optional(7u), std::nullopt, std::nullopt));
  EXPECT_THAT(r->spec_constants, ElementsAre(SpecConstant{7, SpecConstantType::kUint32, 32, "wg_x"}));
}

// Tests specialization constants of every supported type, with defaults and
// names, sorted by id.
TEST(ReflectSpirvTest, SpecConstants) {
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
layout(local_size_x = 1) in;
layout(constant_id = 7) const uint kMask = 0xF0u;
layout(constant_id = 0) const bool kFlag = true;
layout(constant_id = 4) const float kScale = 1.5;
layout(constant_id = 1) const int kCount = -7;
layout(constant_id = 2) const bool kOff = false;
layout(set = 0, binding = 0) buffer Out { float v[]; };
void main() { v[0] = kFlag && !kOff ? kScale * float(kCount) : float(kMask); }
)");
  ASSERT_TRUE(r.ok()) << r.status();
  using T = SpecConstantType;
  EXPECT_THAT(r->spec_constants, ElementsAre(SpecConstant{0, T::kBool, 1, "kFlag"},
                                             SpecConstant{1, T::kInt32, 0xFFFFFFF9u, "kCount"},
                                             SpecConstant{2, T::kBool, 0, "kOff"},
                                             SpecConstant{4, T::kFloat32, FloatBits(1.5f), "kScale"},
                                             SpecConstant{7, T::kUint32, 0xF0, "kMask"}));
}

// Tests that the Workgroup (shared) variables are reflected as terms of
// fixed bytes and bytes per specialization constant, merged by constant,
// and resolved with the defaults or the values given.
TEST(ReflectSpirvTest, SharedMemory) {
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
layout(local_size_x = 16) in;
layout(constant_id = 3) const uint kRows = 8;
layout(constant_id = 5) const uint kCols = 2;
struct Pair { float a; uint b; };
shared float tile[32];
shared vec4 quads[4];
shared Pair pairs[kRows];
shared mat2 m[kRows][kCols];
shared double d[kRows];
layout(set = 0, binding = 0) buffer Out { float v[]; };
void main() {
  tile[gl_LocalInvocationIndex] = 1.0;
  quads[0] = vec4(1.0);
  pairs[0].a = 2.0;
  m[0][0] = mat2(1.0);
  d[0] = 1.0;
  barrier();
  v[gl_LocalInvocationIndex] = tile[0] + quads[0].x + pairs[0].a + m[0][0][0][0] + float(d[0]);
}
)");
  ASSERT_TRUE(r.ok()) << r.status();
  // 32 floats and 4 vec4 (192 bytes); 8 (float, uint) pairs and 8 doubles
  // per kRows (16 bytes); a 16-byte mat2 per kRows x kCols.
  EXPECT_THAT(r->shared_memory, ElementsAre(SharedMemoryTerm{192, {}}, SharedMemoryTerm{16, {3}},
                                            SharedMemoryTerm{16, {3, 5}}));
  EXPECT_EQ(ResolveSharedMemory(*r, {}), 192u + 16 * 8 + 16 * 8 * 2);
  EXPECT_EQ(ResolveSharedMemory(*r, {{3, 100}}), 192u + 16 * 100 + 16 * 100 * 2);
  EXPECT_EQ(ResolveSharedMemory(*r, {{3, 4}, {5, 10}}), 192u + 16 * 4 + 16 * 4 * 10);
  EXPECT_EQ(ResolveSharedMemory(*r, {{3, 0xFFFFFFFFu}, {5, 1}}), 192u + 2 * 16 * 0xFFFFFFFFull);
  // 16 (2^32 - 1)^2 bytes do not fit in 64 bits: beyond every device.
  EXPECT_EQ(ResolveSharedMemory(*r, {{3, 0xFFFFFFFFu}, {5, 0xFFFFFFFFu}}), UINT64_MAX);

  absl::StatusOr<KernelReflection> none = ReflectGlsl(kScaleGlsl);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->shared_memory.empty());
}

// Tests that a 64-bit specialization constant is refused as unsupported.
TEST(ReflectSpirvTest, WideSpecConstantIsUnimplemented) {
  absl::StatusOr<KernelReflection> r = ReflectGlsl(R"(#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 1) in;
layout(constant_id = 3) const uint64_t kBig = 5;
layout(set = 0, binding = 0) buffer Out { uint64_t v[]; };
void main() { v[0] = kBig; }
)");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(r.status().message(), HasSubstr("SpecId 3"));
  EXPECT_THAT(r.status().message(), HasSubstr("64-bit"));
}

// Tests that images and descriptor arrays are refused as unsupported.
TEST(ReflectSpirvTest, UnsupportedBindingsAreUnimplemented) {
  absl::StatusOr<KernelReflection> image = ReflectGlsl(R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 4, r32f) uniform image2D img;
void main() { imageStore(img, ivec2(0), vec4(1)); }
)");
  EXPECT_EQ(image.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(image.status().message(), HasSubstr("binding 4"));

  absl::StatusOr<KernelReflection> array = ReflectGlsl(R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float x[]; } bufs[2];
void main() { bufs[1].x[0] = 1.0; }
)");
  EXPECT_EQ(array.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(array.status().message(), HasSubstr("descriptor arrays"));
}

// Tests that a module must have exactly one GLCompute entry point.
TEST(ReflectSpirvTest, RequiresExactlyOneComputeEntryPoint) {
  absl::StatusOr<KernelReflection> none = ReflectSpirv(Assemble(R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint Fragment %1 "frag"
OpExecutionMode %1 OriginUpperLeft
%2 = OpTypeVoid
%3 = OpTypeFunction %2
%1 = OpFunction %2 None %3
%4 = OpLabel
OpReturn
OpFunctionEnd
)"));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("no GLCompute entry point"));

  absl::StatusOr<KernelReflection> two = ReflectSpirv(Assemble(R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %1 "a"
OpEntryPoint GLCompute %5 "b"
OpExecutionMode %1 LocalSize 1 1 1
OpExecutionMode %5 LocalSize 1 1 1
%2 = OpTypeVoid
%3 = OpTypeFunction %2
%1 = OpFunction %2 None %3
%4 = OpLabel
OpReturn
OpFunctionEnd
%5 = OpFunction %2 None %3
%6 = OpLabel
OpReturn
OpFunctionEnd
)"));
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two.status().message(), HasSubstr("2 GLCompute entry points ('a', 'b')"));
}

// Tests that type nesting deeper than the limit is refused, not recursed
// into without bound, and that a struct containing itself is refused.
TEST(ReflectSpirvTest, DeepAndCyclicTypesAreRefused) {
  std::string text = R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %1 "main"
OpExecutionMode %1 LocalSize 1 1 1
OpDecorate %100 Block
%2 = OpTypeVoid
%3 = OpTypeFunction %2
%4 = OpTypeInt 32 0
)";
  // %100 = struct{%101}, %101 = struct{%102}, ..., %1099 = struct{uint}.
  constexpr int kDepth = 1000;
  for (int i = 0; i < kDepth; ++i) {
    absl::StrAppend(&text, "OpMemberDecorate %", 100 + i, " 0 Offset 0\n");
  }
  absl::StrAppend(&text, "%", 100 + kDepth - 1, " = OpTypeStruct %4\n");
  for (int i = kDepth - 2; i >= 0; --i) {
    absl::StrAppend(&text, "%", 100 + i, " = OpTypeStruct %", 101 + i, "\n");
  }
  absl::StrAppend(&text, R"(
%5 = OpTypePointer PushConstant %100
%6 = OpVariable %5 PushConstant
%1 = OpFunction %2 None %3
%7 = OpLabel
OpReturn
OpFunctionEnd
)");
  absl::StatusOr<KernelReflection> deep = ReflectSpirv(Assemble(text));
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(deep.status().message(), HasSubstr("nested more than 256"));

  absl::StatusOr<KernelReflection> cyclic = ReflectSpirv(Assemble(R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %1 "main"
OpExecutionMode %1 LocalSize 1 1 1
OpMemberDecorate %10 0 Offset 0
OpMemberDecorate %10 1 Offset 4
%2 = OpTypeVoid
%3 = OpTypeFunction %2
%4 = OpTypeInt 32 0
%10 = OpTypeStruct %4 %10
%5 = OpTypePointer PushConstant %10
%6 = OpVariable %5 PushConstant
%1 = OpFunction %2 None %3
%7 = OpLabel
OpReturn
OpFunctionEnd
)"));
  EXPECT_EQ(cyclic.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cyclic.status().message(), HasSubstr("contains itself"));
}

// Tests the parser alone on hand-made words: a zero word count, an
// instruction running past the end, an unterminated string, out-of-bound and
// duplicate result ids, absurd id bounds, and a module ending mid-function.
TEST(ReflectSpirvTest, MalformedWordsGiveErrors) {
  auto expect_error = [](std::vector<uint32_t> words, absl::string_view text) {
    absl::StatusOr<KernelReflection> r = ReflectSpirv(words);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(r.status().message(), HasSubstr(text));
  };
  std::vector<uint32_t> words = Header(10);
  words.push_back(0u << 16 | 5);  // OpName with word count 0
  expect_error(words,
               "malformed SPIR-V at word 5: instruction with opcode 5 "
               "has a word count of 0");

  words = Header(10);
  words.push_back(10u << 16 | 5);  // OpName claiming 10 words
  words.push_back(1);
  expect_error(words, "has 10 words but only 2 remain");

  words = Header(10);
  words.push_back(0xFFFFu << 16 | 17);  // the largest possible word count
  expect_error(words, "has 65535 words but only 1 remain");

  words = Header(10);
  words.insert(words.end(), {3u << 16 | 5, 1, 0x41414141});  // OpName, no NUL
  expect_error(words, "not NUL-terminated");

  words = Header(10);
  words.insert(words.end(), {2u << 16 | 19, 10});  // OpTypeVoid %10, bound 10
  expect_error(words, "result id %10 is outside the header's bound 10");

  words = Header(10);
  words.insert(words.end(), {2u << 16 | 19, 3, 2u << 16 | 20, 3});
  expect_error(words, "id %3 is defined twice");

  words = Header(10);
  words.insert(words.end(), {1u << 16 | 21});  // OpTypeInt without operands
  expect_error(words, "has 0 operands, expected at least 3");

  words = Header(10);
  words.insert(words.end(), {3u << 16 | 71, 4, 33});  // Binding without value
  expect_error(words, "has no value");

  words = Header(10);
  words.insert(words.end(), {5u << 16 | 54, 1, 2, 0, 3});  // OpFunction, no end
  expect_error(words, "ends inside function %2");

  expect_error(Header(0xFFFFFFFF), "id bound of 4294967295");
  expect_error(Header(0), "id bound of 0");
  expect_error(Header(10), "no GLCompute entry point");
}

// Tests FromSpirv's and FromSpirvBytes's checks of size and magic.
TEST(KernelTest, RejectsNonSpirv) {
  auto from_bytes = [](absl::string_view bytes) { return Kernel::FromSpirvBytes("x", bytes).status(); };
  absl::Status s = from_bytes("");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "kernel 'x': empty SPIR-V module: 0 bytes");

  s = Kernel::FromSpirv("x", {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "kernel 'x': empty SPIR-V module: 0 words");

  s = from_bytes("\x03\x02\x23");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "kernel 'x': truncated SPIR-V: 3 bytes is not a whole number of "
            "words");

  s =
      from_bytes(absl::string_view("\x7f"
                                   "ELF\x02\x01\x01\x00",
                                   8));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "kernel 'x': not SPIR-V: magic 0x464c457f (expected 0x07230203)");

  s = Kernel::FromSpirv("x", {kSpirvMagic, 0x00010500}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("2 words are shorter than the 5-word header"));

  std::vector<uint32_t> swapped = MustCompile(kScaleGlsl);
  for (uint32_t& w : swapped) w = __builtin_bswap32(w);
  s = from_bytes(AsBytes(swapped));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kernel 'x': SPIR-V in the wrong byte order: "
                                     "magic 0x03022307"));
}

// Tests that random bytes, with and without a valid header, always give an
// error from both Kernel (validator first) and the parser alone.
TEST(KernelTest, RandomBytesGiveErrors) {
  std::mt19937 rng(1234);
  for (int iteration = 0; iteration < 3000; ++iteration) {
    const size_t size = std::uniform_int_distribution<size_t>(0, 200)(rng);
    std::vector<uint32_t> words(size);
    for (uint32_t& w : words) w = rng();
    const int variant = iteration % 3;
    if (variant >= 1 && size >= 5) {
      // A plausible header, so the instruction stream is reached.
      words[0] = kSpirvMagic;
      words[1] = 0x00010500;
      words[3] = 1 + rng() % 1000;
    }
    if (variant == 2) {
      // Small opcodes and word counts, to reach the per-opcode handling.
      for (size_t i = 5; i < words.size(); ++i) {
        if (rng() % 2 == 0)
          words[i] = (1 + rng() % 6) << 16 | rng() % 80;
        else
          words[i] %= 64;
      }
    }
    absl::Status from_spirv = Kernel::FromSpirv("random", words).status();
    EXPECT_FALSE(from_spirv.ok());
    EXPECT_THAT(from_spirv.message(), HasSubstr("kernel 'random': "));
    absl::StatusOr<KernelReflection> reflected = ReflectSpirv(words);
    EXPECT_FALSE(reflected.ok());
    EXPECT_FALSE(reflected.status().message().empty());
  }
}

// Tests that randomly mutated valid modules (flipped bits, small values,
// rewritten word counts, cuts) either reflect to bindings that are sorted and
// unique or give an error with a message; never anything else.
TEST(KernelTest, MutatedModulesGiveErrorsOrSaneReflections) {
  const std::vector<uint32_t> base = MustCompile(R"(#version 450
layout(local_size_x_id = 3, local_size_y = 2) in;
struct Inner { vec2 xy; float z; mat3 m; };
layout(constant_id = 1) const int kCount = -7;
layout(constant_id = 4) const float kScale = 1.5;
layout(set = 1, binding = 3) buffer Fixed { float values[16]; uvec2 extra; Inner items[2]; } fixed_buf;
layout(set = 0, binding = 2) buffer Header { uint count; vec4 items[]; } header;
layout(set = 1, binding = 0) uniform Params { vec4 scale; layout(row_major) mat4 m; } params;
layout(push_constant) uniform P { float s; Inner inner; Inner arr[2]; } p;
void main() {
  header.items[gl_GlobalInvocationID.x] = vec4(header.count) * kScale * float(kCount) + params.scale + p.s;
  fixed_buf.values[0] = float(fixed_buf.extra.x) + fixed_buf.items[1].z;
}
)");
  ASSERT_GT(base.size(), 5u);
  std::mt19937 rng(99);
  int reflected = 0;
  for (int iteration = 0; iteration < 5000; ++iteration) {
    std::vector<uint32_t> words = base;
    const int mutations = 1 + rng() % 4;
    for (int m = 0; m < mutations && words.size() > 5; ++m) {
      const size_t at = 5 + rng() % (words.size() - 5);
      switch (rng() % 5) {
        case 0:
          words[at] ^= 1u << (rng() % 32);
          break;
        case 1:
          words[at] = rng() % 64;
          break;
        case 2:
          words[at] = rng();
          break;
        case 3:
          words[at] = (words[at] & 0xFFFF) | (rng() % 8) << 16;
          break;
        case 4:
          words.resize(at);
          break;
      }
    }
    absl::StatusOr<KernelReflection> r = ReflectSpirv(words);
    if (r.ok()) {
      ++reflected;
      for (size_t i = 1; i < r->bindings.size(); ++i) {
        EXPECT_LT(std::tie(r->bindings[i - 1].set, r->bindings[i - 1].binding),
                  std::tie(r->bindings[i].set, r->bindings[i].binding));
      }
    } else {
      EXPECT_FALSE(r.status().message().empty());
    }
    if (iteration % 10 == 0) {
      absl::StatusOr<std::shared_ptr<const Kernel>> k = Kernel::FromSpirv("m", words);
      if (!k.ok()) {
        EXPECT_THAT(k.status().message(), HasSubstr("kernel 'm': "));
      }
    }
  }
  // Mutations inside function bodies leave the interface intact.
  EXPECT_GT(reflected, 0);
}

// Tests that a valid module cut at every word boundary gives an error, both
// through Kernel and from the parser alone.
TEST(KernelTest, TruncatedModulesGiveErrors) {
  const std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  ASSERT_GT(words.size(), 5u);
  for (size_t n = 0; n < words.size(); ++n) {
    absl::Span<const uint32_t> prefix = absl::MakeConstSpan(words).first(n);
    absl::Status s = Kernel::FromSpirv("cut", prefix).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(s.message(), HasSubstr("kernel 'cut': ")) << n;
    absl::StatusOr<KernelReflection> r = ReflectSpirv(prefix);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << n << " of " << words.size() << " words";
  }
  EXPECT_TRUE(Kernel::FromSpirv("whole", words).ok());
}

// Tests that an absurd id bound in an otherwise valid module is refused.
TEST(KernelTest, AbsurdIdBoundIsRefused) {
  std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  words[3] = 0xFFFFFFFF;
  absl::Status s = Kernel::FromSpirv("bound", words).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kernel 'bound': SPIR-V validation failed"));
  absl::StatusOr<KernelReflection> r = ReflectSpirv(words);
  EXPECT_THAT(r.status().message(), HasSubstr("id bound of 4294967295"));
}

// Tests ValidateSpirv: valid modules pass, and errors carry the validator's
// message, including a target environment too old for the module.
TEST(ValidateSpirvTest, ReportsValidatorMessages) {
  const std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  EXPECT_TRUE(ValidateSpirv(words).ok());
  EXPECT_TRUE(ValidateSpirv(words, SPV_ENV_VULKAN_1_3).ok());

  absl::Status old_env = ValidateSpirv(words, SPV_ENV_VULKAN_1_0);
  EXPECT_EQ(old_env.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(old_env.message(), HasSubstr("version 1.5"));

  // A storage buffer without DescriptorSet/Binding breaks a Vulkan rule.
  absl::Status unbound = ValidateSpirv(Assemble(R"(
OpCapability Shader
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %1 "main" %6
OpExecutionMode %1 LocalSize 1 1 1
OpDecorate %10 Block
OpMemberDecorate %10 0 Offset 0
%2 = OpTypeVoid
%3 = OpTypeFunction %2
%4 = OpTypeInt 32 0
%10 = OpTypeStruct %4
%5 = OpTypePointer StorageBuffer %10
%6 = OpVariable %5 StorageBuffer
%1 = OpFunction %2 None %3
%7 = OpLabel
%8 = OpLoad %10 %6
OpReturn
OpFunctionEnd
)"));
  EXPECT_EQ(unbound.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unbound.message(), HasSubstr("SPIR-V validation failed"));
  EXPECT_THAT(unbound.message(), HasSubstr("DescriptorSet"));

  EXPECT_EQ(ValidateSpirv({}).code(), absl::StatusCode::kInvalidArgument);
}

// Tests that a GLSL syntax error is InvalidArgument naming the source and the
// line, and that defines do not shift line numbers.
TEST(CompileGlslTest, SyntaxErrorNamesLine) {
  constexpr absl::string_view kBad = R"(#version 450
layout(local_size_x = 1) in;
void main() {
  float x = 1.0 +;
}
)";
  absl::StatusOr<std::vector<uint32_t>> words = CompileGlsl("bad.comp", kBad);
  EXPECT_EQ(words.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(words.status().message(), HasSubstr("bad.comp:4:"));

  words = CompileGlsl("bad.comp", kBad, {{"A", "1"}, {"B", "2"}});
  EXPECT_EQ(words.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(words.status().message(), HasSubstr("bad.comp:4:"));

  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = Kernel::FromGlsl("undeclared", R"(#version 450
layout(local_size_x = 1) in;

void main() { y = 2; }
)");
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(kernel.status().message(), HasSubstr("undeclared:4:"));
  EXPECT_THAT(kernel.status().message(), HasSubstr("'y'"));
}

// Tests that defines reach the source, and that malformed ones are refused.
TEST(CompileGlslTest, Defines) {
  constexpr absl::string_view kSource = R"(#version 450
layout(local_size_x = WG_X, local_size_y = WG_Y) in;
void main() {}
)";
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel =
      Kernel::FromGlsl("defined", kSource, {{"WG_X", "32"}, {"WG_Y", "(2 * 3)"}});
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_THAT((*kernel)->reflection().local_size, ElementsAre(32, 6, 1));

  absl::Status s = CompileGlsl("d", kSource, {{"1X", "3"}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'1X' is not an identifier"));

  s = CompileGlsl("d", kSource, {{"WG_X", "1\n#error injected"}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than one line"));
}

// Tests that concurrent compilations on many threads all succeed.
TEST(CompileGlslTest, ConcurrentCompilation) {
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<std::shared_ptr<const Kernel>>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &results] {
      results[t] = Kernel::FromGlsl(absl::StrCat("k", t), kScaleGlsl, {{"UNUSED", absl::StrCat(t)}});
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << results[t].status();
    EXPECT_THAT((*results[t])->reflection().local_size, ElementsAre(64, 1, 1));
  }
}

// Tests that FromGlsl gives a kernel whose accessors describe it.
TEST(KernelTest, FromGlsl) {
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = Kernel::FromGlsl("scale", kScaleGlsl);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  const Kernel& k = **kernel;
  EXPECT_EQ(k.name(), "scale");
  EXPECT_EQ(k.spirv()[0], kSpirvMagic);
  EXPECT_EQ(k.reflection().push_constant_size, 4u);
  EXPECT_THAT(k.reflection().bindings,
              ElementsAre(KernelBinding{0, 0, BindingKind::kStorageBuffer, false, false, 0, "data"}));
}

// Tests that FromFile on a missing path is NotFound naming the path.
TEST(KernelTest, FromFileMissing) {
  const std::string path = ::testing::TempDir() + "/no_such_kernel.spv";
  absl::Status s = Kernel::FromFile(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

// Tests that FromFile loads a .spv written to disk, named by the file stem.
TEST(KernelTest, FromFileLoadsSpv) {
  const std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  const std::string path = ::testing::TempDir() + "/kernel_test_scale.spv";
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(words.data(), 4, words.size(), f), words.size());
    std::fclose(f);
  }
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = Kernel::FromFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->name(), "kernel_test_scale");
  EXPECT_THAT((*kernel)->spirv(), ::testing::ElementsAreArray(words));
  EXPECT_THAT((*kernel)->reflection().local_size, ElementsAre(64, 1, 1));
}

// Tests that a file that is not SPIR-V is refused with the kernel's name.
TEST(KernelTest, FromFileRejectsGarbage) {
  const std::string path = ::testing::TempDir() + "/kernel_test_garbage.spv";
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("hello, world", f);
    std::fclose(f);
  }
  absl::Status s = Kernel::FromFile(path).status();
  std::remove(path.c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("kernel 'kernel_test_garbage': not SPIR-V"));
}

// Tests that FromFile refuses a directory and an empty file with errors that
// say so.
TEST(KernelTest, FromFileRejectsDirectoryAndEmptyFile) {
  absl::Status s = Kernel::FromFile(::testing::TempDir()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not a regular file"));

  const std::string path = ::testing::TempDir() + "/kernel_test_empty.spv";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  s = Kernel::FromFile(path).status();
  std::remove(path.c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "kernel 'kernel_test_empty': empty SPIR-V module: 0 bytes");
}

// Tests that a kernel's identity is SHA-256 of its bytes (so stable across
// runs), equal for equal words whatever the name, and different for other
// words.
TEST(KernelTest, IdentityIsTheSha256OfTheModule) {
  const std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  auto a = Kernel::FromSpirv("a", words);
  auto b = Kernel::FromSpirvBytes("b", AsBytes(words));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->sha256(), (*b)->sha256());
  EXPECT_EQ((*a)->sha256(), Sha256(AsBytes(words)));
  // SHA-256 of "abc" (FIPS 180-2, appendix B.1).
  EXPECT_EQ(Sha256("abc"), (Kernel::Digest{0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                           0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                           0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad}));

  std::string other_source(kScaleGlsl);
  other_source.replace(other_source.find("64"), 2, "32");
  auto c = Kernel::FromGlsl("a", other_source);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE((*a)->sha256(), (*c)->sha256());
}

}  // namespace
}  // namespace causeway
