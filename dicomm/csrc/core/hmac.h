// HMAC-SHA-256 (FIPS 180-4, RFC 2104), small and dependency-free: it authenticates the connection
// handshake, where pulling in OpenSSL for one MAC per connection is not worth a hard dependency.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dicomm {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const void* data, size_t n);
Digest hmac_sha256(const std::string& key, const void* data, size_t n);
// Constant time: how long it takes says nothing about where two digests differ.
bool digests_equal(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace dicomm
