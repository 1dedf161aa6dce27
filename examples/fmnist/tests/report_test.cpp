// What the trainers report (examples/common/run_report.hpp), their learning-rate shape
// (examples/common/lr_schedule.hpp) and how they read options (examples/common/cli.hpp): JSON
// summaries stay valid JSON when a value is not finite, carry the quality keys of their
// metric, the schedule's factors, and option values other than those expected are refused
// with a message that names the option.
//
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_unit_examples_report_test
//   build/examples/fmnist/tests/unit/examples_report_test
#include <doctest/doctest.h>

#include "common/cli.hpp"
#include "common/lr_schedule.hpp"
#include "common/run_report.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

examples::train_result one_run(double quality) {
  examples::train_result r;
  r.test_accuracy = quality;
  r.val_loss = quality;
  r.val_bpb = quality;
  r.bytes_per_step = 100;
  r.step_seconds = 0.0;  // sync_share is then 0 / 0
  r.layout.add("w", 2, 3);
  r.masks.emplace_back(6);
  examples::epoch_record e;
  e.epoch = 1;
  e.train_loss = std::numeric_limits<double>::infinity();
  e.test_accuracy = quality;
  e.val_bpb = quality;
  r.history.push_back(e);
  return r;
}

std::filesystem::path temp_json() {
  return std::filesystem::temp_directory_path() /
         ("pactrain_report_test_" + std::to_string(std::random_device{}()) + ".json");
}

}  // namespace

TEST_CASE("num writes JSON numbers, and null for what JSON cannot hold") {
  CHECK(examples::num(1.5) == "1.5");
  CHECK(examples::num(0.1f) == "0.1");
  CHECK(examples::num(-2.0) == "-2");
  CHECK(examples::num(std::numeric_limits<double>::quiet_NaN()) == "null");
  CHECK(examples::num(std::numeric_limits<double>::infinity()) == "null");
  CHECK(examples::num(-std::numeric_limits<float>::infinity()) == "null");
}

TEST_CASE("an accuracy summary with a NaN run and an infinite loss has no inf or nan") {
  const auto path = temp_json();
  const std::vector<examples::named_run> runs = {
      {"dense", one_run(0.9)}, {"sparse", one_run(std::numeric_limits<double>::quiet_NaN())}};
  examples::write_summary(path.string(), {4, 1, 7, "{}", "{}"}, runs, 1.0);
  const std::string json = read_file(path);
  std::filesystem::remove(path);
  CHECK(json.find("nan") == std::string::npos);
  CHECK(json.find("inf") == std::string::npos);
  CHECK(json.find("\"test_accuracy\": null") != std::string::npos);
  CHECK(json.find("\"train_loss\": null") != std::string::npos);
  CHECK(json.find("\"sync_share\": null") != std::string::npos);
  CHECK(json.find("\"accuracy_gap_points\": null") != std::string::npos);
  CHECK(json.find("\"accuracy_unit\": \"fraction\"") != std::string::npos);
  CHECK(json.find("val_bits_per_byte") == std::string::npos);
}

TEST_CASE("a bits-per-byte summary carries the validation keys and the ratio to dense") {
  const auto path = temp_json();
  const std::vector<examples::named_run> runs = {
      {"dense", one_run(2.0)}, {"sparse", one_run(2.5)}, {"ternary", one_run(3.0)}};
  examples::summary_header h{2, 3, 1, "{}", "{}", examples::metric::bits_per_byte};
  examples::write_summary(path.string(), h, runs, 1.0);
  const std::string json = read_file(path);
  std::filesystem::remove(path);
  CHECK(json.find("\"val_bits_per_byte\": 2.5") != std::string::npos);
  CHECK(json.find("\"bits_per_byte_ratio\": 1.25") != std::string::npos);
  CHECK(json.find("\"ternary_bits_per_byte_ratio\": 1.5") != std::string::npos);
  CHECK(json.find("test_accuracy") == std::string::npos);
  CHECK(json.find("accuracy_gap_points") == std::string::npos);
}

TEST_CASE("an unwritable summary path throws pactrain::error") {
  const std::vector<examples::named_run> runs = {{"dense", one_run(0.9)}};
  CHECK_THROWS_AS(examples::write_summary("/proc/pactrain/no/such/dir/s.json", {}, runs, 1.0),
                  pactrain::error);
}

