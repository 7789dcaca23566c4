// The bootstrap key-value store. The Python layer adapts torch's c10d store (a PrefixStore scoped
// to the process group) to this interface; C++ tests may use any implementation.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dicomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists or `timeout` passes (then throws TimeoutError naming the key).
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Whether the key exists now, without waiting.
  virtual bool check(const std::string& key) = 0;
  // Adds `delta` to the integer at `key` (0 if absent) and returns the sum, atomically.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

}  // namespace dicomm
