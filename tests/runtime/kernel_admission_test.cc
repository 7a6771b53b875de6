#include "causeway/runtime/kernel_admission.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <spirv-tools/libspirv.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/device.h"
#include "causeway/runtime/kernel.h"
#include "causeway/runtime/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::kPointerKernelGlsl;
using ::causeway::testing::MakeRuntime;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::string_view kScaleGlsl = R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Data { float values[]; };
layout(push_constant) uniform Params { float factor; };
void main() { values[gl_GlobalInvocationID.x] *= factor; }
)";

std::vector<uint32_t> MustCompile(absl::string_view source) {
  absl::StatusOr<std::vector<uint32_t>> words = CompileGlsl("test", source);
  EXPECT_TRUE(words.ok()) << words.status();
  return words.ok() ? *std::move(words) : std::vector<uint32_t>();
}

// An empty compute module with `declarations` (capabilities, extensions)
// after its Shader capability, assembled from SPIR-V text.
std::vector<uint32_t> EmptyModuleWith(absl::string_view declarations) {
  const std::string text = absl::StrCat("OpCapability Shader\n", declarations, R"(
OpMemoryModel Logical GLSL450
OpEntryPoint GLCompute %main "main"
OpExecutionMode %main LocalSize 1 1 1
%void = OpTypeVoid
%fn = OpTypeFunction %void
%main = OpFunction %void None %fn
%entry = OpLabel
OpReturn
OpFunctionEnd
)");
  spvtools::SpirvTools tools(SPV_ENV_UNIVERSAL_1_5);
  std::vector<uint32_t> words;
  EXPECT_TRUE(tools.Assemble(text, &words)) << text;
  return words;
}

// Tests that a buffer_reference kernel is refused at admission, naming the
// capability, the addressing model, the storage class and the conversion, once
// each.
TEST(AdmitSpirvTest, PhysicalStorageBufferPointersAreRefused) {
  absl::StatusOr<std::vector<uint32_t>> admitted = AdmitSpirv(MustCompile(kPointerKernelGlsl));
  EXPECT_EQ(admitted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      admitted.status().message(),
      HasSubstr("capability PhysicalStorageBufferAddresses, addressing model PhysicalStorageBuffer64, "
                "storage class PhysicalStorageBuffer and OpConvertUToPtr are refused: pointers reach "
                "memory outside the kernel's bound buffers"));
}

