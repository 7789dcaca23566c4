// MPI-style matching: receives posted before their message, and messages that arrived before
// their receive. Messages of one (source, tag) never overtake: both queues keep arrival order.
#pragma once

#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <vector>

#include "core/p2p_request.h"
#include "transport/transport.h"

namespace dicomm {

// A message nobody has asked for yet. Small ones are buffered here; large ones, and small ones
// past the sender's credits (core/credits.cpp), stay with the sender (rendezvous) until a receive
// matches, so nothing large is buffered twice and an unmatched flood costs headers.
struct Unexpected {
  int src = -1;
  transport::Header hdr;
  std::vector<char> data;                     // eager payload
  transport::RecvConn* conn = nullptr;        // rendezvous: where to pull from
  std::shared_ptr<P2PRequest> self_send;      // a large send to ourselves, waiting for its receive
  bool rendezvous() const { return conn != nullptr; }
};

class MatchQueues {
 public:
  using RequestSP = std::shared_ptr<P2PRequest>;

  void post(RequestSP r) { posted_.push_back(std::move(r)); }
  // The earliest posted receive that accepts a message from `src` with `tag`.
  RequestSP take_posted(int src, Tag tag);
  // The earliest arrived message that receive (`peer`, `tag`) accepts.
  std::optional<Unexpected> take_unexpected(int peer, Tag tag);
  void add_unexpected(Unexpected u);
  // Eager bytes buffered from `src` that no receive has taken yet.
  size_t unexpected_bytes_from(int src) const { return src >= 0 && size_t(src) < bytes_from_.size() ? bytes_from_[src] : 0; }
  // Whether a posted receive could take a message from `src` (its own or any-source).
  bool has_posted_for(int src) const;
  bool remove_posted(const P2PRequest* r);
  // Puts `with` in r's place; false if r is not posted.
  bool replace_posted(const P2PRequest* r, RequestSP with);
  // Whether r is posted behind an any-source receive with its tag.
  bool any_source_ahead(const P2PRequest* r) const;
  // Posted receives before `r` that name r's source and tag (they take its stream's messages first).
  size_t posted_ahead(const P2PRequest* r) const;
  // Removes and returns posted receives that wait on `src` (and any-source ones if asked).
  std::vector<RequestSP> take_posted_waiting_on(int src, bool any_source_too);
  std::vector<RequestSP> take_all_posted();
  // Removes and returns posted receives whose tag equals `tag` on the bits of `mask`.
  std::vector<RequestSP> take_posted_tagged(Tag tag, Tag mask);
  // Forgets rendezvous announcements from `src` (its data can no longer be pulled).
  void drop_rendezvous_from(int src);
  std::vector<RequestSP> take_self_sends();
  size_t unexpected_count() const { return unexpected_.size(); }

 private:
  std::deque<RequestSP> posted_;  // usually matched at the front: no node allocated per receive
  std::list<Unexpected> unexpected_;
  std::vector<size_t> bytes_from_;
};

}  // namespace dicomm
