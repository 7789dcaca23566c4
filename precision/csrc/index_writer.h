// Writes a stats capture's index lines off the training thread: the observer hands over each
// step's records (binary, in call order) and a thread of this writer formats and appends them to
// the index file. The queue is bounded by records: a hand-over that would pass the bound waits
// for the thread (never drops), and the waits are counted.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "op_record.h"

namespace ditorch_precision {

using Batch = std::vector<std::unique_ptr<Record>>;

class IndexWriter {
 public:
  // Appends to `path` (opened here: a failure raises). `dtype_name` outlives the writer.
  IndexWriter(const std::string& path, const DtypeNames& dtype_name, size_t max_queued);
  ~IndexWriter();
  IndexWriter(const IndexWriter&) = delete;
  IndexWriter& operator=(const IndexWriter&) = delete;

  // A cleared record: one the thread has written, or a new one.
  std::unique_ptr<Record> take();
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
  bool forked() const { return getpid() != owner_; }

 private:
  void run();
  void raise_error() const;  // with mutex_ held

  const pid_t owner_ = getpid();
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
  std::vector<std::unique_ptr<Record>> pool_;  // written records, cleared, for reuse
  std::thread thread_;
};

}  // namespace ditorch_precision
