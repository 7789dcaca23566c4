#include "index_writer.h"

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "part_writer.h"

namespace ditorch_precision {

std::atomic<uint64_t> g_fork_generation{0};

namespace {
constexpr size_t kPoolLimit = 1 << 16;  // records kept for reuse: a step's worth on a large model

// Registered as the module loads, before any writer exists to be inherited by a child.
[[maybe_unused]] const int kForkCounted = pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1); });
}  // namespace

IndexWriter::IndexWriter(const std::string& path, const DtypeNames& dtype_name, size_t max_queued)
    : path_(path), dtype_name_(dtype_name), max_queued_(max_queued < 1 ? 1 : max_queued) {
  file_ = std::fopen(path.c_str(), "ab");
  if (file_ == nullptr)
    throw std::runtime_error("capture index " + path + ": cannot open for writing (" + std::strerror(errno) + ")");
  thread_ = std::thread([this] { run(); });
}

IndexWriter::~IndexWriter() {
  try {
    close();
  } catch (...) {  // a destructor does not raise; close() raised it to whoever closed first
  }
}

void IndexWriter::take(std::vector<std::unique_ptr<Record>>& into, size_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (; n > 0 && !pool_.empty(); --n) {
      into.push_back(std::move(pool_.back()));
      pool_.pop_back();
    }
  }
  for (; n > 0; --n) into.push_back(std::make_unique<Record>());
}

void IndexWriter::raise_error() const {
  if (!error_.empty()) throw std::runtime_error(error_);
}

void IndexWriter::set_parts(const std::string& dir, int64_t part_bytes, int64_t max_queued_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  parts_dir_ = dir;
  part_bytes_ = part_bytes;
  max_queued_bytes_ = max_queued_bytes;
}

void IndexWriter::wait_for(const c10::StorageImpl* storage) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = in_flight_.find(storage);
  if (it == in_flight_.end() || it->second <= done_) return;
  const uint64_t until = it->second;
  ++write_waits_;
  done_cv_.wait(lock, [&] { return done_ >= until || !error_.empty(); });
}

int64_t IndexWriter::parts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return parts_;
}

int64_t IndexWriter::write_waits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return write_waits_;
}

namespace {
int64_t held_bytes(const Batch& batch) {
  int64_t n = 0;
  for (const auto& r : batch)
    if (r->saved) n += r->payload->nbytes;
  return n;
}
}  // namespace

void IndexWriter::write_parts(Batch& batch) {
  std::vector<const Record*> part;
  int64_t bytes = 0;
  auto flush = [&] {
    char name[32];
    std::snprintf(name, sizeof name, "part%05lld.bin", static_cast<long long>(parts_));
    write_part(parts_dir_ + "/" + name, part, dtype_name_);
    part.clear();
    bytes = 0;
    std::lock_guard<std::mutex> lock(mutex_);
    ++parts_;
  };
  for (auto& r : batch) {
    if (!r->saved) continue;
    char name[40];
    std::snprintf(name, sizeof name, "tensors/part%05lld.bin", static_cast<long long>(parts_));
    r->file = name;
    part.push_back(r.get());
    bytes += r->payload->nbytes;
    if (bytes >= part_bytes_) flush();  // as the Python capture: past the size once a record is added
  }
  if (!part.empty()) flush();
}

void IndexWriter::submit(Batch batch) {
  if (batch.empty()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  raise_error();
  if (closing_) throw std::runtime_error("capture index " + path_ + ": written to after it was closed");
  const size_t n = batch.size();
  const int64_t nbytes = held_bytes(batch);
  auto room = [&] {
    return queued_ == 0 || (queued_ + n <= max_queued_ && (max_queued_bytes_ <= 0 || queued_bytes_ + nbytes <=
                                                                                         max_queued_bytes_)) ||
           !error_.empty();
  };
  if (!room()) {
    ++waits_;
    space_.wait(lock, room);
    raise_error();
  }
  queued_ += n;
  queued_bytes_ += nbytes;
  ++submitted_;
  for (const auto& r : batch)  // the program's tensors it holds: an op writing them waits (wait_for)
    if (r->saved)
      for (size_t i = 0; i < r->payload->tensors.size(); ++i)
        if (r->payload->program[i]) in_flight_[r->payload->tensors[i].storage().unsafeGetStorageImpl()] = submitted_;
  queue_.push_back(std::move(batch));
  work_.notify_one();
}

void IndexWriter::run() {
  std::string text;
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return !queue_.empty() || closing_; });
      if (queue_.empty()) return;
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string why, part_error;  // an exception must not leave this thread: it would terminate the process
    try {
      if (!parts_dir_.empty()) write_parts(batch);
    } catch (const std::exception& e) {
      part_error = e.what();
    }
    try {
      text.clear();
      for (const auto& r : batch) {
        format_record(text, *r, dtype_name_);
        text += '\n';
      }
      if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
        why = std::string("write failed (") + std::strerror(errno) + ")";
    } catch (const std::exception& e) {
      why = std::string("formatting failed (") + e.what() + ")";
    }
    // Cleared before the lock is taken: the training thread takes records under it.
    const int64_t bytes = held_bytes(batch);
    size_t reused = batch.size();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reused = std::min(reused, kPoolLimit - std::min(kPoolLimit, pool_.size()));
    }
    for (size_t i = 0; i < reused; ++i) batch[i]->clear();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!part_error.empty() && error_.empty()) error_ = part_error;
    if (!why.empty() && error_.empty()) error_ = "capture index " + path_ + ": " + why;
    written_ += static_cast<int64_t>(batch.size());
    queued_ -= batch.size();
    queued_bytes_ -= bytes;
    ++done_;
    for (auto it = in_flight_.begin(); it != in_flight_.end();) it = it->second <= done_ ? in_flight_.erase(it) : ++it;
    done_cv_.notify_all();
    for (size_t i = 0; i < reused && pool_.size() < kPoolLimit; ++i) pool_.push_back(std::move(batch[i]));
    space_.notify_all();
  }
}

void IndexWriter::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_ && !thread_.joinable()) {
      raise_error();
      return;
    }
    closing_ = true;
  }
  work_.notify_one();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ != nullptr) {
    if (std::fclose(file_) != 0 && error_.empty())
      error_ = "capture index " + path_ + ": close failed (" + std::strerror(errno) + ")";
    file_ = nullptr;
  }
  raise_error();
}

int64_t IndexWriter::waits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_;
}

int64_t IndexWriter::written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return written_;
}

}  // namespace ditorch_precision
