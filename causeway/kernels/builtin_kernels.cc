#include "causeway/kernels/builtin_kernels.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "causeway/shaders/builtin_shaders.h"

namespace causeway {

absl::StatusOr<std::shared_ptr<const Kernel>> BuiltinKernel(absl::string_view name) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache ABSL_GUARDED_BY(mu) =
      new absl::flat_hash_map<std::string, std::shared_ptr<const Kernel>>();
  absl::MutexLock lock(&mu);
  if (auto it = cache->find(name); it != cache->end()) return it->second;
  auto spirv = FindBuiltinShader(name);
  if (!spirv.has_value()) {
    return absl::NotFoundError(absl::StrCat("no built-in kernel '", name, "'; there are: ",
                                            absl::StrJoin(BuiltinKernelNames(), ", ")));
  }
  auto kernel = Kernel::FromSpirv(std::string(name), *spirv);
  if (!kernel.ok()) return kernel.status();
  (*cache)[std::string(name)] = *kernel;
  return *kernel;
}

std::vector<std::string> BuiltinKernelNames() {
  std::vector<std::string> names;
  for (const BuiltinShader& s : BuiltinShaders()) names.emplace_back(s.name);
  return names;
}

}  // namespace causeway
