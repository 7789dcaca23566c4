#include "index_writer.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ditorch_precision {

namespace {
constexpr size_t kPoolLimit = 1 << 16;  // records kept for reuse: a step's worth on a large model
}

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

std::unique_ptr<Record> IndexWriter::take() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pool_.empty()) {
      auto r = std::move(pool_.back());
      pool_.pop_back();
      return r;
    }
  }
  return std::make_unique<Record>();
}

void IndexWriter::raise_error() const {
  if (!error_.empty()) throw std::runtime_error(error_);
}

void IndexWriter::submit(Batch batch) {
  if (batch.empty()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  raise_error();
  if (closing_) throw std::runtime_error("capture index " + path_ + ": written to after it was closed");
  const size_t n = batch.size();
  auto room = [&] { return queued_ == 0 || queued_ + n <= max_queued_ || !error_.empty(); };
  if (!room()) {
    ++waits_;
    space_.wait(lock, room);
    raise_error();
  }
  queued_ += n;
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
    std::string why;  // an exception must not leave this thread: it would terminate the process
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
    std::lock_guard<std::mutex> lock(mutex_);
    if (!why.empty() && error_.empty()) error_ = "capture index " + path_ + ": " + why;
    written_ += static_cast<int64_t>(batch.size());
    queued_ -= batch.size();
    for (auto& r : batch) {
      if (pool_.size() >= kPoolLimit) break;
      r->clear();
      pool_.push_back(std::move(r));
    }
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
