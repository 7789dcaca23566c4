#include "errors.h"

#include "core/types.h"

namespace dicomm::torch_backend {

void fail(Kind kind, const std::string& msg) { throw BackendError(kind, msg); }

void bad_argument(const std::string& op, const std::string& msg) {
  throw BackendError(Kind::kValue, "dicomm " + op + ": " + msg);
}

namespace {

// "dicomm: Timed out after 999 ms waiting for barrier()": torch's suite and users' log filters look
// for " Timed out " (gloo's words), the engine says "timed out".
std::string timed_out_text(std::string text) {
  size_t at = text.find("timed out");
  if (at != std::string::npos) text[at] = 'T';
  else if (text.find("Timed out") == std::string::npos) text = "Timed out waiting: " + text;
  return text.rfind("Timed out", 0) == 0 ? "dicomm: " + text : text;
}

}  // namespace

std::exception_ptr as_backend_error(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const BackendError&) {
    return e;
  } catch (const dicomm::TimeoutError& x) {
    return std::make_exception_ptr(BackendError(Kind::kTimeout, timed_out_text(x.what())));
  } catch (const dicomm::PeerError& x) {
    return std::make_exception_ptr(BackendError(Kind::kPeer, x.what()));
  } catch (const dicomm::MismatchError& x) {
    return std::make_exception_ptr(BackendError(Kind::kMismatch, x.what()));
  } catch (const dicomm::ValueError& x) {
    return std::make_exception_ptr(BackendError(Kind::kValue, x.what()));
  } catch (const c10::Error&) {
    return e;  // torch's own (a failed copy, a bad tensor): already what torch users expect
  } catch (const std::exception& x) {
    return std::make_exception_ptr(BackendError(Kind::kGeneric, x.what()));
  }
}

}  // namespace dicomm::torch_backend
