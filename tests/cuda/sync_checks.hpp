// The device sync engine's expectations, shared by every backend and communicator: the GPU
// tests run them with cuda_compactor over NCCL (one rank) and MPI (several ranks sharing a
// GPU), thrust_cpu_test.cpp on the CPU with thrust_compactor over MPI (label cuda-host).
//
// The reference is the host engine with a host communicator over the same ranks, on the same
// rank-dependent values: equal bit for bit, statistics included, for every mask type, density,
// strategy (the plain ones bypass the codec), value type and 16-bit codec. Values are not dyadic,
// so the codecs' rounding and the 1/P scale are exercised; both engines reduce the same buckets in
// the same order.
//
//   make_sync_checks<Compactor>(make_comm, make_host_comm, rank[, stream, same_reduction]).all()
// make_comm() gives the device engine's communicator, make_host_comm() the host engine's.
#pragma once

#include <doctest/doctest.h>

#include <pactrain/codec/half_precision.hpp>
#include <pactrain/cuda/sgd.hpp>
#include <pactrain/pactrain.hpp>

#include "common/device_array.hpp"
#include "common/test_data.hpp"

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain::test {

// The factories are std::function, so that one instantiation serves every caller with the
// same compactor and communicator types (each is a large one: nvcc takes tens of seconds).
template <class Compactor, class Comm, class HostComm>
struct sync_checks {
  using exec = typename Compactor::exec_type;
  using stream_type = typename Compactor::stream_type;
  template <class T>
  using array = basic_device_array<T, exec>;
  using comm_type = Comm;
  using host_comm_type = HostComm;

  std::function<Comm()> make_comm;
  std::function<HostComm()> make_host_comm;
  int rank = 0;
  stream_type stream{};

  // Whether both engines reduce each bucket with the same algorithm (the same host
  // communicator's nonblocking allreduce, or one rank). Where they may not (a device
  // communicator on several ranks), sums must not depend on the order: values are then
  // dyadic, exactly summable in the wire type.
  bool same_reduction = true;

  // The same masks and strategies on every engine given.
  template <class Mask, class... Engines>
  static void commit_all(const std::vector<Mask>& masks, const std::vector<bucket_strategy>& st,
                         Engines&... engines) {
    (engines.set_masks(masks), ...);
    (engines.set_strategies(st), ...);
  }

  template <class Codec = identity_codec<float>>
  std::vector<typename Codec::value_type> grads(std::size_t n, std::uint64_t seed) const {
    using T = typename Codec::value_type;
    const auto r = static_cast<std::uint64_t>(rank);
    if (!same_reduction) {
      if constexpr (std::is_same_v<Codec, fp16_codec>) return small_values(n, seed, r, 255);
      if constexpr (std::is_same_v<Codec, bf16_codec>) return small_values(n, seed, r, 15);
      return values<T>(n, seed, r);
    }
    std::vector<T> g(n);
    const auto s = spread_values(n, seed, r);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<T>(s[i]) * T(3.7);
    return g;
  }

  template <class Mask, class Codec>
  void against_host(const param_layout& l) const {
    using T = typename Codec::value_type;
    pactrain::sync<comm_type, Codec, Mask, Compactor> ds{make_comm(), l, Codec{}, sync_options{},
                                                         stream};
    pactrain::sync<host_comm_type, Codec, Mask> hs{make_host_comm(), l};
    for (double d : densities) {
      CAPTURE(d);
      const auto masks = masks_for<Mask>(l, d, 17);
      ds.set_masks(masks);
      hs.set_masks(masks);
      CHECK(ds.masks() == masks);
      for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense,
                            bucket_strategy::sparse_plain, bucket_strategy::dense_plain}) {
        const std::string strategy_name = to_string(strategy);
        CAPTURE(strategy_name);
        const std::vector<bucket_strategy> st(l.buckets().size(), strategy);
        ds.set_strategies(st);
        hs.set_strategies(st);
        for (int step = 0; step < 2; ++step) {
          auto g = grads<Codec>(l.total_size(), 3 + step);
          array<T> dg(g);
          ds.allreduce(dg.span(), stream);
          hs.allreduce(std::span<T>(g));
          CHECK(bad_entries(dg.host(), g) == 0);
        }
        CHECK(ds.stats().bytes_sent == hs.stats().bytes_sent);
        CHECK(ds.stats().collectives == hs.stats().collectives);
        CHECK(ds.stats().dense_bytes == hs.stats().dense_bytes);
        CHECK(ds.step() == hs.step());
      }
    }
  }

  // The three-phase step: buckets submitted in any order (the others at finish_step) give
  // the one-call step's results; misuse is refused and leaves no step open.
  void three_phase() const {
    const auto l = small_layout();
    pactrain::sync<comm_type, fp16_codec, bitmap_mask, Compactor> ds{make_comm(), l, fp16_codec{},
                                                                     sync_options{}, stream};
    pactrain::sync<host_comm_type, fp16_codec> hs{make_host_comm(), l};
    const auto masks = masks_for<bitmap_mask>(l, 0.5, 3);
    commit_all(masks,
               {bucket_strategy::sparse, bucket_strategy::dense, bucket_strategy::sparse_plain}, ds,
               hs);
    for (const std::vector<std::size_t>& order :
         {std::vector<std::size_t>{2, 0}, std::vector<std::size_t>{}, {1, 2, 0}}) {
      auto g = grads<fp16_codec>(l.total_size(), 7 + order.size());
      array<float> dg(g);
      CHECK_FALSE(ds.step_open());
      ds.begin_step(dg.span(), stream);
      CHECK(ds.step_open());
      for (std::size_t b : order) ds.submit_bucket(b);
      ds.finish_step();
      CHECK_FALSE(ds.step_open());
      hs.allreduce(std::span<float>(g));
      CHECK(bad_entries(dg.host(), g) == 0);
      CHECK(ds.stats().bytes_sent == hs.stats().bytes_sent);
      CHECK(ds.stats().collectives == hs.stats().collectives);
    }
    CHECK(ds.step() == 3);
    array<float> dg(grads(l.total_size(), 1));
    CHECK_THROWS_WITH_AS(ds.submit_bucket(0), doctest::Contains("no step is open"), error);
    CHECK_THROWS_WITH_AS(ds.finish_step(), doctest::Contains("no step is open"), error);
    ds.begin_step(dg.span(), stream);
    CHECK_THROWS_WITH_AS(ds.begin_step(dg.span(), stream), doctest::Contains("a step is open"),
                         error);
    CHECK_THROWS_WITH_AS(ds.set_masks(masks), doctest::Contains("a step is open"), error);
    CHECK_THROWS_WITH_AS(ds.submit_bucket(3), doctest::Contains("bucket 3 of 3"), error);
    ds.submit_bucket(1);
    CHECK_THROWS_WITH_AS(ds.submit_bucket(1), doctest::Contains("already submitted"), error);
    ds.finish_step();
    CHECK(ds.step() == 4);
    CHECK_THROWS_WITH_AS(ds.begin_step(dg.span().first(5), stream),
                         doctest::Contains("buffer has 5 entries"), error);
    CHECK_FALSE(ds.step_open());
  }

  // One buffer per tensor gives the flat buffer's results, every strategy on every bucket:
  // dense buckets staged (tensors apart) or in place (back to back, or one tensor beside an
  // empty one), the pointer table rewritten when the buffers move and move back; bad views
  // are refused, leaving no step open.
  void separate_buffers() const {
    const auto l = small_layout();
    pactrain::sync<comm_type, fp16_codec, bitmap_mask, Compactor> ds{make_comm(), l, fp16_codec{},
                                                                     sync_options{}, stream};
    pactrain::sync<host_comm_type, fp16_codec> hs{make_host_comm(), l};
    const auto masks = masks_for<bitmap_mask>(l, 0.5, 9);
    ds.set_masks(masks);
    hs.set_masks(masks);
    using B = bucket_strategy;
    const std::vector<std::vector<B>> st{{B::dense, B::dense_plain, B::sparse},
                                         {B::sparse, B::dense, B::sparse_plain},
                                         {B::dense_plain, B::sparse, B::dense},
                                         {B::sparse_plain, B::sparse, B::dense}};
    const auto& ts = l.tensors();
    // Sets 0 and 1: an array per tensor; set 2: views into one array.
    std::vector<std::vector<array<float>>> apart(2);
    array<float> whole(l.total_size());
    for (int step = 0; step < 4; ++step) {
      CAPTURE(step);
      ds.set_strategies(st[step]);
      hs.set_strategies(st[step]);
      const int set = step == 3 ? 0 : step;
      auto g = grads<fp16_codec>(l.total_size(), 21 + step);
      std::vector<std::span<float>> views;
      if (set < 2) {
        auto& arrays = apart[set];
        arrays.clear();
        arrays.reserve(ts.size());  // the views must stay valid
        for (const auto& t : ts) {
          arrays.emplace_back(
              std::vector<float>(g.begin() + t.offset, g.begin() + t.offset + t.size));
          views.push_back(arrays.back().span());
        }
      } else {
        whole.assign(g);
        for (const auto& t : ts) views.push_back(whole.span().subspan(t.offset, t.size));
      }
      if (step == 1) {
        ds.allreduce(views, stream);
      } else {  // the three-phase step over views
        ds.begin_step(std::span<const std::span<float>>(views), stream);
        ds.submit_bucket(1);
        ds.finish_step();
        exec{}.synchronize(stream);
      }
      hs.allreduce(std::span<float>(g));
      std::vector<float> out;
      for (std::size_t i = 0; i < ts.size(); ++i) {
        const auto v = set < 2 ? apart[set][i].host() : whole.host();
        const std::size_t at = set < 2 ? 0 : ts[i].offset;
        out.insert(out.end(), v.begin() + at, v.begin() + at + ts[i].size);
      }
      CHECK(bad_entries(out, g) == 0);
      CHECK(ds.stats().bytes_sent == hs.stats().bytes_sent);
      CHECK(ds.stats().collectives == hs.stats().collectives);
    }
    std::vector<std::span<float>> views;
    for (std::size_t i = 0; i < ts.size(); ++i) views.push_back(apart[0][i].span());
    auto bad = views;
    bad.pop_back();
    CHECK_THROWS_WITH_AS(ds.allreduce(bad, stream),
                         doctest::Contains("4 tensors given, the layout has 5"), error);
    bad = views;
    bad[1] = bad[1].first(19);
    CHECK_THROWS_WITH_AS(ds.allreduce(bad, stream),
                         doctest::Contains("tensor 'fc1.bias' has 19 entries, the layout 20"),
                         error);
    bad[1] = std::span<float>(static_cast<float*>(nullptr), 20);
    CHECK_THROWS_WITH_AS(ds.begin_step(std::span<const std::span<float>>(bad), stream),
                         doctest::Contains("null buffer for tensor 'fc1.bias'"), error);
    CHECK_FALSE(ds.step_open());
    CHECK(ds.stats().steps == 4);
  }

  // ternary_codec, with and without error feedback and scale blocks: every strategy, the
  // three-phase step and densities 0 to 1 give the host engine's results bit for bit (scales,
  // stochastic rounding, residuals, statistics). A rank's NaN makes its whole bucket NaN at
  // kept entries on both, and both keep the residuals they had; the device engine's
  // synchronous allreduce reports it and keeps the step counter as the host engine does, its
  // queued step (which cannot know without waiting) advances the counter.
  template <class Codec>
  void ternary(std::size_t scale_block, scale_source source = scale_source::current_max) const {
    const auto l = small_layout();
    const ternary_codec codec{
        ternary_options{.seed = 5, .scale = source, .scale_block = scale_block}};
    pactrain::sync<comm_type, Codec, bitmap_mask, Compactor> ds{make_comm(), l, codec,
                                                                sync_options{}, stream};
    pactrain::sync<host_comm_type, Codec> hs{make_host_comm(), l, codec};
    using B = bucket_strategy;
    const std::vector<std::vector<B>> st{{B::sparse, B::dense, B::sparse},
                                         {B::dense, B::sparse_plain, B::sparse},
                                         {B::sparse, B::sparse, B::dense}};
    std::uint64_t seed = 31;
    // nan: a NaN at entry `at` of rank 0's gradient (100: bucket 0).
    const auto run = [&](bool three_phase, bool nan, std::size_t at = 100) {
      CAPTURE(seed);
      auto g = grads(l.total_size(), seed);
      if (nan && rank == 0) g[at] = std::numeric_limits<float>::quiet_NaN();
      array<float> dg(g);
      if (three_phase) {  // the same submissions on both: the same scale rounds
        ds.begin_step(dg.span(), stream);
        ds.submit_bucket(2);
        ds.submit_bucket(0);
        ds.finish_step();
        exec{}.synchronize(stream);
        hs.begin_step(std::span<float>(g));
        hs.submit_bucket(2);
        hs.submit_bucket(0);
        hs.finish_step();
      } else {
        ds.allreduce(dg.span(), stream);
        hs.allreduce(std::span<float>(g));
      }
      CHECK(bad_entries(dg.host(), g, nan) == 0);  // a NaN's payload may differ by device
      ++seed;
      if (nan) return;
      CHECK(ds.stats().bytes_sent == hs.stats().bytes_sent);
      CHECK(ds.stats().collectives == hs.stats().collectives);
      CHECK(ds.step() == hs.step());
    };
    for (double d : {0.0, 0.3, 1.0}) {
      CAPTURE(d);
      const auto masks = masks_for<bitmap_mask>(l, d, 13);
      ds.set_masks(masks);
      hs.set_masks(masks);
      for (const auto& s : st) {
        ds.set_strategies(s);
        hs.set_strategies(s);
        for (int k = 0; k < 3; ++k) run(k == 1, false);
      }
    }
    run(false, true);
    CHECK(ds.step() == hs.step());
    CHECK(ds.stats().nonfinite_buckets == 1);
    CHECK(hs.stats().nonfinite_buckets == 1);
    CHECK(ds.stats().nonfinite_steps == hs.stats().nonfinite_steps);
    run(false, false);  // the residuals and step counter of before the NaN, on both
    ds.set_strategies({B::sparse, B::sparse_plain, B::dense});  // every entry kept (d = 1)
    hs.set_strategies({B::sparse, B::sparse_plain, B::dense});
    run(false, true, l.buckets()[1].offset);  // in a plain bucket: the scales are finite
    CHECK(ds.stats().nonfinite_buckets == 1);
    CHECK(ds.step() == hs.step());
    run(false, false);
    run(true, true);
    CHECK(ds.step() == hs.step() + 1);
    CHECK(ds.stats().nonfinite_buckets == 0);
    hs.set_step(ds.step());
    run(true, false);
    run(false, false);
  }

  // save_state and load_state, one format for both engines: after the same steps the device
  // engine saves the host engine's bytes, and a state saved by either resumes the other bit for
  // bit. A corrupt state, or one loaded or saved while a step is open, is refused and changes
  // nothing.
  void state(scale_source source = scale_source::current_max) const {
    using Codec = error_feedback<ternary_codec>;
    using device_sync = pactrain::sync<comm_type, Codec, bitmap_mask, Compactor>;
    using host_sync = pactrain::sync<host_comm_type, Codec>;
    const auto l = small_layout();
    const ternary_codec codec{ternary_options{.seed = 9, .scale = source, .scale_block = 64}};
    const auto masks = masks_for<bitmap_mask>(l, 0.3, 21);
    using B = bucket_strategy;
    const std::vector<B> st{B::sparse, B::dense, B::sparse};
    device_sync ds{make_comm(), l, codec, sync_options{}, stream};
    host_sync hs{make_host_comm(), l, codec};
    commit_all(masks, st, ds, hs);
    const auto step = [&](device_sync& d, host_sync& h, std::uint64_t seed) {
      CAPTURE(seed);
      auto g = grads(l.total_size(), seed);
      array<float> dg(g);
      d.allreduce(dg.span(), stream);
      h.allreduce(std::span<float>(g));
      CHECK(bad_entries(dg.host(), g) == 0);
    };
    for (std::uint64_t k = 0; k < 3; ++k) step(ds, hs, 41 + k);
    const auto saved = ds.save_state();
    CHECK(saved == hs.save_state());

    device_sync ds2{make_comm(), l, codec, sync_options{}, stream};
    host_sync hs2{make_host_comm(), l, codec};
    commit_all(masks, st, ds2, hs2);
    ds2.load_state(saved);
    hs2.load_state(saved);
    CHECK(ds2.step() == ds.step());
    step(ds2, hs, 50);  // the device engine resumed from its own state
    step(ds, hs2, 50);  // the host engine resumed from the device engine's

    auto bad = saved;
    bad[70] ^= std::byte{1};
    const auto before = ds.save_state();
    CHECK_THROWS_WITH_AS(ds.load_state(bad), doctest::Contains("checksum mismatch"), error);
    array<float> dg(grads(l.total_size(), 60));
    ds.begin_step(dg.span(), stream);
    CHECK_THROWS_WITH_AS((void)ds.save_state(), doctest::Contains("a step is open"), error);
    CHECK_THROWS_WITH_AS(ds.load_state(before), doctest::Contains("a step is open"), error);
    ds.finish_step();
    exec{}.synchronize(stream);
    ds.load_state(before);
    step(ds, hs2, 51);  // as before the refused loads and the step since
  }

  // Checked steps (sync_options::checked), with the host engine's expectations
  // (tests/mpi/sync/checked_mpi_test.cpp): the results of unchecked steps bit for bit and one
  // agreement round more; a mistake on one rank (a wrong length, another submission order, a
  // bucket submitted twice) is the same error on every rank, and the gradients and the
  // engine's state stay as they were.
  void checked() const {
    using Codec = error_feedback<ternary_codec>;
    using device_sync = pactrain::sync<comm_type, Codec, bitmap_mask, Compactor>;
    using B = bucket_strategy;
    const auto l = small_layout();
    const ternary_codec codec{ternary_options{.seed = 9}};
    device_sync dc{make_comm(), l, codec, sync_options{.checked = true}, stream};
    device_sync du{make_comm(), l, codec, sync_options{}, stream};
    pactrain::sync<host_comm_type, Codec> hc{make_host_comm(), l, codec,
                                             sync_options{.checked = true}};
    commit_all(masks_for<bitmap_mask>(l, 0.5, 3), {B::sparse, B::dense, B::sparse}, dc, du, hc);
    const auto run = [&](device_sync& e, array<float>& g, const std::vector<std::size_t>& order) {
      e.begin_step(g.span(), stream);
      for (const auto b : order) e.submit_bucket(b);
      e.finish_step();
      exec{}.synchronize(stream);
    };
    for (std::uint64_t k = 0; k < 3; ++k) {
      auto g = grads(l.total_size(), 70 + k);
      array<float> gc(g);
      array<float> gu(g);
      run(dc, gc, {2, 0});
      run(du, gu, {2, 0});
      hc.begin_step(std::span<float>(g));
      hc.submit_bucket(2);
      hc.submit_bucket(0);
      hc.finish_step();
      CHECK(bad_entries(gc.host(), gu.host()) == 0);
      CHECK(bad_entries(gc.host(), g) == 0);
    }
    CHECK(dc.stats().collectives == du.stats().collectives + 1);
    CHECK(dc.stats().bytes_sent == du.stats().bytes_sent + 88);
    CHECK(dc.stats().collectives == hc.stats().collectives);
    CHECK(dc.step() == 3);

    auto host = make_host_comm();
    const int last = host.size() - 1;
    const auto same_everywhere = [&](const std::string& text) {
      const auto d = digest_builder().add(text).value();
      std::uint64_t v[2] = {d, ~d};
      host.allreduce(std::span<std::uint64_t>(v), reduce_op::max);
      return v[0] == ~v[1];
    };
    const auto refused = [&](auto&& f, const std::string& expected) {
      const auto g0 = grads(l.total_size(), 80);
      array<float> g(g0);
      const auto before = dc.save_state();
      std::string what;
      try {
        f(g);
      } catch (const error& e) {
        what = e.what();
      }
      CHECK(same_everywhere(what));
      CHECK(what == expected);
      CHECK(g.host() == g0);
      CHECK_FALSE(dc.step_open());
      CHECK(dc.save_state() == before);
    };
    const std::string on_last = "pactrain: finish_step rejected on rank " + std::to_string(last);
    const std::size_t n = l.total_size();
    refused(
        [&](array<float>& g) { dc.allreduce(g.span().first(rank == last ? n - 1 : n), stream); },
        on_last + ": sync::allreduce: buffer has " + std::to_string(n - 1) +
            " entries, the layout " + std::to_string(n));
    refused(
        [&](array<float>& g) {
          run(dc, g, rank == last ? std::vector<std::size_t>{1, 1} : std::vector<std::size_t>{1});
        },
        on_last + ": sync::submit_bucket: bucket 1 was already submitted in this step");
    if (last > 0) {
      refused(
          [&](array<float>& g) {
            run(dc, g, rank == 0 ? std::vector<std::size_t>{0, 1} : std::vector<std::size_t>{1, 0});
          },
          "pactrain: finish_step: bucket submission orders differ across ranks");
    }
    // The engine goes on as if those steps had not been tried.
    const auto g = grads(l.total_size(), 90);
    array<float> gc(g);
    array<float> gu(g);
    run(dc, gc, {});
    run(du, gu, {});
    CHECK(bad_entries(gc.host(), gu.host()) == 0);
    CHECK(dc.step() == du.step());
  }

  // The fused optimizer step (finish_step(update), allreduce(grads, update, stream)): sgd
  // through device_sgd_update gives sgd::fused's parameters and momentum on the host engine
  // bit for bit, for sparse, dense and plain buckets, and leaves sparse buckets' gradients
  // unwritten as the host engine does; a step with a NaN makes no update and writes every
  // gradient back.
  template <class Codec, class Mask = bitmap_mask>
  void fused(Codec codec = {}) const {
    const auto l = small_layout();
    const std::size_t n = l.total_size();
    using device_sync = pactrain::sync<comm_type, Codec, Mask, Compactor>;
    device_sync ds{make_comm(), l, codec, sync_options{}, stream};
    pactrain::sync<host_comm_type, Codec, Mask> hs{make_host_comm(), l, codec};
    using B = bucket_strategy;
    const auto masks = masks_for<Mask>(l, 0.4, 11);
    commit_all(masks, {B::sparse, B::dense, B::sparse_plain}, ds, hs);
    std::size_t kept = 0;  // a kept entry of the first tensor (bucket 0), for the NaN
    while (!masks[0].test(kept)) ++kept;
    const sgd_options o{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
    sgd host_opt{o};
    sgd device_opt{o};
    auto hp = grads(n, 90);
    std::vector<float> hm(n, 0.0f);
    array<float> dp(hp);
    array<float> dm(hm);
    for (std::uint64_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      const bool nan = k == 2;
      auto g = grads(n, 91 + k);
      if (nan && rank == 0) g[kept] = std::numeric_limits<float>::quiet_NaN();
      array<float> dg(g);
      auto hu = host_opt.fused(l, hs.masks(), std::span<float>(hp), std::span<float>(hm));
      hs.allreduce(std::span<float>(g), hu);
      device_sgd_update du{device_opt, ds, dp.span(), dm.span(), stream};
      if (k == 3) {  // the three-phase step
        ds.begin_step(dg.span(), stream);
        ds.submit_bucket(2);
        ds.finish_step(du);
        exec{}.synchronize(stream);
      } else {
        ds.allreduce(dg.span(), du, stream);
      }
      CHECK(bad_entries(dg.host(), g, nan) == 0);
      CHECK(bad_entries(dp.host(), hp) == 0);
      CHECK(bad_entries(dm.host(), hm) == 0);
      CHECK(ds.stats().nonfinite_buckets == hs.stats().nonfinite_buckets);
      CHECK(device_opt.steps() == host_opt.steps());
    }
    CHECK(host_opt.steps() == 3);
    CHECK(ds.step() == hs.step());
  }

  // An Inf in plain buckets' results: the device engine's synchronous allreduce reports the
  // host engine's non-finite buckets and keeps the step counter, with the same results bit for
  // bit; a queued step cannot know, reports none and advances the counter.
  void nonfinite() const {
    const auto l = small_layout();
    pactrain::sync<comm_type, identity_codec<float>, bitmap_mask, Compactor> ds{make_comm(), l,
                                                                                stream};
    pactrain::sync<host_comm_type, identity_codec<float>> hs{make_host_comm(), l};
    commit_all(masks_for<bitmap_mask>(l, 1.0, 3),
               {bucket_strategy::sparse, bucket_strategy::dense, bucket_strategy::sparse}, ds, hs);
    auto g = grads(l.total_size(), 8);
    const auto& bk = l.buckets();
    if (rank == 0) {
      g[bk[1].offset] = std::numeric_limits<float>::infinity();
      g[bk[2].offset + bk[2].size - 1] = -std::numeric_limits<float>::infinity();
    }
    array<float> dg(g);
    ds.allreduce(dg.span(), stream);
    hs.allreduce(std::span<float>(g));
    CHECK(bad_entries(dg.host(), g) == 0);
    CHECK(ds.stats().nonfinite_buckets == 2);
    CHECK(hs.stats().nonfinite_buckets == 2);
    CHECK(ds.stats().nonfinite_steps == 1);
    CHECK(ds.step() == 0);
    CHECK(hs.step() == 0);
    ds.allreduce_async(dg.span(), stream);
    exec{}.synchronize(stream);
    CHECK(ds.stats().nonfinite_buckets == 0);
    CHECK(ds.step() == 1);
  }

  // A fully pruned model sends nothing and zeroes everything.
  void fully_pruned() const {
    const auto l = small_layout();
    pactrain::sync<comm_type, identity_codec<float>, bitmap_mask, Compactor> ds{make_comm(), l,
                                                                                stream};
    ds.set_masks(masks_for<bitmap_mask>(l, 0.0, 1));
    array<float> g(grads(l.total_size(), 1));
    ds.allreduce(g.data(), g.size(), stream);
    CHECK(same_bits(g.host(), std::vector<float>(l.total_size(), 0.0f)));
    CHECK(ds.stats().collectives == 0);
    CHECK(ds.stats().bytes_sent == 0);
  }

  // Bad input is refused on every rank before anything is queued, and changes nothing.
  void bad_input() const {
    const auto l = small_layout();
    pactrain::sync<comm_type, identity_codec<float>, bitmap_mask, Compactor> ds{make_comm(), l,
                                                                                stream};
    const auto masks = masks_for<bitmap_mask>(l, 0.5, 5);
    ds.set_masks(masks);
    const auto g0 = grads(l.total_size(), 2);
    array<float> g(g0);
    CHECK_THROWS_WITH_AS(ds.allreduce(g.span().first(783), stream),
                         doctest::Contains("buffer has 783 entries, the layout 784"), error);
    CHECK_THROWS_WITH_AS(ds.allreduce(static_cast<float*>(nullptr), 5, stream),
                         doctest::Contains("null buffer"), error);
    CHECK(g.host() == g0);
    auto wrong = masks;
    wrong[3] = bitmap_mask::full(10);
    CHECK_THROWS_WITH_AS(ds.set_masks(wrong),
                         doctest::Contains("mask of tensor 'fc2.weight' has 10 entries"), error);
    CHECK_THROWS_WITH_AS(ds.set_strategies({bucket_strategy::dense}),
                         doctest::Contains("1 strategies given for 3 buckets"), error);
    CHECK_THROWS_WITH_AS(
        ds.set_strategies({bucket_strategy::dense, bucket_strategy::sparse_plain,
                           bucket_strategy{static_cast<payload_kind>(7), encoding_kind::coded}}),
        doctest::Contains("is not one of sparse, dense"), error);
    CHECK_THROWS_WITH_AS(ds.reject_masks("policy failed"), doctest::Contains("policy failed"),
                         error);
    CHECK(ds.masks() == masks);
    CHECK(ds.stats().steps == 0);
    auto state = ds.save_state();  // the step counter only: no residuals, no scales
    state[0] = std::byte{'X'};
    CHECK_THROWS_WITH_AS(ds.load_state(state), doctest::Contains("bad magic"), error);
  }

  // The cross-rank subset (several ranks sharing one GPU, where each instantiation costs
  // nvcc seconds): every mask type, both value types and both 16-bit codecs appear once.
  void cross_rank() const {
    SUBCASE("bitmap masks") { against_host<bitmap_mask, identity_codec<float>>(small_layout()); }
    SUBCASE("index masks, bf16") { against_host<index_mask, bf16_codec>(small_layout()); }
    SUBCASE("block masks, fp16") { against_host<block_mask<4>, fp16_codec>(small_layout()); }
    SUBCASE("double gradients, one big bucket") {
      param_layout l(1 << 20);
      l.add("a", 1000, 300).add("b", 300).add("c", 4099);
      against_host<bitmap_mask, identity_codec<double>>(l);
    }
    SUBCASE("three-phase step") { three_phase(); }
    SUBCASE("separate buffers") { separate_buffers(); }
    SUBCASE("saved state") { state(); }
    SUBCASE("non-finite") { nonfinite(); }
  }

  void all() const {
    SUBCASE("bitmap masks") { against_host<bitmap_mask, identity_codec<float>>(small_layout()); }
    SUBCASE("index masks") { against_host<index_mask, identity_codec<float>>(small_layout()); }
    SUBCASE("block masks") { against_host<block_mask<4>, identity_codec<float>>(small_layout()); }
    SUBCASE("double gradients, one big bucket") {
      param_layout l(1 << 20);
      l.add("a", 1000, 300).add("b", 300).add("c", 4099);
      against_host<bitmap_mask, identity_codec<double>>(l);
    }
    SUBCASE("fp16") {
      against_host<bitmap_mask, fp16_codec>(small_layout());
      against_host<index_mask, fp16_codec>(small_layout());
    }
    SUBCASE("bf16") {
      against_host<bitmap_mask, bf16_codec>(small_layout());
      against_host<block_mask<4>, bf16_codec>(small_layout());
    }
    SUBCASE("three-phase step") { three_phase(); }
    SUBCASE("separate buffers") { separate_buffers(); }
    SUBCASE("ternary") { ternary<ternary_codec>(0); }
    SUBCASE("ternary, error feedback, scale blocks") { ternary<error_feedback<ternary_codec>>(64); }
    SUBCASE("ternary, previous_max") { ternary<ternary_codec>(0, scale_source::previous_max); }
    SUBCASE("ternary, error feedback, scale blocks, previous_max") {
      ternary<error_feedback<ternary_codec>>(64, scale_source::previous_max);
    }
    SUBCASE("saved state") { state(); }
    SUBCASE("saved state, previous_max") { state(scale_source::previous_max); }
    SUBCASE("checked steps") { checked(); }
    SUBCASE("fused update") {
      fused<identity_codec<float>>();
      fused<identity_codec<float>, index_mask>();  // the update's index and block paths
      fused<identity_codec<float>, block_mask<4>>();
      fused<fp16_codec>();
      fused<error_feedback<ternary_codec>>(ternary_codec{{.seed = 3, .scale_block = 64}});
    }
    SUBCASE("non-finite") { nonfinite(); }
    SUBCASE("fully pruned") { fully_pruned(); }
    SUBCASE("bad input") { bad_input(); }
  }
};

template <class Compactor, class MakeComm, class MakeHostComm>
auto make_sync_checks(MakeComm make_comm, MakeHostComm make_host_comm, int rank,
                      typename Compactor::stream_type stream = {}, bool same_reduction = true) {
  using comm = decltype(make_comm());
  using host_comm = decltype(make_host_comm());
  return sync_checks<Compactor, comm, host_comm>{
      std::function<comm()>(std::move(make_comm)),
      std::function<host_comm()>(std::move(make_host_comm)), rank, stream, same_reduction};
}

}  // namespace pactrain::test
