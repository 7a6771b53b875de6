#include "causeway/runtime/spirv_reflect.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "causeway/base/status.h"

// The Khronos SPIR-V header, as glslang ships it (Debian has no spirv-headers
// package). The utility code gives HasResultAndType, which lets the parser
// check every instruction's result id without a grammar table of its own.
#define SPV_ENABLE_UTILITY_CODE
#include <glslang/SPIRV/spirv.hpp>

namespace causeway {
namespace {

constexpr size_t kHeaderWords = 5;
// SPIR-V's universal limit on the result <id> bound.
constexpr uint32_t kMaxIdBound = 0x3FFFFF;
// Type nesting deeper than this is refused. SPIR-V limits struct nesting to
// 255; the limit here also bounds the recursion on hostile input.
constexpr int kMaxTypeDepth = 256;
// The byte-swapped magic, which a module written in the other byte order
// starts with.
constexpr uint32_t kSwappedSpirvMagic = 0x03022307;
// PhysicalStorageBuffer, whose pointers are 8-byte block members.
constexpr uint32_t kStorageClassPhysicalStorageBuffer = 5349;

// Fewest operand words (after the opcode word) an instruction must have for
// the reflection to read it; 0 for opcodes it does not read.
size_t MinOperands(spv::Op op) {
  // clang-format off
  switch (op) {
    case spv::OpName:                   return 2;  // target, name
    case spv::OpEntryPoint:             return 3;  // model, id, name
    case spv::OpExecutionMode:
    case spv::OpExecutionModeId:        return 2;  // entry, mode
    case spv::OpDecorate:               return 2;  // target, decoration
    case spv::OpMemberDecorate:         return 3;  // type, member, decoration
    case spv::OpTypeVoid:
    case spv::OpTypeBool:
    case spv::OpTypeSampler:
    case spv::OpTypeStruct:             return 1;  // result
    case spv::OpTypeFloat:
    case spv::OpTypeRuntimeArray:
    case spv::OpTypeSampledImage:       return 2;
    case spv::OpTypeInt:
    case spv::OpTypeVector:
    case spv::OpTypeMatrix:
    case spv::OpTypeArray:
    case spv::OpTypePointer:            return 3;
    case spv::OpConstantTrue:
    case spv::OpConstantFalse:
    case spv::OpConstantNull:
    case spv::OpConstantComposite:
    case spv::OpSpecConstantTrue:
    case spv::OpSpecConstantFalse:
    case spv::OpSpecConstantComposite:  return 2;  // type, result
    case spv::OpConstant:
    case spv::OpSpecConstant:
    case spv::OpSpecConstantOp:         return 3;  // type, result, value
    case spv::OpVariable:               return 3;  // type, result, class
    case spv::OpFunction:               return 4;  // type, result, control, type
    default:                            return 0;
  }
  // clang-format on
}

bool IsType(spv::Op op) {
  switch (op) {
    case spv::OpTypeVoid:
    case spv::OpTypeBool:
    case spv::OpTypeInt:
    case spv::OpTypeFloat:
    case spv::OpTypeVector:
    case spv::OpTypeMatrix:
    case spv::OpTypeImage:
    case spv::OpTypeSampler:
    case spv::OpTypeSampledImage:
    case spv::OpTypeArray:
    case spv::OpTypeRuntimeArray:
    case spv::OpTypeStruct:
    case spv::OpTypePointer:
    case spv::OpTypeAccelerationStructureKHR:
      return true;
    default:
      return false;
  }
}

bool IsConstant(spv::Op op) {
  switch (op) {
    case spv::OpConstantTrue:
    case spv::OpConstantFalse:
    case spv::OpConstant:
    case spv::OpConstantComposite:
    case spv::OpConstantNull:
    case spv::OpSpecConstantTrue:
    case spv::OpSpecConstantFalse:
    case spv::OpSpecConstant:
    case spv::OpSpecConstantComposite:
    case spv::OpSpecConstantOp:
      return true;
    default:
      return false;
  }
}

absl::Status Malformed(size_t offset, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed SPIR-V at word ", offset, ": ", what));
}

// Decodes a literal string: UTF-8 bytes packed little-endian into words and
// NUL-terminated, all within `words`.
absl::StatusOr<std::string> ReadString(absl::Span<const uint32_t> words, size_t offset) {
  std::string s;
  for (uint32_t word : words) {
    for (int byte = 0; byte < 4; ++byte) {
      const char c = static_cast<char>((word >> (8 * byte)) & 0xFF);
      if (c == '\0') return s;
      s.push_back(c);
    }
  }
  return Malformed(offset, "string literal is not NUL-terminated within its instruction");
}

struct Decorations {
  std::optional<uint32_t> spec_id;
  std::optional<uint32_t> set;
  std::optional<uint32_t> binding;
  std::optional<uint32_t> array_stride;
  bool block = false;
  bool buffer_block = false;
  bool non_writable = false;
  bool non_readable = false;
};

struct MemberDecorations {
  std::optional<uint32_t> offset;
  std::optional<uint32_t> matrix_stride;
  bool row_major = false;
  bool non_writable = false;
  bool non_readable = false;
};

// A type or a constant.
struct Definition {
  spv::Op opcode = spv::OpNop;
  uint32_t result_type = 0;  // constants only
  // Operands after the result id: for OpTypeInt {width, signedness}, for
  // OpConstant the value words, for OpTypeStruct the member types, ...
  absl::Span<const uint32_t> operands;
};

struct Variable {
  uint32_t id = 0;
  uint32_t pointer_type = 0;
  uint32_t storage_class = 0;
};

struct EntryPoint {
  uint32_t model = 0;
  uint32_t id = 0;
  std::string name;
};

struct ExecutionMode {
  uint32_t entry = 0;
  uint32_t mode = 0;
  absl::Span<const uint32_t> operands;  // after the mode
  size_t offset = 0;
};

// One pass over the words collects what reflection needs; Build() then
// answers from the collected tables. Spans point into the caller's words,
// which outlive the Reflector.
class Reflector {
 public:
  explicit Reflector(absl::Span<const uint32_t> words) : words_(words) {}

