#include "causeway/scheduler/function.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"

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

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// The function's buffers, numbered as steps' arguments are: inputs, then
// outputs, then scratch.
class Buffers {
 public:
  Buffers(const std::vector<TensorSpec>& inputs, const std::vector<TensorSpec>& outputs,
          const std::vector<TensorSpec>& scratch)
      : inputs_(inputs), outputs_(outputs), scratch_(scratch) {}

  int size() const { return static_cast<int>(inputs_.size() + outputs_.size() + scratch_.size()); }
  bool is_input(int a) const { return a < static_cast<int>(inputs_.size()); }
  // `a` in 0..size()-1.
  const TensorSpec& operator[](int a) const {
    if (is_input(a)) return inputs_[a];
    a -= static_cast<int>(inputs_.size());
    if (a < static_cast<int>(outputs_.size())) return outputs_[a];
    return scratch_[a - outputs_.size()];
  }
  // "4 buffers (2 inputs, 1 outputs, 1 scratch, numbered in that order)".
  std::string ToString() const {
    return absl::StrCat(size(), " buffers (", inputs_.size(), " inputs, ", outputs_.size(), " outputs, ",
                        scratch_.size(), " scratch, numbered in that order)");
  }

 private:
  const std::vector<TensorSpec>& inputs_;
  const std::vector<TensorSpec>& outputs_;
  const std::vector<TensorSpec>& scratch_;
};

// `at` is "function 'f' step 3". The rules are listed at Function::Create.
absl::Status CheckArgs(const std::string& at, const std::string& of_kernel, const KernelStep& step,
                       const Buffers& buffers) {
  const KernelReflection& r = step.kernel->reflection();
  if (step.args.size() != r.bindings.size()) {
    return Invalid(of_kernel, " has ", r.bindings.size(), " bindings, given ", step.args.size(), " args");
  }
  for (size_t i = 0; i < step.args.size(); ++i) {
    const int a = step.args[i];
    if (a < 0 || a >= buffers.size()) {
      return Invalid(at, ": argument ", a, " is not one of its ", buffers.ToString());
    }
    const KernelBinding& b = r.bindings[i];
    if (buffers.is_input(a) && !b.read_only) {
      return Invalid(of_kernel, " may write binding ", b.binding, ", given input ", a,
                     " (inputs are read-only: bind an output or scratch buffer)");
    }
    const uint64_t need = std::max<uint64_t>(b.min_size, 1);
    if (buffers[a].bytes() < need) {
      return Invalid(of_kernel, " binding ", b.binding, " expects at least ", need, " bytes, given argument ",
                     a, " ", buffers[a].ToString(), " of ", buffers[a].bytes());
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLaunch(const std::string& at, const std::string& of_kernel, const KernelStep& step) {
  const KernelReflection& r = step.kernel->reflection();
  if (step.push_constants.size() != r.push_constant_size) {
    return Invalid(of_kernel, " takes ", r.push_constant_size, " bytes of push constants, given ",
                   step.push_constants.size());
  }
  for (uint32_t g : step.groups) {
    if (g < 1 || g > kMaxWorkgroups) {
      return Invalid(at, ": groups [", absl::StrJoin(step.groups, ", "), "] (each must be 1..",
                     kMaxWorkgroups, ")");
    }
  }
  absl::flat_hash_map<uint32_t, uint32_t> spec;
  for (const auto& [id, value] : step.spec) {
    bool declared = false;
    for (const SpecConstant& c : r.spec_constants) declared |= c.id == id;
    if (!declared) {
      std::vector<uint32_t> ids;
      for (const SpecConstant& c : r.spec_constants) ids.push_back(c.id);
      return Invalid(of_kernel, " has no specialization constant ", id, " (it declares ",
                     ids.empty() ? "none" : absl::StrJoin(ids, ", "), ")");
    }
    if (!spec.emplace(id, value).second) {
      return Invalid(at, ": specialization constant ", id, " is given twice");
    }
  }
  const std::array<uint32_t, 3> local = ResolveLocalSize(r, spec);
  bool fits = true;
  // Each dimension first, so that the product cannot overflow.
  for (uint32_t d : local) fits &= d >= 1 && d <= kMaxWorkgroupInvocations;
  if (!fits || uint64_t{local[0]} * local[1] * local[2] > kMaxWorkgroupInvocations) {
    return Invalid(of_kernel, ": workgroup size ", local[0], "x", local[1], "x", local[2], " (expected 1..",
                   kMaxWorkgroupInvocations, " invocations, each dimension >= 1)");
  }
  return absl::OkStatus();
}

}  // namespace

std::string TensorSpec::ToString() const { return absl::StrCat(DTypeName(dtype), ShapeString(shape)); }

absl::StatusOr<std::shared_ptr<const Function>> Function::Create(std::string name, std::vector<TensorSpec> inputs,
                                                                 std::vector<TensorSpec> outputs,
                                                                 std::vector<TensorSpec> scratch,
                                                                 std::vector<KernelStep> steps) {
  const std::string what = absl::StrCat("function '", name, "'");
  if (outputs.empty()) return Invalid(what, " has no outputs (expected at least 1)");
  if (steps.empty()) return Invalid(what, " has no steps (expected at least 1 kernel)");
  for (const auto* list : {&inputs, &outputs, &scratch}) {
    for (const TensorSpec& t : *list) {
      for (int64_t d : t.shape) {
        if (d < 1) {
          return Invalid(what, ": shape ", ShapeString(t.shape),
                         " is not static (every dimension must be >= 1; shapes that depend on data are not "
                         "supported)");
        }
      }
    }
  }
  const Buffers buffers(inputs, outputs, scratch);
  for (size_t s = 0; s < steps.size(); ++s) {
    const KernelStep& step = steps[s];
    const std::string at = absl::StrCat(what, " step ", s);
    if (step.kernel == nullptr) return Invalid(at, ": no kernel");
    const std::string of_kernel = absl::StrCat(at, ": kernel '", step.kernel->name(), "'");
    CAUSEWAY_RETURN_IF_ERROR(CheckArgs(at, of_kernel, step, buffers));
    CAUSEWAY_RETURN_IF_ERROR(CheckLaunch(at, of_kernel, step));
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
  CAUSEWAY_ASSIGN_OR_RETURN(uint32_t n, Count(shape));
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel(op));
  if (kernel->reflection().bindings.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("'", op, "' is not a binary elementwise kernel"));
  }
  TensorSpec t{shape, DType::kF32};
  return Create(op, {t, t}, {t}, {}, {{kernel, {0, 1, 2}, Bytes(CountParams{n}), Groups1D(n, 256), {}}});
}

absl::StatusOr<std::shared_ptr<const Function>> Function::Scale(const Shape& shape, float alpha) {
  CAUSEWAY_ASSIGN_OR_RETURN(uint32_t n, Count(shape));
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("scale"));
  TensorSpec t{shape, DType::kF32};
  return Create("scale", {t}, {t}, {}, {{kernel, {0, 1}, Bytes(ScaleParams{n, alpha}), Groups1D(n, 256), {}}});
}

