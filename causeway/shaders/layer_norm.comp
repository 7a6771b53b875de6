// layer_norm: per row of a row-major [rows, cols] matrix (f32),
//   mean[r] = sum_c x[r, c] / cols
//   rstd[r] = 1 / sqrt(sum_c (x[r, c] - mean[r])^2 / cols + eps)
//   y[r, c] = (x[r, c] - mean[r]) * rstd[r] * gamma[c] + beta[c]
// (biased variance, as PyTorch's LayerNorm), saving mean and rstd for
// layer_norm_backward. Two forms, chosen by specialization constant 1:
//   0: one workgroup per row; its sums are trees in shared memory of a fixed
//      shape (for wide rows);
//   1: one invocation per row, summing in column order, with no barrier (for
//      narrow rows, where a workgroup's tree costs more barriers per row than
//      the row has elements to add).
// Either way every sum has a fixed order, so results are reproducible run to
// run.
//
// Bindings (set 0):  0: float x[]      (readonly)  rows * cols
//                    1: float gamma[]  (readonly)  cols
//                    2: float beta[]   (readonly)  cols
//                    3: float y[]      (writeonly) rows * cols
//                    4: float mean[]   (writeonly) rows
//                    5: float rstd[]   (writeonly) rows
// Push constants:    uint rows; uint cols; float eps;
// Specialization:    constant 0 = workgroup size x (default 64, at most 1024);
//                    constant 1 = form (0 a workgroup per row, 1 an invocation
//                    per row).
// Dispatch:          any number of workgroups >= 1 (form 0: workgroup g takes
//                    rows g, g + G, ...; the natural choice is
//                    min(rows, 65535) x 1 x 1. Form 1: invocation i takes rows
//                    i, i + G * wg, ...; natural min(ceil(rows / wg), 65535)).
#version 450

const uint kMaxWorkgroupSize = 1024;

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROW_PER_INVOCATION = 0;

layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) readonly buffer Gamma { float gamma[]; };
layout(set = 0, binding = 2, std430) readonly buffer Beta { float beta[]; };
layout(set = 0, binding = 3, std430) writeonly buffer Y { float y[]; };
layout(set = 0, binding = 4, std430) writeonly buffer Mean { float mean[]; };
layout(set = 0, binding = 5, std430) writeonly buffer Rstd { float rstd[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  float eps;
} p;

shared float partial[kMaxWorkgroupSize];

// The sum of every invocation's `v`, returned to all of them. Call in uniform
// control flow.
float WorkgroupSum(float v) {
  const uint lid = gl_LocalInvocationIndex;
  barrier();  // earlier readers of partial[0] are done
  partial[lid] = v;
  barrier();
  for (uint n = gl_WorkGroupSize.x; n > 1;) {
    const uint half_n = (n + 1) / 2;
    if (lid < n - half_n) partial[lid] += partial[lid + half_n];
    barrier();
    n = half_n;
  }
  return partial[0];
}

void RowPerInvocation() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint row = gl_GlobalInvocationID.x; row < p.rows; row += stride) {
    const uint base = row * p.cols;
    float s = 0.0;
    for (uint c = 0; c < p.cols; ++c) s += x[base + c];
    const float mu = s / float(p.cols);
    float sq = 0.0;
    for (uint c = 0; c < p.cols; ++c) {
      const float d = x[base + c] - mu;
      sq += d * d;
    }
    const float r = inversesqrt(sq / float(p.cols) + p.eps);
    for (uint c = 0; c < p.cols; ++c) {
      y[base + c] = (x[base + c] - mu) * r * gamma[c] + beta[c];
    }
    mean[row] = mu;
    rstd[row] = r;
  }
}

void WorkgroupPerRow() {
  const uint lid = gl_LocalInvocationIndex;
  const uint wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.cols;
    float s = 0.0;
    for (uint c = lid; c < p.cols; c += wg) s += x[base + c];
    const float mu = WorkgroupSum(s) / float(p.cols);
    float sq = 0.0;
    for (uint c = lid; c < p.cols; c += wg) {
      const float d = x[base + c] - mu;
      sq += d * d;
    }
    const float r = inversesqrt(WorkgroupSum(sq) / float(p.cols) + p.eps);
    for (uint c = lid; c < p.cols; c += wg) {
      y[base + c] = (x[base + c] - mu) * r * gamma[c] + beta[c];
    }
    if (lid == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
  }
}

void main() {
  if (ROW_PER_INVOCATION != 0) {
    RowPerInvocation();
  } else {
    WorkgroupPerRow();
  }
}
