// The 64-bit signature a collective puts in every message's `meta` word, so that ranks which
// called different collectives (or the same one with different dtype, op, size or root) fail with
// a MismatchError at the first message they exchange instead of reading garbage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"

namespace dicomm {

enum class CollectiveKind : uint8_t {
  kBroadcast = 1, kAllReduce, kReduce, kAllGather, kGather, kScatter, kReduceScatter, kAllToAll,
  kBarrier,
};
const char* collective_name(CollectiveKind kind);

struct Signature {
  CollectiveKind kind = CollectiveKind::kBroadcast;
  DataType dtype = DataType::kUInt8;  // byte-moving collectives count bytes
  ReduceOp op = ReduceOp::kSum;       // only meaningful for reductions
  uint64_t count = 0;                 // elements (reductions) or bytes (the rest), per message
  int root = -1;                      // -1 for collectives without a root

  // Layout, high to low bits: kind 4 | dtype 4 | op 4 | root+1 16 | count 36. A count or root too
  // large for its field saturates; sizes still never overflow a buffer, because the engine rejects
  // a message larger than its receive buffer and the algorithms check every received size.
  uint64_t encode() const;
  static Signature decode(uint64_t meta);
  // "all_reduce(1024 x float32, sum)", "broadcast(4096 B, root 0)", ...
  std::string describe() const;
};

}  // namespace dicomm
