// One opened RDMA port: device context, protection domain, registration cache, and the device's
// asynchronous events (a QP in error, a port going down, a fatal device error), which fail the
// connections they concern.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/config.h"
#include "transport/verbs/device.h"
#include "transport/verbs/mr_cache.h"
#include "transport/verbs/owned.h"

namespace dicomm::transport::verbs {

// A connection's fault, set by an async event, thrown by the connection's next progress().
using Fault = std::shared_ptr<std::string>;

class Nic {
 public:
  Nic(const IbvApi& api, const PortInfo& port, int max_qp_wr, int max_rd_atom, const EngineConfig& config);
  ~Nic();
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;

  const IbvApi& api() const { return api_; }
  ibv::context* ctx() const { return ctx_.get(); }
  ibv::pd* pd() const { return pd_.get(); }
  const PortInfo& port() const { return port_; }
  int max_qp_wr() const { return max_qp_wr_; }
  int max_rd_atom() const { return max_rd_atom_; }
  MrCache& cache() { return *cache_; }
  int async_fd() const;

  // Connections are set up outside the engine lock: the fault table has its own.
  void watch(uint32_t qp_num, Fault fault) {
    std::lock_guard<std::mutex> lock(mu_);
    faults_[qp_num] = std::move(fault);
  }
  void unwatch(uint32_t qp_num) {
    std::lock_guard<std::mutex> lock(mu_);
    faults_.erase(qp_num);
  }
  // Reads pending async events; true if any. Device-wide events fault every watched connection.
  bool poll_events();

 private:
  const IbvApi& api_;
  PortInfo port_;
  int max_qp_wr_, max_rd_atom_;
  // Owned, in dependency order: released in reverse, also when the constructor throws halfway.
  OwnedContext ctx_;
  OwnedPd pd_;
  std::unique_ptr<MrCache> cache_;
  std::mutex mu_;
  std::map<uint32_t, Fault> faults_;
};

}  // namespace dicomm::transport::verbs
