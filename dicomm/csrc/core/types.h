// Shared vocabulary of the engine: data types, reduction ops, tags and error classes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dicomm {

enum class DataType : uint8_t {
  kFloat32, kFloat64, kFloat16, kBFloat16,
  kInt8, kInt16, kInt32, kInt64, kUInt8, kBool,
};
size_t dtype_size(DataType t);
const char* dtype_name(DataType t);
DataType dtype_from_name(const std::string& name);  // throws ValueError listing valid names

enum class ReduceOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax, kBand, kBor, kBxor };
const char* reduce_op_name(ReduceOp op);
ReduceOp reduce_op_from_name(const std::string& name);  // throws ValueError listing valid names

constexpr int kAnySource = -1;

// Tags are 64-bit. User (torch) tags live in the low half; collectives use kCollectiveTagBit
// plus a per-communicator sequence number so concurrent operations never cross-match.
using Tag = uint64_t;
constexpr Tag kCollectiveTagBit = Tag{1} << 63;
inline Tag collective_tag(uint64_t seq, uint32_t step) {
  return kCollectiveTagBit | ((seq & ((Tag{1} << 43) - 1)) << 20) | (step & 0xFFFFF);
}

// A message may carry a 64-bit "meta" word that the receiver checks at match time (0 = no check).
// Collectives put a signature of (operation, dtype, op, count) there so that ranks calling
// different collectives get a MismatchError instead of garbage.

// Which error class a failure raises (PeerError, TimeoutError, MismatchError, ValueError).
enum class ErrorKind { kPeer, kTimeout, kMismatch, kValue };

// Errors. Python sees them as dicomm.DicommError and its subclasses.
struct Error : std::runtime_error { using std::runtime_error::runtime_error; };
struct ValueError : Error { using Error::Error; };       // bad argument (rank, dtype, size...)
struct TimeoutError : Error { using Error::Error; };     // a wait outlived its timeout
struct PeerError : Error { using Error::Error; };        // peer died, connection broken, aborted
struct MismatchError : Error { using Error::Error; };    // message larger than buffer, meta differs
// A peer sent what the wire protocol forbids (a length, offset or count outside what this side
// posted or allows): its connection is closed and the violation counted (stats "protocol_violations").
struct ProtocolError : PeerError { using PeerError::PeerError; };

}  // namespace dicomm
