// Must not compile: fp16_codec sends half values, and this communicator can only sum float,
// double and integer words. The test passes when the compiler prints the engine's
// static_assert.
#include <pactrain/pactrain.hpp>

#include <cstdint>
#include <span>

struct float_only_communicator {  // models pactrain::communicator, but not for half
  struct request_type {
    void wait() {}
  };
  int rank() const { return 0; }
  int size() const { return 1; }
  void allreduce(std::span<float>, pactrain::reduce_op) {}
  void allreduce(std::span<double>, pactrain::reduce_op) {}
  void allreduce(std::span<std::uint32_t>, pactrain::reduce_op) {}
  void allreduce(std::span<std::uint64_t>, pactrain::reduce_op) {}
  void broadcast(std::span<std::byte>, int) {}
  request_type allreduce_async(std::span<float>, pactrain::reduce_op) { return {}; }
  request_type allreduce_async(std::span<double>, pactrain::reduce_op) { return {}; }
  request_type allreduce_async(std::span<std::uint64_t>, pactrain::reduce_op) { return {}; }
};
static_assert(pactrain::communicator<float_only_communicator>);

int main() {
  pactrain::sync<float_only_communicator, pactrain::fp16_codec> s{float_only_communicator{},
                                                                  pactrain::param_layout{}};
  (void)s;
}
