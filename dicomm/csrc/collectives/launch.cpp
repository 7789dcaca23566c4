#include "collectives/launch.h"

#include <exception>

#include "collectives/agreement.h"

namespace dicomm {

RequestPtr launch(Communicator& comm, const Signature& sig, Algorithm algorithm,
                  std::string what) {
  if (what.empty()) what = sig.describe();
  const uint64_t meta = sig.encode();
  // The communicator outlives its collective thread, so the body may hold it by reference.
  const CollectiveKind kind = sig.kind;
  return comm.submit_collective(what, [&comm, what, meta, kind, algorithm = std::move(algorithm)](
                                          uint64_t seq) {
    Session session(comm, seq, what, meta);
    try {
      if (comm.size() > 1 && needs_agreement(kind)) agree_on_signature(session, meta);
      algorithm(session);
      session.wait_all();
    } catch (...) {
      session.fail(std::current_exception());
    }
  });
}

void check_root(const Communicator& comm, int root, const char* arg) {
  if (root < 0 || root >= comm.size())
    throw ValueError(std::string("invalid ") + arg + " " + std::to_string(root) +
                     ": expected a rank in [0, " + std::to_string(comm.size()) + ")");
}

void check_length(size_t actual, size_t expected, const char* arg, const std::string& why) {
  if (actual != expected)
    throw ValueError(std::string(arg) + " has " + std::to_string(actual) + " entries, expected " +
                     std::to_string(expected) + " (" + why + ")");
}

void check_buffer(uintptr_t ptr, size_t bytes, const char* arg) {
  if (ptr == 0 && bytes > 0)
    throw ValueError(std::string(arg) + " is a null pointer but " + std::to_string(bytes) +
                     " bytes were requested");
}

}  // namespace dicomm
