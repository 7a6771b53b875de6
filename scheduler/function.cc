#include "scheduler/function.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/builtin_kernels.h"
#include "runtime/status.h"

namespace causeway {
namespace {

template <typename P>
std::vector<uint8_t> Bytes(const P& p) {
  std::vector<uint8_t> out(sizeof(P));
  std::memcpy(out.data(), &p, sizeof(P));
  return out;
}

absl::StatusOr<uint32_t> Count(const Shape& shape) {
  int64_t n = NumElements(shape);
  if (n < 1 || n > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " must hold 1..2^32-1 elements"));
  }
  return static_cast<uint32_t>(n);
}

}  // namespace

std::string TensorSpec::ToString() const { return absl::StrCat(DTypeName(dtype), ShapeString(shape)); }

absl::StatusOr<std::shared_ptr<const Function>> Function::Create(std::string name, std::vector<TensorSpec> inputs,
                                                                 std::vector<TensorSpec> outputs,
                                                                 std::vector<TensorSpec> scratch,
                                                                 std::vector<KernelStep> steps) {
  if (outputs.empty()) return absl::InvalidArgumentError(absl::StrCat("function '", name, "' has no outputs"));
  if (steps.empty()) return absl::InvalidArgumentError(absl::StrCat("function '", name, "' has no kernels"));
  int buffers = static_cast<int>(inputs.size() + outputs.size() + scratch.size());
  for (const auto* list : {&inputs, &outputs, &scratch}) {
    for (const TensorSpec& t : *list) {
      for (int64_t d : t.shape) {
        if (d < 1) {
          return absl::InvalidArgumentError(absl::StrCat("function '", name, "': shape ", ShapeString(t.shape),
                                                         " is not static (every dimension must be >= 1; shapes "
                                                         "that depend on data are not supported)"));
        }
      }
    }
  }
  for (size_t s = 0; s < steps.size(); ++s) {
    const KernelStep& step = steps[s];
    if (step.kernel == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("function '", name, "' step ", s, ": no kernel"));
    }
    if (step.args.size() != step.kernel->reflection().bindings.size()) {
      return absl::InvalidArgumentError(absl::StrCat("function '", name, "' step ", s, ": kernel '",
                                                     step.kernel->name(), "' has ",
                                                     step.kernel->reflection().bindings.size(), " bindings, given ",
                                                     step.args.size()));
    }
    for (int a : step.args) {
      if (a < 0 || a >= buffers) {
        return absl::InvalidArgumentError(absl::StrCat("function '", name, "' step ", s, ": argument ", a,
                                                       " is not one of its ", buffers, " buffers"));
      }
    }
    if (step.push_constants.size() != step.kernel->reflection().push_constant_size) {
      return absl::InvalidArgumentError(absl::StrCat("function '", name, "' step ", s, ": kernel '",
                                                     step.kernel->name(), "' takes ",
                                                     step.kernel->reflection().push_constant_size,
                                                     " bytes of push constants, given ", step.push_constants.size()));
    }
  }
  std::shared_ptr<Function> f(new Function());
  f->name_ = std::move(name);
  f->inputs_ = std::move(inputs);
  f->outputs_ = std::move(outputs);
  f->scratch_ = std::move(scratch);
  f->steps_ = std::move(steps);
  return f;
}

absl::StatusOr<std::shared_ptr<const Function>> Function::Elementwise(const std::string& op, const Shape& shape) {
  ASSIGN_OR_RETURN(uint32_t n, Count(shape));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(op));
  if (kernel->reflection().bindings.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("'", op, "' is not a binary elementwise kernel"));
  }
  TensorSpec t{shape, DType::kF32};
  return Create(op, {t, t}, {t}, {}, {{kernel, {0, 1, 2}, Bytes(CountParams{n}), Groups1D(n, 256), {}}});
}

absl::StatusOr<std::shared_ptr<const Function>> Function::Scale(const Shape& shape, float alpha) {
  ASSIGN_OR_RETURN(uint32_t n, Count(shape));
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("scale"));
  TensorSpec t{shape, DType::kF32};
  return Create("scale", {t}, {t}, {}, {{kernel, {0, 1}, Bytes(ScaleParams{n, alpha}), Groups1D(n, 256), {}}});
}