  absl::Status Parse();
  absl::StatusOr<KernelReflection> Build();

 private:
  absl::Status CheckResultId(spv::Op op, absl::Span<const uint32_t> operands, size_t offset);
  absl::Status Record(spv::Op op, absl::Span<const uint32_t> operands, size_t offset);
  absl::Status RecordDecoration(absl::Span<const uint32_t> operands, size_t offset);
  absl::Status RecordMemberDecoration(absl::Span<const uint32_t> operands, size_t offset);

  absl::Status ReflectLocalSize(uint32_t entry, KernelReflection& reflection);
  absl::Status ReflectSpecConstants(KernelReflection& reflection);
  absl::Status ReflectVariables(KernelReflection& reflection);
  absl::Status ReflectBuffer(const Variable& variable, uint32_t struct_id,
                             std::vector<KernelBinding>& bindings);

  // A 32-bit integer constant naming a workgroup dimension: its default
  // value and, for a specialization constant, its SpecId.
  absl::StatusOr<std::pair<uint32_t, std::optional<uint32_t>>> SizeConstant(uint32_t id) const;
  // The value of an integer constant used as an array length.
  absl::StatusOr<uint64_t> ArrayLength(uint32_t id) const;
  // The type `type_id` names, reached `depth` types deep: InvalidArgument
  // past kMaxTypeDepth or if it names no type.
  absl::StatusOr<const Definition*> TypeAt(uint32_t type_id, int depth) const;
  // Bytes a value of `type` occupies in a block; `member` carries the
  // matrix layout of the enclosing struct member, if any.
  absl::StatusOr<uint64_t> SizeOf(uint32_t type, const MemberDecorations* member, int depth);
  absl::StatusOr<uint64_t> StructSize(uint32_t id, int depth);
  // The terms of a Workgroup variable's size (see SharedMemoryTerm), merged
  // by their SpecIds; memoized, so that a type reached by many paths is
  // walked once.
  absl::StatusOr<std::vector<SharedMemoryTerm>> SharedTerms(uint32_t type, int depth);
  absl::Status ReflectSharedMemory(KernelReflection& reflection);

  const Definition* Find(uint32_t id) const {
    auto it = definitions_.find(id);
    return it == definitions_.end() ? nullptr : &it->second;
  }
  const Definition* FindType(uint32_t id) const {
    const Definition* d = Find(id);
    return d != nullptr && IsType(d->opcode) ? d : nullptr;
  }
  const Decorations* FindDecorations(uint32_t id) const {
    auto it = decorations_.find(id);
    return it == decorations_.end() ? nullptr : &it->second;
  }
  const MemberDecorations* FindMember(uint32_t id, uint32_t member) const {
    auto it = member_decorations_.find({id, member});
    return it == member_decorations_.end() ? nullptr : &it->second;
  }
  std::string NameOf(uint32_t id) const {
    auto it = names_.find(id);
    return it == names_.end() ? std::string() : it->second;
  }
  // "%7 'name'" or "%7", for messages.
  std::string Describe(uint32_t id) const {
    std::string name = NameOf(id);
    return name.empty() ? absl::StrCat("%", id) : absl::StrCat("%", id, " '", name, "'");
  }

