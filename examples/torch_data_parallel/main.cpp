// A single-process LibTorch trainer made data-parallel with pactrain::data_parallel. The lines
// marked "// +" are what data parallelism adds (MPI with the guard that ends every rank when
// one throws, this rank's shard of the data, the object that syncs and steps), those marked
// "// ~" what it changes (the optimizer's zero_grad and step, the epoch's order); passes() is
// this program's own check for its ctest test, not part of the trainer.
//
//   mpiexec -n 4 build/examples/pactrain_torch_data_parallel
#include <pactrain/mpi.hpp>    // +
#include <pactrain/torch.hpp>  // +

#include <torch/torch.h>

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

// Every rank holds the same weights, and training halved the loss.
template <class DataParallel>
bool passes(DataParallel& dp, const std::vector<double>& epoch_loss) {
  const double local = dp.params().flat_values().sum().template item<double>();
  double extremes[2] = {local, -local};
  MPI_Allreduce(MPI_IN_PLACE, extremes, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const bool same = extremes[0] == -extremes[1];
  const bool learned = epoch_loss.back() < 0.5 * epoch_loss.front();
  std::printf("weights %s across ranks; loss %s\n", same ? "equal" : "DIFFER",
              learned ? "halved" : "NOT halved");
  return same && learned;
}

}  // namespace

// [snippet:trainer]
int main(int argc, char** argv) {
  return pactrain::mpi_main(argc, argv, [&](const pactrain::mpi_world& world) {  // +
    // The task: the labels a fixed random "teacher" gives random inputs (one dataset, drawn
    // from one seed on every rank).
    torch::manual_seed(1);
    const auto x = torch::randn({4096, 32});
    const auto y = x.matmul(torch::randn({32, 4})).argmax(1);
    torch::manual_seed(2);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 4));
    pactrain::data_parallel dp(
        *model, pactrain::mpi_communicator{MPI_COMM_WORLD},                           // +
        {.optimizer = pactrain::sgd_options{.lr = 0.05, .momentum = 0.9}});           // +
    pactrain::distributed_sampler sampler(4096, world.rank, world.size, /*seed=*/3);  // +
    const std::int64_t batch = 32;
    std::vector<double> epoch_loss;
    for (std::uint64_t epoch = 0; epoch < 4; ++epoch) {
      const auto shard = sampler.indices(epoch);                                                // +
      const auto order = torch::tensor(std::vector<std::int64_t>(shard.begin(), shard.end()));  // ~
      double sum = 0;
      std::int64_t steps = 0;
      for (std::int64_t at = 0; at + batch <= order.size(0); at += batch, ++steps) {
        const auto i = order.narrow(0, at, batch);
        dp.zero_grad();  // ~ optimizer.zero_grad()
        const auto loss = torch::nn::functional::cross_entropy(model->forward(x.index_select(0, i)),
                                                               y.index_select(0, i));
        loss.backward();
        dp.step();  // ~ optimizer.step()
        sum += loss.item<double>();
      }
      epoch_loss.push_back(sum / static_cast<double>(steps));
      if (world.rank == 0) {
        std::printf("epoch %llu: mean training loss %.4f, %llu bytes sent a step\n",
                    static_cast<unsigned long long>(epoch), epoch_loss.back(),
                    static_cast<unsigned long long>(dp.stats().bytes_sent));
      }
    }
    return passes(dp, epoch_loss) ? 0 : 1;  // this program's check, for its test
  });                                       // +
}
// [/snippet:trainer]
