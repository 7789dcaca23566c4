#include "collectives/signature.h"

#include <algorithm>
#include <cstdio>

#include "core/communicator.h"

namespace dicomm {
namespace {

constexpr int kCountBits = 36;
constexpr int kRootBits = 16;
constexpr uint64_t kCountMax = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kRootMax = (uint64_t{1} << kRootBits) - 1;

bool is_reduction(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kReduceScatter;
}

std::string count_text(uint64_t count) {
  return count == kCountMax ? ">= " + std::to_string(kCountMax) : std::to_string(count);
}

}  // namespace

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kBarrier: return "barrier";
  }
  return "unknown collective";
}

uint64_t Signature::encode() const {
  const uint64_t root_field = std::min<uint64_t>(static_cast<uint64_t>(root + 1), kRootMax);
  return (uint64_t{static_cast<uint8_t>(kind)} << 60) |
         (uint64_t{static_cast<uint8_t>(dtype)} << 56) |
         (uint64_t{static_cast<uint8_t>(op)} << 52) | (root_field << kCountBits) |
         std::min(count, kCountMax);
}

Signature Signature::decode(uint64_t meta) {
  Signature s{static_cast<CollectiveKind>(meta >> 60)};
  s.dtype = static_cast<DataType>((meta >> 56) & 0xF);
  s.op = static_cast<ReduceOp>((meta >> 52) & 0xF);
  s.root = static_cast<int>((meta >> kCountBits) & kRootMax) - 1;
  s.count = meta & kCountMax;
  return s;
}

std::string Signature::describe() const {
  const uint8_t k = static_cast<uint8_t>(kind);
  if (k < static_cast<uint8_t>(CollectiveKind::kBroadcast) ||
      k > static_cast<uint8_t>(CollectiveKind::kBarrier) ||
      static_cast<uint8_t>(dtype) > static_cast<uint8_t>(DataType::kBool) ||
      static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kBxor)) {
    char text[48];
    std::snprintf(text, sizeof(text), "a message with meta 0x%016llx",
                  static_cast<unsigned long long>(encode()));
    return text;
  }
  std::string args;
  if (kind == CollectiveKind::kBarrier) {
    args = "";
  } else if (is_reduction(kind)) {
    args = count_text(count) + " x " + dtype_name(dtype) + ", " + reduce_op_name(op);
  } else {
    args = count_text(count) + " B";
  }
  if (kind == CollectiveKind::kAllGather || kind == CollectiveKind::kGather ||
      kind == CollectiveKind::kScatter || kind == CollectiveKind::kReduceScatter)
    args += " per rank";
  if (kind == CollectiveKind::kAllToAll) args += " for this pair";
  if (root >= 0) args += ", root " + (root + 1 == static_cast<int>(kRootMax)
                                          ? ">= " + std::to_string(kRootMax - 1)
                                          : std::to_string(root));
  return std::string(collective_name(kind)) + "(" + args + ")";
}

// Messages of collectives carry an encoded Signature; point-to-point ones carry user metas.
std::function<std::string(uint64_t)> Communicator::describe_meta = [](uint64_t meta) {
  return Signature::decode(meta).describe();
};

}  // namespace dicomm