absl::StatusOr<std::shared_ptr<const Function>> Function::Matmul(uint32_t m, uint32_t n, uint32_t k) {
  if (m == 0 || n == 0 || k == 0) return absl::InvalidArgumentError("matmul sizes must be >= 1");
  ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("matmul"));
  constexpr uint32_t kTile = 16;
  std::array<uint32_t, 3> groups{(n + 4 * kTile - 1) / (4 * kTile), (m + 4 * kTile - 1) / (4 * kTile), 1};
  return Create("matmul", {{{m, k}, DType::kF32}, {{k, n}, DType::kF32}}, {{{m, n}, DType::kF32}}, {},
                {{kernel, {0, 1, 2}, Bytes(MatmulParams{m, n, k}), groups, {{0, kTile}, {1, kTile}}}});
}

absl::StatusOr<std::shared_ptr<const Function>> Function::RepeatedAdd(const Shape& shape, int count) {
  if (count < 1) return absl::InvalidArgumentError("RepeatedAdd count must be >= 1");
  ASSIGN_OR_RETURN(uint32_t n, Count(shape));
  ASSIGN_OR_RETURN(auto add, BuiltinKernel("add"));
  TensorSpec t{shape, DType::kF32};
  // y = x + b, then y = y + b (count - 1) times: one fused function.
  std::vector<KernelStep> steps;
  steps.push_back({add, {0, 1, 2}, Bytes(CountParams{n}), Groups1D(n, 256), {}});
  for (int i = 1; i < count; ++i) steps.push_back({add, {2, 1, 2}, Bytes(CountParams{n}), Groups1D(n, 256), {}});
  return Create(absl::StrCat("add_x", count), {t, t}, {t}, {}, std::move(steps));
}

FunctionBuilder& FunctionBuilder::Add(const absl::StatusOr<ops::OpPlan>& plan, std::vector<int> buffers) {
  ops_.push_back({plan, std::move(buffers)});
  return *this;
}

absl::StatusOr<std::shared_ptr<const Function>> FunctionBuilder::Build() const {
  // Function arguments are inputs, then outputs, then scratch.
  std::vector<int> index(buffers_.size());
  std::vector<TensorSpec> lists[3];
  for (Kind kind : {kInput, kOutput, kScratch}) {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      if (buffers_[b].kind != kind) continue;
      index[b] = static_cast<int>(lists[kInput].size() + lists[kOutput].size() + lists[kScratch].size());
      lists[kind].push_back(buffers_[b].spec);
    }
  }
  std::vector<KernelStep> steps;
  for (size_t o = 0; o < ops_.size(); ++o) {
    const Added& added = ops_[o];
    if (!added.plan.ok()) {
      return absl::Status(added.plan.status().code(), absl::StrCat("function '", name_, "' operation ", o, ": ",
                                                                   added.plan.status().message()));
    }
    const ops::OpPlan& plan = *added.plan;
    if (added.buffers.size() != plan.operands.size()) {
      return absl::InvalidArgumentError(absl::StrCat("function '", name_, "': ", plan.name, " takes ",
                                                     plan.operands.size(), " buffers, given ", added.buffers.size()));
    }
    for (size_t i = 0; i < added.buffers.size(); ++i) {
      const int b = added.buffers[i];
      if (b < 0 || static_cast<size_t>(b) >= buffers_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("function '", name_, "': ", plan.name, ": ",
                                                       plan.operands[i].name, " is bound to unknown buffer ", b));
      }
      if (buffers_[b].spec.bytes() < plan.operands[i].bytes) {
        return absl::InvalidArgumentError(absl::StrCat("function '", name_, "': ", plan.name, ": ",
                                                       plan.operands[i].name, " needs ", plan.operands[i].bytes,
                                                       " bytes, its buffer ", buffers_[b].spec.ToString(), " has ",
                                                       buffers_[b].spec.bytes()));
      }
    }
    for (const ops::Launch& launch : plan.launches) {
      ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel, BuiltinKernel(launch.kernel));
      KernelStep step{std::move(kernel), {}, launch.push_constants, launch.groups, launch.spec};
      for (int operand : launch.operands) step.args.push_back(index[added.buffers[operand]]);
      steps.push_back(std::move(step));
    }
  }
  return Function::Create(name_, std::move(lists[kInput]), std::move(lists[kOutput]), std::move(lists[kScratch]),
                          std::move(steps));
}

absl::Status Function::Record(CommandList& list, const std::vector<BufferArg>& buffers) const {
  size_t want = inputs_.size() + outputs_.size() + scratch_.size();
  if (buffers.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("function '", name_, "' takes ", want, " buffers, given ",
                                                   buffers.size()));
  }
  for (const KernelStep& s : steps_) {
    std::vector<BufferArg> args;
    for (int a : s.args) args.push_back(buffers[a]);
    RETURN_IF_ERROR(list.Dispatch(s.kernel, std::move(args), s.push_constants, s.groups, s.spec));
  }
  return absl::OkStatus();
}

}  // namespace causeway
