// The main() of a fuzz target when it is built without libFuzzer (the gcc
// release and ASan builds): it feeds every file of the directories (or
// files) named on the command line to LLVMFuzzerTestOneInput once, so the
// seed corpus and every committed regression run in every build as a
// plain meson test.
//
//   fuzz_header_replay tests/fuzz/corpus/header tests/fuzz/regressions/header
//
// A directory that does not exist is reported and skipped (a target may
// have no regressions yet), but replaying nothing at all fails: a test that
// feeds no input cannot fail.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace fs = std::filesystem;

namespace {

bool replay(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
    return false;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // An exact-size heap copy, as libFuzzer does, so AddressSanitizer sees a
  // read one byte past the input.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
  std::copy(bytes.begin(), bytes.end(), copy.get());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(copy.get(), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::error_code ec;
    if (fs::is_regular_file(arg, ec)) {
      if (!replay(arg)) return 1;
      ++replayed;
      continue;
    }
    if (!fs::is_directory(arg, ec)) {
      std::fprintf(stderr, "replay: %s does not exist, skipped\n", arg.c_str());
      continue;
    }
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(arg))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());  // the same order on every run
    for (const fs::path& f : files) {
      if (!replay(f)) return 1;
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "replay: no input files found; nothing was tested\n");
    return 1;
  }
  std::printf("replayed %zu inputs, no failure\n", replayed);
  return 0;
}
