#include "transport/verbs/device.h"

#include "core/config.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/types.h"

namespace dicomm::transport::verbs {
namespace {

std::string sysfs_root() {
  return config::text("DICOMM_SYSFS_ROOT");
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// "0000:0000:0000:0000:0000:ffff:0a00:020f" -> "10.0.2.15"; "" if not IPv4-mapped.
std::string mapped_ipv4(const std::string& gid) {
  static const std::string prefix = "0000:0000:0000:0000:0000:ffff:";
  if (gid.size() != 39 || gid.compare(0, prefix.size(), prefix) != 0) return "";
  unsigned a = std::stoul(gid.substr(30, 4), nullptr, 16), b = std::stoul(gid.substr(35, 4), nullptr, 16);
  return std::to_string(a >> 8) + "." + std::to_string(a & 255) + "." + std::to_string(b >> 8) + "." + std::to_string(b & 255);
}

std::vector<GidEntry> read_gids(const std::string& dev, int port, int table_len) {
  std::vector<GidEntry> out;
  std::string base = sysfs_root() + "/class/infiniband/" + dev + "/ports/" + std::to_string(port);
  for (int i = 0; i < table_len && i < 256; ++i) {
    GidEntry g;
    g.index = i;
    g.gid = read_line(base + "/gids/" + std::to_string(i));
    if (g.gid.empty() || g.gid == "0000:0000:0000:0000:0000:0000:0000:0000") continue;
    g.type = read_line(base + "/gid_attrs/types/" + std::to_string(i));
    g.netdev = read_line(base + "/gid_attrs/ndevs/" + std::to_string(i));
    g.ipv4 = mapped_ipv4(g.gid);
    out.push_back(g);
  }
  return out;
}

std::string quote(const std::string& s) {  // a JSON string: control characters (the GID table's newlines) escaped
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      o += esc;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

std::string table_text(const PortInfo& p) {
  std::string t;
  for (const auto& g : p.gids)
    t += "\n  [" + std::to_string(g.index) + "] " + g.gid + " " + (g.type.empty() ? "?" : g.type) +
         (g.netdev.empty() ? "" : " " + g.netdev);
  return t.empty() ? " (empty)" : t;
}

}  // namespace

std::string PortInfo::describe() const { return device + " port " + std::to_string(port); }

std::vector<DeviceInfo> discover(const IbvApi& api, std::string* why) {
  std::vector<DeviceInfo> out;
  int n = 0;
  ibv::device** list = api.get_device_list(&n);
  if (!list || n == 0) {
    if (why) *why = "libibverbs found no RDMA device (no /sys/class/infiniband entries or no provider for them)";
    if (list) api.free_device_list(list);
    return out;
  }
  for (int i = 0; i < n; ++i) {
    DeviceInfo d;
    d.name = api.get_device_name(list[i]);
    ibv::context* ctx = api.open_device(list[i]);
    if (!ctx) continue;
    ibv::device_attr attr{};
    if (api.query_device(ctx, &attr) == 0) {
      d.max_qp_wr = attr.max_qp_wr;
      d.max_qp_rd_atom = attr.max_qp_rd_atom;
      for (int p = 1; p <= attr.phys_port_cnt; ++p) {
        alignas(8) unsigned char raw[256] = {};  // room for newer libraries' larger port_attr
        auto* pa = reinterpret_cast<ibv::port_attr*>(raw);
        if (api.query_port(ctx, static_cast<uint8_t>(p), pa) != 0) continue;
        PortInfo port;
        port.device = d.name;
        port.port = p;
        port.active = pa->state == ibv::PORT_ACTIVE;
        port.active_mtu = pa->active_mtu;
        port.ethernet = pa->link_layer == ibv::LINK_LAYER_ETHERNET;
        port.gids = read_gids(d.name, p, pa->gid_tbl_len);
        d.ports.push_back(port);
      }
    }
    api.close_device(ctx);
    out.push_back(d);
  }
  api.free_device_list(list);
  if (out.empty() && why) *why = "no RDMA device could be opened";
  return out;
}

std::vector<PortInfo> usable_ports(const std::vector<DeviceInfo>& devices, const std::string& allow) {
  std::vector<PortInfo> out;
  std::string all;
  for (const auto& d : devices)
    for (const auto& p : d.ports) {
      all += (all.empty() ? "" : ", ") + d.name + ":" + std::to_string(p.port) + (p.active ? "" : " (down)");
      bool allowed = allow.empty();
      std::stringstream items(allow);
      std::string item;
      while (!allowed && std::getline(items, item, ',')) {
        auto colon = item.find(':');
        std::string name = item.substr(0, colon);
        allowed = name == d.name && (colon == std::string::npos || item.substr(colon + 1) == std::to_string(p.port));
      }
      if (allowed && p.active) out.push_back(p);
    }
  if (!allow.empty() && out.empty())
    throw ValueError("DICOMM_IB_HCA='" + allow + "' matches no active RDMA port; this host has: " +
                     (all.empty() ? "none" : all));
  return out;
}

int choose_gid(const PortInfo& port, const std::string& local_ip, std::optional<long> gid_index,
               std::string* why_chosen) {
  if (const auto idx = gid_index) {
    for (const auto& g : port.gids)
      if (g.index == *idx) {
        if (why_chosen) *why_chosen = "DICOMM_IB_GID_INDEX=" + std::to_string(*idx);
        return g.index;
      }
    throw ValueError("DICOMM_IB_GID_INDEX=" + std::to_string(*idx) + " names no valid GID on " + port.describe() +
                     "; its GID table:" + table_text(port));
  }
  if (!port.ethernet) {
    if (why_chosen) *why_chosen = "InfiniBand port: GID 0";
    return 0;
  }
  for (const auto& g : port.gids)
    if (g.roce_v2() && !g.ipv4.empty() && g.ipv4 == local_ip) {
      if (why_chosen) *why_chosen = "RoCE v2, IPv4-mapped, address " + local_ip + " that reaches the peer";
      return g.index;
    }
  for (const auto& g : port.gids)
    if (g.roce_v2() && !g.ipv4.empty()) {
      if (why_chosen) *why_chosen = "RoCE v2, IPv4-mapped (" + g.ipv4 + "); no GID has the address " + local_ip;
      return g.index;
    }
  throw ValueError(port.describe() + " has no RoCE v2 IPv4-mapped GID (does its interface have an IPv4 address?); "
                   "set DICOMM_IB_GID_INDEX to one of:" + table_text(port));
}

std::string probe_json(const EngineConfig& config) {
  std::string why;
  const IbvApi* api = ibv_api(&why);
  std::ostringstream o;
  o << "{\"library\": " << (api ? "true" : "false");
  std::vector<DeviceInfo> devs;
  if (api) devs = discover(*api, &why);
  o << ", \"why\": " << quote(devs.empty() ? why : "") << ", \"devices\": [";
  for (size_t i = 0; i < devs.size(); ++i) {
    const auto& d = devs[i];
    o << (i ? ", " : "") << "{\"name\": " << quote(d.name) << ", \"max_qp_wr\": " << d.max_qp_wr
      << ", \"max_qp_rd_atom\": " << d.max_qp_rd_atom << ", \"ports\": [";
    for (size_t j = 0; j < d.ports.size(); ++j) {
      const auto& p = d.ports[j];
      o << (j ? ", " : "") << "{\"port\": " << p.port << ", \"active\": " << (p.active ? "true" : "false")
        << ", \"active_mtu\": " << ibv::mtu_bytes(p.active_mtu) << ", \"link_layer\": "
        << quote(p.ethernet ? "Ethernet" : "InfiniBand") << ", \"gids\": [";
      for (size_t k = 0; k < p.gids.size(); ++k) {
        const auto& g = p.gids[k];
        o << (k ? ", " : "") << "{\"index\": " << g.index << ", \"gid\": " << quote(g.gid) << ", \"type\": "
          << quote(g.type) << ", \"netdev\": " << quote(g.netdev) << ", \"ipv4\": " << quote(g.ipv4) << "}";
      }
      std::string chosen_why;
      int chosen = -1;
      try {
        chosen = choose_gid(p, "", config.ib_gid_index, &chosen_why);
      } catch (const ValueError& e) {
        chosen_why = e.what();
      }
      o << "], \"chosen_gid\": " << chosen << ", \"chosen_why\": " << quote(chosen_why) << "}";
    }
    o << "]}";
  }
  o << "]}";
  return o.str();
}

}  // namespace dicomm::transport::verbs
