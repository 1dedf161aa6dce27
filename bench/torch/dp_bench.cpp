// pactrain_torch_dp_bench: training steps per second of one LibTorch trainer made data-parallel
// four ways, on the same model and data:
//   official  the LibTorch distributed example's pattern: after backward, one blocking
//             allreduce per parameter, a division by the rank count, torch::optim::SGD;
//   flat      one blocking allreduce of all gradients (bound to one flat buffer) after
//             backward, then the same SGD step (pactrain::sgd, torch's arithmetic);
//   dense     pactrain::data_parallel: buckets sent from backward's hooks (--bucket entries
//             each; data_parallel's default 4 Mi makes this model one bucket);
//   pruned    the same with 90% of the weight matrices pruned (magnitude, at the first step).
// The model: an MLP of --layers hidden layers of --width units on 784 inputs (Fashion-MNIST's
// shape), 10 classes, synthetic data; one LibTorch thread per rank.
//
//   bench/netbed/launch.sh -n 4 build/bench/pactrain_torch_dp_bench --method dense --csv
#include <pactrain/mpi.hpp>
#include <pactrain/torch.hpp>

#include <torch/torch.h>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct options {
  std::string method = "dense";
  std::int64_t width = 512;
  int layers = 3;
  std::int64_t batch = 64;
  int steps = 40;
  int warmup = 5;
  std::size_t bucket = pactrain::param_layout::default_bucket_capacity;  // data_parallel's
  bool csv = false;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw pactrain::error("pactrain_torch_dp_bench: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--method") {
      o.method = next();
    } else if (a == "--width") {
      o.width = std::stoll(next());
    } else if (a == "--layers") {
      o.layers = std::stoi(next());
    } else if (a == "--batch") {
      o.batch = std::stoll(next());
    } else if (a == "--steps") {
      o.steps = std::stoi(next());
    } else if (a == "--warmup") {
      o.warmup = std::stoi(next());
    } else if (a == "--bucket") {
      o.bucket = std::stoull(next());
    } else if (a == "--csv") {
      o.csv = true;
    } else if (a == "--csv-header") {
      std::printf(
          "method,ranks,params,layers,width,batch,bucket,steps,steps_per_s,bytes_per_step\n");
      std::exit(0);
    } else {
      throw pactrain::error("pactrain_torch_dp_bench: unknown option '" + a +
                            "' (--method official|flat|dense|pruned, --width, --layers, "
                            "--batch, --steps, --warmup, --bucket, --csv, --csv-header)");
    }
  }
  if (o.method != "official" && o.method != "flat" && o.method != "dense" && o.method != "pruned") {
    throw pactrain::error("pactrain_torch_dp_bench: unknown method '" + o.method + "'");
  }
  return o;
}

torch::nn::Sequential make_model(const options& o) {
  torch::manual_seed(1);
  torch::nn::Sequential m;
  std::int64_t in = 784;
  for (int l = 0; l < o.layers; ++l) {
    m->push_back(torch::nn::Linear(in, o.width));
    m->push_back(torch::nn::ReLU());
    in = o.width;
  }
  m->push_back(torch::nn::Linear(in, 10));
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  return pactrain::mpi_main(argc, argv, [&](const pactrain::mpi_world& world) {
    const options o = parse(argc, argv);
    torch::set_num_threads(1);
    auto model = make_model(o);
    torch::manual_seed(100 + static_cast<std::uint64_t>(world.rank));
    const auto x = torch::randn({o.batch, 784});
    const auto y = torch::randint(0, 10, {o.batch});
    const auto loss_of = [&] { return torch::nn::functional::cross_entropy(model->forward(x), y); };
    const int total = o.warmup + o.steps;
    const pactrain::sgd_options sgd{.lr = 0.01, .momentum = 0.9};
    std::uint64_t bytes = 0;
    std::int64_t params = 0;
    for (const auto& p : model->parameters()) params += p.numel();
    double seconds = 0;
    const auto timed = [&](int step, auto&& body) {
      if (step == o.warmup) MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      body();
      if (step >= o.warmup) {
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    };
    if (o.method == "official") {
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(sgd.lr).momentum(0.9));
      for (int s = 0; s < total; ++s) {
        timed(s, [&] {
          opt.zero_grad();
          loss_of().backward();
          for (auto& p : model->parameters()) {
            auto g = p.mutable_grad();
            MPI_Allreduce(MPI_IN_PLACE, g.data_ptr<float>(), static_cast<int>(g.numel()), MPI_FLOAT,
                          MPI_SUM, MPI_COMM_WORLD);
            g.div_(world.size);
          }
          opt.step();
        });
      }
      bytes = static_cast<std::uint64_t>(params) * sizeof(float);
    } else if (o.method == "flat") {
      pactrain::torch_params tp(*model);
      pactrain::sgd opt(sgd);
      const float inv = 1.0f / static_cast<float>(world.size);
      for (int s = 0; s < total; ++s) {
        timed(s, [&] {
          tp.zero_grad();
          loss_of().backward();
          auto g = tp.grads();
          MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM,
                        MPI_COMM_WORLD);
          for (float& v : g) v *= inv;
          opt.step(tp.values(), tp.grads(), tp.momentum());
        });
      }
      bytes = static_cast<std::uint64_t>(params) * sizeof(float);
    } else {
      pactrain::data_parallel_options dpo{.params = {.bucket_capacity = o.bucket},
                                          .optimizer = sgd};
      if (o.method == "pruned") {
        dpo.pruning = {.sparsity = 0.9,
                       .total_steps = static_cast<std::uint64_t>(total),
                       .start = 0,
                       .end = 0,
                       .updates = 1};
      }
      pactrain::data_parallel dp(*model, pactrain::mpi_communicator{MPI_COMM_WORLD}, dpo);
      for (int s = 0; s < total; ++s) {
        timed(s, [&] {
          dp.zero_grad();
          loss_of().backward();
          dp.step();
        });
      }
      bytes = dp.stats().bytes_sent;
    }
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const double rate = static_cast<double>(o.steps) / seconds;
    if (world.rank == 0) {
      if (o.csv) {
        std::printf("%s,%d,%lld,%d,%lld,%lld,%zu,%d,%.3f,%llu\n", o.method.c_str(), world.size,
                    static_cast<long long>(params), o.layers, static_cast<long long>(o.width),
                    static_cast<long long>(o.batch), o.bucket, o.steps, rate,
                    static_cast<unsigned long long>(bytes));
      } else {
        std::printf("%s: %d ranks, %lld parameters: %.2f steps/s, %llu bytes sent a step\n",
                    o.method.c_str(), world.size, static_cast<long long>(params), rate,
                    static_cast<unsigned long long>(bytes));
      }
    }
    return 0;
  });
}
