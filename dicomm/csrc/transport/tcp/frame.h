// Framing on a TCP stream: a fixed 56-byte header, then the payload for eager and data frames.
#pragma once

#include <cstdint>

namespace dicomm::transport::tcp {

enum FrameKind : uint32_t {
  kEager = 1,   // sender -> receiver: header + payload
  kRts = 2,     // sender -> receiver: a large message waits for clear-to-send
  kData = 3,    // sender -> receiver: `bytes` bytes of message msg_id at `offset`
  kCts = 4,     // receiver -> sender: matched, send the data of msg_id
  kRefuse = 5,  // receiver -> sender: msg_id does not fit (bytes/meta = the receiver's)
};

struct Frame {
  uint32_t kind = 0;
  uint32_t code = 0;
  uint64_t msg_id = 0;
  uint64_t tag = 0;
  uint64_t meta = 0;
  uint64_t bytes = 0;
  uint64_t offset = 0;
  uint32_t tag_seq = 0;  // kEager/kRts: Header::tag_seq
  uint32_t reserved = 0;
};
static_assert(sizeof(Frame) == 56, "Frame is a wire format");

}  // namespace dicomm::transport::tcp
