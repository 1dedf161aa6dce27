// mpi_communicator: pactrain's collectives over an MPI communicator the user owns; mpi_main: a
// whole MPI program, with the guard that ends every rank when one throws.
//
// Needs MPI (link pactrain::mpi). Uses only MPI's C API.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mpi_algorithms.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

namespace detail {

template <class T>
MPI_Datatype mpi_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, std::uint32_t>) return MPI_UINT32_T;
  if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  if constexpr (std::is_same_v<T, std::byte>) return MPI_BYTE;
  if constexpr (half_value<T>) return MPI_UINT16_T;  // reduced by pactrain's own MPI_Ops
}

inline MPI_Op mpi_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return MPI_SUM;
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
  }
  return MPI_SUM;
}

inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw communication_error(std::string("pactrain: ") + call + " failed: " +
                            std::string(text, static_cast<std::size_t>(std::max(len, 0))));
}

// The user-defined reduction of 16-bit floats: convert to float, combine, round once.
template <half_value T, reduce_op Op>
void mpi_half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const std::size_t n = *len > 0 ? static_cast<std::size_t>(*len) : 0;
  combine(static_cast<const T*>(in), static_cast<T*>(inout), n, [](float a, float b) {
    if constexpr (Op == reduce_op::sum) return a + b;
    if constexpr (Op == reduce_op::max) return a > b ? a : b;
    if constexpr (Op == reduce_op::min) return a < b ? a : b;
  });
}

// MPI counts are int: larger buffers go in chunks of this many elements.
inline constexpr std::size_t mpi_chunk = std::size_t{1} << 30;

/// The requests of one nonblocking collective, one per chunk: held inline up to two chunks
/// (2^31 elements), so a collective allocates nothing; more spill into a heap array.
class mpi_requests {
 public:
  static constexpr std::size_t inline_capacity = 2;

  mpi_requests() = default;
  mpi_requests(mpi_requests&& o) noexcept
      : inline_(o.inline_), heap_(std::move(o.heap_)), size_(std::exchange(o.size_, 0)) {
    o.heap_.clear();
  }
  mpi_requests& operator=(mpi_requests&& o) noexcept {
    if (this != &o) {
      inline_ = o.inline_;
      heap_ = std::move(o.heap_);
      size_ = std::exchange(o.size_, 0);
      o.heap_.clear();
    }
    return *this;
  }
  mpi_requests(const mpi_requests&) = delete;
  mpi_requests& operator=(const mpi_requests&) = delete;

  void push_back(MPI_Request r) {
    if (heap_.empty() && size_ < inline_capacity) {
      inline_[size_++] = r;
      return;
    }
    if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + size_);
    heap_.push_back(r);
    ++size_;
  }
  [[nodiscard]] MPI_Request* data() noexcept {
    return heap_.empty() ? inline_.data() : heap_.data();
  }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(size_); }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  void clear() noexcept {
    size_ = 0;
    heap_.clear();
  }

 private:
  std::array<MPI_Request, inline_capacity> inline_{};
  std::vector<MPI_Request> heap_;  // every request, once there are more than inline_capacity
  std::size_t size_ = 0;
};

/// Starts an in-place MPI_Iallreduce of data[0, n) in chunks of at most `chunk` elements,
/// adding one request per chunk to `out`. Throws pactrain::communication_error; the requests
/// started before a failure stay in `out`.
template <class T>
void mpi_iallreduce_chunks(T* data, std::size_t n, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                           std::size_t chunk, mpi_requests& out) {
  for (std::size_t at = 0; at < n; at += chunk) {
    const int count = static_cast<int>(std::min(chunk, n - at));
    MPI_Request r = MPI_REQUEST_NULL;
    mpi_check(MPI_Iallreduce(MPI_IN_PLACE, data + at, count, type, op, comm, &r), "MPI_Iallreduce");
    out.push_back(r);
  }
}

}  // namespace detail

