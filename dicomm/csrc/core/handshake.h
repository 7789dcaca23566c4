// The first bytes of every connection. A connection whose hello has the wrong magic (garbage, a
// port scanner), the wrong token (another job), or that stays silent past the deadline is closed
// and counted; it never reaches the engine.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dicomm {

using Token = std::array<uint8_t, 16>;  // per-job random, published by rank 0 in the store

constexpr uint32_t kHelloMagic = 0x4D434944;  // "DICM"
constexpr uint16_t kHelloVersion = 1;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kHelloVersion;
  uint16_t transport = 0;  // which transport the connector believes it talks to
  Token token{};
  int32_t src = -1;
  int32_t dst = -1;
  uint16_t stream = 0;     // index of this socket among the connection's streams
  uint16_t nstreams = 1;
  uint32_t reserved = 0;
  uint64_t extra[2] = {0, 0};  // transport specific (shm: address of the sender's probe word)
};
static_assert(sizeof(Hello) == 56, "Hello is a wire format");

enum class TransportId : uint16_t { kTcp = 1, kShm = 2, kVerbs = 3 };

// "" if `h` is acceptable for rank `self` of `size` in the job of `token`, else why not.
std::string check_hello(const Hello& h, const Token& token, int self, int size, TransportId transport);

Token random_token();
std::string token_hex(const Token& t);
Token token_from_hex(const std::string& hex);  // throws ValueError

}  // namespace dicomm