  absl::Span<const uint32_t> words_;
  uint32_t bound_ = 0;
  absl::flat_hash_set<uint32_t> defined_ids_;
  absl::flat_hash_map<uint32_t, std::string> names_;
  std::vector<EntryPoint> entry_points_;
  std::vector<ExecutionMode> execution_modes_;
  absl::flat_hash_map<uint32_t, Decorations> decorations_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, MemberDecorations> member_decorations_;
  std::vector<uint32_t> workgroup_size_ids_;  // decorated BuiltIn WorkgroupSize
  absl::flat_hash_map<uint32_t, Definition> definitions_;
  std::vector<uint32_t> spec_constant_ids_;  // in module order
  std::vector<Variable> variables_;          // in module order
  absl::flat_hash_set<uint32_t> functions_;  // OpFunction result ids
  absl::flat_hash_map<uint32_t, std::vector<SharedMemoryTerm>> shared_terms_;
  uint32_t open_function_ = 0;               // the function being walked, 0 between them
  absl::flat_hash_map<uint32_t, uint64_t> struct_sizes_;
  absl::flat_hash_set<uint32_t> structs_in_progress_;
};

absl::Status Reflector::Parse() {
  CAUSEWAY_RETURN_IF_ERROR(CheckSpirvHeader(words_));
  bound_ = words_[3];
  if (bound_ == 0 || bound_ > kMaxIdBound) {
    return absl::InvalidArgumentError(
        absl::StrCat("SPIR-V header declares an id bound of ", bound_, ", expected 1 to ", kMaxIdBound));
  }
  size_t offset = kHeaderWords;
  while (offset < words_.size()) {
    const uint32_t word_count = words_[offset] >> 16;
    const auto op = static_cast<spv::Op>(words_[offset] & 0xFFFF);
    if (word_count == 0) {
      return Malformed(offset, absl::StrCat("instruction with opcode ", static_cast<uint32_t>(op),
                                            " has a word count of 0"));
    }
    const size_t remaining = words_.size() - offset;
    if (word_count > remaining) {
      return Malformed(
          offset, absl::StrCat("instruction with opcode ", static_cast<uint32_t>(op), " has ", word_count,
                               " words but only ", remaining, " remain in the module"));
    }
    const absl::Span<const uint32_t> operands = words_.subspan(offset + 1, word_count - 1);
    if (operands.size() < MinOperands(op)) {
      return Malformed(offset,
                       absl::StrCat("instruction with opcode ", static_cast<uint32_t>(op), " has ",
                                    operands.size(), " operands, expected at least ", MinOperands(op)));
    }
    CAUSEWAY_RETURN_IF_ERROR(CheckResultId(op, operands, offset));
    CAUSEWAY_RETURN_IF_ERROR(Record(op, operands, offset));
    offset += word_count;
  }
  if (open_function_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated SPIR-V: the module ends inside function %", open_function_));
  }
  return absl::OkStatus();
}

absl::Status Reflector::CheckResultId(spv::Op op, absl::Span<const uint32_t> operands, size_t offset) {
  bool has_result = false;
  bool has_result_type = false;
  spv::HasResultAndType(op, &has_result, &has_result_type);
  if (!has_result) return absl::OkStatus();
  const size_t index = has_result_type ? 1 : 0;
  if (operands.size() <= index) {
    return Malformed(
        offset, absl::StrCat("instruction with opcode ", static_cast<uint32_t>(op), " has no result id"));
  }
  const uint32_t id = operands[index];
  if (id == 0 || id >= bound_) {
    return Malformed(offset, absl::StrCat("result id %", id, " is outside the header's bound ", bound_));
  }
  if (!defined_ids_.insert(id).second) {
    return Malformed(offset, absl::StrCat("id %", id, " is defined twice"));
  }
  return absl::OkStatus();
}

absl::Status Reflector::Record(spv::Op op, absl::Span<const uint32_t> operands, size_t offset) {
  switch (op) {
    case spv::OpName: {
      CAUSEWAY_ASSIGN_OR_RETURN(std::string name, ReadString(operands.subspan(1), offset));
      names_[operands[0]] = std::move(name);
      return absl::OkStatus();
    }
    case spv::OpEntryPoint: {
      CAUSEWAY_ASSIGN_OR_RETURN(std::string name, ReadString(operands.subspan(2), offset));
      entry_points_.push_back({operands[0], operands[1], std::move(name)});
      return absl::OkStatus();
    }
    case spv::OpExecutionMode:
    case spv::OpExecutionModeId:
      execution_modes_.push_back({operands[0], operands[1], operands.subspan(2), offset});
      return absl::OkStatus();
    case spv::OpDecorate:
      return RecordDecoration(operands, offset);
    case spv::OpMemberDecorate:
      return RecordMemberDecoration(operands, offset);
    case spv::OpVariable:
      variables_.push_back({operands[1], operands[0], operands[2]});
      return absl::OkStatus();
    case spv::OpFunction:
      if (open_function_ != 0) {
        return Malformed(
            offset, absl::StrCat("function %", operands[1], " begins inside function %", open_function_));
      }
      open_function_ = operands[1];
      functions_.insert(operands[1]);
      return absl::OkStatus();
    case spv::OpFunctionEnd:
      if (open_function_ == 0) {
        return Malformed(offset, "OpFunctionEnd outside a function");
      }
      open_function_ = 0;
      return absl::OkStatus();
    default:
      break;
  }
  if (IsType(op)) {
    // MinOperands is 0 for types the reflection never looks inside.
    if (operands.empty()) return Malformed(offset, "type without a result id");
    definitions_[operands[0]] = {op, 0, operands.subspan(1)};
  } else if (IsConstant(op)) {
    definitions_[operands[1]] = {op, operands[0], operands.subspan(2)};
    if (op == spv::OpSpecConstantTrue || op == spv::OpSpecConstantFalse || op == spv::OpSpecConstant) {
      spec_constant_ids_.push_back(operands[1]);
    }
  }
  return absl::OkStatus();
}

absl::Status Reflector::RecordDecoration(absl::Span<const uint32_t> operands, size_t offset) {
  const uint32_t target = operands[0];
  const auto decoration = static_cast<spv::Decoration>(operands[1]);
  const absl::Span<const uint32_t> literals = operands.subspan(2);
  auto literal = [&]() -> absl::StatusOr<uint32_t> {
    if (literals.empty()) {
      return Malformed(offset, absl::StrCat("decoration ", operands[1], " on %", target, " has no value"));
    }
    return literals[0];
  };
  if (target == 0 || target >= bound_) {
    return Malformed(offset,
                     absl::StrCat("decoration targets %", target, ", outside the header's bound ", bound_));
  }
  switch (decoration) {
    case spv::DecorationSpecId: {
      CAUSEWAY_ASSIGN_OR_RETURN(decorations_[target].spec_id, literal());
      break;
    }
    case spv::DecorationDescriptorSet: {
      CAUSEWAY_ASSIGN_OR_RETURN(decorations_[target].set, literal());
      break;
    }
    case spv::DecorationBinding: {
      CAUSEWAY_ASSIGN_OR_RETURN(decorations_[target].binding, literal());
      break;
    }
    case spv::DecorationArrayStride: {
      CAUSEWAY_ASSIGN_OR_RETURN(decorations_[target].array_stride, literal());
      break;
    }
    case spv::DecorationBuiltIn: {
      CAUSEWAY_ASSIGN_OR_RETURN(uint32_t builtin, literal());
      if (builtin == spv::BuiltInWorkgroupSize) {
        workgroup_size_ids_.push_back(target);
      }
      break;
    }
    case spv::DecorationBlock:
      decorations_[target].block = true;
      break;
    case spv::DecorationBufferBlock:
      decorations_[target].buffer_block = true;
      break;
    case spv::DecorationNonWritable:
      decorations_[target].non_writable = true;
      break;
    case spv::DecorationNonReadable:
      decorations_[target].non_readable = true;
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

absl::Status Reflector::RecordMemberDecoration(absl::Span<const uint32_t> operands, size_t offset) {
  const uint32_t target = operands[0];
  const uint32_t member = operands[1];
  const auto decoration = static_cast<spv::Decoration>(operands[2]);
  const absl::Span<const uint32_t> literals = operands.subspan(3);
  auto literal = [&]() -> absl::StatusOr<uint32_t> {
    if (literals.empty()) {
      return Malformed(offset, absl::StrCat("decoration ", operands[2], " on member ", member, " of %",
                                            target, " has no value"));
    }
    return literals[0];
  };
  const std::pair<uint32_t, uint32_t> key(target, member);
  switch (decoration) {
    case spv::DecorationOffset: {
      CAUSEWAY_ASSIGN_OR_RETURN(member_decorations_[key].offset, literal());
      break;
    }
    case spv::DecorationMatrixStride: {
      CAUSEWAY_ASSIGN_OR_RETURN(member_decorations_[key].matrix_stride, literal());
      break;
    }
    case spv::DecorationRowMajor:
      member_decorations_[key].row_major = true;
      break;
    case spv::DecorationColMajor:
      member_decorations_[key].row_major = false;
      break;
    case spv::DecorationNonWritable:
      member_decorations_[key].non_writable = true;
      break;
    case spv::DecorationNonReadable:
      member_decorations_[key].non_readable = true;
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

absl::StatusOr<KernelReflection> Reflector::Build() {
  std::vector<const EntryPoint*> compute;
  for (const EntryPoint& entry : entry_points_) {
    if (entry.model == spv::ExecutionModelGLCompute) compute.push_back(&entry);
  }
  if (compute.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("module has no GLCompute entry point (it has ",
                                                   entry_points_.size(),
                                                   " entry points of other execution models)"));
  }
  if (compute.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module has ", compute.size(), " GLCompute entry points (",
        absl::StrJoin(compute, ", ",
                      [](std::string* out, const EntryPoint* e) { absl::StrAppend(out, "'", e->name, "'"); }),
        "), expected exactly one"));
  }
  if (!functions_.contains(compute[0]->id)) {
    return absl::InvalidArgumentError(absl::StrCat("entry point '", compute[0]->name, "' names %",
                                                   compute[0]->id,
                                                   ", which is not a function defined in the module"));
  }
  KernelReflection reflection;
  reflection.entry_point = compute[0]->name;
  CAUSEWAY_RETURN_IF_ERROR(ReflectLocalSize(compute[0]->id, reflection));
  CAUSEWAY_RETURN_IF_ERROR(ReflectSpecConstants(reflection));
  CAUSEWAY_RETURN_IF_ERROR(ReflectVariables(reflection));
  CAUSEWAY_RETURN_IF_ERROR(ReflectSharedMemory(reflection));
  return reflection;
}

absl::StatusOr<std::pair<uint32_t, std::optional<uint32_t>>> Reflector::SizeConstant(uint32_t id) const {
  const Definition* constant = Find(id);
  if (constant != nullptr && constant->opcode == spv::OpSpecConstantOp) {
    return absl::UnimplementedError(
        absl::StrCat("workgroup size dimension ", Describe(id),
                     " is an OpSpecConstantOp expression, which reflection cannot evaluate"));
  }
  if (constant == nullptr ||
      (constant->opcode != spv::OpConstant && constant->opcode != spv::OpSpecConstant)) {
    return absl::InvalidArgumentError(
        absl::StrCat("workgroup size dimension ", Describe(id), " is not an integer constant"));
  }
  const Definition* type = FindType(constant->result_type);
  if (type == nullptr || type->opcode != spv::OpTypeInt || type->operands[0] != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("workgroup size dimension ", Describe(id), " is not a 32-bit integer constant"));
  }
  std::optional<uint32_t> spec_id;
  if (constant->opcode == spv::OpSpecConstant) {
    if (const Decorations* d = FindDecorations(id)) spec_id = d->spec_id;
  }
  return std::make_pair(constant->operands[0], spec_id);
}

absl::Status Reflector::ReflectLocalSize(uint32_t entry, KernelReflection& reflection) {
  bool found = false;
  for (const ExecutionMode& mode : execution_modes_) {
    if (mode.entry != entry) continue;
    if (mode.mode != spv::ExecutionModeLocalSize && mode.mode != spv::ExecutionModeLocalSizeId) {
      continue;
    }
    if (mode.operands.size() < 3) {
      return Malformed(mode.offset, "LocalSize execution mode with fewer than 3 operands");
    }
    for (int d = 0; d < 3; ++d) {
      if (mode.mode == spv::ExecutionModeLocalSize) {
        reflection.local_size[d] = mode.operands[d];
        reflection.local_size_spec_id[d].reset();
      } else {
        CAUSEWAY_ASSIGN_OR_RETURN(auto dimension, SizeConstant(mode.operands[d]));
        reflection.local_size[d] = dimension.first;
        reflection.local_size_spec_id[d] = dimension.second;
      }
    }
    found = true;
  }
  // The WorkgroupSize built-in, when present, overrides the execution mode.
  for (uint32_t id : workgroup_size_ids_) {
    const Definition* composite = Find(id);
    if (composite == nullptr || (composite->opcode != spv::OpConstantComposite &&
                                 composite->opcode != spv::OpSpecConstantComposite)) {
      return absl::InvalidArgumentError(absl::StrCat("BuiltIn WorkgroupSize decorates ", Describe(id),
                                                     ", which is not a constant composite"));
    }
    if (composite->operands.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat("BuiltIn WorkgroupSize ", Describe(id), " has ",
                                                     composite->operands.size(), " components, expected 3"));
    }
    for (int d = 0; d < 3; ++d) {
      CAUSEWAY_ASSIGN_OR_RETURN(auto dimension, SizeConstant(composite->operands[d]));
      reflection.local_size[d] = dimension.first;
      reflection.local_size_spec_id[d] = dimension.second;
    }
    found = true;
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("entry point '", reflection.entry_point,
                     "' declares no workgroup size (no LocalSize or LocalSizeId execution "
                     "mode and no WorkgroupSize built-in)"));
  }
  return absl::OkStatus();
}

absl::Status Reflector::ReflectSpecConstants(KernelReflection& reflection) {
  absl::flat_hash_map<uint32_t, uint32_t> id_by_spec_id;
  for (uint32_t id : spec_constant_ids_) {
    const Decorations* decorations = FindDecorations(id);
    // Without a SpecId the constant cannot be specialized: not an input.
    if (decorations == nullptr || !decorations->spec_id) continue;
    const uint32_t spec_id = *decorations->spec_id;
    const Definition& constant = *Find(id);
    const Definition* type = FindType(constant.result_type);
    SpecConstant spec{spec_id, SpecConstantType::kBool, 0, NameOf(id)};
    if (constant.opcode == spv::OpSpecConstantTrue || constant.opcode == spv::OpSpecConstantFalse) {
      if (type == nullptr || type->opcode != spv::OpTypeBool) {
        return absl::InvalidArgumentError(
            absl::StrCat("boolean specialization constant ", Describe(id), " does not have a bool type"));
      }
      spec.type = SpecConstantType::kBool;
      spec.default_bits = constant.opcode == spv::OpSpecConstantTrue ? 1 : 0;
    } else {
      if (type == nullptr || (type->opcode != spv::OpTypeInt && type->opcode != spv::OpTypeFloat)) {
        return absl::InvalidArgumentError(
            absl::StrCat("specialization constant ", Describe(id), " does not have a scalar numeric type"));
      }
      if (type->operands[0] != 32) {
        return absl::UnimplementedError(
            absl::StrCat("specialization constant ", Describe(id), " (SpecId ", spec_id, ") is ",
                         type->operands[0], "-bit; only bool and 32-bit int, uint and float are supported"));
      }
      if (type->opcode == spv::OpTypeFloat) {
        spec.type = SpecConstantType::kFloat32;
      } else {
        spec.type = type->operands[1] != 0 ? SpecConstantType::kInt32 : SpecConstantType::kUint32;
      }
      spec.default_bits = constant.operands[0];
    }
    auto [it, inserted] = id_by_spec_id.emplace(spec_id, id);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("SpecId ", spec_id, " is given to both ",
                                                     Describe(it->second), " and ", Describe(id)));
    }
    reflection.spec_constants.push_back(std::move(spec));
  }
  std::sort(reflection.spec_constants.begin(), reflection.spec_constants.end(),
            [](const SpecConstant& a, const SpecConstant& b) { return a.id < b.id; });
  return absl::OkStatus();
}

