// A rank's address card, published in the store: who it is (kernel, namespaces, pid) and where
// each of its transports listens. Peers read it on first contact to choose a transport.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace dicomm {

struct Card {
  std::string boot_id;   // one per booted kernel
  uint64_t mnt_ns = 0;   // same /dev/shm
  uint64_t net_ns = 0;   // same abstract Unix socket namespace
  uint64_t pid_ns = 0;   // cross-memory attach addresses pids in this namespace
  int64_t pid = 0;
  std::string hostname;
  std::map<std::string, std::string> addresses;  // transport name -> address

  static Card local();  // this process
  std::string encode() const;
  static Card decode(const std::string& text);  // throws ValueError on a malformed card

  bool same_kernel(const Card& other) const { return boot_id == other.boot_id; }
};

}  // namespace dicomm
