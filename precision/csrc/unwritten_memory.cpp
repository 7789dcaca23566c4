#include "unwritten_memory.h"

#include <ATen/ATen.h>

namespace ditorch_precision {

namespace {
bool tracked_kind(const at::Tensor& t) {
  return t.defined() && t.layout() == c10::kStrided && t.has_storage() && t.numel() > 0;
}
}  // namespace

void UnwrittenMemory::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  masks_.clear();
  size_ = 0;
}

void UnwrittenMemory::allocated(const at::Tensor& t) {
  if (!tracked_kind(t)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (entry(t) != nullptr) return;  // the same storage, seen already
  if (masks_.size() >= limit_) {  // storages freed since, never looked up again: forget them
    for (auto it = masks_.begin(); it != masks_.end();) it = it->second.ref.expired() ? masks_.erase(it) : ++it;
    limit_ = std::max<size_t>(64, 2 * masks_.size());
  }
  const int64_t itemsize = static_cast<int64_t>(t.element_size());
  const int64_t n = static_cast<int64_t>(s->nbytes()) / itemsize;
  masks_.insert_or_assign(
      s, Entry{c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl()),
               at::ones({n}, at::TensorOptions().dtype(at::kBool)), itemsize});
  size_ = masks_.size();
}

UnwrittenMemory::Entry* UnwrittenMemory::entry(const at::Tensor& t) {
  if (masks_.empty() || !tracked_kind(t)) return nullptr;
  auto it = masks_.find(t.storage().unsafeGetStorageImpl());
  if (it == masks_.end()) return nullptr;
  if (it->second.ref.expired()) {  // freed; the address may be another storage's now
    masks_.erase(it);
    size_ = masks_.size();
    return nullptr;
  }
  return &it->second;
}

at::Tensor UnwrittenMemory::view(const Entry& e, const at::Tensor& t) const {
  if (static_cast<int64_t>(t.element_size()) != e.itemsize) return {};
  // The view's furthest element must lie in the mask (a storage grown since is not the mask's).
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  if (t.storage_offset() < 0 || last >= e.mask.numel()) return {};
  return e.mask.as_strided(t.sizes(), t.strides(), t.storage_offset());
}

void UnwrittenMemory::written(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = entry(t);
  if (e == nullptr) return;
  at::Tensor v = view(*e, t);
  if (!v.defined()) {  // a view in another dtype: its elements are not the mask's
    masks_.erase(t.storage().unsafeGetStorageImpl());
    size_ = masks_.size();
    return;
  }
  v.fill_(false);
  if (!e->mask.any().item<bool>()) masks_.erase(t.storage().unsafeGetStorageImpl());
  size_ = masks_.size();
}

at::Tensor UnwrittenMemory::mask(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = entry(t);
  if (e == nullptr) return {};
  at::Tensor v = view(*e, t);
  if (!v.defined() || !v.any().item<bool>()) return {};
  return v.clone();
}

}  // namespace ditorch_precision
