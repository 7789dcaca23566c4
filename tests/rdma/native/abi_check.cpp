// Compiles only if dicomm's own libibverbs declarations (transport/verbs/ibv.h) match rdma-core's
// real header: sizes and the offset of every field the transport touches.
#include <infiniband/verbs.h>

#include <cstddef>

#include "transport/verbs/ibv.h"

namespace d = dicomm::transport::verbs::ibv;

#define SAME_SIZE(ours, theirs) static_assert(sizeof(d::ours) == sizeof(theirs), #ours " size")
#define SAME_OFF(ours, theirs, f1, f2) \
  static_assert(offsetof(d::ours, f1) == offsetof(theirs, f2), #ours "." #f1 " offset")

SAME_SIZE(gid, ibv_gid);
SAME_SIZE(context_ops, ibv_context_ops);
SAME_OFF(context_ops, ibv_context_ops, poll_cq, poll_cq);
SAME_OFF(context_ops, ibv_context_ops, req_notify_cq, req_notify_cq);
SAME_OFF(context_ops, ibv_context_ops, post_send, post_send);
SAME_OFF(context_ops, ibv_context_ops, post_recv, post_recv);
SAME_SIZE(context, ibv_context);
SAME_OFF(context, ibv_context, ops, ops);
SAME_OFF(context, ibv_context, async_fd, async_fd);
SAME_SIZE(comp_channel, ibv_comp_channel);
SAME_OFF(comp_channel, ibv_comp_channel, fd, fd);
SAME_SIZE(pd, ibv_pd);
SAME_SIZE(mr, ibv_mr);
SAME_OFF(mr, ibv_mr, lkey, lkey);
SAME_OFF(mr, ibv_mr, rkey, rkey);
SAME_OFF(cq, ibv_cq, ctx, context);
SAME_OFF(qp, ibv_qp, qp_num, qp_num);
SAME_OFF(qp, ibv_qp, state, state);
SAME_SIZE(device_attr, ibv_device_attr);
SAME_OFF(device_attr, ibv_device_attr, max_qp_wr, max_qp_wr);
SAME_OFF(device_attr, ibv_device_attr, max_qp_rd_atom, max_qp_rd_atom);
SAME_OFF(device_attr, ibv_device_attr, phys_port_cnt, phys_port_cnt);
SAME_SIZE(port_attr, ibv_port_attr);
SAME_OFF(port_attr, ibv_port_attr, active_mtu, active_mtu);
SAME_OFF(port_attr, ibv_port_attr, gid_tbl_len, gid_tbl_len);
SAME_OFF(port_attr, ibv_port_attr, link_layer, link_layer);
SAME_SIZE(wc, ibv_wc);
SAME_OFF(wc, ibv_wc, status, status);
SAME_OFF(wc, ibv_wc, opcode, opcode);
SAME_OFF(wc, ibv_wc, vendor_err, vendor_err);
SAME_OFF(wc, ibv_wc, byte_len, byte_len);
SAME_OFF(wc, ibv_wc, qp_num, qp_num);
SAME_SIZE(sge, ibv_sge);
SAME_SIZE(send_wr, ibv_send_wr);
SAME_OFF(send_wr, ibv_send_wr, opcode, opcode);
SAME_OFF(send_wr, ibv_send_wr, send_flags, send_flags);
SAME_OFF(send_wr, ibv_send_wr, wr.rdma.remote_addr, wr.rdma.remote_addr);
SAME_OFF(send_wr, ibv_send_wr, wr.rdma.rkey, wr.rdma.rkey);
SAME_SIZE(recv_wr, ibv_recv_wr);
SAME_SIZE(qp_cap, ibv_qp_cap);
SAME_SIZE(qp_init_attr, ibv_qp_init_attr);
SAME_OFF(qp_init_attr, ibv_qp_init_attr, cap, cap);
SAME_OFF(qp_init_attr, ibv_qp_init_attr, qp_type, qp_type);
SAME_SIZE(global_route, ibv_global_route);
SAME_SIZE(ah_attr, ibv_ah_attr);
SAME_OFF(ah_attr, ibv_ah_attr, is_global, is_global);
SAME_OFF(ah_attr, ibv_ah_attr, port_num, port_num);
SAME_SIZE(qp_attr, ibv_qp_attr);
SAME_OFF(qp_attr, ibv_qp_attr, dest_qp_num, dest_qp_num);
SAME_OFF(qp_attr, ibv_qp_attr, ah, ah_attr);
SAME_OFF(qp_attr, ibv_qp_attr, pkey_index, pkey_index);
SAME_OFF(qp_attr, ibv_qp_attr, max_rd_atomic, max_rd_atomic);
SAME_OFF(qp_attr, ibv_qp_attr, max_dest_rd_atomic, max_dest_rd_atomic);
SAME_OFF(qp_attr, ibv_qp_attr, min_rnr_timer, min_rnr_timer);
SAME_OFF(qp_attr, ibv_qp_attr, port_num, port_num);
SAME_OFF(qp_attr, ibv_qp_attr, timeout, timeout);
SAME_OFF(qp_attr, ibv_qp_attr, rnr_retry, rnr_retry);
SAME_SIZE(async_event, ibv_async_event);
SAME_OFF(async_event, ibv_async_event, event_type, event_type);

static_assert(d::QPS_RTS == IBV_QPS_RTS && d::QPS_ERR == IBV_QPS_ERR && d::QPT_RC == IBV_QPT_RC, "qp enums");
static_assert(d::WR_RDMA_WRITE == IBV_WR_RDMA_WRITE && d::WR_SEND == IBV_WR_SEND && d::WR_RDMA_READ == IBV_WR_RDMA_READ, "wr");
static_assert(d::SEND_SIGNALED == IBV_SEND_SIGNALED && d::SEND_INLINE == IBV_SEND_INLINE, "send flags");
static_assert(d::QP_AV == IBV_QP_AV && d::QP_MAX_DEST_RD_ATOMIC == IBV_QP_MAX_DEST_RD_ATOMIC && d::QP_SQ_PSN == IBV_QP_SQ_PSN &&
              d::QP_MIN_RNR_TIMER == IBV_QP_MIN_RNR_TIMER && d::QP_RQ_PSN == IBV_QP_RQ_PSN && d::QP_DEST_QPN == IBV_QP_DEST_QPN &&
              d::QP_PATH_MTU == IBV_QP_PATH_MTU && d::QP_RNR_RETRY == IBV_QP_RNR_RETRY, "attr mask");
static_assert(d::WC_RETRY_EXC_ERR == IBV_WC_RETRY_EXC_ERR && d::WC_RECV == IBV_WC_RECV && d::WC_WR_FLUSH_ERR == IBV_WC_WR_FLUSH_ERR, "wc");
static_assert(d::EVENT_QP_FATAL == IBV_EVENT_QP_FATAL && d::EVENT_DEVICE_FATAL == IBV_EVENT_DEVICE_FATAL &&
              d::EVENT_PORT_ERR == IBV_EVENT_PORT_ERR && d::EVENT_GID_CHANGE == IBV_EVENT_GID_CHANGE, "events");
static_assert(d::LINK_LAYER_ETHERNET == IBV_LINK_LAYER_ETHERNET && d::PORT_ACTIVE == IBV_PORT_ACTIVE, "port");

int main() { return 0; }