absl::Status Reflector::ReflectVariables(KernelReflection& reflection) {
  for (const Variable& variable : variables_) {
    const bool is_buffer = variable.storage_class == spv::StorageClassUniform ||
                           variable.storage_class == spv::StorageClassStorageBuffer;
    const bool is_push_constant = variable.storage_class == spv::StorageClassPushConstant;
    const Decorations* decorations = FindDecorations(variable.id);
    if (variable.storage_class == spv::StorageClassUniformConstant) {
      if (decorations != nullptr && decorations->binding) {
        return absl::UnimplementedError(
            absl::StrCat("variable ", Describe(variable.id), " (binding ", *decorations->binding,
                         ") is an image, sampler or acceleration structure; kernels may "
                         "only bind storage and uniform buffers"));
      }
      continue;
    }
    if (!is_buffer && !is_push_constant) continue;

    const Definition* pointer = FindType(variable.pointer_type);
    if (pointer == nullptr || pointer->opcode != spv::OpTypePointer) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", Describe(variable.id), " does not have a pointer type"));
    }
    const uint32_t pointee_id = pointer->operands[1];
    const Definition* pointee = FindType(pointee_id);
    if (pointee != nullptr &&
        (pointee->opcode == spv::OpTypeArray || pointee->opcode == spv::OpTypeRuntimeArray)) {
      return absl::UnimplementedError(absl::StrCat(
          "variable ", Describe(variable.id), " is an array of blocks; descriptor arrays are not supported"));
    }
    if (pointee == nullptr || pointee->opcode != spv::OpTypeStruct) {
      return absl::InvalidArgumentError(absl::StrCat("variable ", Describe(variable.id), " points to ",
                                                     Describe(pointee_id), ", which is not a struct"));
    }
    if (is_buffer) {
      CAUSEWAY_RETURN_IF_ERROR(ReflectBuffer(variable, pointee_id, reflection.bindings));
    } else {
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t size, StructSize(pointee_id, 0));
      if (size > UINT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("push-constant block ", Describe(pointee_id), " is ", size, " bytes"));
      }
      reflection.push_constant_size = std::max(reflection.push_constant_size, static_cast<uint32_t>(size));
    }
  }
  std::sort(reflection.bindings.begin(), reflection.bindings.end(),
            [](const KernelBinding& a, const KernelBinding& b) {
              return std::tie(a.set, a.binding) < std::tie(b.set, b.binding);
            });
  return absl::OkStatus();
}

