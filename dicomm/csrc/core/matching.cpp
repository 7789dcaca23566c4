#include "core/matching.h"

namespace dicomm {

MatchQueues::RequestSP MatchQueues::take_posted(int src, Tag tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    const P2PRequest& r = **it;
    if (r.tag == tag && (r.peer == src || r.peer == kAnySource)) {
      RequestSP found = std::move(*it);
      if (it == posted_.begin()) posted_.pop_front();  // the usual case; erase() is much longer
      else posted_.erase(it);
      return found;
    }
  }
  return nullptr;
}

void MatchQueues::add_unexpected(Unexpected u) {
  if (u.src >= 0) {
    if (bytes_from_.size() <= size_t(u.src)) bytes_from_.resize(size_t(u.src) + 1, 0);
    bytes_from_[u.src] += u.data.size();
  }
  unexpected_.push_back(std::move(u));
}

bool MatchQueues::has_posted_for(int src) const {
  for (const auto& r : posted_)
    if (r->peer == src || r->peer == kAnySource) return true;
  return false;
}

std::optional<Unexpected> MatchQueues::take_unexpected(int peer, Tag tag) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->hdr.tag == tag && (peer == kAnySource || it->src == peer)) {
      Unexpected found = std::move(*it);
      unexpected_.erase(it);
      if (found.src >= 0 && size_t(found.src) < bytes_from_.size()) bytes_from_[found.src] -= found.data.size();
      return found;
    }
  }
  return std::nullopt;
}

size_t MatchQueues::posted_ahead(const P2PRequest* r) const {
  size_t n = 0;
  for (const auto& p : posted_) {
    if (p.get() == r) break;
    if (p->peer == r->peer && p->tag == r->tag) ++n;
  }
  return n;
}

bool MatchQueues::remove_posted(const P2PRequest* r) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (it->get() == r) {
      posted_.erase(it);
      return true;
    }
  }
  return false;
}

bool MatchQueues::replace_posted(const P2PRequest* r, RequestSP with) {
  for (auto& p : posted_) {
    if (p.get() == r) {
      p = std::move(with);
      return true;
    }
  }
  return false;
}

bool MatchQueues::any_source_ahead(const P2PRequest* r) const {
  bool seen = false;  // an any-source receive with r's tag so far
  for (const auto& p : posted_) {
    if (p.get() == r) return seen;
    seen |= p->peer == kAnySource && p->tag == r->tag;
  }
  return false;  // r is not posted
}

std::vector<MatchQueues::RequestSP> MatchQueues::take_posted_waiting_on(int src, bool any_source_too) {
  std::vector<RequestSP> out;
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer == src || (any_source_too && (*it)->peer == kAnySource)) {
      out.push_back(std::move(*it));
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<MatchQueues::RequestSP> MatchQueues::take_all_posted() {
  std::vector<RequestSP> out(posted_.begin(), posted_.end());
  posted_.clear();
  return out;
}

std::vector<MatchQueues::RequestSP> MatchQueues::take_posted_tagged(Tag tag, Tag mask) {
  std::vector<RequestSP> out;
  for (auto it = posted_.begin(); it != posted_.end();) {
    if (((*it)->tag & mask) == (tag & mask)) {
      out.push_back(std::move(*it));
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void MatchQueues::drop_rendezvous_from(int src) {
  unexpected_.remove_if([&](const Unexpected& u) { return u.src == src && u.rendezvous(); });
}

std::vector<MatchQueues::RequestSP> MatchQueues::take_self_sends() {
  std::vector<RequestSP> out;
  for (auto it = unexpected_.begin(); it != unexpected_.end();) {
    if (it->self_send) {
      out.push_back(std::move(it->self_send));
      it = unexpected_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace dicomm
