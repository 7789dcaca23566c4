// The first bytes of every connection: challenge-response on a key only the job's ranks hold.
//
//   listener  -> connector  Challenge (a fresh nonce)
//   connector -> listener   Hello, whose mac = HMAC(key, "dicomm hello" | challenge nonce | hello)
//   listener  -> connector  proof  = HMAC(key, "dicomm accept" | hello)   (the connector's nonce is in it)
//
// The key is the per-job token (drawn by rank 0, published in the store) followed by
// DICOMM_JOB_SECRET when the launcher sets it (given out of band, never written to the store): the
// token alone keeps other jobs and stray clients out; only the secret keeps out whoever can read
// the store. Neither travels on the wire, and the nonces make a recorded handshake useless.
// A connection whose hello has the wrong magic (garbage, a port scanner), a wrong MAC (another job,
// another secret), or that stays silent past the deadline is closed and counted; it never reaches
// the engine.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/hmac.h"

namespace dicomm {

using Token = std::array<uint8_t, 16>;  // per-job random, published by rank 0 in the store
using Nonce = std::array<uint8_t, 16>;

constexpr uint32_t kHelloMagic = 0x4D434944;  // "DICM"
constexpr uint16_t kHelloVersion = 2;

struct Challenge {
  uint32_t magic = kHelloMagic;
  uint16_t version = kHelloVersion;
  uint16_t reserved = 0;
  Nonce nonce{};
};
static_assert(sizeof(Challenge) == 24, "Challenge is a wire format");

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kHelloVersion;
  uint16_t transport = 0;  // which transport the connector believes it talks to
  int32_t src = -1;
  int32_t dst = -1;
  uint16_t stream = 0;     // index of this socket among the connection's streams
  uint16_t nstreams = 1;
  uint32_t reserved = 0;
  uint64_t extra[2] = {0, 0};  // transport specific (shm: address of the sender's probe word)
  Nonce nonce{};               // the connector's, so that the listener's proof is fresh too
  uint8_t mac[32] = {};
};
static_assert(sizeof(Hello) == 88, "Hello is a wire format");

enum class TransportId : uint16_t { kTcp = 1, kShm = 2, kVerbs = 3 };

// The handshake key: the job token, then the out-of-band secret (DICOMM_JOB_SECRET) if any.
std::string handshake_key(const Token& token, const std::string& secret);

void sign_hello(Hello& h, const std::string& key, const Nonce& challenge);
Digest accept_proof(const Hello& h, const std::string& key);

// "" if `h` is acceptable for rank `self` of `size` as the answer to `challenge`, else why not.
std::string check_hello(const Hello& h, const std::string& key, const Nonce& challenge, int self, int size,
                        TransportId transport);

Token random_token();
Nonce random_nonce();
std::string hex_of(const uint8_t* p, size_t n);  // lower-case, two digits a byte
std::string token_hex(const Token& t);
Token token_from_hex(const std::string& hex);  // throws ValueError

}  // namespace dicomm
