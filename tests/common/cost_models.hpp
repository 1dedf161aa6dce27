// Synthetic cost models shared by the planner and tuner tests.
#pragma once

#include <pactrain/cost_model.hpp>

namespace pactrain::test {

// 1 Gbit/s-class link, compaction of about 1 ns per entry.
inline cost_model slow_link() {
  cost_model m;
  m.latency = 50e-6;
  m.seconds_per_byte = 8e-9;
  m.compact_seconds_per_entry = 1e-9;
  m.dense_seconds_per_entry = 0.25e-9;
  return m;
}

// Memory-speed link: moving a byte costs about as much as compacting it.
inline cost_model fast_link() {
  cost_model m = slow_link();
  m.latency = 2e-6;
  m.seconds_per_byte = 0.05e-9;
  return m;
}

// A link where latency counts: one ring step costs 1 ms, a byte 1 ns; codec work 1 ns.
inline cost_model round_model() {
  cost_model m;
  m.latency = 1e-3;
  m.seconds_per_byte = 1e-9;
  m.compact_seconds_per_entry = 1e-10;
  m.codec_seconds_per_entry = 1e-9;
  return m;
}

}  // namespace pactrain::test
