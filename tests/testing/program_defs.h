// ProgramDefs built in C++ for tests, a part at a time (meshes, parameters,
// calls, reshards, all-reduces: defs a test may then break on purpose,
// where ProgramDefBuilder would refuse), and the spinner (a kernel that
// runs about as long as asked, for deadlines and cancels).
#ifndef CAUSEWAY_TESTS_TESTING_PROGRAM_DEFS_H_
#define CAUSEWAY_TESTS_TESTING_PROGRAM_DEFS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "causeway/runtime/kernel.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/program_def.pb.h"
#include "tests/testing/test_support.h"

namespace causeway::testing {

inline MeshDef* AddMesh(ProgramDef& def, const std::string& name, const std::vector<int>& dims,
                        const std::string& island = "") {
  MeshDef* m = def.add_meshes();
  m->set_name(name);
  m->mutable_dims()->Add(dims.begin(), dims.end());
  if (!island.empty()) m->set_island(island);
  return m;
}

inline ParameterDef* AddParameter(ProgramDef& def, const std::string& value, const std::string& mesh,
                                  const Shape& shape, Sharding sharding = Sharding::Replicated()) {
  ParameterDef* p = def.add_parameters();
  p->set_value(value);
  p->set_mesh(mesh);
  p->mutable_shape()->Add(shape.begin(), shape.end());
  if (!sharding.replicated()) *p->mutable_sharding() = ToDef(sharding);
  return p;
}

inline NodeDef* AddCall(ProgramDef& def, const std::string& node, const std::string& function,
                        const std::string& mesh, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs) {
  NodeDef* n = def.add_nodes();
  n->set_name(node);
  CallDef* c = n->mutable_call();
  c->set_function(function);
  c->set_mesh(mesh);
  for (const std::string& in : inputs) c->add_inputs(in);
  for (const std::string& out : outputs) c->add_outputs(out);
  return n;
}

inline NodeDef* AddReshard(ProgramDef& def, const std::string& node, const std::string& mesh,
                           const std::string& input, const std::string& output, Sharding sharding) {
  NodeDef* n = def.add_nodes();
  n->set_name(node);
  ReshardDef* r = n->mutable_reshard();
  r->set_mesh(mesh);
  r->set_input(input);
  r->set_output(output);
  *r->mutable_sharding() = ToDef(sharding);
  return n;
}

inline NodeDef* AddAllReduce(ProgramDef& def, const std::string& node, const std::string& mesh,
                             const std::string& input, const std::string& output,
                             CollectiveDef::ReduceOp op = CollectiveDef::SUM) {
  NodeDef* n = def.add_nodes();
  n->set_name(node);
  CollectiveDef* c = n->mutable_collective();
  c->set_kind(CollectiveDef::ALL_REDUCE);
  c->set_mesh(mesh);
  c->set_input(input);
  c->set_output(output);
  c->set_op(op);
  return n;
}

// The spin kernel (test_support.h) as the program "spinner" on a mesh "m"
// of one accelerator: input x (one i32, unused), output out (65 i32); `groups`
// workgroups sized to run about `length` on this machine's CPU driver (as
// measured in this process: an island running with LP_NUM_THREADS=0 takes
// up to twice as long).
inline ProgramDef SpinnerDef(uint32_t groups, absl::Duration length) {
  KernelStep step;
  step.kernel = ValueOrThrow(Kernel::FromGlsl("spin", kSpinGlsl));
  step.args = {0, 1};
  step.groups = {groups, 1, 1};
  step.push_constants = SpinPushConstants(SpinRoundsFor(groups, length));
  auto fn = ValueOrThrow(Function::Create("spin", {{{1}, DType::kI32}}, {{{65}, DType::kI32}}, {}, {step}));
  ProgramDef def;
  def.set_name("spinner");
  AddMesh(def, "m", {1});
  *def.add_functions() = ValueOrThrow(ToDef(*fn, "spin"));
  AddParameter(def, "x", "m", {1}, Sharding::Replicated());
  def.mutable_parameters(0)->set_dtype(I32);
  AddCall(def, "spin", "spin", "m", {"x"}, {"out"});
  def.add_outputs("out");
  return def;
}

}  // namespace causeway::testing

#endif  // CAUSEWAY_TESTS_TESTING_PROGRAM_DEFS_H_