absl::StatusOr<std::shared_ptr<const Function>> Function::Matmul(uint32_t m, uint32_t n, uint32_t k) {
  if (m == 0 || n == 0 || k == 0) return absl::InvalidArgumentError("matmul sizes must be >= 1");
  CAUSEWAY_ASSIGN_OR_RETURN(auto kernel, BuiltinKernel("matmul"));
  constexpr uint32_t kTile = 16;
  std::array<uint32_t, 3> groups{(n + 4 * kTile - 1) / (4 * kTile), (m + 4 * kTile - 1) / (4 * kTile), 1};
  return Create("matmul", {{{m, k}, DType::kF32}, {{k, n}, DType::kF32}}, {{{m, n}, DType::kF32}}, {},
                {{kernel, {0, 1, 2}, Bytes(MatmulParams{m, n, k}), groups, {{0, kTile}, {1, kTile}}}});
}

absl::StatusOr<std::shared_ptr<const Function>> Function::RepeatedAdd(const Shape& shape, int count) {
  if (count < 1) return absl::InvalidArgumentError("RepeatedAdd count must be >= 1");
  CAUSEWAY_ASSIGN_OR_RETURN(uint32_t n, Count(shape));
  CAUSEWAY_ASSIGN_OR_RETURN(auto add, BuiltinKernel("add"));
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
      CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel, BuiltinKernel(launch.kernel));
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
    CAUSEWAY_RETURN_IF_ERROR(list.Dispatch(s.kernel, std::move(args), s.push_constants, s.groups, s.spec));
  }
  return absl::OkStatus();
}

}  // namespace causeway
