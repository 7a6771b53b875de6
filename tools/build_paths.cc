#include "tools/build_paths.h"

namespace causeway::cli {

std::string SourceDirectory() { return CAUSEWAY_SOURCE_DIR; }
std::string DataDirectory() { return CAUSEWAY_DATA_DIR; }
std::string LibexecDirectory() { return CAUSEWAY_LIBEXEC_DIR; }
std::string BuiltBenchDirectory() {
#ifdef CAUSEWAY_BENCH_DIR
  return CAUSEWAY_BENCH_DIR;
#else
  return "";
#endif
}

}  // namespace causeway::cli
