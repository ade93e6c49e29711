// A libFuzzer-compatible driver for compilers without -fsanitize=fuzzer: runs every file given on the command
// line, then random mutations of them (byte flips, inserts, deletes, splices, JSON-token inserts) for
// -max_total_time=SECONDS (default 10) with a fixed seed. Usage: fuzz_request [-max_total_time=N] FILE|DIR...
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  double seconds = 10;
  std::vector<std::string> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("-max_total_time=", 0) == 0) {
      seconds = std::stod(a.substr(16));
      continue;
    }
    if (a[0] == '-') continue;  // other libFuzzer flags
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(a)) {
      for (const auto& e : std::filesystem::directory_iterator(a)) files.push_back(e.path());
    } else {
      files.push_back(a);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      seeds.push_back(ss.str());
    }
  }
  if (seeds.empty()) seeds.push_back("{}");
  for (const auto& s : seeds) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  static const char* tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "-1", "1e999", "0.5", "\"prompt\"",
                                 "\"messages\"", "\"role\"", "\"content\"", "\"max_tokens\"", "\"n\"", "\"stop\"", "\\u0000",
                                 "\\ud800", "\xff", "\xc3\x28", "\"stream_options\"", "\"logprobs\"", "{{", "{%", "\"top_p\""};
  std::mt19937_64 rng(12345);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  long long runs = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string s = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
      switch (rng() % 5) {
        case 0: if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng()); break;
        case 1: s.insert(pos, 1, static_cast<char>(rng())); break;
        case 2: if (!s.empty() && pos < s.size()) s.erase(pos, 1 + rng() % 8); break;
        case 3: s.insert(pos, tokens[rng() % (sizeof(tokens) / sizeof(tokens[0]))]); break;
        default: {
          const std::string& o = seeds[rng() % seeds.size()];
          if (!o.empty()) s.insert(pos, o.substr(rng() % o.size(), 1 + rng() % 32));
        }
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    ++runs;
  }
  std::printf("fuzz_request: %lld runs in %.0f s, no crash\n", runs, seconds);
  return 0;
}
