// pactrain::error and the precondition macros used by every component.
#pragma once

#include <stdexcept>
#include <string>

namespace pactrain {

/// The one exception type pactrain throws for bad input, impossible configurations and
/// failures reported by a communicator. Derived types name the subsystem.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A failure reported by the communication library (MPI, NCCL).
class communication_error : public error {
 public:
  using error::error;
};

namespace detail {

[[noreturn]] inline void fail(const std::string& what) { throw error("pactrain: " + what); }

}  // namespace detail
}  // namespace pactrain

/// Throws pactrain::error with `msg` (anything convertible to std::string) unless `cond`.
#define PACTRAIN_EXPECTS(cond, msg)             \
  do {                                          \
    if (!(cond)) ::pactrain::detail::fail(msg); \
  } while (false)

/// Throws pactrain::error with `msg`.
#define PACTRAIN_FAIL(msg) ::pactrain::detail::fail(msg)
