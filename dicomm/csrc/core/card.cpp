#include "core/card.h"

#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include "core/types.h"

namespace dicomm {
namespace {

uint64_t ns_inode(const char* which) {
  struct stat st{};
  std::string path = std::string("/proc/self/ns/") + which;
  return stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

Card Card::local() {
  Card c;
  c.boot_id = read_first_line("/proc/sys/kernel/random/boot_id");
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  c.hostname = host;
  if (c.boot_id.empty()) c.boot_id = "host:" + c.hostname;  // no procfs: trust the hostname
  c.mnt_ns = ns_inode("mnt");
  c.net_ns = ns_inode("net");
  c.pid_ns = ns_inode("pid");
  c.pid = getpid();
  return c;
}

std::string Card::encode() const {
  std::ostringstream out;
  out << "boot_id=" << boot_id << "\nmnt_ns=" << mnt_ns << "\nnet_ns=" << net_ns
      << "\npid_ns=" << pid_ns << "\npid=" << pid << "\nhostname=" << hostname << "\n";
  for (const auto& [name, addr] : addresses) out << "addr." << name << "=" << addr << "\n";
  return out.str();
}

Card Card::decode(const std::string& text) {
  Card c;
  std::istringstream in(text);
  std::string line;
  bool saw_boot = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto eq = line.find('=');
    if (eq == std::string::npos) throw ValueError("malformed address card line '" + line + "'");
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    try {
      if (key == "boot_id") { c.boot_id = value; saw_boot = true; }
      else if (key == "mnt_ns") c.mnt_ns = std::stoull(value);
      else if (key == "net_ns") c.net_ns = std::stoull(value);
      else if (key == "pid_ns") c.pid_ns = std::stoull(value);
      else if (key == "pid") c.pid = std::stoll(value);
      else if (key == "hostname") c.hostname = value;
      else if (key.rfind("addr.", 0) == 0) c.addresses[key.substr(5)] = value;
    } catch (const std::logic_error&) {
      throw ValueError("malformed address card value in '" + line + "'");
    }
  }
  if (!saw_boot) throw ValueError("address card without boot_id");
  return c;
}

}  // namespace dicomm
