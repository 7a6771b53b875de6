// Reading operation plans (causeway/kernels/op_plan.h) in tests: operands as (name,
// bytes) pairs and push constants as 32-bit words, for gmock matchers.
#ifndef CAUSEWAY_TESTS_TESTING_OP_PLAN_SUPPORT_H_
#define CAUSEWAY_TESTS_TESTING_OP_PLAN_SUPPORT_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "causeway/kernels/op_plan.h"

namespace causeway::testing {

// The plan's operands as (name, bytes) pairs, in order.
inline std::vector<std::pair<std::string, uint64_t>> PlanOperands(const ops::OpPlan& plan) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& o : plan.operands) out.emplace_back(o.name, o.bytes);
  return out;
}

// A launch's push constants as 32-bit words (a trailing partial word is
// dropped; every kernel's block is whole words).
inline std::vector<uint32_t> PushWords(const ops::Launch& launch) {
  std::vector<uint32_t> words(launch.push_constants.size() / 4);
  std::memcpy(words.data(), launch.push_constants.data(), words.size() * 4);
  return words;
}

// A float's bits, to compare with a push-constant word.
inline uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace causeway::testing

#endif  // CAUSEWAY_TESTS_TESTING_OP_PLAN_SUPPORT_H_
