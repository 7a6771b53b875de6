// Compiled functions: one kernel, or a fused sequence of kernels, over
// static shapes, run SPMD on every accelerator of a mesh.
#ifndef CAUSEWAY_SCHEDULER_FUNCTION_H_
#define CAUSEWAY_SCHEDULER_FUNCTION_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/kernel.h"
#include "causeway/scheduler/dtype.h"

namespace causeway {

// The shape and type of one argument as each device sees it (a shard).
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kF32;
  uint64_t bytes() const { return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype); }
  bool operator==(const TensorSpec& o) const { return shape == o.shape && dtype == o.dtype; }
  std::string ToString() const;  // "f32[4, 8]"
};

// What one kernel step may ask for (Vulkan's guaranteed minimum of
// maxComputeWorkGroupCount in each dimension, and the invocations of one
// workgroup after specialization).
inline constexpr uint32_t kMaxWorkgroups = 65535;
inline constexpr uint32_t kMaxWorkgroupInvocations = 1024;

// One kernel launch of a function. `args` index the function's buffers:
// inputs first, then outputs, then scratch.
struct KernelStep {
  std::shared_ptr<const Kernel> kernel;
  std::vector<int> args;
  std::vector<uint8_t> push_constants;
  std::array<uint32_t, 3> groups{1, 1, 1};
  SpecValues spec;
};

// Immutable once built; shared by every program that calls it.
//
// Example:
//   auto add = Function::Elementwise("add", {1024});   // out = a + b
//   auto mm = Function::Matmul(64, 64, 64);            // out = a * b
class Function {
 public:
  // Checks the function as a whole, then each step against its kernel, and
  // refuses with InvalidArgument naming the function, the step, the kernel
  // and, where one is at fault, the binding, with what was expected and what
  // came:
  //   "function 'axpb' step 0: kernel 'axpb' may write binding 1, given input 0 (...)"
  // The rules (a custom function from a def, FunctionFromDef, is held to
  // the same ones, here):
  //  - at least one output and one step; every dimension of every shape >= 1;
  //  - one argument per kernel binding, each one of the function's buffers;
  //  - no input bound where the kernel may write (an input is the caller's
  //    array: a kernel that wrote it would change it under the caller);
  //  - each buffer at least its binding's fixed size (KernelBinding::min_size);
  //  - push constants of exactly the kernel's size;
  //  - 1..kMaxWorkgroups workgroups in each dimension;
  //  - specialization constants that the kernel declares, each given once;
  //  - a workgroup of 1..kMaxWorkgroupInvocations invocations once
  //    specialized, each dimension >= 1.
  // What a kernel does with its push constants or its own code is not
  // checked.
  static absl::StatusOr<std::shared_ptr<const Function>> Create(std::string name, std::vector<TensorSpec> inputs,
                                                                std::vector<TensorSpec> outputs,
                                                                std::vector<TensorSpec> scratch,
                                                                std::vector<KernelStep> steps);

  // Built-in functions over f32 shards.
  static absl::StatusOr<std::shared_ptr<const Function>> Elementwise(const std::string& op, const Shape& shape);
  static absl::StatusOr<std::shared_ptr<const Function>> Scale(const Shape& shape, float alpha);
  static absl::StatusOr<std::shared_ptr<const Function>> Matmul(uint32_t m, uint32_t n, uint32_t k);
  // `count` times "x = x + b" fused into one function (inputs x, b; output y).
  static absl::StatusOr<std::shared_ptr<const Function>> RepeatedAdd(const Shape& shape, int count);

  const std::string& name() const { return name_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  const std::vector<TensorSpec>& scratch() const { return scratch_; }
  const std::vector<KernelStep>& steps() const { return steps_; }

  // Appends the function's kernels to `list` with these buffers (inputs,
  // outputs, scratch, in order).
  absl::Status Record(CommandList& list, const std::vector<BufferArg>& buffers) const;

 private:
  Function() = default;
  std::string name_;
  std::vector<TensorSpec> inputs_, outputs_, scratch_;
  std::vector<KernelStep> steps_;
};

// Builds a Function from operation plans (causeway/kernels/op_plan.h): declare its
// buffers, then add operations that bind them, in the order they run.
//
// Example (the first half of a GELU MLP):
//   FunctionBuilder f("mlp_up");
//   const int x = f.Input({{rows, d}}), w = f.Input({{d, ff}}), b = f.Input({{ff}});
//   const int h = f.Scratch({{rows, ff}}), y = f.Output({{rows, ff}});
//   f.Add(ops::PlanGemm(rows, ff, d), {x, w, h});
//   f.Add(ops::PlanBiasGelu(rows, ff), {h, b, y});
//   CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Function> mlp_up, f.Build());
class FunctionBuilder {
 public:
  explicit FunctionBuilder(std::string name) : name_(std::move(name)) {}

  // Each returns the buffer's handle for Add.
  int Input(TensorSpec spec) { return Declare(kInput, std::move(spec)); }
  int Output(TensorSpec spec) { return Declare(kOutput, std::move(spec)); }
  int Scratch(TensorSpec spec) { return Declare(kScratch, std::move(spec)); }

  // Appends the plan's launches with its operand i bound to buffers[i]. A
  // failed plan, a wrong number of buffers, an unknown handle or a buffer
  // smaller than its operand needs is reported by Build, naming the plan.
  FunctionBuilder& Add(const absl::StatusOr<ops::OpPlan>& plan, std::vector<int> buffers);

  absl::StatusOr<std::shared_ptr<const Function>> Build() const;

 private:
  enum Kind { kInput, kOutput, kScratch };
  struct Declared {
    Kind kind;
    TensorSpec spec;
  };
  struct Added {
    absl::StatusOr<ops::OpPlan> plan;
    std::vector<int> buffers;
  };
  int Declare(Kind kind, TensorSpec spec) {
    buffers_.push_back({kind, std::move(spec)});
    return static_cast<int>(buffers_.size()) - 1;
  }

  std::string name_;
  std::vector<Declared> buffers_;
  std::vector<Added> ops_;
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_FUNCTION_H_
