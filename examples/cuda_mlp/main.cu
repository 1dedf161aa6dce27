// cuda_mlp: a data-parallel MLP on Fashion-MNIST on GPUs. cuBLAS does the matrix work;
// pactrain's device sync engine averages the pruned gradients through NCCL, one rank per GPU
// (MPI starts the ranks and hands out the NCCL unique id).
//
// Build and run (from the repository root, on a machine with GPUs and the Debian package
// dataset-fashion-mnist):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
//   cmake --build build --target pactrain_cuda_mlp
//   mpiexec -n 1 build/examples/pactrain_cuda_mlp --epochs 2 --sparsity 0.9
//   mpiexec -n <GPUs> build/examples/pactrain_cuda_mlp --epochs 10
// Options: --epochs N (2) --batch B per rank (128) --lr (0.05) --momentum (0.9) --sparsity S
// (0.9, magnitude pruning of the weight matrices after --prune-epoch, default 1)
// --data DIR (/usr/share/datasets/fashion-mnist) --limit N (training samples, 0 = all).
// Exits with 77 when no GPU is found.
//
// Model: 784-1024-64-10, ReLU, softmax cross-entropy, SGD with momentum. Activations are
// column-major features x batch, so cuBLAS sees every row-major weight matrix (out x in) as its
// transpose.
#include <pactrain/cuda/nccl.hpp>
#include <pactrain/cuda/sync.cuh>
#include <pactrain/pactrain.hpp>

#include "../common/run_main.hpp"
#include "../fmnist/idx.hpp"

#include <cublas_v2.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using pactrain::detail::device_buffer;

#define CUBLAS_TRY(call)                                                            \
  do {                                                                              \
    const cublasStatus_t st_ = (call);                                              \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                               \
      PACTRAIN_FAIL(std::string(#call) + " failed: " + cublasGetStatusString(st_)); \
  } while (false)

struct options {
  int epochs = 2;
  int batch = 128;
  float lr = 0.05f;
  float momentum = 0.9f;
  double sparsity = 0.9;
  int prune_epoch = 1;
  std::string data = pactrain::fmnist::default_data_dir;
  std::size_t limit = 0;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    PACTRAIN_EXPECTS(i + 1 < argc, "missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--epochs")
      o.epochs = std::stoi(v);
    else if (a == "--batch")
      o.batch = std::stoi(v);
    else if (a == "--lr")
      o.lr = std::stof(v);
    else if (a == "--momentum")
      o.momentum = std::stof(v);
    else if (a == "--sparsity")
      o.sparsity = std::stod(v);
    else if (a == "--prune-epoch")
      o.prune_epoch = std::stoi(v);
    else if (a == "--data")
      o.data = v;
    else if (a == "--limit")
      o.limit = std::stoul(v);
    else
      PACTRAIN_FAIL("unknown option " + a);
  }
  PACTRAIN_EXPECTS(o.epochs > 0 && o.batch > 0, "epochs and batch must be positive");
  return o;
}

constexpr int layers = 3;
constexpr int width[layers + 1] = {784, 1024, 64, 10};

// Xb[:, j] = X[:, idx[j]] (features x batch, column-major).
__global__ void gather_columns(const float* x, const int* idx, int features, int batch, float* xb) {
  const long n = static_cast<long>(features) * batch;
  for (long k = blockIdx.x * long{blockDim.x} + threadIdx.x; k < n;
       k += long{gridDim.x} * blockDim.x) {
    const long j = k / features;
    xb[k] = x[static_cast<long>(idx[j]) * features + (k - j * features)];
  }
}

__global__ void bias_act(float* y, const float* b, int out, int batch, bool relu) {
  const long n = static_cast<long>(out) * batch;
  for (long k = blockIdx.x * long{blockDim.x} + threadIdx.x; k < n;
       k += long{gridDim.x} * blockDim.x) {
    const float v = y[k] + b[k % out];
    y[k] = relu && v < 0.0f ? 0.0f : v;
  }
}

// Softmax cross-entropy per sample (one thread each): dlogits = (p - onehot) / batch.
__global__ void softmax_xent(const float* logits, const int* labels, const int* idx, int classes,
                             int batch, float* dlogits, float* loss, int* correct) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= batch) return;
  const float* z = logits + static_cast<long>(j) * classes;
  float m = z[0];
  int arg = 0;
  for (int c = 1; c < classes; ++c) {
    if (z[c] > m) {
      m = z[c];
      arg = c;
    }
  }
  float sum = 0.0f;
  for (int c = 0; c < classes; ++c) sum += expf(z[c] - m);
  const int y = labels[idx != nullptr ? idx[j] : j];
  atomicAdd(loss, logf(sum) - (z[y] - m));
  if (arg == y) atomicAdd(correct, 1);
  if (dlogits == nullptr) return;
  for (int c = 0; c < classes; ++c) {
    dlogits[static_cast<long>(j) * classes + c] =
        (expf(z[c] - m) / sum - (c == y ? 1.0f : 0.0f)) / static_cast<float>(batch);
  }
}

