// Every public header of causeway::kernels (link that target, or causeway::causeway).
// The kernel library: op plans, built-in kernel ops, nn and attention ops, and their CPU references.
#ifndef CAUSEWAY_KERNELS_H_
#define CAUSEWAY_KERNELS_H_

#include "causeway/kernels/attention_ops.h"        // IWYU pragma: export
#include "causeway/kernels/attention_reference.h"  // IWYU pragma: export
#include "causeway/kernels/builtin_kernels.h"      // IWYU pragma: export
#include "causeway/kernels/nn_ops.h"               // IWYU pragma: export
#include "causeway/kernels/nn_reference.h"         // IWYU pragma: export
#include "causeway/kernels/op_plan.h"              // IWYU pragma: export
#include "causeway/kernels/ops.h"                  // IWYU pragma: export
#include "causeway/kernels/reference.h"            // IWYU pragma: export

#endif  // CAUSEWAY_KERNELS_H_
