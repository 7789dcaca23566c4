#include "core/config.h"

#include <cerrno>
#include <cstdlib>
#include <strings.h>

#include "core/communicator.h"
#include "core/types.h"

namespace dicomm {
namespace {

using K = Knob::Kind;
constexpr long kMany = 1L << 30;

const std::vector<Knob> kTable = {
    // The engine
    {"DICOMM_TRANSPORT", K::kText, "auto", 0, 0, "", "",
     "auto (each peer gets the reachable transport it prefers), or one transport's name (shm, tcp, verbs) for every peer; overrides the transport argument"},
    {"DICOMM_CONNECT", K::kChoice, "eager", 0, 0, "eager|lazy", "",
     "eager: connect to every peer at start-up (a dead peer is noticed at once); lazy: on first use"},
    {"DICOMM_HANDSHAKE_TIMEOUT_MS", K::kInteger, "5000", 1, 3600000, "", "ms",
     "how long an accepted connection may take to complete its handshake"},
    {"DICOMM_JOB_SECRET", K::kText, "", 0, 0, "", "",
     "a secret every rank of the job shares: mixed into the handshake key, and the address cards are signed with it"},
    {"DICOMM_LOG_LEVEL", K::kChoice, "warn", 0, 0, "error|warn|info|debug", "", "what the engine logs to stderr"},
    // Progress
    {"DICOMM_SPIN_US", K::kInteger, "100", 0, 10000000, "", "us",
     "how long a waiter polls shared memory (and unknown peers) itself before sleeping"},
    {"DICOMM_TCP_SPIN_US", K::kInteger, "50", 0, 10000000, "", "us", "the same over TCP"},
    {"DICOMM_IB_SPIN_US", K::kInteger, "1000", 0, 10000000, "", "us", "the same over RDMA verbs"},
    {"DICOMM_SPIN_THOROUGH_EVERY", K::kInteger, "64", 1, kMany, "", "polls",
     "a spinning waiter also reads sockets (EOF, accepts) every this many polls"},
    {"DICOMM_SPIN_PAUSES", K::kInteger, "0", 0, 1 << 20, "", "pauses", "CPU pause instructions between two polls"},
    {"DICOMM_SPIN_YIELD_EVERY", K::kInteger, "", 0, kMany, "", "polls",
     "a spinning waiter yields the CPU every this many polls (0: never); unset: every 8th when this host's ranks outnumber its CPUs, else never"},
    {"DICOMM_SPIN_CONTENTION", K::kFlag, "1", 0, 0, "", "",
     "1: while the host has more runnable tasks than CPUs, waiters block at once instead of spinning"},
    {"DICOMM_UNEXPECTED_MB", K::kInteger, "32", 0, 1 << 20, "", "MiB",
     "eager bytes a sender may have to one peer that the peer has not taken yet (credits); later sends are announced only (rendezvous)"},
    {"DICOMM_MAX_PENDING_HANDSHAKES", K::kInteger, "", 1, 1 << 20, "", "connections",
     "handshakes waiting at once per listener; unset: a quarter of the open-file soft limit, within [16, 1024]"},
    // Shared memory
    {"DICOMM_SHM_CMA", K::kFlag, "1", 0, 0, "", "", "0: no cross-memory attach (large messages take the two-copy pipeline)"},
    {"DICOMM_SHM_SPLIT", K::kFlag, "1", 0, 0, "", "", "0: the receiver copies a large message alone (the sender does not help)"},
    // TCP
    {"DICOMM_SOCKET_IFNAME", K::kText, "", 0, 0, "", "",
     "the interface whose IPv4 address listeners bind; unset: loopback for a one-host torchrun job, else the first interface that is up"},
    {"DICOMM_TCP_STREAMS", K::kInteger, "4", 1, 64, "", "sockets", "sockets per peer and direction"},
    {"DICOMM_TCP_CHUNK_KB", K::kInteger, "1024", 64, 1 << 20, "", "KiB", "the unit large messages are striped in"},
    // RDMA verbs
    {"DICOMM_IB_HCA", K::kText, "", 0, 0, "", "", "allowed RDMA ports: device[:port],...; unset: any active port"},
    {"DICOMM_IB_GID_INDEX", K::kInteger, "", 0, 65535, "", "", "the GID to use; unset: the RoCE v2 IPv4 GID of the side channel's address"},
    {"DICOMM_IB_CHUNK_KB", K::kInteger, "512", 4, 1 << 20, "", "KiB", "the unit of pipelined RDMA reads and of staging"},
    {"DICOMM_IB_SLOTS", K::kInteger, "32", 4, 1024, "", "slots", "eager receive slots (and credits) per connection"},
    {"DICOMM_IB_EAGER_BYTES", K::kInteger, "8192", 0, 1 << 20, "", "bytes", "largest message sent eagerly through a slot"},
    {"DICOMM_IB_SIGNAL_EVERY", K::kInteger, "16", 1, 64, "", "sends",
     "one signalled completion per this many sends (at most a quarter of the send queue)"},
    {"DICOMM_IB_DRAIN_MS", K::kInteger, "2000", 0, 60000, "", "ms", "how long closing a connection waits for its posted sends"},
    {"DICOMM_IB_TIMEOUT", K::kInteger, "14", 1, 31, "", "4.096 us * 2^n", "the queue pair's local ACK timeout"},
    {"DICOMM_IB_RETRY_CNT", K::kInteger, "7", 0, 7, "", "retries", "the queue pair's transport retries"},
    {"DICOMM_IB_REG_CACHE", K::kInteger, "256", 0, 1 << 20, "", "registrations", "memory registrations kept for reuse"},
    {"DICOMM_IB_FORCE_STAGING", K::kFlag, "0", 0, 0, "", "", "1: stage device memory through host buffers even where the NIC could reach it"},
    {"DICOMM_IBVERBS_LIB", K::kText, "libibverbs.so.1", 0, 0, "", "", "the libibverbs to load"},
    {"DICOMM_SYSFS_ROOT", K::kText, "/sys", 0, 0, "", "", "where RDMA devices are looked up (tests point it at a fake tree)"},
    // Collectives
    {"DICOMM_COLL_CHUNK_BYTES", K::kInteger, "524288", 1, 1L << 40, "", "bytes", "the pipeline unit of ring and chain algorithms"},
    {"DICOMM_COLL_SMALL_BYTES", K::kInteger, "", 0, 1L << 40, "", "bytes",
     "below this size every collective takes its small-message algorithm; unset: per collective (docs/architecture.md)"},
    {"DICOMM_ALL_REDUCE_DIRECT_RANKS", K::kInteger, "0", 0, 1 << 20, "", "ranks",
     "where the push algorithm does not run, a large all_reduce of at most this many ranks takes the direct algorithm (each rank reduces its own block from every peer, in rank order), of more the ring; 0: always the ring"},
    {"DICOMM_ALL_REDUCE_PUSH", K::kFlag, "1", 0, 0, "", "",
     "1: a large all_reduce whose ranks can all read and write each other's memory (one host, cross-memory attach) takes the push algorithm (each rank reduces its own block out of its peers' buffers and writes it into theirs, in rank order); 0, or where some rank cannot: the ring or the direct algorithm"},
    {"DICOMM_ALL_REDUCE_STEAL", K::kFlag, "0", 0, 0, "", "",
     "1: in the push algorithm a rank done with its own block reduces the chunks its peers have not started (work stealing; every element still in rank order; no gain measured on a loaded 2-core host, docs/benchmarks.md); 0: each rank reduces its own block alone"},
    {"DICOMM_ALL_REDUCE_FUSED", K::kFlag, "1", 0, 0, "", "",
     "1: the push algorithm combines a chunk's inputs of every rank in one pass (up to 16 ranks; the same bits as pairwise, in rank order); 0: one pairwise pass per peer"},
    {"DICOMM_ALL_REDUCE_PUSH_DELAY_MS", K::kInteger, "0", 0, 60000, "", "ms",
     "testing: in the push algorithm this rank waits so long before it reduces its first chunk, as a descheduled rank would"},
    {"DICOMM_REDUCE_KERNELS", K::kChoice, "auto", 0, 0, "auto|generic", "", "generic: the portable reduction kernels even where AVX2 runs"},
};

const Knob* find_knob(const std::string& name) {
  for (const auto& k : kTable)
    if (name == k.name) return &k;
  return nullptr;
}

const Knob& knob(const char* name) {
  if (const Knob* k = find_knob(name)) return *k;
  throw Error(std::string("internal: ") + name + " is not in the configuration table (core/config.cpp)");
}

// Why a knob cannot be one communicator's setting ("" if it can): read once per process, or given
// otherwise.
std::string not_a_setting(const Knob& k) {
  const std::string name = k.name;
  if (name == "DICOMM_TRANSPORT") return "give the communicator's transport argument instead";
  for (const char* process_wide : {"DICOMM_LOG_LEVEL", "DICOMM_IBVERBS_LIB", "DICOMM_SYSFS_ROOT", "DICOMM_REDUCE_KERNELS"})
    if (name == process_wide) return "it is read for the whole process: set it in the environment";
  return "";
}

[[noreturn]] void bad(const Knob& k, const char* v) {
  throw ValueError(std::string(k.name) + "='" + v + "' is not valid; expected " + k.form());
}

long parse_integer(const Knob& k, const char* v) {
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (errno || end == v || *end || n < k.lo || n > k.hi) bad(k, v);
  return n;
}

std::string parse(const Knob& k, const char* v) {  // checks v; returns it canonical
  switch (k.kind) {
    case K::kInteger: return std::to_string(parse_integer(k, v));
    case K::kFlag:
      if (std::string(v) != "0" && std::string(v) != "1") bad(k, v);
      return v;
    case K::kChoice: {
      std::string all = k.choices, word;
      for (size_t start = 0; start <= all.size();) {
        size_t bar = all.find('|', start);
        if (bar == std::string::npos) bar = all.size();
        word = all.substr(start, bar - start);
        if (!strcasecmp(word.c_str(), v)) return word;
        start = bar + 1;
      }
      bad(k, v);
    }
    case K::kText: return v;
  }
  return v;
}

}  // namespace

std::string Knob::form() const {
  switch (kind) {
    case Kind::kInteger:
      return hi >= kMany ? "an integer >= " + std::to_string(lo)
                         : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    case Kind::kFlag: return "0 or 1";
    case Kind::kChoice: {
      std::string words = choices;
      for (auto& c : words)
        if (c == '|') c = ',';
      return "one of " + words;
    }
    case Kind::kText: return "text";
  }
  return "";
}

const std::vector<Knob>& knobs() { return kTable; }

namespace {

// Where a knob's text comes from: the environment (when set, it wins), then a communicator's
// settings, then the table's default.
struct Source {
  const std::map<std::string, std::string>* settings = nullptr;
  bool environment = true;

