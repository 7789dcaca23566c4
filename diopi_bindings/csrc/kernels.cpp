// The memory kernels of the device: allocation, views, resize_, set_, and copies through the
// library's memcpy (synchronous ones after the current stream, non_blocking ones queued on it). Every other operator reaches the boxed fallback (Python, router.py), which runs
// it in the library or on the CPU.
#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_conj.h>
#include <ATen/ops/_neg_view.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <memory>
#include <optional>

#include "device.h"
#include "runtime.h"
#include "streams.h"

namespace diopi_bindings {

namespace {

// Tensor copies by direction (CopyKind), whoever asked: .to(), .cpu(), .item(), the CPU fallback's.
std::array<std::atomic<int64_t>, 4> g_copies{};

const c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

bool on_device(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device target = c10::device_or_default(device);
  TORCH_CHECK(target.type() == c10::DeviceType::PrivateUse1, "diopi: empty on ", target);
  c10::DeviceGuard guard(target);  // the allocator allocates on the current device
  return at::detail::empty_generic(size, device_allocator(), kKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::Device target = c10::device_or_default(device);
  c10::DeviceGuard guard(target);
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) offset = storage_offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Makes the storage hold `nbytes` at least.
void ensure_storage(const at::Tensor& self, size_t nbytes) {
  const c10::Storage& storage = self.storage();
  if (nbytes > storage.nbytes()) resize_storage(storage, nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  impl->set_sizes_contiguous(sizes);
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  ensure_storage(self, at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                        self.storage_offset()));
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1, "diopi: set_ with storage of ", source.device());
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.empty())
    impl->set_sizes_contiguous(size);
  else
    impl->set_sizes_and_strides(size, stride);
  ensure_storage(self, at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                        self.storage_offset()));
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

// The bytes a device tensor spans in its storage, on the host, and a CPU view into them with the
// tensor's sizes and strides: strided copies run on the CPU between two bulk transfers.
struct HostStage {
  at::Tensor buffer;
  at::Tensor view;
  char* device_bytes = nullptr;
  c10::DeviceIndex device = 0;

  HostStage(const at::Tensor& t, bool load) : device(t.device().index()) {
    int64_t low = 0, high = 0;  // element offsets relative to storage_offset
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.size(d) <= 1) continue;
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? low : high) += reach;
    }
    const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
    const int64_t nbytes = (high - low + 1) * itemsize;
    device_bytes = static_cast<char*>(t.storage().data_ptr().get()) + (t.storage_offset() + low) * itemsize;
    buffer = at::empty({nbytes}, at::TensorOptions().dtype(at::kByte));
    if (load) copy_d2h(device, buffer.data_ptr(), device_bytes, nbytes);
    view = buffer.view(t.scalar_type()).as_strided(t.sizes(), t.strides(), -low);
  }

  void store() const { copy_h2d(device, device_bytes, buffer.data_ptr(), buffer.numel()); }
};

// A conjugate or negative view's memory holds the values before the conjugation or negation.
bool lazy_math(const at::Tensor& t) { return t.is_conj() || t.is_neg(); }

// `host`, a CPU view of `t`'s bytes, with `t`'s conjugate and negative bits (CPU copies resolve them).
at::Tensor with_math_bits(const at::Tensor& host, const at::Tensor& t) {
  at::Tensor out = t.is_conj() ? at::_conj(host) : host;
  return t.is_neg() ? at::_neg_view(out) : out;
}

bool plain(const at::Tensor& a, const at::Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes().equals(b.sizes()) && a.is_contiguous() && b.is_contiguous() &&
         !lazy_math(a) && !lazy_math(b);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  const bool src_dev = on_device(self), dst_dev = on_device(dst);
  g_copies[src_dev && dst_dev ? kDeviceToDevice : dst_dev ? kHostToDevice : kDeviceToHost].fetch_add(1);
  const int64_t nbytes = static_cast<int64_t>(self.nbytes());
  if (plain(self, dst)) {  // one transfer
    // non_blocking between host and device: queued on the current stream (a library with streams), the
    // host side held until the stream reaches it; the caller synchronizes before reading a host result.
    if (non_blocking && has_streams() && src_dev != dst_dev) {
      if (dst_dev)
        copy_h2d_async(dst.device().index(), dst.data_ptr(), self.data_ptr(), nbytes, self.storage());
      else
        copy_d2h_async(self.device().index(), dst.data_ptr(), self.data_ptr(), nbytes, dst.storage());
      return dst;
    }
    if (src_dev && dst_dev)
      copy_d2d(dst.device().index(), dst.data_ptr(), self.device().index(), self.data_ptr(), nbytes);
    else if (dst_dev)
      copy_h2d(dst.device().index(), dst.data_ptr(), self.data_ptr(), nbytes);
    else
      copy_d2h(self.device().index(), dst.data_ptr(), self.data_ptr(), nbytes);
    return dst;
  }
  std::optional<HostStage> source;
  if (src_dev) source.emplace(self, true);
  const at::Tensor host_src = src_dev ? with_math_bits(source->view, self) : self;
  if (!dst_dev) {
    dst.copy_(host_src);
    return dst;
  }
  // A destination that does not cover its whole span keeps the bytes in between: read them first.
  HostStage target(dst, !dst.is_non_overlapping_and_dense());
  with_math_bits(target.view, dst).copy_(host_src);
  target.store();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

// Tensor.record_stream(s): the caching allocator holds the storage's block for s when it is freed.
void record_stream(at::Tensor& self, c10::Stream stream) {
  static_cast<c10::DeviceAllocator*>(device_allocator())->recordStream(self.storage().data_ptr(), stream);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  g_copies[kItem].fetch_add(1);
  HostStage stage(self, true);
  return stage.view.item();
}

}  // namespace

int64_t copy_count(CopyKind kind) { return g_copies[kind].load(); }

void register_kernels() {
  static auto* library =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  library->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  library->impl("empty_strided", TORCH_FN(empty_strided));
  library->impl("as_strided", TORCH_FN(as_strided));
  library->impl("view", TORCH_FN(view));
  library->impl("_reshape_alias", TORCH_FN(reshape_alias));
  library->impl("resize_", TORCH_FN(resize_));
  library->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  library->impl("set_.source_Storage", TORCH_FN(set_storage));
  library->impl("set_.source_Tensor", TORCH_FN(set_tensor));
  library->impl("_copy_from", TORCH_FN(copy_from));
  library->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  library->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  library->impl("record_stream", TORCH_FN(record_stream));
  // torch's fallback for conjugate and negative views resolves them with a clone, which copies through
  // _copy_from again, without end: the copies take the views as they are and resolve them on the host.
  for (const c10::DispatchKey key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
    auto* views = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    views->impl("_copy_from", torch::CppFunction::makeFallthrough());
    views->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }
}

}  // namespace diopi_bindings
