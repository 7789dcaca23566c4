// Layout of the shared-memory segment of one directed pair (created by the sender, passed to the
// receiver as a file descriptor). Every field is written by one side only; `seq` words publish.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace dicomm::transport::shm {

constexpr size_t kSlots = 64;               // eager ring
constexpr size_t kSlotPayload = 16 * 1024;  // = the eager limit
constexpr size_t kAcks = 256;               // receiver -> sender
constexpr size_t kChunks = 8;               // pipeline ring when cross-memory attach is unavailable
constexpr size_t kChunkBytes = 512 * 1024;
constexpr size_t kShares = 16;             // large messages copied by both sides at once
constexpr size_t kShareChunk = 1024 * 1024;

enum SlotKind : uint32_t { kEager = 1, kRts = 2 };
enum AckKind : uint32_t {
  kFin = 1,     // the receiver has pulled msg_id: the send is complete
  kRefuse = 2,  // msg_id does not fit (bytes/meta = the receiver's)
  kCts = 3,     // stream msg_id through the chunk ring (no cross-memory attach)
  kHelp = 4,    // while waiting, help copy msg_id: claim chunks of share `code` (generation `bytes`)
};

struct alignas(64) Slot {
  std::atomic<uint64_t> seq;  // n + 1 once message n is in this slot
  uint32_t kind;
  uint32_t pad;
  uint64_t tag, meta, bytes, msg_id;
  uint64_t addr;  // rendezvous: where the data lives in the sender
  uint64_t tag_seq;  // Header::tag_seq
  char payload[kSlotPayload];
};

struct alignas(64) Ack {
  std::atomic<uint64_t> seq;
  uint32_t kind, code;
  uint64_t msg_id, bytes, meta;
};

struct alignas(64) Chunk {
  std::atomic<uint64_t> seq;
  uint64_t msg_id, offset, len;
  alignas(64) char data[kChunkBytes];
};

// One large message that both sides copy, chunk by chunk: the receiver reads with
// process_vm_readv, the otherwise idle waiting sender writes with process_vm_writev. With two
// cores that is two copy engines instead of one.
struct alignas(64) Share {
  std::atomic<uint64_t> claim;     // (generation << 32) | next chunk; generation 0: not in use
  std::atomic<uint64_t> done;      // bytes in place
  std::atomic<uint64_t> returned;  // chunk + 1 that the sender claimed but could not write
  std::atomic<uint32_t> writing;   // the sender is inside a write right now
  uint64_t dst, bytes;
};

struct Segment {
  alignas(64) std::atomic<uint64_t> slots_consumed;   // by the receiver
  alignas(64) std::atomic<uint64_t> acks_consumed;    // by the sender
  alignas(64) std::atomic<uint64_t> chunks_consumed;  // by the receiver
  // Set by a side about to sleep in epoll: the other side then rings the doorbell (a byte on the
  // control socket) after publishing. Unset while someone polls, so polling costs no syscalls.
  alignas(64) std::atomic<uint32_t> sender_sleeping;
  alignas(64) std::atomic<uint32_t> receiver_sleeping;
  Slot slots[kSlots];
  Ack acks[kAcks];
  Share shares[kShares];
  Chunk chunks[kChunks];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free");

}  // namespace dicomm::transport::shm
