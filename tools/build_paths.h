// Where this causeway was built from and installs to. The build writes these
// paths into build_paths.cc alone, so that every other source of the tools
// compiles the same wherever the tree is checked out (a compiler cache then
// hits across checkouts).
#ifndef CAUSEWAY_TOOLS_BUILD_PATHS_H_
#define CAUSEWAY_TOOLS_BUILD_PATHS_H_

#include <string>

namespace causeway::cli {

// The source tree it was built from (data/, BENCHMARKS.md).
std::string SourceDirectory();
// <prefix>/share/causeway and <prefix>/libexec/causeway.
std::string DataDirectory();
std::string LibexecDirectory();
// The build tree's benchmark binaries; "" when it was built without them.
std::string BuiltBenchDirectory();
// The shipped corpus (data/kjv-genesis-exodus.txt): beside the source tree,
// or installed in DataDirectory().
std::string ShippedCorpus();

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_BUILD_PATHS_H_
