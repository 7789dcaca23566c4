// libibverbs, loaded with dlopen on first use: a host without rdma-core simply has no verbs.
#pragma once

#include <string>

#include "transport/verbs/ibv.h"

namespace dicomm::transport::verbs {

struct IbvApi {
  ibv::device** (*get_device_list)(int* num);
  void (*free_device_list)(ibv::device** list);
  const char* (*get_device_name)(ibv::device* dev);
  ibv::context* (*open_device)(ibv::device* dev);
  int (*close_device)(ibv::context* ctx);
  int (*query_device)(ibv::context* ctx, ibv::device_attr* attr);
  int (*query_port)(ibv::context* ctx, uint8_t port, ibv::port_attr* attr);
  int (*query_gid)(ibv::context* ctx, uint8_t port, int index, ibv::gid* gid);
  ibv::pd* (*alloc_pd)(ibv::context* ctx);
  int (*dealloc_pd)(ibv::pd* pd);
  ibv::mr* (*reg_mr)(ibv::pd* pd, void* addr, size_t length, int access);
  ibv::mr* (*reg_dmabuf_mr)(ibv::pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);  // may be null
  int (*dereg_mr)(ibv::mr* mr);
  ibv::comp_channel* (*create_comp_channel)(ibv::context* ctx);
  int (*destroy_comp_channel)(ibv::comp_channel* ch);
  ibv::cq* (*create_cq)(ibv::context* ctx, int cqe, void* cq_context, ibv::comp_channel* ch, int comp_vector);
  int (*destroy_cq)(ibv::cq* cq);
  int (*get_cq_event)(ibv::comp_channel* ch, ibv::cq** cq, void** cq_context);
  void (*ack_cq_events)(ibv::cq* cq, unsigned int nevents);
  ibv::qp* (*create_qp)(ibv::pd* pd, ibv::qp_init_attr* attr);
  int (*modify_qp)(ibv::qp* qp, ibv::qp_attr* attr, int mask);
  int (*destroy_qp)(ibv::qp* qp);
  int (*get_async_event)(ibv::context* ctx, ibv::async_event* event);
  void (*ack_async_event)(ibv::async_event* event);
  const char* (*wc_status_str)(uint32_t status);
  const char* (*event_type_str)(uint32_t event);

  // The inline verbs of verbs.h: through the context's op table.
  static int post_send(ibv::qp* qp, ibv::send_wr* wr, ibv::send_wr** bad) { return qp->ctx->ops.post_send(qp, wr, bad); }
  static int post_recv(ibv::qp* qp, ibv::recv_wr* wr, ibv::recv_wr** bad) { return qp->ctx->ops.post_recv(qp, wr, bad); }
  static int poll_cq(ibv::cq* cq, int n, ibv::wc* wc) { return cq->ctx->ops.poll_cq(cq, n, wc); }
  static int req_notify_cq(ibv::cq* cq) { return cq->ctx->ops.req_notify_cq(cq, 0); }
};

// The loaded library, or null with `why` set ("libibverbs.so.1 not found: ..."). Loaded once.
const IbvApi* ibv_api(std::string* why = nullptr);

}  // namespace dicomm::transport::verbs
