// How an array lies on a mesh: no Vulkan types, for causeway/client/client.h and
// planners.
#ifndef CAUSEWAY_SCHEDULER_SHARDING_H_
#define CAUSEWAY_SCHEDULER_SHARDING_H_

#include <string>

namespace causeway {

// How an array lies on a mesh. On a 2-D mesh, a split array is replicated
// along the other mesh axis.
struct Sharding {
  int array_axis = -1;  // -1: every device holds the whole array
  int mesh_axis = 0;
  static Sharding Replicated() { return {}; }
  static Sharding Split(int array_axis, int mesh_axis = 0) { return {array_axis, mesh_axis}; }
  bool replicated() const { return array_axis < 0; }
  bool operator==(const Sharding& o) const { return array_axis == o.array_axis && mesh_axis == o.mesh_axis; }
  std::string ToString() const;  // "replicated", "split(0 over 1)"
};

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_SHARDING_H_
