// Every DICOMM_* setting the C++ code reads, in one table (config.cpp; docs/dicomm-config.md is the
// same table for people, and tests/dicomm/test_engine_config.py keeps the two equal), read through
// one parser that checks each value against its stated form: a bad value is a ValueError naming the
// variable and the form it expects, never a silent clamp.
//
// EngineConfig is parsed once per communicator, when it is created (options from Python first, then
// the environment, which overrides them as it always has), and checks every knob of the table, so
// that a bad value anywhere fails there. The engine, its transports (transport::Context::config) and
// the collectives (Communicator::config) take their settings from it, so two communicators of one
// process may differ. Process-wide settings (log level, libibverbs, sysfs root, reduction kernels)
// are read where they are used, through the same parser.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dicomm {

struct Options;

// One knob as the table states it.
struct Knob {
  enum class Kind { kInteger, kFlag, kChoice, kText };
  const char* name = "";
  Kind kind = Kind::kText;
  const char* fallback = "";  // the default as text; "" for none (unset: the code decides, see `meaning`)
  long lo = 0, hi = 0;   // kInteger: the accepted range
  const char* choices = "";  // kChoice: the accepted words, separated by '|'
  const char* unit = "";
  const char* meaning = "";
  std::string form() const;  // what an error and the docs say it expects: "an integer in [1, 64]"
};

// The whole table, in documentation order.
const std::vector<Knob>& knobs();

namespace config {
// The knob's value, checked against its form; its default when the variable is unset or empty.
long integer(const char* name);
// The same for knobs without a default: nullopt when unset.
std::optional<long> optional_integer(const char* name);
bool flag(const char* name);            // "0" or "1"
std::string choice(const char* name);   // one of the table's words (lower case)
std::string text(const char* name);     // as given
}  // namespace config

struct EngineConfig {
  std::string transport = "auto";  // DICOMM_TRANSPORT, else Options::transport
  bool transport_from_env = false;
  bool connect_eager = true;       // DICOMM_CONNECT
  std::chrono::milliseconds handshake_timeout{5000};
  std::string job_secret;
  std::chrono::microseconds spin{100};      // DICOMM_SPIN_US (shm, and before a transport is known)
  std::chrono::microseconds tcp_spin{50};   // DICOMM_TCP_SPIN_US
  std::chrono::microseconds verbs_spin{1000};  // DICOMM_IB_SPIN_US
  int spin_thorough_every = 64;
  int spin_pauses = 0;
  int spin_yield_every = -1;  // -1: decided by the ranks per CPU
  bool spin_contention = true;
  size_t unexpected_bytes = size_t{32} << 20;  // DICOMM_UNEXPECTED_MB
  bool shm_cma = true;
  bool shm_split = true;
  int tcp_streams = 4;
  size_t tcp_chunk_bytes = size_t{1024} << 10;
  size_t verbs_chunk_bytes = size_t{512} << 10;
  std::optional<size_t> max_pending_handshakes;  // DICOMM_MAX_PENDING_HANDSHAKES; unset: from the fd limit
  std::string socket_ifname;                     // DICOMM_SOCKET_IFNAME
  // RDMA verbs: the port, then connections
  std::string ib_hca;                 // DICOMM_IB_HCA; empty: any active port
  std::optional<long> ib_gid_index;   // DICOMM_IB_GID_INDEX; unset: chosen by address
  int ib_slots = 32;
  size_t ib_eager_bytes = 8192;
  int ib_signal_every = 16;
  std::chrono::milliseconds ib_drain{2000};
  int ib_timeout = 14;
  int ib_retry_cnt = 7;
  size_t ib_reg_cache = 256;
  bool ib_force_staging = false;
  // Collectives (collectives/tuning.h)
  size_t coll_chunk_bytes = size_t{512} << 10;
  std::optional<size_t> coll_small_bytes;
  int all_reduce_direct_ranks = 0;
  bool all_reduce_push = true;
  bool all_reduce_steal = false;
  bool all_reduce_fused = true;
  unsigned all_reduce_push_delay_ms = 0;

  // Options first (`transport`, and `settings`: knobs of the table by name), then the environment;
  // checks every knob in the table and every setting's name. Throws ValueError.
  static EngineConfig load(const Options& options);
  // The table's defaults, environment unread (programs that open a transport without an engine).
  static const EngineConfig& defaults();
};

}  // namespace dicomm
