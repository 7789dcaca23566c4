// What the verbs devices of this host offer: ports, their state and MTU, and each port's GID
// table with the type and network interface of every entry (from sysfs), plus the choice of
// device, port and GID that DICOMM_IB_HCA / DICOMM_IB_GID_INDEX and the routing table imply.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "transport/verbs/ibv_api.h"

namespace dicomm::transport::verbs {

struct GidEntry {
  int index = 0;
  std::string gid;      // as sysfs shows it: 0000:0000:0000:0000:0000:ffff:0a00:020f
  std::string type;     // "RoCE v2", "RoCE v1" or "IB/RoCE v1"
  std::string netdev;   // the interface the GID belongs to ("" for InfiniBand)
  std::string ipv4;     // dotted quad when the GID is IPv4-mapped, else ""
  bool roce_v2() const { return type == "RoCE v2"; }
};

struct PortInfo {
  std::string device;
  int port = 1;
  bool active = false;
  uint32_t active_mtu = 0;  // IB MTU enum (3 = 1024 B)
  bool ethernet = false;    // RoCE (else InfiniBand)
  std::vector<GidEntry> gids;
  std::string describe() const;  // "rxe0 port 1"
};

struct DeviceInfo {
  std::string name;
  int max_qp_wr = 0;
  int max_qp_rd_atom = 0;
  std::vector<PortInfo> ports;
};

// Every device and port; `why` says what failed (no library, no devices) when the list is empty.
std::vector<DeviceInfo> discover(const IbvApi& api, std::string* why);

// The ports `allow` (DICOMM_IB_HCA) allows ("mlx5_0,mlx5_1:1"; every port when empty), active ones
// only. Throws ValueError when it names nothing that exists, listing what does.
std::vector<PortInfo> usable_ports(const std::vector<DeviceInfo>& devices, const std::string& allow);

// The GID index for traffic leaving through `local_ip` (the address a socket to the peer is bound
// to): `gid_index` (DICOMM_IB_GID_INDEX) when set (checked), else the RoCE v2 IPv4-mapped GID of that address,
// else the first RoCE v2 IPv4-mapped one, else index 0 (InfiniBand). Throws ValueError naming the
// device, port and GID table when the override points at an empty or unknown entry.
int choose_gid(const PortInfo& port, const std::string& local_ip, std::optional<long> gid_index,
               std::string* why_chosen);

// JSON of discover() plus the choices a communicator of `config` would make, for probes and tests.
std::string probe_json(const EngineConfig& config);

}  // namespace dicomm::transport::verbs