__global__ void bias_grad(const float* dy, int out, int batch, float* db) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= out) return;
  float s = 0.0f;
  for (int j = 0; j < batch; ++j) s += dy[static_cast<long>(j) * out + o];
  db[o] = s;
}

__global__ void relu_back(float* dx, const float* act, long n) {
  for (long k = blockIdx.x * long{blockDim.x} + threadIdx.x; k < n;
       k += long{gridDim.x} * blockDim.x) {
    if (act[k] <= 0.0f) dx[k] = 0.0f;
  }
}

__global__ void sgd(float* w, float* v, const float* g, long n, float lr, float mu) {
  for (long k = blockIdx.x * long{blockDim.x} + threadIdx.x; k < n;
       k += long{gridDim.x} * blockDim.x) {
    v[k] = mu * v[k] + g[k];
    w[k] -= lr * v[k];
  }
}

unsigned blocks_for(long n) { return static_cast<unsigned>(std::min<long>((n + 255) / 256, 4096)); }

struct split {
  device_buffer<float> x;  // 784 x count, column per sample
  device_buffer<int> y;
  std::size_t count = 0;
};

split upload(const pactrain::fmnist::dataset& d, cudaStream_t s) {
  split r;
  r.count = d.count;
  std::vector<float> x(d.pixels.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(d.pixels[i]) / 255.0f;
  std::vector<int> y(d.labels.begin(), d.labels.end());
  r.x = device_buffer<float>(x.size(), s);
  r.y = device_buffer<int>(y.size(), s);
  PACTRAIN_CUDA_TRY(cudaMemcpyAsync(r.x.data(), x.data(), x.size() * 4, cudaMemcpyHostToDevice, s));
  PACTRAIN_CUDA_TRY(cudaMemcpyAsync(r.y.data(), y.data(), y.size() * 4, cudaMemcpyHostToDevice, s));
  PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s));
  return r;
}

// The network: parameters, gradients and momentum as flat buffers laid out by `layout`.
struct mlp {
  pactrain::param_layout layout;
  device_buffer<float> w, g, v;
  std::vector<device_buffer<float>> act, dact;  // per layer boundary: width x batch
  int batch = 0;

  mlp(int max_batch, cudaStream_t s) : batch(max_batch) {
    for (int l = 0; l < layers; ++l) {
      layout.add("fc" + std::to_string(l + 1) + ".weight", width[l + 1], width[l]);
      layout.add("fc" + std::to_string(l + 1) + ".bias", width[l + 1]);
    }
    const std::size_t n = layout.total_size();
    w = device_buffer<float>(n, s);
    g = device_buffer<float>(n, s);
    v = device_buffer<float>(n, s);
    // He-uniform from one seed: every rank starts from the same weights.
    std::vector<float> h(n, 0.0f);
    std::mt19937 rng(42);
    for (int l = 0; l < layers; ++l) {
      const auto& t = layout.tensor(2 * l);
      const float a = std::sqrt(6.0f / static_cast<float>(width[l]));
      std::uniform_real_distribution<float> u(-a, a);
      for (std::size_t k = 0; k < t.size; ++k) h[t.offset + k] = u(rng);
    }
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(w.data(), h.data(), n * 4, cudaMemcpyHostToDevice, s));
    PACTRAIN_CUDA_TRY(cudaMemsetAsync(v.data(), 0, n * 4, s));
    for (int l = 0; l <= layers; ++l) {
      act.emplace_back(static_cast<std::size_t>(width[l]) * max_batch, s);
      dact.emplace_back(static_cast<std::size_t>(width[l]) * max_batch, s);
    }
  }
  float* param(float* base, int l, bool bias) { return base + layout.tensor(2 * l + bias).offset; }

  // act[0] must hold the inputs; leaves the logits in act[layers].
  void forward(cublasHandle_t h, int b, cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    for (int l = 0; l < layers; ++l) {
      CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, width[l + 1], b, width[l], &one,
                             param(w.data(), l, false), width[l], act[l].data(), width[l], &zero,
                             act[l + 1].data(), width[l + 1]));
      const long n = static_cast<long>(width[l + 1]) * b;
      bias_act<<<blocks_for(n), 256, 0, s>>>(act[l + 1].data(), param(w.data(), l, true),
                                             width[l + 1], b, l + 1 < layers);
    }
  }

  // dact[layers] must hold dlogits; fills g.
  void backward(cublasHandle_t h, int b, cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    for (int l = layers - 1; l >= 0; --l) {
      CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, width[l], width[l + 1], b, &one,
                             act[l].data(), width[l], dact[l + 1].data(), width[l + 1], &zero,
                             param(g.data(), l, false), width[l]));
      bias_grad<<<(width[l + 1] + 255) / 256, 256, 0, s>>>(dact[l + 1].data(), width[l + 1], b,
                                                           param(g.data(), l, true));
      if (l == 0) break;
      CUBLAS_TRY(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, width[l], b, width[l + 1], &one,
                             param(w.data(), l, false), width[l], dact[l + 1].data(), width[l + 1],
                             &zero, dact[l].data(), width[l]));
      const long n = static_cast<long>(width[l]) * b;
      relu_back<<<blocks_for(n), 256, 0, s>>>(dact[l].data(), act[l].data(), n);
    }
  }
};

