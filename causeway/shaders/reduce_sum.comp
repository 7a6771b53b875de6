// reduce_sum: one partial sum of x per workgroup (f32).
//
// Workgroup g sums its grid-stride share of x[0, count) and writes the sum to
// partial[g]. Summing a whole buffer takes two dispatches:
//   pass 1: x = input,    count = N,      G groups  -> partial[0, G)
//   pass 2: x = partials, count = G,      1 group   -> partial2[0]
// Every workgroup writes its slot, even when its share is empty (it writes 0),
// so `partial` must hold at least as many floats as workgroups dispatched.
//
// Bindings (set 0):  0: float x[]        (readonly)
//                    1: float partial[]  (writeonly)
// Push constants:    uint count;
// Specialization:    constant 0 = workgroup size x (default 256, at most 1024).
// Dispatch:          any number of workgroups G >= 1, G x 1 x 1; the natural
//                    choice is G = min(ceil(count / wg), 65535). Pass 2 is
//                    always a single workgroup (G = 1).
//
// Requires subgroup arithmetic in the compute stage
// (VkPhysicalDeviceSubgroupProperties::supportedOperations & ARITHMETIC_BIT).
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

// Upper bound of the workgroup size; shared memory is sized for it so the
// specialization constant can pick any size up to it.
const uint kMaxWorkgroupSize = 1024;

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) writeonly buffer Partial { float partial[]; };

layout(push_constant) uniform Params {
  uint count;
} p;

// One slot per subgroup. Subgroups have at least one invocation, so
// kMaxWorkgroupSize slots always suffice.
shared float subgroup_sums[kMaxWorkgroupSize];

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  float sum = 0.0;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    sum += x[i];
  }

  // Reduce within each subgroup, then across the subgroups' sums with a tree
  // in shared memory that also handles a non-power-of-two number of slots.
  sum = subgroupAdd(sum);
  if (subgroupElect()) {
    subgroup_sums[gl_SubgroupID] = sum;
  }
  // lavapipe (Mesa 22.3) reports gl_NumSubgroups rounded down when the
  // workgroup size is not a multiple of the subgroup size, though the last,
  // partial subgroup exists and writes its slot. No correct driver reports
  // fewer than ceil(size / gl_SubgroupSize) subgroups, so the larger of the
  // two is the true count everywhere.
  const uint num_subgroups =
      max(gl_NumSubgroups,
          (gl_WorkGroupSize.x + gl_SubgroupSize - 1) / gl_SubgroupSize);
  barrier();
  for (uint n = num_subgroups; n > 1;) {
    // Fold the upper `n - half_n` slots onto the lower ones. Reads are from
    // [half_n, n) and writes to [0, n - half_n), which never overlap.
    const uint half_n = (n + 1) / 2;
    if (gl_LocalInvocationIndex < n - half_n) {
      subgroup_sums[gl_LocalInvocationIndex] +=
          subgroup_sums[gl_LocalInvocationIndex + half_n];
    }
    barrier();
    n = half_n;
  }
  if (gl_LocalInvocationIndex == 0) {
    partial[gl_WorkGroupID.x] = subgroup_sums[0];
  }
}