  const char* raw(const Knob& k) const {  // nullptr when unset or empty
    if (environment)
      if (const char* v = std::getenv(k.name); v && *v) return v;
    if (settings)
      if (auto it = settings->find(k.name); it != settings->end() && !it->second.empty()) return it->second.c_str();
    return nullptr;
  }
  const char* text_or_default(const Knob& k) const {
    const char* v = raw(k);
    return v ? v : k.fallback;
  }
  long integer(const char* name) const {
    const Knob& k = knob(name);
    return parse_integer(k, text_or_default(k));
  }
  std::optional<long> optional_integer(const char* name) const {
    const Knob& k = knob(name);
    const char* v = text_or_default(k);
    if (!*v) return std::nullopt;
    return parse_integer(k, v);
  }
  bool flag(const char* name) const {
    const Knob& k = knob(name);
    return parse(k, text_or_default(k)) == "1";
  }
  std::string choice(const char* name) const {
    const Knob& k = knob(name);
    return parse(k, text_or_default(k));
  }
  std::string text(const char* name) const { return text_or_default(knob(name)); }
};

}  // namespace

namespace config {

long integer(const char* name) { return Source{}.integer(name); }
std::optional<long> optional_integer(const char* name) { return Source{}.optional_integer(name); }
bool flag(const char* name) { return Source{}.flag(name); }
std::string choice(const char* name) { return Source{}.choice(name); }
std::string text(const char* name) { return Source{}.text(name); }

}  // namespace config

namespace {

EngineConfig build(const Options& options, const Source& src) {
  EngineConfig c;
  c.transport_from_env = src.environment && src.raw(knob("DICOMM_TRANSPORT")) != nullptr;
  c.transport = c.transport_from_env ? src.text("DICOMM_TRANSPORT") : options.transport;
  c.connect_eager = src.choice("DICOMM_CONNECT") == "eager";
  c.handshake_timeout = std::chrono::milliseconds(src.integer("DICOMM_HANDSHAKE_TIMEOUT_MS"));
  c.job_secret = src.text("DICOMM_JOB_SECRET");
  c.spin = std::chrono::microseconds(src.integer("DICOMM_SPIN_US"));
  c.tcp_spin = std::chrono::microseconds(src.integer("DICOMM_TCP_SPIN_US"));
  c.verbs_spin = std::chrono::microseconds(src.integer("DICOMM_IB_SPIN_US"));
  c.spin_thorough_every = static_cast<int>(src.integer("DICOMM_SPIN_THOROUGH_EVERY"));
  c.spin_pauses = static_cast<int>(src.integer("DICOMM_SPIN_PAUSES"));
  c.spin_yield_every = static_cast<int>(src.optional_integer("DICOMM_SPIN_YIELD_EVERY").value_or(-1));
  c.spin_contention = src.flag("DICOMM_SPIN_CONTENTION");
  c.unexpected_bytes = static_cast<size_t>(src.integer("DICOMM_UNEXPECTED_MB")) << 20;
  if (auto n = src.optional_integer("DICOMM_MAX_PENDING_HANDSHAKES")) c.max_pending_handshakes = static_cast<size_t>(*n);
  c.shm_cma = src.flag("DICOMM_SHM_CMA");
  c.shm_split = src.flag("DICOMM_SHM_SPLIT");
  c.socket_ifname = src.text("DICOMM_SOCKET_IFNAME");
  c.tcp_streams = static_cast<int>(src.integer("DICOMM_TCP_STREAMS"));
  c.tcp_chunk_bytes = static_cast<size_t>(src.integer("DICOMM_TCP_CHUNK_KB")) << 10;
  c.verbs_chunk_bytes = static_cast<size_t>(src.integer("DICOMM_IB_CHUNK_KB")) << 10;
  c.ib_hca = src.text("DICOMM_IB_HCA");
  c.ib_gid_index = src.optional_integer("DICOMM_IB_GID_INDEX");
  c.ib_slots = static_cast<int>(src.integer("DICOMM_IB_SLOTS"));
  c.ib_eager_bytes = static_cast<size_t>(src.integer("DICOMM_IB_EAGER_BYTES"));
  c.ib_signal_every = static_cast<int>(src.integer("DICOMM_IB_SIGNAL_EVERY"));
  c.ib_drain = std::chrono::milliseconds(src.integer("DICOMM_IB_DRAIN_MS"));
  c.ib_timeout = static_cast<int>(src.integer("DICOMM_IB_TIMEOUT"));
  c.ib_retry_cnt = static_cast<int>(src.integer("DICOMM_IB_RETRY_CNT"));
  c.ib_reg_cache = static_cast<size_t>(src.integer("DICOMM_IB_REG_CACHE"));
  c.ib_force_staging = src.flag("DICOMM_IB_FORCE_STAGING");
  c.coll_chunk_bytes = static_cast<size_t>(src.integer("DICOMM_COLL_CHUNK_BYTES"));
  if (auto n = src.optional_integer("DICOMM_COLL_SMALL_BYTES")) c.coll_small_bytes = static_cast<size_t>(*n);
  c.all_reduce_direct_ranks = static_cast<int>(src.integer("DICOMM_ALL_REDUCE_DIRECT_RANKS"));
  c.all_reduce_push = src.flag("DICOMM_ALL_REDUCE_PUSH");
  c.all_reduce_steal = src.flag("DICOMM_ALL_REDUCE_STEAL");
  c.all_reduce_fused = src.flag("DICOMM_ALL_REDUCE_FUSED");
  c.all_reduce_push_delay_ms = static_cast<unsigned>(src.integer("DICOMM_ALL_REDUCE_PUSH_DELAY_MS"));
  return c;
}

}  // namespace

const EngineConfig& EngineConfig::defaults() {
  static const EngineConfig c = build(Options{}, Source{nullptr, false});
  return c;
}

EngineConfig EngineConfig::load(const Options& options) {
  for (const auto& [name, value] : options.settings) {  // a setting names a knob of the table, with a valid value
    const Knob* k = find_knob(name);
    if (!k) throw ValueError("unknown setting '" + name + "': expected a DICOMM_* variable of docs/dicomm-config.md");
    if (std::string why = not_a_setting(*k); !why.empty()) throw ValueError(name + " cannot be set per communicator: " + why);
    if (!value.empty()) parse(*k, value.c_str());
  }
  for (const auto& k : kTable)  // a bad value anywhere fails now, naming its variable
    if (const char* v = Source{}.raw(k)) parse(k, v);
  return build(options, Source{&options.settings, true});
}

}  // namespace dicomm
