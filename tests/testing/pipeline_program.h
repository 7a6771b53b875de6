// A small program that exercises every kind of node, built with
// ProgramBuilder: the C++ twin of the pipeline text in program_def_test.cc
// and program_file_test.cc (both check that their text builds the same
// program). On two meshes a and b of 2 devices each:
//   s = x + y          (add on a; x, y [8, 16] split by rows)
//   t = 0.5 s          (scale on a)
//   t_full = t         (reshard on a, replicated)
//   u = t_full * w     (matmul on b; w [16, 16] replicated)
//   u_split = u        (reshard on b, split by rows)
//   v = all-reduce(u_split)
//   out = v + 3 v      (repeated_add x3 on b)
// Outputs: out, t_full.
#ifndef CAUSEWAY_TESTS_TESTING_PIPELINE_PROGRAM_H_
#define CAUSEWAY_TESTS_TESTING_PIPELINE_PROGRAM_H_

#include <memory>

#include "absl/status/statusor.h"
#include "causeway/base/status.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/mesh.h"
#include "causeway/scheduler/program.h"

namespace causeway::testing {

inline absl::StatusOr<std::shared_ptr<const Program>> PipelineInCpp(const std::shared_ptr<Mesh>& a,
                                                                    const std::shared_ptr<Mesh>& b) {
  CAUSEWAY_ASSIGN_OR_RETURN(auto add, Function::Elementwise("add", {4, 16}));
  CAUSEWAY_ASSIGN_OR_RETURN(auto half, Function::Scale({4, 16}, 0.5f));
  CAUSEWAY_ASSIGN_OR_RETURN(auto mm, Function::Matmul(8, 16, 16));
  CAUSEWAY_ASSIGN_OR_RETURN(auto acc3, Function::RepeatedAdd({4, 16}, 3));
  ProgramBuilder pb("pipeline");
  pb.Parameter("x", a, {8, 16}, DType::kF32, Sharding::Split(0));
  pb.Parameter("y", a, {8, 16}, DType::kF32, Sharding::Split(0));
  pb.Parameter("w", b, {16, 16}, DType::kF32, Sharding::Replicated());
  pb.Call("sum", add, a, {"x", "y"}, {"s"});
  pb.Call("halve", half, a, {"s"}, {"t"});
  pb.Reshard("gather", a, "t", "t_full", Sharding::Replicated());
  pb.Call("matmul", mm, b, {"t_full", "w"}, {"u"});
  pb.Reshard("split", b, "u", "u_split", Sharding::Split(0));
  pb.AllReduce("allreduce", b, "u_split", "v", ReduceOp::kSum);
  pb.Call("accumulate", acc3, b, {"v", "v"}, {"out"});
  pb.Output("out");
  pb.Output("t_full");
  return pb.Build();
}

}  // namespace causeway::testing

#endif  // CAUSEWAY_TESTS_TESTING_PIPELINE_PROGRAM_H_
