// Runs a libFuzzer target once over every file of the directories (or the
// files) named on the command line: the seed corpus as a regression test
// where libFuzzer is not available (g++ builds). Fails when it finds no
// input, so that an empty or misnamed corpus cannot pass.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// Runs the target on the contents of `path`; false if it cannot be read.
bool RunFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "corpus: cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    std::error_code error;
    std::vector<fs::path> files;
    if (fs::is_directory(argv[i], error)) {
      for (const fs::directory_entry& entry : fs::directory_iterator(argv[i], error)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(argv[i]);
    }
    if (error) {
      std::fprintf(stderr, "corpus: cannot list %s: %s\n", argv[i], error.message().c_str());
      return 1;
    }
    for (const fs::path& file : files) {
      if (!RunFile(file)) return 1;
      ++inputs;
    }
  }
  std::printf("corpus: ran %zu inputs\n", inputs);
  if (inputs == 0) {
    std::fprintf(stderr, "corpus: no inputs found\n");
    return 1;
  }
  return 0;
}
