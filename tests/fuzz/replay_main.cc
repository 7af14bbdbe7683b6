// Replays fuzz inputs through the ingress path without libFuzzer (a plain GCC build, with or without
// sanitizers): the seed corpus and every input that once crashed (tests/fuzz/regressions) run in the
// normal test suite. Also writes the seed corpus.
//   ingress_fuzz_replay [--strict] FILE|DIR... replays each file (each regular file of a DIR); --strict:
//                                              fails unless every packet of every input reaches a QP
//   ingress_fuzz_replay --make-seeds DIR PCAP  writes the seed corpus into DIR (created if missing)
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/ingress.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc == 4 && std::string(argv[1]) == "--make-seeds") {
    std::error_code ec;
    fs::create_directories(argv[2], ec);
    std::string error;
    const int n = softrdma::fuzz::write_seeds(argv[2], argv[3], &error);
    if (n < 0) {
      std::fprintf(stderr, "ingress_fuzz_replay: %s\n", error.c_str());
      return 1;
    }
    std::printf("wrote %d seed inputs into %s\n", n, argv[2]);
    return 0;
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE|DIR... | --make-seeds DIR PCAP\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> files;
  const bool strict = std::string(argv[1]) == "--strict";
  for (int i = strict ? 2 : 1; i < argc; ++i) {
    std::error_code ec;
    if (fs::is_directory(argv[i], ec)) {
      for (const auto& e : fs::directory_iterator(argv[i], ec))
        if (e.is_regular_file(ec)) files.push_back(e.path());
    } else if (fs::is_regular_file(argv[i], ec)) {
      files.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "ingress_fuzz_replay: %s: no such file or directory\n", argv[i]);
      return 1;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "ingress_fuzz_replay: no inputs\n");
    return 1;
  }
  softrdma::fuzz::IngressStats total;
  int bad = 0;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto st = softrdma::fuzz::run_ingress(bytes.data(), bytes.size());
    if (strict && (st.records == 0 || st.reached != st.records)) {
      std::fprintf(stderr, "%s: %zu packets, %zu passed the ICRC check, %zu reached a QP\n", f.c_str(), st.records,
                   st.checked, st.reached);
      ++bad;
    }
    total.records += st.records;
    total.checked += st.checked;
    total.reached += st.reached;
    total.completions += st.completions;
  }
  std::printf("replayed %zu inputs: %zu packets, %zu passed the ICRC check, %zu reached a QP, %zu successful "
              "completions\n",
              files.size(), total.records, total.checked, total.reached, total.completions);
  return bad ? 1 : 0;
}