int run(int argc, char** argv) {
  const auto [rank, size] = examples::world();
  const options opt = parse(argc, argv);

  // One GPU per rank on each node.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local = 0, local_size = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  const int gpus = pactrain::detail::cuda_device_count();
  PACTRAIN_EXPECTS(local_size <= gpus, std::to_string(local_size) + " ranks on a node with " +
                                           std::to_string(gpus) +
                                           " GPUs: NCCL needs one GPU per rank");
  PACTRAIN_CUDA_TRY(cudaSetDevice(local));

  ncclUniqueId id;
  if (rank == 0) PACTRAIN_NCCL_TRY(nullptr, ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  PACTRAIN_NCCL_TRY(nullptr, ncclCommInitRank(&comm, size, id, rank));

  cudaStream_t s = nullptr;
  PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cublasHandle_t blas = nullptr;
  CUBLAS_TRY(cublasCreate(&blas));
  CUBLAS_TRY(cublasSetStream(blas, s));
  {
    const auto train_h = pactrain::fmnist::load_split(opt.data, "train", opt.limit);
    const auto test_h = pactrain::fmnist::load_split(opt.data, "t10k");
    const split train = upload(train_h, s);
    const split test = upload(test_h, s);
    const int eval_batch = 1000;
    mlp net(std::max(opt.batch, eval_batch), s);

    pactrain::sync sync{pactrain::nccl_communicator{comm, s}, net.layout, s};  // cuda_compactor
    const pactrain::cuda_compactor compactor;

    device_buffer<int> idx(static_cast<std::size_t>(std::max(opt.batch, eval_batch)), s);
    device_buffer<float> loss(1, s);
    device_buffer<int> correct(1, s);
    std::vector<int> order(train.count);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 shuffle_rng(7);  // the same order on every rank; each takes its share
    const std::size_t steps = train.count / (static_cast<std::size_t>(opt.batch) * size);
    if (rank == 0) {
      std::printf("cuda_mlp: %d rank(s), %zu training samples, %zu steps of %d x %d per epoch\n",
                  size, train.count, steps, size, opt.batch);
    }

    for (int epoch = 0; epoch < opt.epochs; ++epoch) {
      if (epoch == opt.prune_epoch && opt.sparsity > 0) {
        // Magnitude pruning of the weight matrices; equal weights on every rank give equal
        // masks, and the agreement checks it.
        std::vector<float> hw(net.layout.total_size());
        PACTRAIN_CUDA_TRY(
            cudaMemcpyAsync(hw.data(), net.w.data(), hw.size() * 4, cudaMemcpyDeviceToHost, s));
        PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s));
        const auto masks = pactrain::magnitude_pruning{}.compute(
            net.layout, std::span<const float>(hw), opt.sparsity,
            pactrain::matrix_tensors(net.layout));
        sync.set_masks(masks);
        // Pruned weights and their momentum become exactly 0 (gather, then scatter back).
        for (std::size_t i = 0; i < masks.size(); ++i) {
          const auto& t = net.layout.tensor(i);
          for (float* buf : {net.w.data(), net.v.data()}) {
            const std::span<float> d(buf + t.offset, t.size);
            const std::span<float> p(net.g.data(), sync.plan(i).count());
            compactor.gather_async(sync.plan(i), std::span<const float>(d), p, s);
            compactor.scatter_async(sync.plan(i), std::span<const float>(p), d, 1.0f, s);
          }
        }
      }
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      PACTRAIN_CUDA_TRY(cudaMemsetAsync(loss.data(), 0, 4, s));
      PACTRAIN_CUDA_TRY(cudaMemsetAsync(correct.data(), 0, 4, s));
      double sync_bytes = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t step = 0; step < steps; ++step) {
        const int* mine = order.data() + (step * size + rank) * opt.batch;
        PACTRAIN_CUDA_TRY(
            cudaMemcpyAsync(idx.data(), mine, opt.batch * 4, cudaMemcpyHostToDevice, s));
        gather_columns<<<blocks_for(784L * opt.batch), 256, 0, s>>>(train.x.data(), idx.data(), 784,
                                                                    opt.batch, net.act[0].data());
        net.forward(blas, opt.batch, s);
        softmax_xent<<<(opt.batch + 127) / 128, 128, 0, s>>>(
            net.act[layers].data(), train.y.data(), idx.data(), 10, opt.batch,
            net.dact[layers].data(), loss.data(), correct.data());
        net.backward(blas, opt.batch, s);
        sync.allreduce_async(std::span<float>(net.g.data(), net.layout.total_size()), s);
        sgd<<<blocks_for(static_cast<long>(net.layout.total_size())), 256, 0, s>>>(
            net.w.data(), net.v.data(), net.g.data(), static_cast<long>(net.layout.total_size()),
            opt.lr, opt.momentum);
        // The index buffer is rewritten from pageable memory next step: the copy is staged,
        // so no synchronisation is needed here.
        sync_bytes += static_cast<double>(sync.stats().bytes_sent);
      }
      PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      float train_loss = 0;
      int train_correct = 0;
      PACTRAIN_CUDA_TRY(cudaMemcpy(&train_loss, loss.data(), 4, cudaMemcpyDeviceToHost));
      PACTRAIN_CUDA_TRY(cudaMemcpy(&train_correct, correct.data(), 4, cudaMemcpyDeviceToHost));

      // Test accuracy (every rank evaluates the same weights; rank 0 reports).
      PACTRAIN_CUDA_TRY(cudaMemsetAsync(loss.data(), 0, 4, s));
      PACTRAIN_CUDA_TRY(cudaMemsetAsync(correct.data(), 0, 4, s));
      for (std::size_t at = 0; at + eval_batch <= test.count; at += eval_batch) {
        PACTRAIN_CUDA_TRY(cudaMemcpyAsync(net.act[0].data(), test.x.data() + at * 784,
                                          784UL * eval_batch * 4, cudaMemcpyDeviceToDevice, s));
        net.forward(blas, eval_batch, s);
        softmax_xent<<<(eval_batch + 127) / 128, 128, 0, s>>>(
            net.act[layers].data(), test.y.data() + at, nullptr, 10, eval_batch, nullptr,
            loss.data(), correct.data());
      }
      int test_correct = 0;
      PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s));
      PACTRAIN_CUDA_TRY(cudaMemcpy(&test_correct, correct.data(), 4, cudaMemcpyDeviceToHost));
      if (rank == 0) {
        const double samples = static_cast<double>(steps) * opt.batch;
        std::printf(
            "epoch %d: loss %.4f  train acc %.4f  test acc %.4f  %.2f s  "
            "sync %.2f MB/step (dense %.2f MB)\n",
            epoch + 1, train_loss / samples, train_correct / samples,
            test_correct / static_cast<double>(test.count / eval_batch * eval_batch), seconds,
            sync_bytes / std::max<double>(1, static_cast<double>(steps)) / 1e6,
            static_cast<double>(sync.stats().dense_bytes) / 1e6);
      }
    }
  }
  CUBLAS_TRY(cublasDestroy(blas));
  PACTRAIN_CUDA_TRY(cudaStreamDestroy(s));
  ncclCommDestroy(comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "cuda_mlp", [&] {
    if (pactrain::detail::cuda_device_count() == 0) {
      std::printf("cuda_mlp: no CUDA device usable: %s\n",
                  pactrain::detail::cuda_device_status().c_str());
      return 77;
    }
    return run(argc, argv);
  });
}
