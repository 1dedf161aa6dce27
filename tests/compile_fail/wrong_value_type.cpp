// Must not compile: the host compactor handles float and double gradients only.
#include <pactrain/pactrain.hpp>

struct int_codec {
  using value_type = int;
  using wire_type = int;
};
template <>
struct pactrain::codec_traits<int_codec> {
  static constexpr bool is_linear = true;
  static constexpr bool is_identity = true;
};

int main() {
  pactrain::sync<pactrain::loopback_communicator, int_codec> s{pactrain::loopback_communicator{},
                                                               pactrain::param_layout{}};
  (void)s;
}
