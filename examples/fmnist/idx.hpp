// Fashion-MNIST loader: gzipped IDX files read with zlib.
//
// Header-only; used by examples/fmnist/main.cpp and by the tests. Build and run the trainer
// that uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   export OMPI_MCA_mpi_yield_when_idle=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
//
// IDX format (big-endian): a 4-byte magic (0x00000803 for uint8 images with 3 dimensions,
// 0x00000801 for uint8 labels with 1), one uint32 per dimension, then the bytes, row-major.
// Every problem (missing file, bad gzip stream, wrong magic, wrong dimensions, truncated or
// overlong data, a label outside 0..9, image and label counts that differ) throws
// pactrain::error with a message naming the file and the Debian package that ships the data.
#pragma once

#include <pactrain/error.hpp>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace pactrain::fmnist {

/// Where the Debian package dataset-fashion-mnist installs the four files.
inline constexpr const char* default_data_dir = "/usr/share/datasets/fashion-mnist";

inline constexpr std::uint32_t idx_images_magic = 0x00000803;  // uint8, 3 dimensions
inline constexpr std::uint32_t idx_labels_magic = 0x00000801;  // uint8, 1 dimension
inline constexpr std::size_t class_count = 10;

/// One split: `count` images of rows x cols uint8 pixels (row-major, image after image) and
/// their labels in 0..9.
struct dataset {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> pixels;  // count * rows * cols
  std::vector<std::uint8_t> labels;  // count
  [[nodiscard]] std::size_t features() const noexcept { return rows * cols; }
};

namespace detail {

inline std::string package_hint() {
  return " (the Fashion-MNIST files come with the Debian package dataset-fashion-mnist: "
         "apt-get install dataset-fashion-mnist)";
}

[[noreturn]] inline void data_fail(const std::string& path, const std::string& what) {
  PACTRAIN_FAIL("fmnist: " + path + ": " + what + package_hint());
}

/// The whole decompressed content of a gzip file (zlib also reads uncompressed files as
/// they are).
// zlib's message, without the "<path>: " it puts in front.
inline std::string zlib_message(gzFile f, const std::string& path, int& code) {
  const char* msg = gzerror(f, &code);
  std::string text = msg != nullptr ? msg : "";
  if (text.rfind(path + ": ", 0) == 0) text.erase(0, path.size() + 2);
  return text.empty() ? "unknown zlib error" : text;
}

inline std::vector<std::uint8_t> read_gzip(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    data_fail(path,
              std::string("cannot open: ") + (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(f, 1u << 17);
  std::vector<std::uint8_t> out;
  std::size_t used = 0;
  for (;;) {
    if (out.size() - used < (1u << 20)) out.resize(used + std::max<std::size_t>(used, 1u << 20));
    const int n = gzread(f, out.data() + used, static_cast<unsigned>(out.size() - used));
    if (n < 0) {
      int code = Z_OK;
      const std::string text = zlib_message(f, path, code);
      gzclose(f);
      data_fail(path, "corrupt gzip data: " + text);
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  // gzread returns 0 at the end of the data and also when the stream stops early: tell them
  // apart through the error state.
  int code = Z_OK;
  const std::string text = zlib_message(f, path, code);
  const int rc = gzclose(f);
  if (code != Z_OK) data_fail(path, "corrupt gzip data: " + text);
  if (rc != Z_OK) data_fail(path, "corrupt gzip data (gzclose failed)");
  out.resize(used);
  return out;
}

inline std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) |
         (std::uint32_t{b[at + 2]} << 8) | std::uint32_t{b[at + 3]};
}

inline std::string hex32(std::uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) s.push_back(digits[(v >> shift) & 0xf]);
  return s;
}

// Checks the magic and the length, returns the dimensions; the data starts after them.
inline std::vector<std::size_t> idx_header(const std::string& path,
                                           const std::vector<std::uint8_t>& b, std::uint32_t magic,
                                           std::size_t dims) {
  const std::size_t header = 4 + 4 * dims;
  if (b.size() < 4)
    data_fail(path, "too short for an IDX file (" + std::to_string(b.size()) + " bytes)");
  const std::uint32_t m = be32(b, 0);
  if (m != magic) {
    data_fail(path, "bad IDX magic " + hex32(m) + ", expected " + hex32(magic) +
                        (magic == idx_images_magic ? " (uint8 images)" : " (uint8 labels)"));
  }
  if (b.size() < header) data_fail(path, "truncated IDX header");
  std::vector<std::size_t> d(dims);
  std::size_t total = 1;
  for (std::size_t i = 0; i < dims; ++i) {
    d[i] = be32(b, 4 + 4 * i);
    if (d[i] != 0 && total > (std::size_t{1} << 40) / d[i])
      data_fail(path, "IDX dimensions overflow");
    total *= d[i];
  }
  const std::size_t have = b.size() - header;
  if (have < total) {
    data_fail(path, "truncated: " + std::to_string(have) + " data bytes, the header announces " +
                        std::to_string(total));
  }
  if (have > total) {
    data_fail(path, std::to_string(have - total) + " bytes after the data the header announces");
  }
  return d;
}

}  // namespace detail

/// Reads an IDX uint8 image file (gzipped or not): count x rows x cols. Throws
/// pactrain::error on any problem.
inline dataset read_idx_images(const std::string& path) {
  const auto b = detail::read_gzip(path);
  const auto d = detail::idx_header(path, b, idx_images_magic, 3);
  if (d[1] == 0 || d[2] == 0) {
    detail::data_fail(
        path, "empty image dimensions " + std::to_string(d[1]) + "x" + std::to_string(d[2]));
  }
  dataset s;
  s.count = d[0];
  s.rows = d[1];
  s.cols = d[2];
  s.pixels.assign(b.begin() + 16, b.end());
  return s;
}

/// Reads an IDX uint8 label file (gzipped or not) and checks every label is in 0..9.
inline std::vector<std::uint8_t> read_idx_labels(const std::string& path) {
  const auto b = detail::read_gzip(path);
  detail::idx_header(path, b, idx_labels_magic, 1);
  std::vector<std::uint8_t> labels(b.begin() + 8, b.end());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= class_count) {
      detail::data_fail(path, "label " + std::to_string(labels[i]) + " of sample " +
                                  std::to_string(i) + " is outside 0..9");
    }
  }
  return labels;
}

/// Reads one split, "train" or "t10k", from `dir`: <split>-images-idx3-ubyte.gz and
/// <split>-labels-idx1-ubyte.gz. Checks that the images are 28 x 28 and that both files hold
/// the same number of samples. `limit` > 0 keeps only the first `limit` samples.
inline dataset load_split(const std::string& dir, const std::string& split, std::size_t limit = 0) {
  const std::string images = dir + "/" + split + "-images-idx3-ubyte.gz";
  const std::string labels = dir + "/" + split + "-labels-idx1-ubyte.gz";
  dataset s = read_idx_images(images);
  if (s.rows != 28 || s.cols != 28) {
    detail::data_fail(images, "images are " + std::to_string(s.rows) + "x" +
                                  std::to_string(s.cols) + ", Fashion-MNIST has 28x28");
  }
  s.labels = read_idx_labels(labels);
  if (s.labels.size() != s.count) {
    detail::data_fail(labels, std::to_string(s.labels.size()) + " labels for " +
                                  std::to_string(s.count) + " images in " + images);
  }
  if (s.count == 0) detail::data_fail(images, "no samples");
  if (limit > 0 && limit < s.count) {
    s.count = limit;
    s.pixels.resize(limit * s.features());
    s.labels.resize(limit);
  }
  return s;
}

}  // namespace pactrain::fmnist
