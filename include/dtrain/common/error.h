// Errors that dtrain reports to its callers.
//
// Every failure a user can cause or meet (bad configuration, a shape mismatch, a peer that died, a
// deadline that passed) is thrown as one of these, with a message that names what went wrong and,
// where there is one, the node involved (role, rank, host:port). Assertions are kept for bugs in
// dtrain itself.
#pragma once

#include <stdexcept>
#include <string>

namespace dtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A DMLC_* / PS_* / MXNET_* / DTRAIN_* variable is missing or malformed.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// The caller passed something that cannot work: unknown key, wrong length, a key initialised twice.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A blocking wait ran past its deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Another node of the job died, was cut off, or answered with something we cannot accept.
class PeerError : public Error {
 public:
  using Error::Error;
};

// Bytes read off the network do not form a valid message.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

}  // namespace dtrain
