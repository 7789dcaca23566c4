// Python methods for the collectives: each checks its arguments (dicomm.ValueError, a ValueError),
// releases the GIL
// and returns a Request at once. Buffers are raw addresses (e.g. tensor.data_ptr()) that must stay
// valid until the request completes.
#include <pybind11/stl.h>

#include "collectives/collectives.h"
#include "python/bindings.h"
#include "reduce/reduce.h"

namespace py = pybind11;

namespace dicomm::python {
namespace {

void* ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

}  // namespace

void bind_collectives(py::module_& m, CommClass& comm) {
  using py::arg;
  const auto release = py::call_guard<py::gil_scoped_release>();

  comm.def(
      "broadcast",
      [](Communicator& c, uintptr_t buf, size_t nbytes, int root) {
        return broadcast(c, ptr(buf), nbytes, root);
      },
      arg("ptr"), arg("nbytes"), arg("root"), release,
      "Copies root's nbytes at ptr into every rank's ptr.");
  comm.def(
      "all_reduce",
      [](Communicator& c, uintptr_t buf, size_t count, const std::string& dtype,
         const std::string& op) {
        return all_reduce(c, ptr(buf), count, dtype_from_name(dtype), reduce_op_from_name(op));
      },
      arg("ptr"), arg("count"), arg("dtype"), arg("op"), release,
      "In place: ptr becomes op over every rank's ptr (count elements of dtype).");
  comm.def(
      "reduce",
      [](Communicator& c, uintptr_t buf, size_t count, const std::string& dtype,
         const std::string& op, int root) {
        return reduce(c, ptr(buf), count, dtype_from_name(dtype), reduce_op_from_name(op), root);
      },
      arg("ptr"), arg("count"), arg("dtype"), arg("op"), arg("root"), release,
      "In place at root: root's ptr becomes op over every rank's ptr; other ranks' are unchanged.");
  comm.def(
      "all_gather",
      [](Communicator& c, uintptr_t send, size_t nbytes, const Pointers& recv) {
        return all_gather(c, ptr(send), nbytes, recv);
      },
      arg("send_ptr"), arg("nbytes"), arg("recv_ptrs"), release,
      "recv_ptrs[r] receives rank r's nbytes at send_ptr.");
  comm.def(
      "gather",
      [](Communicator& c, uintptr_t send, size_t nbytes, const Pointers& recv, int root) {
        return gather(c, ptr(send), nbytes, recv, root);
      },
      arg("send_ptr"), arg("nbytes"), arg("recv_ptrs"), arg("root"), release,
      "At root, recv_ptrs[r] receives rank r's nbytes; recv_ptrs is empty on other ranks.");
  comm.def(
      "scatter",
      [](Communicator& c, const Pointers& send, uintptr_t recv, size_t nbytes, int root) {
        return scatter(c, send, ptr(recv), nbytes, root);
      },
      arg("send_ptrs"), arg("recv_ptr"), arg("nbytes"), arg("root"), release,
      "Root's send_ptrs[r] lands in rank r's recv_ptr; send_ptrs is empty on other ranks.");
  comm.def(
      "reduce_scatter",
      [](Communicator& c, const Pointers& send, uintptr_t recv, size_t count,
         const std::string& dtype, const std::string& op) {
        return reduce_scatter(c, send, ptr(recv), count, dtype_from_name(dtype),
                              reduce_op_from_name(op));
      },
      arg("send_ptrs"), arg("recv_ptr"), arg("count"), arg("dtype"), arg("op"), release,
      "send_ptrs[r] holds count elements for rank r; recv_ptr gets op over every rank's block "
      "for this rank.");
  comm.def(
      "all_to_all",
      [](Communicator& c, const Pointers& send, const Sizes& send_nbytes, const Pointers& recv,
         const Sizes& recv_nbytes) {
        return all_to_all(c, send, send_nbytes, recv, recv_nbytes);
      },
      arg("send_ptrs"), arg("send_nbytes"), arg("recv_ptrs"), arg("recv_nbytes"), release,
      "send_ptrs[r] goes to rank r, recv_ptrs[r] comes from rank r; sizes may differ per pair "
      "but each pair's must agree.");
  comm.def(
      "barrier", [](Communicator& c) { return barrier(c); }, release,
      "Completes once every rank has entered the barrier.");

  m.def(
      "reduce_into",
      [](uintptr_t dst, uintptr_t src, size_t count, const std::string& dtype,
         const std::string& op) {
        const ReduceOp rop = reduce_op_from_name(op);
        if (rop == ReduceOp::kAvg)
          throw ValueError("reduce_into has no 'avg': collectives sum, then divide once");
        if (count > 0 && (dst == 0 || src == 0)) throw ValueError("null dst or src pointer");
        reduction::combine(ptr(dst), ptr(dst), ptr(src), count, dtype_from_name(dtype), rop);
      },
      arg("dst_ptr"), arg("src_ptr"), arg("count"), arg("dtype"), arg("op"), release,
      "dst = op(dst, src) element-wise with the collectives' kernels (torch semantics).");
  m.def("reduce_kernel_isa", &reduction::kernel_isa,
        "Instruction set the reduction kernels use on this machine: 'avx2+f16c' or 'generic'.");
}

}  // namespace dicomm::python
