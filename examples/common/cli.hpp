// Command-line helpers shared by pactrain's examples: numbers, lists and named choices from
// option values, with a pactrain::error naming the option for anything else.
//
// Header-only. Build and run an example that uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
#pragma once

#include <pactrain/codec/ternary.hpp>
#include <pactrain/error.hpp>
#include <pactrain/pruning/policies.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace examples {

/// The whole of `v` as a number; throws pactrain::error naming `flag` otherwise.
inline double to_double(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty()) throw pactrain::error(flag + ": not a number: '" + v + "'");
  return d;
}

/// The whole of `v` as a non-negative integer; throws pactrain::error naming `flag` otherwise.
inline std::uint64_t to_count(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || v[0] == '-') {
    throw pactrain::error(flag + ": not a non-negative integer: '" + v + "'");
  }
  return n;
}

/// "flag: expected a, b or c, got 'v'".
inline pactrain::error not_one_of(const std::string& flag, const std::string& v,
                                  std::span<const std::string_view> names) {
  std::string list;
  std::size_t i = 0;
  for (const std::string_view name : names) {
    list += i == 0 ? "" : i + 1 == names.size() ? " or " : ", ";
    list += name;
    ++i;
  }
  return pactrain::error(flag + ": expected " + list + ", got '" + v + "'");
}

/// `v` where it is one of `names`; throws pactrain::error naming `flag` and the names otherwise.
inline std::string one_of(const std::string& flag, const std::string& v,
                          std::initializer_list<std::string_view> names) {
  for (const std::string_view name : names) {
    if (v == name) return v;
  }
  throw not_one_of(flag, v, {names.begin(), names.size()});
}

/// The value that `v` names among `choices`; throws as one_of(flag, v, names) otherwise.
template <class T>
T one_of(const std::string& flag, const std::string& v,
         std::initializer_list<std::pair<std::string_view, T>> choices) {
  for (const auto& [name, value] : choices) {
    if (v == name) return value;
  }
  std::vector<std::string_view> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  throw not_one_of(flag, v, names);
}

/// on|off.
inline bool on_off(const std::string& flag, const std::string& v) {
  return one_of<bool>(flag, v, {{"on", true}, {"off", false}});
}

/// global|per-tensor: the magnitude ranking across all prunable tensors or within each.
inline pactrain::pruning_scope scope_option(const std::string& flag, const std::string& v) {
  return one_of<pactrain::pruning_scope>(flag, v,
                                         {{"global", pactrain::pruning_scope::global},
                                          {"per-tensor", pactrain::pruning_scope::per_tensor}});
}

/// current|previous: where the ternary codec's scales come from.
inline pactrain::scale_source scale_source_option(const std::string& flag, const std::string& v) {
  return one_of<pactrain::scale_source>(flag, v,
                                        {{"current", pactrain::scale_source::current_max},
                                         {"previous", pactrain::scale_source::previous_max}});
}

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

}  // namespace examples
