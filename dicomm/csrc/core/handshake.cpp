#include "core/handshake.h"

#include <cstring>
#include <fcntl.h>
#include <random>
#include <sys/random.h>
#include <unistd.h>

#include "core/types.h"

namespace dicomm {

std::string check_hello(const Hello& h, const Token& token, int self, int size, TransportId transport) {
  if (h.magic != kHelloMagic) return "not a dicomm hello (bad magic: garbage bytes or a foreign client)";
  if (h.version != kHelloVersion)
    return "hello version " + std::to_string(h.version) + ", expected " + std::to_string(kHelloVersion);
  if (h.transport != static_cast<uint16_t>(transport)) return "hello for another transport";
  // Constant-time compare: the token is a secret of the job.
  uint8_t diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= h.token[i] ^ token[i];
  if (diff) return "wrong job token (a connection from another job?)";
  if (h.dst != self) return "hello addressed to rank " + std::to_string(h.dst) + ", this is rank " + std::to_string(self);
  if (h.src < 0 || h.src >= size || h.src == self)
    return "hello from invalid rank " + std::to_string(h.src);
  if (h.nstreams == 0 || h.stream >= h.nstreams || h.nstreams > 64) return "hello with invalid stream index";
  return "";
}

Token random_token() {
  Token t{};
  size_t got = 0;
  while (got < t.size()) {
    ssize_t n = getrandom(t.data() + got, t.size() - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < t.size()) {  // no getrandom: fall back to the OS seed of random_device
    std::random_device rd;
    for (auto& b : t) b = static_cast<uint8_t>(rd());
  }
  return t;
}

std::string token_hex(const Token& t) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : t) { s += digits[b >> 4]; s += digits[b & 15]; }
  return s;
}

Token token_from_hex(const std::string& hex) {
  Token t{};
  if (hex.size() != 2 * t.size()) throw ValueError("job token in the store has " + std::to_string(hex.size()) + " characters, expected 32 hex digits");
  auto val = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw ValueError("job token in the store is not hex");
  };
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(val(hex[2 * i]) * 16 + val(hex[2 * i + 1]));
  return t;
}

}  // namespace dicomm
