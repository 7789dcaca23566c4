// Writes a stats capture's index lines off the training thread: the observer hands over each
// step's records (binary, in call order) and a thread of this writer formats and appends them to
// the index file. The queue is bounded by records: a hand-over that would pass the bound waits
// for the thread (never drops), and the waits are counted. A full capture's records hold tensors:
// the thread writes them to part files (part_writer.h) before their lines, and the queue is also
// bounded by their bytes; an op about to write a storage a queued record holds uncopied waits for
// that record's part (wait_for).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <c10/core/StorageImpl.h>

#include "op_record.h"

namespace ditorch_precision {

// Forks this process image has gone through: bumped in each child (pthread_atfork, registered
// when the module loads). Read per op where getpid() would be a system call.
extern std::atomic<uint64_t> g_fork_generation;

using Batch = std::vector<std::unique_ptr<Record>>;

class IndexWriter {
 public:
  // Appends to `path` (opened here: a failure raises). `dtype_name` outlives the writer.
  IndexWriter(const std::string& path, const DtypeNames& dtype_name, size_t max_queued);
  ~IndexWriter();
  IndexWriter(const IndexWriter&) = delete;
  IndexWriter& operator=(const IndexWriter&) = delete;

  // Full capture: part files go to `dir` (named "tensors/partNNNNN.bin" in the index lines), a part
  // closed once it holds `part_bytes`; the queue holds at most `max_queued_bytes` of tensors.
  void set_parts(const std::string& dir, int64_t part_bytes, int64_t max_queued_bytes);
  // Before an op writes `storage`: waits until no queued record holds it uncopied.
  void wait_for(const c10::StorageImpl* storage);
  int64_t parts() const;        // part files written
  int64_t write_waits() const;  // ops that waited for a part to be written (wait_for)
  // Appends n cleared records to `into`: ones the thread has written, else new ones (one lock for n).
  void take(std::vector<std::unique_ptr<Record>>& into, size_t n);
  // Hands `batch` to the thread; waits while more than max_queued records would be queued (a batch
  // larger than the bound waits for an empty queue). Raises the thread's write error, if any.
  void submit(Batch batch);
  // Everything handed over is written and the file closed; raises the first write error.
  void close();
  int64_t waits() const;    // hand-overs that waited for the thread
  int64_t written() const;  // lines written
  // In a child forked after this writer was made: its thread is not there (only the forking thread
  // is copied), and its lock, condition variables and FILE may be copied mid-use. Nothing of it may
  // be touched there, not even destroyed (a condition variable the parent's thread waited on blocks
  // its destruction): the owner leaks it.
  bool forked() const { return g_fork_generation.load(std::memory_order_relaxed) != generation_; }

 private:
  void run();
  void raise_error() const;  // with mutex_ held

  const uint64_t generation_ = g_fork_generation.load();
  std::FILE* file_ = nullptr;
  std::string path_;
  const DtypeNames& dtype_name_;
  const size_t max_queued_;
  mutable std::mutex mutex_;
  std::condition_variable work_, space_;
  std::deque<Batch> queue_;
  size_t queued_ = 0;
  bool closing_ = false;
  int64_t waits_ = 0, written_ = 0;
  std::string error_;
  void write_parts(Batch& batch);  // on the thread, without mutex_
  std::string parts_dir_;
  int64_t part_bytes_ = 0, max_queued_bytes_ = 0, queued_bytes_ = 0, parts_ = 0, write_waits_ = 0;
  uint64_t submitted_ = 0, done_ = 0;  // batches handed over, written
  std::unordered_map<const c10::StorageImpl*, uint64_t> in_flight_;  // storage -> last batch holding it
  std::condition_variable done_cv_;
  std::vector<std::unique_ptr<Record>> pool_;  // written records, cleared, for reuse
  std::thread thread_;
};

}  // namespace ditorch_precision
