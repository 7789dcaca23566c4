// The part of libibverbs' stable ABI (rdma-core's infiniband/verbs.h, x86_64/aarch64 LP64) that the
// verbs transport uses, declared here so that dicomm builds without rdma-core. The library itself
// is loaded at run time (ibv_api.h). Layouts are checked against the real header by
// tests/rdma/native/abi_check.cpp wherever that header is available.
#pragma once

#include <cstddef>
#include <cstdint>
#include <pthread.h>

namespace dicomm::transport::verbs::ibv {

struct device;
struct comp_channel { struct context* context; int fd; int refcnt; };
struct cq;
struct qp;
struct wc;
struct send_wr;
struct recv_wr;

union gid {
  uint8_t raw[16];
  struct { uint64_t subnet_prefix; uint64_t interface_id; } global;
};

// Only post_send / post_recv / poll_cq / req_notify_cq are called through here: in rdma-core they
// are inline functions of verbs.h that jump through this table.
struct context_ops {
  void* compat0[11];
  int (*poll_cq)(struct cq* cq, int num_entries, struct wc* wc);
  int (*req_notify_cq)(struct cq* cq, int solicited_only);
  void* compat1[7];
  int (*post_srq_recv)(void* srq, recv_wr* wr, recv_wr** bad);
  void* compat2[4];
  int (*post_send)(struct qp* qp, send_wr* wr, send_wr** bad);
  int (*post_recv)(struct qp* qp, recv_wr* wr, recv_wr** bad);
  void* compat3[5];
};

struct context {
  device* dev;
  context_ops ops;
  int cmd_fd;
  int async_fd;
  int num_comp_vectors;
  pthread_mutex_t mutex;
  void* abi_compat;
};

struct pd { context* ctx; uint32_t handle; };

struct mr {
  context* ctx;
  struct pd* pd;
  void* addr;
  size_t length;
  uint32_t handle;
  uint32_t lkey;
  uint32_t rkey;
};

struct cq { context* ctx; };  // leading member only: the library allocates it

struct qp {
  context* ctx;
  void* qp_context;
  struct pd* pd;
  struct cq* send_cq;
  struct cq* recv_cq;
  void* srq;
  uint32_t handle;
  uint32_t qp_num;
  uint32_t state;
  uint32_t qp_type;
};

struct device_attr {
  char fw_ver[64];
  uint64_t node_guid;
  uint64_t sys_image_guid;
  uint64_t max_mr_size;
  uint64_t page_size_cap;
  uint32_t vendor_id;
  uint32_t vendor_part_id;
  uint32_t hw_ver;
  int max_qp;
  int max_qp_wr;
  unsigned int device_cap_flags;
  int max_sge;
  int max_sge_rd;
  int max_cq;
  int max_cqe;
  int max_mr;
  int max_pd;
  int max_qp_rd_atom;
  int max_ee_rd_atom;
  int max_res_rd_atom;
  int max_qp_init_rd_atom;
  int max_ee_init_rd_atom;
  uint32_t atomic_cap;
  int max_ee, max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
      max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge;
  uint16_t max_pkeys;
  uint8_t local_ca_ack_delay;
  uint8_t phys_port_cnt;
};

// The exported ibv_query_port fills at most this much (newer headers append fields we do not read).
struct port_attr {
  uint32_t state;
  uint32_t max_mtu;
  uint32_t active_mtu;
  int gid_tbl_len;
  uint32_t port_cap_flags;
  uint32_t max_msg_sz;
  uint32_t bad_pkey_cntr;
  uint32_t qkey_viol_cntr;
  uint16_t pkey_tbl_len;
  uint16_t lid;
  uint16_t sm_lid;
  uint8_t lmc;
  uint8_t max_vl_num;
  uint8_t sm_sl;
  uint8_t subnet_timeout;
  uint8_t init_type_reply;
  uint8_t active_width;
  uint8_t active_speed;
  uint8_t phys_state;
  uint8_t link_layer;
  uint8_t flags;
  uint16_t port_cap_flags2;
};

struct wc {
  uint64_t wr_id;
  uint32_t status;
  uint32_t opcode;
  uint32_t vendor_err;
  uint32_t byte_len;
  uint32_t imm_data;
  uint32_t qp_num;
  uint32_t src_qp;
  unsigned int wc_flags;
  uint16_t pkey_index;
  uint16_t slid;
  uint8_t sl;
  uint8_t dlid_path_bits;
};

struct sge { uint64_t addr; uint32_t length; uint32_t lkey; };

struct send_wr {
  uint64_t wr_id;
  send_wr* next;
  sge* sg_list;
  int num_sge;
  uint32_t opcode;
  unsigned int send_flags;
  uint32_t imm_data;
  union {
    struct { uint64_t remote_addr; uint32_t rkey; } rdma;
    struct { uint64_t remote_addr; uint64_t compare_add; uint64_t swap; uint32_t rkey; } atomic;
  } wr;
  uint32_t xrc_remote_srqn;
  uint8_t tail[48];  // bind_mw / tso, unused
};

struct recv_wr { uint64_t wr_id; recv_wr* next; sge* sg_list; int num_sge; };

struct qp_cap {
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
};

struct qp_init_attr {
  void* qp_context;
  cq* send_cq;
  cq* recv_cq;
  void* srq;
  qp_cap cap;
  uint32_t qp_type;
  int sq_sig_all;
};

struct global_route {
  gid dgid;
  uint32_t flow_label;
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
};

struct ah_attr {
  global_route grh;
  uint16_t dlid;
  uint8_t sl;
  uint8_t src_path_bits;
  uint8_t static_rate;
  uint8_t is_global;
  uint8_t port_num;
};

struct qp_attr {
  uint32_t qp_state, cur_qp_state, path_mtu, path_mig_state;
  uint32_t qkey, rq_psn, sq_psn, dest_qp_num;
  unsigned int qp_access_flags;
  qp_cap cap;
  ah_attr ah;
  ah_attr alt_ah;
  uint16_t pkey_index, alt_pkey_index;
  uint8_t en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout,
      retry_cnt, rnr_retry, alt_port_num, alt_timeout;
  uint32_t rate_limit;
};

struct async_event {
  union { struct cq* cq; struct qp* qp; void* srq; void* wq; int port_num; } element;
  uint32_t event_type;
};

// Enumerations (values of the ABI).
enum : uint32_t { QPS_RESET = 0, QPS_INIT = 1, QPS_RTR = 2, QPS_RTS = 3, QPS_ERR = 6 };
enum : uint32_t { QPT_RC = 2 };
enum : uint32_t { PORT_ACTIVE = 4 };
enum : uint32_t { LINK_LAYER_INFINIBAND = 1, LINK_LAYER_ETHERNET = 2 };
enum : uint32_t { WR_RDMA_WRITE = 0, WR_SEND = 2, WR_RDMA_READ = 4 };
enum : unsigned { SEND_SIGNALED = 2, SEND_INLINE = 8 };
enum : int { ACCESS_LOCAL_WRITE = 1, ACCESS_REMOTE_WRITE = 2, ACCESS_REMOTE_READ = 4 };
enum : int {
  QP_STATE = 1, QP_ACCESS_FLAGS = 1 << 3, QP_PKEY_INDEX = 1 << 4, QP_PORT = 1 << 5, QP_AV = 1 << 7,
  QP_PATH_MTU = 1 << 8, QP_TIMEOUT = 1 << 9, QP_RETRY_CNT = 1 << 10, QP_RNR_RETRY = 1 << 11, QP_RQ_PSN = 1 << 12,
  QP_MAX_QP_RD_ATOMIC = 1 << 13, QP_MIN_RNR_TIMER = 1 << 15, QP_SQ_PSN = 1 << 16, QP_MAX_DEST_RD_ATOMIC = 1 << 17, QP_DEST_QPN = 1 << 20,
};
enum : uint32_t { WC_SUCCESS = 0, WC_WR_FLUSH_ERR = 5, WC_RETRY_EXC_ERR = 12, WC_RNR_RETRY_EXC_ERR = 13 };
enum : uint32_t { WC_RECV = 128 };
enum : uint32_t {
  EVENT_CQ_ERR = 0, EVENT_QP_FATAL = 1, EVENT_QP_REQ_ERR = 2, EVENT_QP_ACCESS_ERR = 3, EVENT_DEVICE_FATAL = 8,
  EVENT_PORT_ACTIVE = 9, EVENT_PORT_ERR = 10, EVENT_GID_CHANGE = 18,
};

// IB MTU enum <-> bytes.
inline int mtu_bytes(uint32_t mtu) { return mtu >= 1 && mtu <= 5 ? 128 << mtu : 0; }

}  // namespace dicomm::transport::verbs::ibv
