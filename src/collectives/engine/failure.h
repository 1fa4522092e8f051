// A failure that ends many handles at once (the backend failed, the engine shut down): kept as
// its kind and text, so that each handle gets its own exception object of the right type.
#pragma once

#include <exception>
#include <string>

namespace dtrain::collectives {

enum class ErrorKind { kPeer, kTimeout, kInvalid, kProtocol, kOther };

struct Failure {
  ErrorKind kind = ErrorKind::kOther;
  std::string message;

  // The kind of dtrain error `e` is (PeerError, TimeoutError...), and its text.
  static Failure From(const std::exception& e);
  // A new exception of the failure's kind: "<what> failed: <message>".
  std::exception_ptr For(const std::string& what) const;
};

}  // namespace dtrain::collectives
