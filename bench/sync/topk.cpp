// topk: pactrain-sync-bench's Top-k method (topk.hpp).
#include "topk.hpp"

namespace sync_bench {

std::unique_ptr<strategy> make_topk(const method_args& a) {
  return std::make_unique<topk_strategy>(a.comm, a.o, a.n);
}

}  // namespace sync_bench