TEST_CASE("the learning-rate shape: warm-up, hold, cosine, and the rewind after pruning") {
  const examples::lr_shape shape{.warmup = 0.1, .hold = 0.2, .rewind = 0.5};
  constexpr std::uint64_t n = 100;
  CHECK(examples::lr_factor(shape, 0, n, n) == doctest::Approx(0.1));  // (0 + 1/100) / 0.1
  CHECK(examples::lr_factor(shape, 9, n, n) == doctest::Approx(1.0));
  CHECK(examples::lr_factor(shape, 10, n, n) == 1.0);  // the hold
  CHECK(examples::lr_factor(shape, 29, n, n) == 1.0);
  CHECK(examples::lr_factor(shape, 30, n, n) == 1.0);  // cosine from 1 ...
  CHECK(examples::lr_factor(shape, 65, n, n) == doctest::Approx(0.5));
  CHECK(examples::lr_factor(shape, 99, n, n) < 1e-3);  // ... to nearly 0
  // A pruned run whose masks stop changing at step 60: from 61 on, 0.5 x a second cosine.
  CHECK(examples::lr_factor(shape, 60, n, 60) == examples::lr_factor(shape, 60, n, n));
  CHECK(examples::lr_factor(shape, 61, n, 60) ==
        doctest::Approx(0.5 * 0.5 * (1 + std::cos(std::acos(-1.0) / 40))));
  CHECK(examples::lr_factor(shape, 80, n, 60) == doctest::Approx(0.25));
  // No rewind: the dense run's shape throughout.
  const examples::lr_shape plain{.warmup = 0.1};
  CHECK(examples::lr_factor(plain, 80, n, 60) == examples::lr_factor(plain, 80, n, n));
  const pactrain::gradual_schedule g = pactrain::gradual_schedule::over_run(n, 0.1, 0.5, 0.9, 4);
  CHECK(examples::last_mask_update(g, n) == 50);
  CHECK(examples::last_mask_update(g, 40) == 40);
}

TEST_CASE("option values: numbers and named choices, anything else refused naming the option") {
  CHECK(examples::to_count("--n", "42") == 42);
  CHECK(examples::to_double("--x", "0.25") == 0.25);
  CHECK_THROWS_WITH_AS(examples::to_count("--n", "-1"), "--n: not a non-negative integer: '-1'",
                       pactrain::error);
  CHECK_THROWS_WITH_AS(examples::to_count("--n", "4x"), "--n: not a non-negative integer: '4x'",
                       pactrain::error);
  CHECK_THROWS_WITH_AS(examples::to_double("--x", ""), "--x: not a number: ''", pactrain::error);

  CHECK(examples::one_of("--mode", "sparse", {"dense", "sparse", "ternary"}) == "sparse");
  CHECK_THROWS_WITH_AS(examples::one_of("--mode", "Sparse", {"dense", "sparse", "ternary"}),
                       "--mode: expected dense, sparse or ternary, got 'Sparse'", pactrain::error);
  CHECK(examples::on_off("--fused", "on"));
  CHECK_FALSE(examples::on_off("--fused", "off"));
  CHECK_THROWS_WITH_AS(examples::on_off("--fused", "yes"), "--fused: expected on or off, got 'yes'",
                       pactrain::error);
  CHECK(examples::scope_option("--scope", "global") == pactrain::pruning_scope::global);
  CHECK(examples::scope_option("--scope", "per-tensor") == pactrain::pruning_scope::per_tensor);
  CHECK_THROWS_WITH_AS(examples::scope_option("--scope", ""),
                       "--scope: expected global or per-tensor, got ''", pactrain::error);
  CHECK(examples::scale_source_option("--ternary-scale", "previous") ==
        pactrain::scale_source::previous_max);
  CHECK(examples::scale_source_option("--ternary-scale", "current") ==
        pactrain::scale_source::current_max);
  // One choice: no list separators.
  CHECK_THROWS_WITH_AS(examples::one_of<int>("--k", "2", {{"1", 1}}), "--k: expected 1, got '2'",
                       pactrain::error);
}
