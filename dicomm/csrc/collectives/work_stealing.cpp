#include "collectives/work_stealing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "core/log.h"
#include "transport/socket.h"

namespace dicomm {
namespace {

constexpr size_t kBytes = WorkStealing::kWords * sizeof(uint64_t);

void say_no_stealing(const std::string& why) {
  log(LogLevel::kInfo, "dicomm: the push all_reduce runs without work stealing: " + why);
}

}  // namespace

WorkStealing::~WorkStealing() {
  if (words_ != nullptr) munmap(words_, kBytes);
}

bool WorkStealing::map(int fd) {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return false;
  words_ = static_cast<uint64_t*>(p);
  return true;
}

int64_t WorkStealing::offer() {
  if (fd_.get() < 0 && !failed_) {
    transport::UniqueFd fd(memfd_create("dicomm-claims", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    // Sealed at its size, so that no peer can shrink it under another's mapping (SIGBUS).
    if (fd.get() >= 0 && ftruncate(fd.get(), kBytes) == 0 &&
        fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0 && map(fd.get())) {
      fd_ = std::move(fd);
    } else {
      failed_ = true;
      say_no_stealing("cannot create the claim words: " + transport::errno_text(errno));
    }
  }
  return fd_.get();
}

bool WorkStealing::attach(int64_t pid, int64_t fd) {
  if (words_ != nullptr) return true;
  if (failed_) return false;
  failed_ = true;  // one try
  // pid comes from the kernel; fd from rank 0's message: a number only, checked like any wire value.
  if (pid <= 0 || pid > INT_MAX || fd < 0 || fd > INT_MAX) return false;
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const transport::UniqueFd mine(open(path.c_str(), O_RDWR | O_CLOEXEC));
  struct stat st {};
  std::string why;
  if (mine.get() < 0) why = "cannot open rank 0's claim words: " + transport::errno_text(errno);
  else if (fstat(mine.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != kBytes)
    why = "rank 0 named a descriptor that is not its claim words";
  else if (const int seals = fcntl(mine.get(), F_GET_SEALS); seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    why = "rank 0's claim words are not sealed against shrinking";  // a shrink would SIGBUS this rank
  else if (!map(mine.get()))
    why = "cannot map rank 0's claim words: " + transport::errno_text(errno);
  if (!why.empty()) {
    say_no_stealing(why);
    return false;
  }
  failed_ = false;
  return true;
}

bool WorkStealing::claim(size_t i, uint64_t call) {
  uint64_t* w = words_ + i;
  uint64_t seen = __atomic_load_n(w, __ATOMIC_ACQUIRE);
  // Words hold earlier calls' numbers; one at `call` (or, from a misbehaving peer, above it) is taken.
  if (seen >= call) return false;
  return __atomic_compare_exchange_n(w, &seen, call, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

}  // namespace dicomm