// Tests that Kernel creation refuses the pointer kernel with InvalidArgument
// naming the kernel and the capability, from GLSL and from SPIR-V bytes.
TEST(AdmitSpirvTest, KernelCreationRefusesPointers) {
  absl::Status from_glsl = Kernel::FromGlsl("peek", kPointerKernelGlsl).status();
  EXPECT_EQ(from_glsl.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(from_glsl.message(),
              AllOf(HasSubstr("kernel 'peek'"), HasSubstr("PhysicalStorageBufferAddresses")));
  const std::vector<uint32_t> words = MustCompile(kPointerKernelGlsl);
  std::string bytes(words.size() * 4, '\0');
  std::memcpy(bytes.data(), words.data(), bytes.size());
  absl::Status from_bytes = Kernel::FromSpirvBytes("peek", bytes).status();
  EXPECT_EQ(from_bytes.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(from_bytes.message(), HasSubstr("PhysicalStorageBufferAddresses"));
}

// Tests that the pointer extensions and variable pointers are refused by
// name, even in a module that declares nothing else of them.
TEST(AdmitSpirvTest, PointerExtensionsAndVariablePointersAreRefused) {
  for (absl::string_view extension :
       {"SPV_KHR_physical_storage_buffer", "SPV_EXT_physical_storage_buffer", "SPV_KHR_variable_pointers"}) {
    SCOPED_TRACE(extension);
    const std::vector<uint32_t> words = EmptyModuleWith(absl::StrCat("OpExtension \"", extension, "\"\n"));
    absl::StatusOr<std::vector<uint32_t>> admitted = AdmitSpirv(words);
    EXPECT_EQ(admitted.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(admitted.status().message(), HasSubstr(absl::StrCat("extension ", extension, " is refused")));
  }
  const std::vector<uint32_t> variable = EmptyModuleWith("OpCapability VariablePointers\n");
  absl::StatusOr<std::vector<uint32_t>> admitted = AdmitSpirv(variable);
  EXPECT_EQ(admitted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(admitted.status().message(), HasSubstr("capability VariablePointers is refused"));
}

// Tests that an ordinary kernel, and one using subgroup arithmetic, are
// admitted with the capabilities they declare.
TEST(AdmitSpirvTest, OrdinaryKernelsAreAdmitted) {
  absl::StatusOr<std::vector<uint32_t>> scale = AdmitSpirv(MustCompile(kScaleGlsl));
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_THAT(*scale, ElementsAre(1u));  // Shader
  absl::StatusOr<std::vector<uint32_t>> subgroup = AdmitSpirv(MustCompile(R"(#version 450
#extension GL_KHR_shader_subgroup_arithmetic : require
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer Data { float v[]; };
void main() { v[gl_GlobalInvocationID.x] = subgroupAdd(v[gl_GlobalInvocationID.x]); }
)"));
  ASSERT_TRUE(subgroup.ok()) << subgroup.status();
  EXPECT_THAT(*subgroup, ElementsAre(1u, 61u, 63u));  // Shader, GroupNonUniform, GroupNonUniformArithmetic
}

// Tests that a capability the device has not enabled is refused naming the
// capability and the feature it needs.
TEST(CheckKernelCapabilitiesTest, NeedsTheDeviceFeature) {
  KernelDeviceFeatures none;
  EXPECT_OK(CheckKernelCapabilities({1u}, none));
  absl::Status int64 = CheckKernelCapabilities({1u, 11u}, none);
  EXPECT_EQ(int64.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(int64.message(), HasSubstr("capability Int64 needs the device feature shaderInt64"));
  absl::Status arithmetic =
      CheckKernelCapabilities({61u, 63u}, KernelDeviceFeatures{.subgroup_operations = 1});
  EXPECT_THAT(arithmetic.message(), HasSubstr("GroupNonUniformArithmetic needs the device feature subgroup"));
  KernelDeviceFeatures all{.shader_int64 = true, .subgroup_operations = kSubgroupBasic | kSubgroupArithmetic};
  EXPECT_OK(CheckKernelCapabilities({1u, 11u, 61u, 63u}, all));
  EXPECT_THAT(CheckKernelCapabilities({5347u}, all).message(), HasSubstr("refused"));
}

// --- on a device ---------------------------------------------------------------

// Tests that devices turn on robustBufferAccess (and robustBufferAccess2)
// wherever the physical device offers them, and say so.
TEST(DeviceAdmissionTest, RobustAccessIsOnWhereOffered) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  const Device& device = rt->accelerator(0)->device();
  EXPECT_EQ(device.robust_buffer_access(), device.info().robust_buffer_access);
  EXPECT_EQ(device.robust_buffer_access2(), device.info().robust_buffer_access2);
  // lavapipe offers both.
  EXPECT_TRUE(device.robust_buffer_access());
  EXPECT_THAT(RobustAccessSummary(device.info()), HasSubstr("robustBufferAccess on"));
}

// Tests that an admitted kernel still runs, with the right results.
TEST(DeviceAdmissionTest, AdmittedKernelRuns) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  ASSERT_OK_AND_ASSIGN(auto kernel, Kernel::FromGlsl("scale", kScaleGlsl));
  std::vector<float> values(64);
  for (int i = 0; i < 64; ++i) values[i] = static_cast<float>(i);
  ASSERT_OK_AND_ASSIGN(auto buffer, acc->CreateBuffer(values.size() * sizeof(float)));
  ASSERT_OK(acc->UploadSync(buffer, values.data(), values.size() * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("admission_test"));
  ASSERT_OK(list->Dispatch(kernel, {buffer}, 3.0f, {1, 1, 1}));
  ASSERT_OK(acc->Submit(list).Await());
  std::vector<float> got(64);
  ASSERT_OK(acc->DownloadSync(buffer, got.data(), got.size() * sizeof(float)));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], 3.0f * i) << i;
}

// Tests that a kernel declaring a capability whose feature the device did not
// enable (Int8: shaderInt8 is never enabled) is refused when its pipeline is
// built, naming the kernel, the capability and the feature.
TEST(DeviceAdmissionTest, CapabilityWithoutItsFeatureIsRefusedAtPipelineCreation) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto kernel, Kernel::FromGlsl("bytes", R"(#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Data { uint v[]; };
void main() { int8_t x = int8_t(v[0]); v[0] = uint(x * int8_t(3)); }
)"));
  absl::Status s = rt->accelerator(0)->device().GetPipeline(kernel).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("kernel 'bytes'"), HasSubstr("capability Int8 needs the device feature "
                                                           "shaderInt8")));
}