/// Collectives over a duplicate of the user's MPI communicator; MPI failures throw
/// pactrain::communication_error. half and bfloat16 round once per pairwise combine, in MPI's
/// order, so P ranks round P - 1 times: exact when every partial sum is representable.
class mpi_communicator {
 public:
  /// A pending nonblocking collective. wait() completes it; destroying a request that was
  /// not waited for waits for it (and ignores errors, since destructors cannot throw).
  class request_type {
   public:
    request_type() = default;
    request_type(request_type&& o) noexcept : reqs_(std::move(o.reqs_)) {}
    request_type& operator=(request_type&& o) noexcept {
      if (this != &o) {
        finish_quietly();
        reqs_ = std::move(o.reqs_);
      }
      return *this;
    }
    request_type(const request_type&) = delete;
    request_type& operator=(const request_type&) = delete;
    ~request_type() { finish_quietly(); }

    void wait() {
      if (reqs_.empty()) return;
      const int rc = MPI_Waitall(reqs_.size(), reqs_.data(), MPI_STATUSES_IGNORE);
      reqs_.clear();  // done or failed: never waited for again
      detail::mpi_check(rc, "MPI_Waitall");
    }

    /// Advances the collective without blocking; true once it is complete (wait() then
    /// returns at once). Open MPI progresses nonblocking collectives only inside MPI calls,
    /// so a caller doing local work between them should test now and then.
    bool test() {
      if (reqs_.empty()) return true;
      int done = 0;
      detail::mpi_check(MPI_Testall(reqs_.size(), reqs_.data(), &done, MPI_STATUSES_IGNORE),
                        "MPI_Testall");
      if (done != 0) reqs_.clear();
      return done != 0;
    }

   private:
    friend class mpi_communicator;
    void finish_quietly() noexcept {
      if (reqs_.empty()) return;
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Waitall(reqs_.size(), reqs_.data(), MPI_STATUSES_IGNORE);
      reqs_.clear();
    }
    detail::mpi_requests reqs_;
  };

  /// Collective on `comm`, which is never modified and may be freed afterwards. Throws
  /// pactrain::error when MPI is not initialised or `comm` is MPI_COMM_NULL. The first one of
  /// 2 or more ranks in a process warns on stderr, on rank 0 of MPI_COMM_WORLD, where Open
  /// MPI would run the nonblocking allreduces as a binomial tree (mpi_algorithm_warning).
  explicit mpi_communicator(MPI_Comm comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    PACTRAIN_EXPECTS(initialized != 0, "mpi_communicator: MPI is not initialised");
    PACTRAIN_EXPECTS(comm != MPI_COMM_NULL, "mpi_communicator: MPI_COMM_NULL given");
    detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    detail::mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    detail::mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    detail::warn_mpi_algorithms_once(size_);
    try {
      create_ops<half>(0);
      create_ops<bfloat16>(3);
    } catch (...) {
      release();
      throw;
    }
  }

