// topk: pactrain_sync_bench's Top-k method (topk.hpp).
#include "topk.hpp"

namespace sync_bench {

std::unique_ptr<method> make_topk(const method_args& a) {
  return std::make_unique<topk_method>(a.comm, a.o, a.n);
}

}  // namespace sync_bench
