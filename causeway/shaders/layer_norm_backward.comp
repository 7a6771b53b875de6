// layer_norm_backward: the gradients of layer_norm (f32, row-major [rows, cols]),
// with xhat = (x - mean[r]) * rstd[r] and g = dy * gamma:
//   pass 0 (spec 1 = 0): dx[r, c] = rstd[r] * (g - mean_c(g) - xhat * mean_c(g * xhat))
//                        in layer_norm's two forms (spec 2): a workgroup per
//                        row, or an invocation per row;
//   pass 1 (spec 1 = 1): dgamma[c] = sum_r dy * xhat,  dbeta[c] = sum_r dy
//                        kLanes invocations per column, lane l summing rows
//                        l, l + kLanes, ... in order, then the lanes' sums
//                        added in lane order; a workgroup takes wg / kLanes
//                        columns.
// Every sum has a fixed order, so results are reproducible run to run. Each
// pass writes only its own outputs; the two are independent, so a list may
// record them in either order.
//
// Bindings (set 0):  0: float dy[]      (readonly)  rows * cols
//                    1: float x[]       (readonly)  rows * cols (layer_norm's input)
//                    2: float gamma[]   (readonly)  cols
//                    3: float mean[]    (readonly)  rows (saved by layer_norm)
//                    4: float rstd[]    (readonly)  rows (saved by layer_norm)
//                    5: float dx[]      (writeonly) rows * cols (pass 0)
//                    6: float dgamma[]  (writeonly) cols (pass 1)
//                    7: float dbeta[]   (writeonly) cols (pass 1)
// Push constants:    uint rows; uint cols;
// Specialization:    constant 0 = workgroup size x (default 64, a multiple of
//                    kLanes, at most 1024);
//                    constant 1 = pass (0 dx, 1 dgamma and dbeta);
//                    constant 2 = pass 0's form (0 a workgroup per row, 1 an
//                    invocation per row).
// Dispatch:          pass 0: any number of workgroups >= 1, natural
//                    min(rows, 65535) x 1 x 1 (form 0) or
//                    min(ceil(rows / wg), 65535) x 1 x 1 (form 1); pass 1:
//                    any number >= 1, natural
//                    min(ceil(cols / (wg / kLanes)), 65535) x 1 x 1.
#version 450

const uint kMaxWorkgroupSize = 1024;
// Pass 1's invocations per column.
const uint kLanes = 4;

layout(local_size_x = 64, local_size_x_id = 0) in;
layout(constant_id = 1) const uint PASS = 0;
layout(constant_id = 2) const uint ROW_PER_INVOCATION = 0;

layout(set = 0, binding = 0, std430) readonly buffer DY { float dy[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 2, std430) readonly buffer Gamma { float gamma[]; };
layout(set = 0, binding = 3, std430) readonly buffer Mean { float mean[]; };
layout(set = 0, binding = 4, std430) readonly buffer Rstd { float rstd[]; };
layout(set = 0, binding = 5, std430) writeonly buffer DX { float dx[]; };
layout(set = 0, binding = 6, std430) writeonly buffer DGamma { float dgamma[]; };
layout(set = 0, binding = 7, std430) writeonly buffer DBeta { float dbeta[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
} p;

shared float partial[kMaxWorkgroupSize];
shared float partial2[kMaxWorkgroupSize];

// The sum of every invocation's `v`, returned to all of them. Call in uniform
// control flow.
float WorkgroupSum(float v) {
  const uint lid = gl_LocalInvocationIndex;
  barrier();
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

void RowGradientPerInvocation() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint row = gl_GlobalInvocationID.x; row < p.rows; row += stride) {
    const uint base = row * p.cols;
    const float mu = mean[row];
    const float r = rstd[row];
    float sg = 0.0, sgx = 0.0;
    for (uint c = 0; c < p.cols; ++c) {
      const float g = dy[base + c] * gamma[c];
      sg += g;
      sgx += g * (x[base + c] - mu) * r;
    }
    const float mean_g = sg / float(p.cols);
    const float mean_gx = sgx / float(p.cols);
    for (uint c = 0; c < p.cols; ++c) {
      const float g = dy[base + c] * gamma[c];
      const float xhat = (x[base + c] - mu) * r;
      dx[base + c] = r * (g - mean_g - xhat * mean_gx);
    }
  }
}

void RowGradient() {
  const uint lid = gl_LocalInvocationIndex;
  const uint wg = gl_WorkGroupSize.x;
  for (uint row = gl_WorkGroupID.x; row < p.rows; row += gl_NumWorkGroups.x) {
    const uint base = row * p.cols;
    const float mu = mean[row];
    const float r = rstd[row];
    float sg = 0.0, sgx = 0.0;
    for (uint c = lid; c < p.cols; c += wg) {
      const float g = dy[base + c] * gamma[c];
      sg += g;
      sgx += g * (x[base + c] - mu) * r;
    }
    const float mean_g = WorkgroupSum(sg) / float(p.cols);
    const float mean_gx = WorkgroupSum(sgx) / float(p.cols);
    for (uint c = lid; c < p.cols; c += wg) {
      const float g = dy[base + c] * gamma[c];
      const float xhat = (x[base + c] - mu) * r;
      dx[base + c] = r * (g - mean_g - xhat * mean_gx);
    }
  }
}

void ColumnGradient() {
  const uint lid = gl_LocalInvocationIndex;
  const uint per_group = gl_WorkGroupSize.x / kLanes;
  const uint lane = lid / per_group;
  const uint slot = lid % per_group;
  for (uint first = gl_WorkGroupID.x * per_group; first < p.cols; first += gl_NumWorkGroups.x * per_group) {
    const uint c = first + slot;
    float sg = 0.0, sb = 0.0;
    if (c < p.cols) {
      for (uint r = lane; r < p.rows; r += kLanes) {
        const uint i = r * p.cols + c;
        sg += dy[i] * (x[i] - mean[r]) * rstd[r];
        sb += dy[i];
      }
    }
    barrier();  // the previous columns' readers of partial are done
    partial[lid] = sg;
    partial2[lid] = sb;
    barrier();
    if (lane == 0 && c < p.cols) {
      for (uint l = 1; l < kLanes; ++l) {
        sg += partial[l * per_group + slot];
        sb += partial2[l * per_group + slot];
      }
      dgamma[c] = sg;
      dbeta[c] = sb;
    }
  }
}

void main() {
  if (PASS == 0 && ROW_PER_INVOCATION != 0) {
    RowGradientPerInvocation();
  } else if (PASS == 0) {
    RowGradient();
  } else {
    ColumnGradient();
  }
}