  mpi_communicator(mpi_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        rank_(o.rank_),
        size_(o.size_),
        ops_(std::exchange(o.ops_, null_ops())) {}
  mpi_communicator& operator=(mpi_communicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      ops_ = std::exchange(o.ops_, null_ops());
    }
    return *this;
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  /// Collective: destroy it, and any engine holding it, on every rank before MPI_Finalize
  /// (after MPI_Finalize it frees nothing).
  ~mpi_communicator() { release(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The duplicated communicator pactrain uses.
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

  template <wire_value T>
  void allreduce(std::span<T> data, reduce_op op) {
    check(data.data(), data.size(), "allreduce");
    for (std::size_t at = 0; at < data.size(); at += detail::mpi_chunk) {
      const int n = static_cast<int>(std::min(detail::mpi_chunk, data.size() - at));
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data.data() + at, n, detail::mpi_type<T>(),
                                      op_for<T>(op), comm_),
                        "MPI_Allreduce");
    }
  }

  template <wire_value T>
  request_type allreduce_async(std::span<T> data, reduce_op op) {
    check(data.data(), data.size(), "allreduce_async");
    request_type req;
    detail::mpi_iallreduce_chunks(data.data(), data.size(), detail::mpi_type<T>(), op_for<T>(op),
                                  comm_, detail::mpi_chunk, req.reqs_);
    return req;
  }

  template <wire_value T>
  void broadcast(std::span<T> data, int root) {
    check(data.data(), data.size(), "broadcast");
    PACTRAIN_EXPECTS(root >= 0 && root < size_,
                     "mpi_communicator::broadcast: root " + std::to_string(root) + " out of range");
    for (std::size_t at = 0; at < data.size(); at += detail::mpi_chunk) {
      const int n = static_cast<int>(std::min(detail::mpi_chunk, data.size() - at));
      detail::mpi_check(MPI_Bcast(data.data() + at, n, detail::mpi_type<T>(), root, comm_),
                        "MPI_Bcast");
    }
  }

 private:
  void check(const void* p, std::size_t n, const char* op) const {
    PACTRAIN_EXPECTS(comm_ != MPI_COMM_NULL,
                     std::string("mpi_communicator::") + op + ": moved-from communicator");
    PACTRAIN_EXPECTS(p != nullptr || n == 0,
                     std::string("mpi_communicator::") + op + ": null buffer");
  }
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (auto& op : ops_) {
      if (op != MPI_OP_NULL && !finalized) MPI_Op_free(&op);
      op = MPI_OP_NULL;
    }
    if (comm_ == MPI_COMM_NULL) return;
    if (!finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  static std::array<MPI_Op, 6> null_ops() noexcept {
    std::array<MPI_Op, 6> a;
    a.fill(MPI_OP_NULL);
    return a;
  }

  // ops_[first + k] reduces T with reduce_op k (sum, max, min).
  template <half_value T>
  void create_ops(std::size_t first) {
    detail::mpi_check(MPI_Op_create(&detail::mpi_half_reduce<T, reduce_op::sum>, 1, &ops_[first]),
                      "MPI_Op_create");
    detail::mpi_check(
        MPI_Op_create(&detail::mpi_half_reduce<T, reduce_op::max>, 1, &ops_[first + 1]),
        "MPI_Op_create");
    detail::mpi_check(
        MPI_Op_create(&detail::mpi_half_reduce<T, reduce_op::min>, 1, &ops_[first + 2]),
        "MPI_Op_create");
  }

  template <class T>
  MPI_Op op_for(reduce_op op) const noexcept {
    if constexpr (half_value<T>) {
      return ops_[(std::is_same_v<T, half> ? 0 : 3) + static_cast<std::size_t>(op)];
    } else {
      return detail::mpi_op(op);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::array<MPI_Op, 6> ops_ = null_ops();
};

static_assert(communicator<mpi_communicator>);

/// Where this process is in MPI_COMM_WORLD.
struct mpi_world {
  int rank = 0;
  int size = 1;
};

// [snippet:guard]
/// Prints "<name>: <what>" on stderr and ends every rank of the job with exit code 1: a rank
/// that returned alone would leave its peers waiting forever in a collective it never joins.
[[noreturn]] inline void abort_job(const char* name, const char* what) noexcept {
  std::fprintf(stderr, "%s: %s\n", name, what);
  std::fflush(nullptr);  // MPI_Abort does not flush what the program wrote so far
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // not reached: MPI_Abort does not return
}

/// A whole MPI program: MPI_Init_thread, body(world) (it returns the exit code), MPI_Finalize.
/// MPI_THREAD_SERIALIZED: the LibTorch adapter's hooks call MPI from the thread that runs
/// backward, which need not be main's. An exception from body (pactrain::error or any other)
/// ends the whole job through abort_job, named `name` (argv[0] when null).
template <class Body>
int mpi_main(int& argc, char**& argv, Body&& body, const char* name = nullptr) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (name == nullptr) name = argc > 0 ? argv[0] : "mpi_main";
  int rc = 1;
  try {
    if (provided < MPI_THREAD_SERIALIZED) {
      throw error("mpi_main: the MPI library does not provide MPI_THREAD_SERIALIZED");
    }
    mpi_world w;
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
    rc = body(static_cast<const mpi_world&>(w));
  } catch (const std::exception& e) {
    abort_job(name, e.what());
  } catch (...) {
    abort_job(name, "unknown exception");
  }
  MPI_Finalize();
  return rc;
}
// [/snippet:guard]

}  // namespace pactrain
