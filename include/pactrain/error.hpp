// pactrain::error and the precondition macros used by every component.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

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

/// A failed CUDA runtime call: the message names the call, the CUDA error and where it was
/// made (see PACTRAIN_CUDA_TRY in <pactrain/cuda/detail/cuda_runtime.hpp>). Defined here, without
/// CUDA headers, so that host code can catch it.
class cuda_error : public error {
 public:
  cuda_error(const std::string& what, std::string call, std::string file, int line)
      : error(what), call_(std::move(call)), file_(std::move(file)), line_(line) {}
  /// The call as written, e.g. "cudaMemcpyAsync(...)".
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  std::string call_;
  std::string file_;
  int line_ = 0;
};

namespace detail {

[[noreturn]] inline void fail(const std::string& what) { throw error("pactrain: " + what); }

}  // namespace detail
}  // namespace pactrain

/// Throws pactrain::error with `msg` (anything convertible to std::string) unless `cond`.
/// `msg` is evaluated only when `cond` fails: a message built by concatenation costs nothing,
/// and allocates nothing, where the check passes.
#define PACTRAIN_EXPECTS(cond, msg)             \
  do {                                          \
    if (!(cond)) ::pactrain::detail::fail(msg); \
  } while (false)

/// Throws pactrain::error with `msg`.
#define PACTRAIN_FAIL(msg) ::pactrain::detail::fail(msg)
