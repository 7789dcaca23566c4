#include "collectives/agreement.h"

#include <vector>

#include "core/communicator.h"
#include "core/types.h"

namespace dicomm {
namespace {

// Step 0, as every algorithm's first message, and the signature as meta: a rank that runs another
// collective (which starts at step 0 too) meets these messages and fails with both calls named.
// Messages of one pair and tag never overtake, so the algorithm's own step-0 messages that follow
// cannot be taken for these.
constexpr uint32_t kStep = 0;

struct Verdict {
  int64_t rank = -1;    // the first rank whose call differs from rank 0's, or -1
  uint64_t theirs = 0;  // its signature
  uint64_t rank0 = 0;   // rank 0's
};

}  // namespace

bool needs_agreement(CollectiveKind kind) {
  return kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kScatter || kind == CollectiveKind::kReduce ||
         kind == CollectiveKind::kGather;
}

void agree_on_signature(Session& s, uint64_t meta) {
  const int p = s.size();
  auto* verdict = reinterpret_cast<Verdict*>(s.scratch(sizeof(Verdict)));
  *verdict = Verdict{};
  if (s.rank() == 0) {
    auto* sigs = reinterpret_cast<uint64_t*>(s.scratch(sizeof(uint64_t) * p));
    std::vector<Transfer> in;
    for (int r = 1; r < p; ++r) in.push_back(s.recv(r, &sigs[r], sizeof(uint64_t), kStep, meta));
    for (auto& t : in) s.wait(t);
    verdict->rank0 = meta;
    for (int r = 1; r < p && verdict->rank < 0; ++r)
      if (sigs[r] != meta) {
        verdict->rank = r;
        verdict->theirs = sigs[r];
      }
    std::vector<Transfer> out;
    for (int r = 1; r < p; ++r) out.push_back(s.send(r, verdict, sizeof(Verdict), kStep, meta));
    for (auto& t : out) s.wait(t);
  } else {
    auto* mine = reinterpret_cast<uint64_t*>(s.scratch(sizeof(uint64_t)));
    *mine = meta;
    Transfer out = s.send(0, mine, sizeof(uint64_t), kStep, meta);
    Transfer in = s.recv(0, verdict, sizeof(Verdict), kStep, meta);
    s.wait(in);
    s.wait(out);
  }
  if (verdict->rank >= 0)
    throw MismatchError("the ranks called different collectives: rank " + std::to_string(verdict->rank) + " called " +
                        Communicator::describe_meta(verdict->theirs) + " but rank 0 called " +
                        Communicator::describe_meta(verdict->rank0));
}

}  // namespace dicomm
