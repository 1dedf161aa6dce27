// Must not compile: a codec that is not linear under summation cannot be used with the
// compacted allreduce. The test passes when the compiler prints the engine's static_assert.
#include <pactrain/pactrain.hpp>

struct rounding_codec {  // e.g. a per-rank quantiser: sum of codes != code of the sum
  using value_type = float;
  using wire_type = float;
};

int main() {
  pactrain::sync<pactrain::loopback_communicator, rounding_codec> s{
      pactrain::loopback_communicator{}, pactrain::param_layout{}};
  (void)s;
}
