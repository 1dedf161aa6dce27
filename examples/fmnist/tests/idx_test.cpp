// The Fashion-MNIST IDX reader (examples/fmnist/idx.hpp): reading small gzipped files, and
// every kind of bad file throwing pactrain::error.
//
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_unit_fmnist_idx_test
//   build/examples/fmnist/tests/unit/fmnist_idx_test
#include <doctest/doctest.h>

#include "fmnist/idx.hpp"

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fm = pactrain::fmnist;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test case.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static const unsigned tag = std::random_device{}();
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("pactrain_idx_test_" + std::to_string(tag) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  [[nodiscard]] std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_be32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<std::uint8_t>(v >> shift));
}

std::vector<std::uint8_t> images_bytes(std::uint32_t count, std::uint32_t rows, std::uint32_t cols,
                                       std::uint32_t magic = fm::idx_images_magic) {
  std::vector<std::uint8_t> b;
  put_be32(b, magic);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  for (std::uint32_t i = 0; i < count * rows * cols; ++i)
    b.push_back(static_cast<std::uint8_t>(i * 7));
  return b;
}

std::vector<std::uint8_t> labels_bytes(const std::vector<std::uint8_t>& labels,
                                       std::uint32_t magic = fm::idx_labels_magic) {
  std::vector<std::uint8_t> b;
  put_be32(b, magic);
  put_be32(b, static_cast<std::uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

void write_gz(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) {
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
  }
  REQUIRE(gzclose(f) == Z_OK);
}

std::vector<std::uint8_t> read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_raw(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A split of `n` 28x28 images with labels i % 10.
void write_split(const temp_dir& d, const std::string& split, std::uint32_t n) {
  std::vector<std::uint8_t> labels;
  for (std::uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<std::uint8_t>(i % 10));
  write_gz(d.file(split + "-images-idx3-ubyte.gz"), images_bytes(n, 28, 28));
  write_gz(d.file(split + "-labels-idx1-ubyte.gz"), labels_bytes(labels));
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const pactrain::error& e) {
    return e.what();
  } catch (...) {
    return "<not a pactrain::error>";
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a small split reads back exactly") {
  temp_dir d;
  write_split(d, "train", 12);
  const fm::dataset s = fm::load_split(d.path.string(), "train");
  CHECK(s.count == 12);
  CHECK(s.rows == 28);
  CHECK(s.cols == 28);
  CHECK(s.features() == 784);
  REQUIRE(s.pixels.size() == 12 * 784);
  REQUIRE(s.labels.size() == 12);
  for (std::size_t i = 0; i < s.pixels.size(); ++i) {
    if (s.pixels[i] != static_cast<std::uint8_t>(i * 7)) {
      FAIL_CHECK("pixel " << i << " differs");
      break;
    }
  }
  for (std::size_t i = 0; i < 12; ++i) CHECK(s.labels[i] == i % 10);

  const fm::dataset part = fm::load_split(d.path.string(), "train", 5);
  CHECK(part.count == 5);
  CHECK(part.pixels.size() == 5 * 784);
  CHECK(part.labels.size() == 5);
  CHECK(part.labels[4] == 4);
  CHECK(fm::load_split(d.path.string(), "train", 100).count == 12);  // a limit above the count
}

TEST_CASE("the generic readers take other shapes and uncompressed files") {
  temp_dir d;
  write_gz(d.file("img.gz"), images_bytes(3, 2, 5));
  const fm::dataset s = fm::read_idx_images(d.file("img.gz"));
  CHECK(s.count == 3);
  CHECK(s.rows == 2);
  CHECK(s.cols == 5);
  CHECK(s.pixels.size() == 30);

  write_raw(d.file("labels.raw"), labels_bytes({9, 0, 3}));
  const auto labels = fm::read_idx_labels(d.file("labels.raw"));
  CHECK(labels == std::vector<std::uint8_t>{9, 0, 3});
}

TEST_CASE("a missing file names the Debian package") {
  temp_dir d;
  const std::string msg = error_of([&] { fm::load_split(d.path.string(), "train"); });
  CHECK(contains(msg, "dataset-fashion-mnist"));
  CHECK(contains(msg, "train-images-idx3-ubyte.gz"));
  CHECK(contains(msg, "cannot open"));

  write_gz(d.file("train-images-idx3-ubyte.gz"), images_bytes(2, 28, 28));
  const std::string no_labels = error_of([&] { fm::load_split(d.path.string(), "train"); });
  CHECK(contains(no_labels, "train-labels-idx1-ubyte.gz"));
  CHECK(contains(no_labels, "dataset-fashion-mnist"));
}

TEST_CASE("bad magic numbers are rejected") {
  temp_dir d;
  write_gz(d.file("img.gz"), images_bytes(2, 28, 28, 0x00000801));
  const std::string msg = error_of([&] { fm::read_idx_images(d.file("img.gz")); });
  CHECK(contains(msg, "bad IDX magic 0x00000801"));
  CHECK(contains(msg, "dataset-fashion-mnist"));

  write_gz(d.file("lab.gz"), labels_bytes({1, 2}, 0x00000803));
  CHECK(contains(error_of([&] { fm::read_idx_labels(d.file("lab.gz")); }), "bad IDX magic"));

  // Images and labels swapped.
  write_gz(d.file("train-images-idx3-ubyte.gz"), labels_bytes({1, 2}));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), images_bytes(2, 28, 28));
  CHECK(contains(error_of([&] { fm::load_split(d.path.string(), "train"); }), "bad IDX magic"));
}

