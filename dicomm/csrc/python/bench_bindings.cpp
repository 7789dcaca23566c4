// `dicomm._C_bench`: `_pingpong` and `_stream`, the benchmark's loops in C++, through the same
// Communicator calls the Python API makes (isend/irecv + wait), so a latency figure can separate the
// engine from the interpreter (perftest and OSU-style benchmarks are C loops too). A module apart from
// the production `_C`: it borrows `_C`'s engine through the table `_C._native_p2p` (python/native_p2p.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"
#include "python/native_p2p.h"

namespace py = pybind11;

namespace dicomm::python {
namespace {

const NativeP2P* g_p2p = nullptr;  // `_C`'s table: static, alive as long as the process

// A thin handle on `_C`'s Communicator, so that the loops below read as the Python API does.
struct Comm {
  Communicator* c;
  explicit Comm(const py::object& obj) : c(g_p2p->unwrap(obj.ptr())) {}
  int rank() const { return g_p2p->rank(*c); }
  RequestPtr isend(const void* buf, size_t bytes, int peer, Tag tag) const { return g_p2p->isend(*c, buf, bytes, peer, tag); }
  RequestPtr irecv(void* buf, size_t bytes, int peer, Tag tag) const { return g_p2p->irecv(*c, buf, bytes, peer, tag); }
};

// What both loops check before they start: another rank as the peer, and a positive timeout (returned
// as the wait's timeout).
std::chrono::milliseconds checked_loop(const Comm& c, int peer, double timeout_s, const char* loop) {
  if (!(timeout_s > 0)) throw ValueError("timeout_s must be positive");
  if (peer == c.rank()) throw ValueError(std::string(loop) + " needs a peer other than this rank (" + std::to_string(peer) + ")");
  return std::chrono::milliseconds(std::llround(timeout_s * 1000.0));
}

}  // namespace

void bind_bench(py::module_& m) {
  py::capsule table = py::module_::import("dicomm._C").attr("_native_p2p");
  if (std::string(table.name() ? table.name() : "") != NativeP2P::kCapsuleName)
    throw std::runtime_error("dicomm._C._native_p2p is not the capsule this module expects");
  g_p2p = table.get_pointer<NativeP2P>();
  if (g_p2p->version != NativeP2P::kVersion)
    throw std::runtime_error("dicomm._C lends native calls of version " + std::to_string(g_p2p->version) +
                             "; dicomm._C_bench was built for version " + std::to_string(NativeP2P::kVersion));
  m.def(
      "_pingpong",
      [](const py::object& comm, int peer, uintptr_t send_ptr, uintptr_t recv_ptr, size_t nbytes, int iters,
         bool initiator, int64_t tag, double timeout_s) {
        const Comm c(comm);
        if (iters < 0) throw ValueError("iters must be >= 0, got " + std::to_string(iters));
        if (tag < 0) throw ValueError("tag " + std::to_string(tag) + " is negative; tags are integers in [0, 2**63)");
        const auto timeout = checked_loop(c, peer, timeout_s, "ping-pong");
        const void* sbuf = reinterpret_cast<const void*>(send_ptr);
        void* rbuf = reinterpret_cast<void*>(recv_ptr);
        const Tag t = static_cast<Tag>(tag);
        std::vector<int64_t> round_trips;
        round_trips.reserve(initiator ? static_cast<size_t>(iters) : 0);
        py::gil_scoped_release nogil;
        for (int i = 0; i < iters; ++i) {
          if (initiator) {  // the same order as the Python loop: send, then receive the answer
            const auto t0 = std::chrono::steady_clock::now();
            c.isend(sbuf, nbytes, peer, t)->wait(timeout);
            c.irecv(rbuf, nbytes, peer, t)->wait(timeout);
            round_trips.push_back(
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
          } else {
            c.irecv(rbuf, nbytes, peer, t)->wait(timeout);
            c.isend(sbuf, nbytes, peer, t)->wait(timeout);
          }
        }
        return round_trips;
      },
      py::arg("comm"), py::arg("peer"), py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("nbytes"), py::arg("iters"),
      py::arg("initiator"), py::arg("tag") = 7, py::arg("timeout_s") = 60.0,
      "`iters` ping-pongs with `peer` through the Communicator's isend/irecv, looped in C++ without the GIL.\n"
      "The initiator sends first and returns each round trip's duration in ns; the other side answers and\n"
      "returns an empty list.");

  // Streaming, as osu_bw and ib_write_bw measure bandwidth: `window` messages in flight, then a 1 B
  // acknowledgement, so per-message handshakes overlap instead of adding up as in a ping-pong.
  m.def(
      "_stream",
      [](const py::object& comm, int peer, uintptr_t send_ptr, uintptr_t recv_ptr, size_t nbytes, int window,
         int iters, bool sender, int64_t tag, double timeout_s) {
        const Comm c(comm);
        if (window < 1 || iters < 0)
          throw ValueError("window must be >= 1 and iters >= 0, got window " + std::to_string(window) + ", iters " +
                           std::to_string(iters));
        // The acknowledgement uses tag + 1.
        if (tag < 0 || tag == INT64_MAX) throw ValueError("tag " + std::to_string(tag) + " is not in [0, 2**63 - 1)");
        const auto timeout = checked_loop(c, peer, timeout_s, "streaming");
        const Tag t = static_cast<Tag>(tag);
        std::vector<int64_t> windows;
        windows.reserve(sender ? static_cast<size_t>(iters) : 0);
        std::vector<RequestPtr> reqs(static_cast<size_t>(window));
        char ack = 0;
        py::gil_scoped_release nogil;
        for (int i = 0; i < iters; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int w = 0; w < window; ++w)  // the receiver lands message w in its own slice of recv_ptr
            reqs[w] = sender ? c.isend(reinterpret_cast<const void*>(send_ptr), nbytes, peer, t)
                             : c.irecv(reinterpret_cast<char*>(recv_ptr) + w * nbytes, nbytes, peer, t);
          for (auto& r : reqs) r->wait(timeout);
          if (sender) {
            c.irecv(&ack, 1, peer, t + 1)->wait(timeout);
            windows.push_back(
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
          } else {
            c.isend(&ack, 1, peer, t + 1)->wait(timeout);
          }
        }
        return windows;
      },
      py::arg("comm"), py::arg("peer"), py::arg("send_ptr"), py::arg("recv_ptr"), py::arg("nbytes"), py::arg("window"),
      py::arg("iters"), py::arg("sender"), py::arg("tag") = 9, py::arg("timeout_s") = 60.0,
      "`iters` windows of `window` messages of `nbytes` from the sender to `peer`, each window answered with a\n"
      "1 B acknowledgement, through the Communicator's isend/irecv looped in C++ without the GIL. The receiver\n"
      "lands message w of each window at recv_ptr + w * nbytes (window * nbytes bytes). The sender returns each\n"
      "window's duration in ns; the receiver returns an empty list.");
}

}  // namespace dicomm::python

PYBIND11_MODULE(_C_bench, m) {
  m.doc() = "dicomm's benchmark loops in C++ over a dicomm._C.Communicator (not part of the API)";
  dicomm::python::bind_bench(m);
}
