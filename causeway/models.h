// Every public header of causeway::models (link that target, or causeway::causeway).
// The benchmark models: a decoder-only Transformer language model, its trainer and its text data.
#ifndef CAUSEWAY_MODELS_H_
#define CAUSEWAY_MODELS_H_

#include "causeway/models/text_data.h"    // IWYU pragma: export
#include "causeway/models/trainer.h"      // IWYU pragma: export
#include "causeway/models/transformer.h"  // IWYU pragma: export

#endif  // CAUSEWAY_MODELS_H_