TEST_CASE("truncated and overlong data are rejected") {
  temp_dir d;
  auto img = images_bytes(4, 28, 28);
  img.resize(img.size() - 1);
  write_gz(d.file("img.gz"), img);
  CHECK(contains(error_of([&] { fm::read_idx_images(d.file("img.gz")); }), "truncated"));

  auto header_only = images_bytes(4, 28, 28);
  header_only.resize(10);
  write_gz(d.file("short.gz"), header_only);
  CHECK(
      contains(error_of([&] { fm::read_idx_images(d.file("short.gz")); }), "truncated IDX header"));

  write_gz(d.file("empty.gz"), {});
  CHECK(contains(error_of([&] { fm::read_idx_images(d.file("empty.gz")); }), "too short"));

  auto lab = labels_bytes({1, 2, 3});
  lab.push_back(4);  // one byte the header does not announce
  write_gz(d.file("lab.gz"), lab);
  CHECK(contains(error_of([&] { fm::read_idx_labels(d.file("lab.gz")); }), "after the data"));
}

TEST_CASE("a damaged gzip stream is rejected") {
  temp_dir d;
  write_gz(d.file("img.gz"), images_bytes(50, 28, 28));
  const auto gz = read_raw(d.file("img.gz"));
  REQUIRE(gz.size() > 40);

  // Cut in the middle of the compressed stream.
  write_raw(d.file("cut.gz"), std::vector<std::uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  const std::string cut = error_of([&] { fm::read_idx_images(d.file("cut.gz")); });
  CHECK(contains(cut, "corrupt gzip data"));
  CHECK(contains(cut, "dataset-fashion-mnist"));

  // A flipped byte in the trailer's CRC.
  auto bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 0xff;
  write_raw(d.file("crc.gz"), bad_crc);
  CHECK(contains(error_of([&] { fm::read_idx_images(d.file("crc.gz")); }), "corrupt gzip data"));
}

TEST_CASE("labels outside 0..9 are rejected") {
  temp_dir d;
  write_gz(d.file("lab.gz"), labels_bytes({0, 9, 10, 1}));
  const std::string msg = error_of([&] { fm::read_idx_labels(d.file("lab.gz")); });
  CHECK(contains(msg, "label 10 of sample 2 is outside 0..9"));
  CHECK(contains(msg, "dataset-fashion-mnist"));
}

TEST_CASE("image and label counts must match") {
  temp_dir d;
  write_gz(d.file("t10k-images-idx3-ubyte.gz"), images_bytes(5, 28, 28));
  write_gz(d.file("t10k-labels-idx1-ubyte.gz"), labels_bytes({1, 2, 3, 4}));
  const std::string msg = error_of([&] { fm::load_split(d.path.string(), "t10k"); });
  CHECK(contains(msg, "4 labels for 5 images"));
  CHECK(contains(msg, "dataset-fashion-mnist"));
}

TEST_CASE("images must be 28x28 and not empty") {
  temp_dir d;
  write_gz(d.file("train-images-idx3-ubyte.gz"), images_bytes(2, 27, 28));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), labels_bytes({1, 2}));
  CHECK(contains(error_of([&] { fm::load_split(d.path.string(), "train"); }),
                 "images are 27x28, Fashion-MNIST has 28x28"));

  write_gz(d.file("zero.gz"), images_bytes(2, 0, 28));
  CHECK(contains(error_of([&] { fm::read_idx_images(d.file("zero.gz")); }),
                 "empty image dimensions"));

  write_gz(d.file("train-images-idx3-ubyte.gz"), images_bytes(0, 28, 28));
  write_gz(d.file("train-labels-idx1-ubyte.gz"), labels_bytes({}));
  CHECK(contains(error_of([&] { fm::load_split(d.path.string(), "train"); }), "no samples"));
}
