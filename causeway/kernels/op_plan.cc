#include "causeway/kernels/op_plan.h"

#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/kernels/builtin_kernels.h"

namespace causeway::ops {

absl::Status Record(CommandList& list, const OpPlan& plan, const std::vector<BufferArg>& buffers) {
  if (buffers.size() != plan.operands.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(plan.name, ": takes ", plan.operands.size(), " buffers, given ", buffers.size()));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const BufferArg& arg = buffers[i];
    const OpPlan::Operand& operand = plan.operands[i];
    if (arg.buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(plan.name, ": ", operand.name, " is not bound"));
    }
    // size > buffer - offset rather than offset + size > buffer: the sum of
    // two sizes from a caller may wrap.
    if (arg.offset > arg.buffer->size() ||
        (arg.size != VK_WHOLE_SIZE && arg.size > arg.buffer->size() - arg.offset)) {
      return absl::InvalidArgumentError(absl::StrCat(plan.name, ": ", operand.name, " range [", arg.offset, ", +",
                                                     arg.size, ") exceeds its buffer of ", arg.buffer->size(),
                                                     " bytes"));
    }
    if (arg.resolved_size() < operand.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(plan.name, ": ", operand.name, " needs ", operand.bytes,
                                                     " bytes, got ", arg.resolved_size()));
    }
  }
  std::vector<std::shared_ptr<const Kernel>> kernels;
  for (const Launch& launch : plan.launches) {
    CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel, BuiltinKernel(launch.kernel));
    kernels.push_back(std::move(kernel));
  }
  for (size_t l = 0; l < plan.launches.size(); ++l) {
    const Launch& launch = plan.launches[l];
    std::vector<BufferArg> args;
    args.reserve(launch.operands.size());
    for (int operand : launch.operands) args.push_back(buffers[operand]);
    CAUSEWAY_RETURN_IF_ERROR(
        list.Dispatch(kernels[l], std::move(args), launch.push_constants, launch.groups, launch.spec));
  }
  return absl::OkStatus();
}

}  // namespace causeway::ops