// Adds `terms` times `factor` to `into`, merging terms of the same SpecIds.
absl::Status AddTerms(const std::vector<SharedMemoryTerm>& terms, uint64_t factor,
                      std::optional<uint32_t> spec_id, std::vector<SharedMemoryTerm>& into) {
  for (SharedMemoryTerm t : terms) {
    if (__builtin_mul_overflow(t.bytes, factor, &t.bytes)) {
      return absl::InvalidArgumentError("the module's workgroup memory overflows 64 bits");
    }
    if (spec_id)
      t.spec_ids.insert(std::upper_bound(t.spec_ids.begin(), t.spec_ids.end(), *spec_id), *spec_id);
    auto same = std::find_if(into.begin(), into.end(),
                             [&t](const SharedMemoryTerm& u) { return u.spec_ids == t.spec_ids; });
    if (same == into.end()) {
      if (into.size() == kMaxSharedMemoryTerms) {
        return absl::UnimplementedError(absl::StrCat("the module's workgroup memory depends on more than ",
                                                     kMaxSharedMemoryTerms,
                                                     " products of specialization constants"));
      }
      into.push_back(std::move(t));
    } else if (__builtin_add_overflow(same->bytes, t.bytes, &same->bytes)) {
      return absl::InvalidArgumentError("the module's workgroup memory overflows 64 bits");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const Definition*> Reflector::TypeAt(uint32_t type_id, int depth) const {
  if (depth > kMaxTypeDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("type ", Describe(type_id), " is nested more than ", kMaxTypeDepth, " levels deep"));
  }
  const Definition* type = FindType(type_id);
  if (type == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(type_id), " is used as a type but is not one"));
  }
  return type;
}

