// sgd: one SGD step, in place (f32), for i < count:
//   momentum == 0:  p -= lr * g                           (velocity unread)
//   momentum != 0:  velocity = momentum * velocity + g;  p -= lr * velocity
// (PyTorch's SGD without dampening; velocity starts at zero).
//
// Bindings (set 0):  0: float p[]         (read-write) count
//                    1: float g[]         (readonly)   count
//                    2: float velocity[]  (read-write) count (momentum != 0;
//                                          otherwise bind any buffer, e.g. g)
// Push constants:    uint count; float lr; float momentum;
// Specialization:    constant 0 = workgroup size x (default 256).
// Dispatch:          any number of workgroups >= 1 (grid-stride loop); the
//                    natural choice is min(ceil(count / wg), 65535) x 1 x 1.
#version 450

layout(local_size_x = 256, local_size_x_id = 0) in;

layout(set = 0, binding = 0, std430) buffer P { float param[]; };
layout(set = 0, binding = 1, std430) readonly buffer G { float grad[]; };
layout(set = 0, binding = 2, std430) buffer Velocity { float velocity[]; };

layout(push_constant) uniform Params {
  uint count;
  float lr;
  float momentum;
} p;

void main() {
  const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride) {
    float step = grad[i];
    if (p.momentum != 0.0) {
      step = p.momentum * velocity[i] + step;
      velocity[i] = step;
    }
    param[i] -= p.lr * step;
  }
}
