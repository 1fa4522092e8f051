#include "collectives/engine/failure.h"

#include "dtrain/common/error.h"

namespace dtrain::collectives {

Failure Failure::From(const std::exception& e) {
  if (dynamic_cast<const PeerError*>(&e)) return {ErrorKind::kPeer, e.what()};
  if (dynamic_cast<const TimeoutError*>(&e)) return {ErrorKind::kTimeout, e.what()};
  if (dynamic_cast<const InvalidArgument*>(&e)) return {ErrorKind::kInvalid, e.what()};
  if (dynamic_cast<const ProtocolError*>(&e)) return {ErrorKind::kProtocol, e.what()};
  return {ErrorKind::kOther, e.what()};
}

std::exception_ptr Failure::For(const std::string& what) const {
  const std::string text = what + " failed: " + message;
  switch (kind) {
    case ErrorKind::kPeer:
      return std::make_exception_ptr(PeerError(text));
    case ErrorKind::kTimeout:
      return std::make_exception_ptr(TimeoutError(text));
    case ErrorKind::kInvalid:
      return std::make_exception_ptr(InvalidArgument(text));
    case ErrorKind::kProtocol:
      return std::make_exception_ptr(ProtocolError(text));
    case ErrorKind::kOther:
      break;
  }
  return std::make_exception_ptr(Error(text));
}

}  // namespace dtrain::collectives
