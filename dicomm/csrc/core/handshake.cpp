#include "core/handshake.h"

#include <cstdlib>
#include <cstring>
#include <random>
#include <sys/random.h>

#include "core/types.h"

namespace dicomm {
namespace {

void fill_random(uint8_t* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  if (got < n) {  // no getrandom: fall back to the OS seed of random_device
    std::random_device rd;
    for (size_t i = got; i < n; ++i) p[i] = static_cast<uint8_t>(rd());
  }
}

Digest labelled_mac(const std::string& key, const char* label, const void* a, size_t an, const void* b, size_t bn) {
  std::string msg(label);
  msg.append(static_cast<const char*>(a), an);
  msg.append(static_cast<const char*>(b), bn);
  return hmac_sha256(key, msg.data(), msg.size());
}

}  // namespace

std::string handshake_key(const Token& token, const std::string& secret) {
  return std::string(reinterpret_cast<const char*>(token.data()), token.size()) + secret;
}

void sign_hello(Hello& h, const std::string& key, const Nonce& challenge) {
  std::memset(h.mac, 0, sizeof(h.mac));
  Digest d = labelled_mac(key, "dicomm hello", challenge.data(), challenge.size(), &h, sizeof(h));
  std::memcpy(h.mac, d.data(), d.size());
}

Digest accept_proof(const Hello& h, const std::string& key) {
  return labelled_mac(key, "dicomm accept", &h, sizeof(h), nullptr, 0);
}

std::string check_hello(const Hello& h, const std::string& key, const Nonce& challenge, int self, int size,
                        TransportId transport) {
  if (h.magic != kHelloMagic) return "not a dicomm hello (bad magic: garbage bytes or a foreign client)";
  if (h.version != kHelloVersion)
    return "hello version " + std::to_string(h.version) + ", expected " + std::to_string(kHelloVersion);
  if (h.transport != static_cast<uint16_t>(transport)) return "hello for another transport";
  Hello unsigned_copy = h;
  sign_hello(unsigned_copy, key, challenge);
  if (!digests_equal(unsigned_copy.mac, h.mac, sizeof(h.mac)))
    return "hello not signed with this job's key (another job, or a different or missing DICOMM_JOB_SECRET)";
  if (h.dst != self) return "hello addressed to rank " + std::to_string(h.dst) + ", this is rank " + std::to_string(self);
  if (h.src < 0 || h.src >= size || h.src == self)
    return "hello from invalid rank " + std::to_string(h.src);
  if (h.nstreams == 0 || h.stream >= h.nstreams || h.nstreams > 64) return "hello with invalid stream index";
  return "";
}

Token random_token() {
  Token t{};
  fill_random(t.data(), t.size());
  return t;
}

Nonce random_nonce() {
  Nonce n{};
  fill_random(n.data(), n.size());
  return n;
}

std::string hex_of(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) { s += digits[p[i] >> 4]; s += digits[p[i] & 15]; }
  return s;
}

std::string token_hex(const Token& t) { return hex_of(t.data(), t.size()); }

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