absl::StatusOr<std::vector<SharedMemoryTerm>> Reflector::SharedTerms(uint32_t type_id, int depth) {
  if (auto it = shared_terms_.find(type_id); it != shared_terms_.end()) return it->second;
  CAUSEWAY_ASSIGN_OR_RETURN(const Definition* type, TypeAt(type_id, depth));
  std::vector<SharedMemoryTerm> terms;
  switch (type->opcode) {
    case spv::OpTypeBool:
      terms.push_back({4, {}});
      break;
    case spv::OpTypeInt:
    case spv::OpTypeFloat: {
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t bytes, SizeOf(type_id, nullptr, depth));
      terms.push_back({bytes, {}});
      break;
    }
    case spv::OpTypeVector:
    case spv::OpTypeMatrix: {
      CAUSEWAY_ASSIGN_OR_RETURN(std::vector<SharedMemoryTerm> part,
                                SharedTerms(type->operands[0], depth + 1));
      CAUSEWAY_RETURN_IF_ERROR(AddTerms(part, type->operands[1], std::nullopt, terms));
      break;
    }
    case spv::OpTypeArray: {
      CAUSEWAY_ASSIGN_OR_RETURN(std::vector<SharedMemoryTerm> element,
                                SharedTerms(type->operands[0], depth + 1));
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t length, ArrayLength(type->operands[1]));
      const Definition* constant = Find(type->operands[1]);
      const Decorations* d = FindDecorations(type->operands[1]);
      if (constant->opcode == spv::OpSpecConstant && d != nullptr && d->spec_id) {
        CAUSEWAY_RETURN_IF_ERROR(AddTerms(element, 1, *d->spec_id, terms));
      } else {
        CAUSEWAY_RETURN_IF_ERROR(AddTerms(element, length, std::nullopt, terms));
      }
      break;
    }
    case spv::OpTypeStruct:
      for (uint32_t member : type->operands) {
        CAUSEWAY_ASSIGN_OR_RETURN(std::vector<SharedMemoryTerm> part, SharedTerms(member, depth + 1));
        CAUSEWAY_RETURN_IF_ERROR(AddTerms(part, 1, std::nullopt, terms));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("type ", Describe(type_id), " (opcode ",
                                                     static_cast<uint32_t>(type->opcode),
                                                     ") has no size in workgroup memory"));
  }
  shared_terms_[type_id] = terms;
  return terms;
}

absl::Status Reflector::ReflectSharedMemory(KernelReflection& reflection) {
  for (const Variable& variable : variables_) {
    if (variable.storage_class != spv::StorageClassWorkgroup) continue;
    const Definition* pointer = FindType(variable.pointer_type);
    if (pointer == nullptr || pointer->opcode != spv::OpTypePointer) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", Describe(variable.id), " does not have a pointer type"));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(std::vector<SharedMemoryTerm> terms, SharedTerms(pointer->operands[1], 0));
    CAUSEWAY_RETURN_IF_ERROR(AddTerms(terms, 1, std::nullopt, reflection.shared_memory));
  }
  return absl::OkStatus();
}

