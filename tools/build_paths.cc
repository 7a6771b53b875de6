#include "tools/build_paths.h"

#include <filesystem>

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

std::string ShippedCorpus() {
  for (const std::string& dir : {SourceDirectory() + "/data", DataDirectory()}) {
    const std::string path = dir + "/kjv-genesis-exodus.txt";
    if (std::filesystem::exists(path)) return path;
  }
  return "data/kjv-genesis-exodus.txt";
}

}  // namespace causeway::cli
