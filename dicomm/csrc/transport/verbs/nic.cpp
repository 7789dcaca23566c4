#include "transport/verbs/nic.h"

#include <cstring>
#include <fcntl.h>

#include "core/log.h"
#include "core/types.h"

namespace dicomm::transport::verbs {

Nic::Nic(const IbvApi& api, const PortInfo& port, int max_qp_wr, int max_rd_atom, const EngineConfig& config)
    : api_(api), port_(port), max_qp_wr_(max_qp_wr), max_rd_atom_(max_rd_atom), ctx_(nullptr, {&api}),
      pd_(nullptr, {&api}) {
  int n = 0;
  ibv::device** list = api.get_device_list(&n);
  for (int i = 0; list && i < n && !ctx_; ++i)
    if (port.device == api.get_device_name(list[i])) ctx_.reset(api.open_device(list[i]));
  if (list) api.free_device_list(list);
  if (!ctx_) throw Error("verbs: cannot open RDMA device " + port.device);
  pd_.reset(api.alloc_pd(ctx_.get()));
  if (!pd_) throw Error("verbs: cannot allocate a protection domain on " + port.device);
  int fl = fcntl(ctx_->async_fd, F_GETFL);
  fcntl(ctx_->async_fd, F_SETFL, fl | O_NONBLOCK);  // events are read from the progress loop
  cache_ = std::make_unique<MrCache>(api, pd_.get(), port.describe(), config.ib_reg_cache, config.ib_force_staging);
}

Nic::~Nic() = default;  // the members release cache, protection domain and device, in that order

int Nic::async_fd() const { return ctx_->async_fd; }

bool Nic::poll_events() {
  bool any = false;
  ibv::async_event ev{};
  while (api_.get_async_event(ctx_.get(), &ev) == 0) {
    any = true;
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = port_.describe() + ": asynchronous event " + api_.event_type_str(ev.event_type);
    switch (ev.event_type) {
      case ibv::EVENT_QP_FATAL:
      case ibv::EVENT_QP_REQ_ERR:
      case ibv::EVENT_QP_ACCESS_ERR: {
        auto it = faults_.find(ev.element.qp->qp_num);
        if (it != faults_.end() && it->second->empty())
          *it->second = what + " on QP " + std::to_string(ev.element.qp->qp_num) + " (the queue pair is in error state)";
        break;
      }
      case ibv::EVENT_DEVICE_FATAL:
      case ibv::EVENT_PORT_ERR:
      case ibv::EVENT_CQ_ERR:
        if (ev.event_type != ibv::EVENT_PORT_ERR || ev.element.port_num == port_.port)
          for (auto& [qpn, f] : faults_)
            if (f->empty()) *f = what;
        log(LogLevel::kWarn, what);
        break;
      default:
        log(LogLevel::kInfo, what);
    }
    api_.ack_async_event(&ev);
  }
  return any;
}

}  // namespace dicomm::transport::verbs
