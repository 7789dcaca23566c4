#include "transport/verbs/ibv_api.h"

#include "core/config.h"

#include <cstdlib>
#include <dlfcn.h>
#include <mutex>

namespace dicomm::transport::verbs {
namespace {

struct Loaded {
  IbvApi api{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool bind(void* lib, const char* name, F* slot, std::string* missing) {
  *slot = reinterpret_cast<F>(dlsym(lib, name));
  if (!*slot) *missing += (missing->empty() ? "" : ", ") + std::string(name);
  return *slot != nullptr;
}

Loaded load() {
  Loaded l;
  // DICOMM_IBVERBS_LIB points at another build of the library (tests, unusual installs).
  const std::string lib_name = config::text("DICOMM_IBVERBS_LIB");
  const char* name = lib_name.c_str();
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    l.why = std::string(name) + " could not be loaded (rdma-core is not installed?): " + (err ? err : "unknown error");
    return l;
  }
  IbvApi& a = l.api;
  std::string missing;
  bind(lib, "ibv_get_device_list", &a.get_device_list, &missing);
  bind(lib, "ibv_free_device_list", &a.free_device_list, &missing);
  bind(lib, "ibv_get_device_name", &a.get_device_name, &missing);
  bind(lib, "ibv_open_device", &a.open_device, &missing);
  bind(lib, "ibv_close_device", &a.close_device, &missing);
  bind(lib, "ibv_query_device", &a.query_device, &missing);
  bind(lib, "ibv_query_port", &a.query_port, &missing);
  bind(lib, "ibv_query_gid", &a.query_gid, &missing);
  bind(lib, "ibv_alloc_pd", &a.alloc_pd, &missing);
  bind(lib, "ibv_dealloc_pd", &a.dealloc_pd, &missing);
  bind(lib, "ibv_reg_mr", &a.reg_mr, &missing);
  bind(lib, "ibv_dereg_mr", &a.dereg_mr, &missing);
  bind(lib, "ibv_create_comp_channel", &a.create_comp_channel, &missing);
  bind(lib, "ibv_destroy_comp_channel", &a.destroy_comp_channel, &missing);
  bind(lib, "ibv_create_cq", &a.create_cq, &missing);
  bind(lib, "ibv_destroy_cq", &a.destroy_cq, &missing);
  bind(lib, "ibv_get_cq_event", &a.get_cq_event, &missing);
  bind(lib, "ibv_ack_cq_events", &a.ack_cq_events, &missing);
  bind(lib, "ibv_create_qp", &a.create_qp, &missing);
  bind(lib, "ibv_modify_qp", &a.modify_qp, &missing);
  bind(lib, "ibv_destroy_qp", &a.destroy_qp, &missing);
  bind(lib, "ibv_get_async_event", &a.get_async_event, &missing);
  bind(lib, "ibv_ack_async_event", &a.ack_async_event, &missing);
  bind(lib, "ibv_wc_status_str", &a.wc_status_str, &missing);
  bind(lib, "ibv_event_type_str", &a.event_type_str, &missing);
  if (!missing.empty()) {
    l.why = std::string(name) + " lacks " + missing + " (too old an rdma-core?)";
    dlclose(lib);
    return l;
  }
  std::string optional;  // ibv_reg_dmabuf_mr came with rdma-core 34: its absence only rules out dma-buf
  bind(lib, "ibv_reg_dmabuf_mr", &a.reg_dmabuf_mr, &optional);
  l.ok = true;
  return l;  // the library stays loaded for the life of the process
}

}  // namespace

const IbvApi* ibv_api(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.ok && why) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace dicomm::transport::verbs
