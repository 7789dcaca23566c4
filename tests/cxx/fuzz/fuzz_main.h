// A stand-in for libFuzzer's driver where clang's -fsanitize=fuzzer is not available (GCC): each
// target defines LLVMFuzzerTestOneInput, and this main feeds it random inputs (the targets decode
// their bytes structurally, so random bytes make well-formed frames often) for a bounded time.
// Built with -DDICOMM_LIBFUZZER, the target links with libFuzzer's own main instead.
//
//   fuzz_tcp [seconds=10] [seed=1]     exits 0 after the time; a sanitizer aborts on a finding
//   fuzz_tcp FILE                      runs the one input in FILE (a finding to reproduce)
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#ifndef DICOMM_LIBFUZZER
int main(int argc, char** argv) {
  if (argc == 2) {
    if (std::FILE* f = std::fopen(argv[1], "rb")) {
      std::vector<uint8_t> one;
      for (int c; (c = std::fgetc(f)) != EOF;) one.push_back(static_cast<uint8_t>(c));
      std::fclose(f);
      LLVMFuzzerTestOneInput(one.data(), one.size());
      return 0;
    }
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 1u;
  std::mt19937_64 rng(seed);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  std::vector<uint8_t> input;
  while (std::chrono::steady_clock::now() < until) {
    input.resize(rng() % 512);
    for (auto& b : input) b = static_cast<uint8_t>(rng());
    // Each input is written where a finding can be replayed from (`fuzz_tcp FILE`).
    if (const char* keep = std::getenv("DICOMM_FUZZ_INPUT")) {
      if (std::FILE* f = std::fopen(keep, "wb")) {
        std::fwrite(input.data(), 1, input.size(), f);
        std::fclose(f);
      }
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
    ++runs;
  }
  std::printf("%llu runs in %.1f s\n", static_cast<unsigned long long>(runs), seconds);
  return 0;
}
#endif
