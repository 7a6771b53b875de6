// Operations as data. An OpPlan is what one operation of the kernel library
// dispatches (built-in kernels, push constants, workgroups, specialization
// constants) over a list of named operands, computed from sizes alone: the
// ops:: helpers record a plan into a command list (Record, below), and the
// scheduler turns the same plan into a Function's kernel steps, which a
// ProgramDef can carry to another island as they are.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(ops::OpPlan plan, ops::PlanBiasGelu(rows, cols));
//   CAUSEWAY_RETURN_IF_ERROR(ops::Record(*list, plan, {x, bias, y}));
#ifndef CAUSEWAY_KERNELS_OP_PLAN_H_
#define CAUSEWAY_KERNELS_OP_PLAN_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "causeway/runtime/command_list.h"
#include "causeway/runtime/kernel.h"

namespace causeway::ops {

// One dispatch of a built-in kernel. `operands` gives, binding by binding,
// which of the plan's operands is bound there.
struct Launch {
  std::string kernel;
  std::vector<int> operands;
  std::vector<uint8_t> push_constants;
  std::array<uint32_t, 3> groups{1, 1, 1};
  SpecValues spec;
};

struct OpPlan {
  // The operation and its sizes, for errors ("bias_gelu 64x128").
  std::string name;
  // Each operand's name and the bytes the operation reads or writes from its
  // start (a bound range must hold at least that many).
  struct Operand {
    std::string name;
    uint64_t bytes = 0;
  };
  std::vector<Operand> operands;
  std::vector<Launch> launches;
};

// Push-constant bytes of a trivially copyable parameter block.
template <typename Params>
std::vector<uint8_t> PushBytes(const Params& params) {
  static_assert(std::is_trivially_copyable_v<Params>);
  std::vector<uint8_t> bytes(sizeof(Params));
  std::memcpy(bytes.data(), &params, sizeof(Params));
  return bytes;
}

// Checks that `buffers` bind every operand of `plan` (in its order) with
// enough bytes, then appends its launches to `list`. InvalidArgument naming
// the operation and the operand otherwise; nothing is appended then.
absl::Status Record(CommandList& list, const OpPlan& plan, const std::vector<BufferArg>& buffers);

}  // namespace causeway::ops

#endif  // CAUSEWAY_KERNELS_OP_PLAN_H_