absl::Status Reflector::ReflectBuffer(const Variable& variable, uint32_t struct_id,
                                      std::vector<KernelBinding>& bindings) {
  const Decorations* decorations = FindDecorations(variable.id);
  if (decorations == nullptr || !decorations->set || !decorations->binding) {
    return absl::InvalidArgumentError(absl::StrCat("buffer variable ", Describe(variable.id),
                                                   " lacks a DescriptorSet or Binding decoration"));
  }
  const Decorations* block = FindDecorations(struct_id);
  KernelBinding binding;
  binding.set = *decorations->set;
  binding.binding = *decorations->binding;
  if (variable.storage_class == spv::StorageClassStorageBuffer) {
    binding.kind = BindingKind::kStorageBuffer;
  } else if (block != nullptr && block->buffer_block) {
    binding.kind = BindingKind::kStorageBuffer;
  } else if (block != nullptr && block->block) {
    binding.kind = BindingKind::kUniformBuffer;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("uniform variable ", Describe(variable.id), " has type ",
                                                   Describe(struct_id),
                                                   ", decorated neither Block nor BufferBlock"));
  }

  const size_t member_count = FindType(struct_id)->operands.size();
  bool all_non_writable = member_count > 0;
  bool all_non_readable = member_count > 0;
  for (uint32_t i = 0; i < member_count; ++i) {
    const MemberDecorations* member = FindMember(struct_id, i);
    all_non_writable = all_non_writable && member != nullptr && member->non_writable;
    all_non_readable = all_non_readable && member != nullptr && member->non_readable;
  }
  binding.read_only =
      binding.kind == BindingKind::kUniformBuffer || decorations->non_writable || all_non_writable;
  binding.write_only = decorations->non_readable || all_non_readable;
  CAUSEWAY_ASSIGN_OR_RETURN(binding.min_size, StructSize(struct_id, 0));
  binding.name = NameOf(variable.id);
  if (binding.name.empty()) binding.name = NameOf(struct_id);

  // Several variables may alias one binding; they must agree on its kind.
  for (KernelBinding& existing : bindings) {
    if (existing.set != binding.set || existing.binding != binding.binding) {
      continue;
    }
    if (existing.kind != binding.kind) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "set %u binding %u is declared both as a %s ('%s') and as a %s "
          "('%s')",
          binding.set, binding.binding,
          existing.kind == BindingKind::kStorageBuffer ? "storage buffer" : "uniform buffer", existing.name,
          binding.kind == BindingKind::kStorageBuffer ? "storage buffer" : "uniform buffer", binding.name));
    }
    existing.read_only = existing.read_only && binding.read_only;
    existing.write_only = existing.write_only && binding.write_only;
    existing.min_size = std::max(existing.min_size, binding.min_size);
    return absl::OkStatus();
  }
  bindings.push_back(std::move(binding));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Reflector::ArrayLength(uint32_t id) const {
  const Definition* constant = Find(id);
  if (constant != nullptr && constant->opcode == spv::OpSpecConstantOp) {
    return absl::UnimplementedError(
        absl::StrCat("array length ", Describe(id),
                     " is an OpSpecConstantOp expression, which reflection cannot evaluate"));
  }
  if (constant == nullptr ||
      (constant->opcode != spv::OpConstant && constant->opcode != spv::OpSpecConstant)) {
    return absl::InvalidArgumentError(
        absl::StrCat("array length ", Describe(id), " is not an integer constant"));
  }
  const Definition* type = FindType(constant->result_type);
  if (type == nullptr || type->opcode != spv::OpTypeInt ||
      (type->operands[0] != 32 && type->operands[0] != 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("array length ", Describe(id), " is not a 32- or 64-bit integer constant"));
  }
  const size_t value_words = type->operands[0] / 32;
  if (constant->operands.size() != value_words) {
    return absl::InvalidArgumentError(absl::StrCat("array length ", Describe(id), " has ",
                                                   constant->operands.size(), " value words, expected ",
                                                   value_words));
  }
  const bool is_signed = type->operands[1] != 0;
  uint64_t value = constant->operands[0];
  if (value_words == 2) value |= uint64_t{constant->operands[1]} << 32;
  const bool negative = is_signed && (value_words == 2 ? (value >> 63) != 0 : (value >> 31) != 0);
  if (negative) {
    return absl::InvalidArgumentError(absl::StrCat("array length ", Describe(id), " is negative"));
  }
  return value;
}

absl::StatusOr<uint64_t> Reflector::SizeOf(uint32_t type_id, const MemberDecorations* member, int depth) {
  CAUSEWAY_ASSIGN_OR_RETURN(const Definition* type, TypeAt(type_id, depth));
  auto overflow = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat("the size of type ", Describe(type_id), " overflows 64 bits"));
  };
  uint64_t size = 0;
  switch (type->opcode) {
    case spv::OpTypeInt:
    case spv::OpTypeFloat: {
      const uint32_t width = type->operands[0];
      if (width == 0 || width % 8 != 0 || width > 64) {
        return absl::InvalidArgumentError(
            absl::StrCat("type ", Describe(type_id), " has an invalid width of ", width));
      }
      return width / 8;
    }
    case spv::OpTypeVector: {
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t component, SizeOf(type->operands[0], nullptr, depth + 1));
      if (__builtin_mul_overflow(component, type->operands[1], &size)) {
        return overflow();
      }
      return size;
    }
    case spv::OpTypeMatrix: {
      const uint32_t columns = type->operands[1];
      if (member != nullptr && member->matrix_stride) {
        const Definition* column = FindType(type->operands[0]);
        if (column == nullptr || column->opcode != spv::OpTypeVector) {
          return absl::InvalidArgumentError(
              absl::StrCat("matrix ", Describe(type_id), " has a non-vector column type"));
        }
        const uint32_t rows = column->operands[1];
        // The stride separates columns, or rows when row-major.
        if (__builtin_mul_overflow(uint64_t{*member->matrix_stride}, member->row_major ? rows : columns,
                                   &size)) {
          return overflow();
        }
        return size;
      }
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t column, SizeOf(type->operands[0], nullptr, depth + 1));
      if (__builtin_mul_overflow(column, columns, &size)) return overflow();
      return size;
    }
    case spv::OpTypeArray: {
      CAUSEWAY_ASSIGN_OR_RETURN(uint64_t length, ArrayLength(type->operands[1]));
      uint64_t stride = 0;
      if (const Decorations* d = FindDecorations(type_id); d != nullptr && d->array_stride) {
        stride = *d->array_stride;
      } else {
        CAUSEWAY_ASSIGN_OR_RETURN(stride, SizeOf(type->operands[0], member, depth + 1));
      }
      if (__builtin_mul_overflow(length, stride, &size)) return overflow();
      return size;
    }
    case spv::OpTypeRuntimeArray:
      return 0;  // Only the fixed part of a block has a size.
    case spv::OpTypeStruct:
      return StructSize(type_id, depth + 1);
    case spv::OpTypePointer:
      if (type->operands[0] == kStorageClassPhysicalStorageBuffer) return 8;
      break;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("type ", Describe(type_id), " (opcode ",
                                                 static_cast<uint32_t>(type->opcode),
                                                 ") has no size in a buffer or push-constant block"));
}

