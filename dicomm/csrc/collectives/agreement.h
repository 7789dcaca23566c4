// Rooted collectives check that every rank called the same one before any data moves.
//
// Where the root only sends (broadcast, scatter) or only receives (reduce, gather), a disagreement
// is not always visible in the data messages: ranks that name different roots may never exchange
// one, and a root that only sends learns nothing of a receiver's mismatch. So every rank first
// sends its signature (collective, size, root) to rank 0, which answers each with the verdict:
// two small hops, through a rank nobody can disagree on. On a disagreement every rank fails with a
// MismatchError naming both calls (rank 0's abort notice reaches the ones it could not answer),
// and no data message is left queued anywhere.
#pragma once

#include <cstdint>

#include "collectives/session.h"
#include "collectives/signature.h"

namespace dicomm {

bool needs_agreement(CollectiveKind kind);
void agree_on_signature(Session& s, uint64_t meta);  // throws MismatchError

}  // namespace dicomm
