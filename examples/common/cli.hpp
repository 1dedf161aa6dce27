// Command-line helpers shared by pactrain's examples: numbers and lists from option values,
// with a pactrain::error naming the option for anything else.
//
// Header-only. Build and run an example that uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
#pragma once

#include <pactrain/error.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>
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

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

}  // namespace examples