absl::StatusOr<uint64_t> Reflector::StructSize(uint32_t id, int depth) {
  if (auto it = struct_sizes_.find(id); it != struct_sizes_.end()) {
    return it->second;
  }
  if (depth > kMaxTypeDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("struct ", Describe(id), " is nested more than ", kMaxTypeDepth, " levels deep"));
  }
  if (!structs_in_progress_.insert(id).second) {
    return absl::InvalidArgumentError(absl::StrCat("struct ", Describe(id), " contains itself"));
  }
  const Definition& type = *FindType(id);
  uint64_t size = 0;
  for (uint32_t i = 0; i < type.operands.size(); ++i) {
    const uint32_t member_type = type.operands[i];
    const MemberDecorations* member = FindMember(id, i);
    if (member == nullptr || !member->offset) {
      structs_in_progress_.erase(id);
      return absl::InvalidArgumentError(
          absl::StrCat("member ", i, " of struct ", Describe(id), " has no Offset decoration"));
    }
    uint64_t end = *member->offset;
    const Definition* member_def = FindType(member_type);
    // A runtime array adds nothing to the fixed part, but the fixed part
    // reaches at least to where the array starts.
    if (member_def == nullptr || member_def->opcode != spv::OpTypeRuntimeArray) {
      absl::StatusOr<uint64_t> member_size = SizeOf(member_type, member, depth);
      if (!member_size.ok()) {
        structs_in_progress_.erase(id);
        return member_size.status();
      }
      if (__builtin_add_overflow(end, *member_size, &end)) {
        structs_in_progress_.erase(id);
        return absl::InvalidArgumentError(
            absl::StrCat("the size of struct ", Describe(id), " overflows 64 bits"));
      }
    }
    size = std::max(size, end);
  }
  structs_in_progress_.erase(id);
  struct_sizes_[id] = size;
  return size;
}

}  // namespace

absl::Status CheckSpirvHeader(absl::Span<const uint32_t> words) {
  if (words.empty()) {
    return absl::InvalidArgumentError("empty SPIR-V module: 0 words");
  }
  if (words[0] == kSwappedSpirvMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SPIR-V in the wrong byte order: magic 0x%08x is 0x%08x byte-swapped; "
                        "the module was written on a machine of the other endianness",
                        words[0], kSpirvMagic));
  }
  if (words[0] != kSpirvMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not SPIR-V: magic 0x%08x (expected 0x%08x)", words[0], kSpirvMagic));
  }
  if (words.size() < kHeaderWords) {
    return absl::InvalidArgumentError(absl::StrCat("truncated SPIR-V: ", words.size(),
                                                   words.size() == 1 ? " word is" : " words are",
                                                   " shorter than the 5-word header"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KernelReflection> ReflectSpirv(absl::Span<const uint32_t> words) {
  Reflector reflector(words);
  CAUSEWAY_RETURN_IF_ERROR(reflector.Parse());
  return reflector.Build();
}

std::array<uint32_t, 3> ResolveLocalSize(const KernelReflection& reflection,
                                         const absl::flat_hash_map<uint32_t, uint32_t>& spec_values) {
  std::array<uint32_t, 3> size = reflection.local_size;
  for (int d = 0; d < 3; ++d) {
    if (!reflection.local_size_spec_id[d]) continue;
    auto it = spec_values.find(*reflection.local_size_spec_id[d]);
    if (it != spec_values.end()) size[d] = it->second;
  }
  return size;
}

uint64_t ResolveSharedMemory(const KernelReflection& reflection,
                             const absl::flat_hash_map<uint32_t, uint32_t>& spec_values) {
  uint64_t total = 0;
  for (const SharedMemoryTerm& t : reflection.shared_memory) {
    uint64_t bytes = t.bytes;
    for (uint32_t id : t.spec_ids) {
      uint64_t value = 0;
      if (auto it = spec_values.find(id); it != spec_values.end()) {
        value = it->second;
      } else {
        for (const SpecConstant& c : reflection.spec_constants) {
          if (c.id == id) value = c.default_bits;
        }
      }
      if (__builtin_mul_overflow(bytes, value, &bytes)) return UINT64_MAX;
    }
    if (__builtin_add_overflow(total, bytes, &total)) return UINT64_MAX;
  }
  return total;
}

}  // namespace causeway