// Tests that the pipeline key covers every word of the module and every
// specialization value: changing any one word or value gives another key,
// and the key is SHA-256 of the documented serialization.
TEST(PipelineKeyTest, CoversTheWholeModuleAndTheSpecValues) {
  const std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  auto key_of = [](const std::vector<uint32_t>& module,
                   const SpecValues& spec) -> absl::StatusOr<PipelineKey> {
    CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, Kernel::FromSpirv("k", module));
    return MakePipelineKey(kernel->sha256(), spec);
  };
  ASSERT_OK_AND_ASSIGN(const PipelineKey key, key_of(words, {}));
  // Every word the module's validation leaves free to change (an instruction
  // changed elsewhere may no longer be valid SPIR-V: then it is no kernel).
  int compared = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    std::vector<uint32_t> changed = words;
    changed[i] ^= 1u << (i % 32);
    absl::StatusOr<PipelineKey> other = key_of(changed, {});
    if (!other.ok()) continue;
    ++compared;
    ASSERT_NE(*other, key) << "word " << i;
  }
  EXPECT_GT(compared, 0);
  const Kernel::Digest digest =
      Sha256(absl::string_view(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(uint32_t)));
  EXPECT_EQ(MakePipelineKey(digest, {}), key);
  EXPECT_NE(MakePipelineKey(digest, {{0, 0}}), key);
  EXPECT_NE(MakePipelineKey(digest, {{0, 1}}), MakePipelineKey(digest, {{0, 2}}));
  EXPECT_NE(MakePipelineKey(digest, {{0, 1}}), MakePipelineKey(digest, {{1, 1}}));
  EXPECT_NE(MakePipelineKey(digest, {{0, 1}, {1, 1}}), MakePipelineKey(digest, {{0, 1}}));

  std::string serialized(digest.begin(), digest.end());
  auto append = [&serialized](uint32_t w) { serialized.append(reinterpret_cast<const char*>(&w), 4); };
  append(1);
  append(3);
  append(0x40400000);
  EXPECT_EQ(MakePipelineKey(digest, {{3, 0x40400000}}), Sha256(serialized));
}

// Tests that two different modules never share a pipeline on one device,
// and that one module with other values gets another.
TEST(PipelineKeyTest, DifferentModulesGetDifferentPipelines) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Device& device = rt->accelerator(0)->device();
  std::string other(kScaleGlsl);
  other.replace(other.find("*= factor"), 9, "+= factor");
  ASSERT_OK_AND_ASSIGN(auto a, Kernel::FromGlsl("same-name", kScaleGlsl));
  ASSERT_OK_AND_ASSIGN(auto b, Kernel::FromGlsl("same-name", other));
  ASSERT_OK_AND_ASSIGN(const Pipeline* pa, device.GetPipeline(a));
  ASSERT_OK_AND_ASSIGN(const Pipeline* pb, device.GetPipeline(b));
  EXPECT_NE(pa, pb);
  EXPECT_EQ(pa->kernel, a);
  EXPECT_EQ(pb->kernel, b);
  EXPECT_NE(a->sha256(), b->sha256());
}

// Tests that a kernel asking for more workgroup (shared) memory than the
// device allows is refused before a pipeline is made, whether its size is
// fixed or set by a specialization constant, and that one within the limit
// runs with the right results. lavapipe built the pipeline and gave every
// thread the memory asked (Vulkan leaves it undefined).
TEST(DeviceAdmissionTest, SharedMemoryBeyondTheDeviceIsRefused) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint32_t limit = acc->info().limits.maxComputeSharedMemorySize;
  ASSERT_OK_AND_ASSIGN(auto fixed, Kernel::FromGlsl("big-shared", R"(#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer Data { float v[]; };
shared float s[4194304];
void main() {
  s[gl_LocalInvocationID.x] = 1.0;
  barrier();
  v[gl_LocalInvocationID.x] = s[63 - gl_LocalInvocationID.x];
}
)"));
  absl::Status s = acc->device().GetPipeline(fixed).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("kernel 'big-shared': 16777216 bytes of workgroup (shared) memory"),
                    HasSubstr(absl::StrCat("allows at most ", limit))));

  // Reverses each group of n floats through shared memory.
  ASSERT_OK_AND_ASSIGN(auto sized, Kernel::FromGlsl("reverse", R"(#version 450
layout(local_size_x = 64) in;
layout(constant_id = 1) const uint n = 64;
layout(set = 0, binding = 0) buffer Data { float v[]; };
shared float s[n];
void main() {
  s[gl_LocalInvocationID.x] = v[gl_GlobalInvocationID.x];
  barrier();
  v[gl_GlobalInvocationID.x] = s[n - 1 - gl_LocalInvocationID.x];
}
)"));
  const uint32_t over = limit / 4 + 1;
  s = acc->device().GetPipeline(sized, {{1, over}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("kernel 'reverse': ", 4 * over, " bytes of workgroup")));
  std::vector<float> values(128), got(128);
  for (int i = 0; i < 128; ++i) values[i] = static_cast<float>(i);
  ASSERT_OK_AND_ASSIGN(auto buffer, acc->CreateBuffer(values.size() * sizeof(float)));
  ASSERT_OK(acc->UploadSync(buffer, values.data(), values.size() * sizeof(float)));
  ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("reverse"));
  ASSERT_OK(list->Dispatch(sized, {buffer}, absl::Span<const uint8_t>(), {2, 1, 1}));
  ASSERT_OK(acc->Submit(list).Await());
  ASSERT_OK(acc->DownloadSync(buffer, got.data(), got.size() * sizeof(float)));
  for (int i = 0; i < 128; ++i) EXPECT_EQ(got[i], values[(i / 64) * 64 + 63 - i % 64]) << i;
}

