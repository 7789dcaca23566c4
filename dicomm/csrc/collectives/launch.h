// Argument checks shared by the collectives, and the step that queues an algorithm on the
// communicator's collective thread inside a Session.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/session.h"
#include "collectives/signature.h"
#include "core/communicator.h"

namespace dicomm {

using Algorithm = std::function<void(Session&)>;

// Queues `algorithm` behind the communicator's earlier collectives; its messages carry
// `sig.encode()` as meta. The request fails with the algorithm's error (prefixed with the
// collective and rank) and a failed collective aborts the communicator. `what` names the
// collective in errors; empty means sig.describe().
RequestPtr launch(Communicator& comm, const Signature& sig, Algorithm algorithm,
                  std::string what = "");

// ValueError naming `arg` unless 0 <= root < size.
void check_root(const Communicator& comm, int root, const char* arg = "root");
// ValueError naming `arg` unless a list has exactly `expected` entries.
void check_length(size_t actual, size_t expected, const char* arg, const std::string& why);
// ValueError unless `ptr` is non-null when `bytes` > 0.
void check_buffer(uintptr_t ptr, size_t bytes, const char* arg);

inline void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
inline uint8_t* as_bytes(uintptr_t p) { return reinterpret_cast<uint8_t*>(p); }

// True when [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace dicomm
