// pactrain/torch.hpp: a LibTorch module's parameters on pactrain (CMake target pactrain::torch).
//
//   pactrain::torch_params params(*model);                 // flat parameters, gradients, momentum
//   pactrain::sync sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, params.layout()};
//   params.broadcast(sync.get_communicator());             // rank 0's initial weights everywhere
//   pactrain::torch_overlap overlap(params, sync);         // buckets go out during backward
//   pactrain::sgd opt({.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
//   for (...) {
//     overlap.begin_step();                                // zeroes the gradients
//     loss.backward();                                     // each bucket submitted when written
//     overlap.finish_step();                               // averaged, +0 at pruned entries
//     opt.step(params.values(), params.grads(), params.momentum());
//     if (pruner.step(sync, params.values_const())) params.apply_masks(sync.masks());
//   }
#pragma once

#include <pactrain/sampler.hpp>              // distributed_sampler: each rank's shard
#include <pactrain/torch_data_parallel.hpp>  // data_parallel: the common case in one object
#include <pactrain/torch_overlap.hpp>        // torch_overlap: buckets leave during backward
#include <pactrain/torch_params.hpp>         // torch_params: parameters in flat buffers