// A kernel with `count` storage buffers at bindings 0.. count - 1, each read
// (so each is statically used), the sum written to binding 0.
std::string ManyBuffersGlsl(uint32_t count) {
  std::string source = "#version 450\nlayout(local_size_x = 1) in;\n";
  std::string sum = "0.0";
  for (uint32_t i = 0; i < count; ++i) {
    absl::StrAppend(&source, "layout(set = 0, binding = ", i, ") buffer B", i, " { float v", i, "[]; };\n");
    absl::StrAppend(&sum, " + v", i, "[1]");
  }
  absl::StrAppend(&source, "void main() { v0[0] = ", sum, "; }\n");
  return source;
}

// Tests that a kernel with more buffers than the device lets one stage (or
// one pushed descriptor set) bind is refused before its layout is made,
// naming the count and the limit, and that one at the limit runs with the
// right result. Beyond the limit the layout is invalid usage, which the
// validation layer reports and a driver may crash on.
TEST(DeviceAdmissionTest, MoreBuffersThanTheDeviceBindsAreRefused) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  const uint32_t limit = MaxStorageBuffersPerKernel(acc->info(), acc->device().push_descriptors());
  ASSERT_GE(limit, 4u);  // Vulkan's minimum
  ASSERT_LT(limit, 1000u) << "a limit this test cannot reach";
  ASSERT_OK_AND_ASSIGN(auto over, Kernel::FromGlsl("many-buffers", ManyBuffersGlsl(limit + 1)));
  absl::Status s = acc->device().GetPipeline(over).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("kernel 'many-buffers'"),
                                 HasSubstr(absl::StrCat(limit + 1, " storage buffers")),
                                 HasSubstr(absl::StrCat("at most ", limit))));

  ASSERT_OK_AND_ASSIGN(auto at, Kernel::FromGlsl("most-buffers", ManyBuffersGlsl(limit)));
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::vector<BufferArg> args;
  for (uint32_t i = 0; i < limit; ++i) {
    const std::array<float, 2> values = {0.0f, static_cast<float>(i + 1)};
    ASSERT_OK_AND_ASSIGN(auto buffer, acc->CreateBuffer(sizeof(values)));
    ASSERT_OK(acc->UploadSync(buffer, values.data(), sizeof(values)));
    buffers.push_back(buffer);
    args.push_back(buffer);
  }
  ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("most-buffers"));
  ASSERT_OK(list->Dispatch(at, args, absl::Span<const uint8_t>(), {1, 1, 1}));
  ASSERT_OK(acc->Submit(list).Await());
  float got = 0;
  ASSERT_OK(acc->DownloadSync(buffers[0], &got, sizeof(got)));
  // Binding 0's v[1] is read before the write to v[0]: 1 + 2 + ... + limit.
  EXPECT_EQ(got, static_cast<float>(limit * (limit + 1) / 2));
}

// Tests that a binding number far beyond any kernel's binding count is
// refused: Causeway binds buffers by position, and a driver sizes its layout
// by the highest number (lavapipe allocates an entry per number up to it).
// glslang refuses such numbers, so the module's Binding decoration is
// rewritten.
TEST(DeviceAdmissionTest, HugeBindingNumbersAreRefused) {
  std::unique_ptr<Runtime> rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  const std::vector<uint32_t> words = MustCompile(kScaleGlsl);
  for (const uint32_t binding : {kMaxBindingNumber + 1, 0x7fffffffu, 0xffffffffu}) {
    std::vector<uint32_t> patched = words;
    int rewritten = 0;
    // OpDecorate (opcode 71, 4 words) %target Binding (33) literal.
    for (size_t i = 5; i < patched.size();) {
      const uint32_t count = patched[i] >> 16, opcode = patched[i] & 0xffff;
      if (opcode == 71 && count == 4 && patched[i + 2] == 33) {
        patched[i + 3] = binding;
        ++rewritten;
      }
      i += count == 0 ? 1 : count;
    }
    ASSERT_EQ(rewritten, 1);
    ASSERT_OK_AND_ASSIGN(auto kernel, Kernel::FromSpirv("far-binding", patched));
    absl::Status s = rt->accelerator(0)->device().GetPipeline(kernel).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(),
                AllOf(HasSubstr("kernel 'far-binding'"), HasSubstr(absl::StrCat("binding ", binding)),
                      HasSubstr(absl::StrCat("at most ", kMaxBindingNumber))));
  }
}

}  // namespace
}  // namespace causeway
