// IDX reading (gzip and plain, every error path), Fashion-MNIST, and the synthetic dataset.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.hpp"

using kiln::data::Dataset;

namespace {

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols,
                                const std::vector<uint8_t>& pixels, uint32_t magic = 0x803) {
  std::vector<uint8_t> out;
  for (uint32_t v : {magic, n, rows, cols}) {
    auto b = be32(v);
    out.insert(out.end(), b.begin(), b.end());
  }
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 0x801) {
  std::vector<uint8_t> out = be32(magic);
  auto n = be32(static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), n.begin(), n.end());
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

class IdxTest : public ::testing::Test {
 protected:
  // POSIX rather than std::filesystem: libtorch.so exports its own std::filesystem symbols,
  // which the dynamic linker may bind in place of libstdc++'s (remove_all crashes that way).
  void SetUp() override {
    char tmpl[] = "/tmp/kiln_data_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : files_) unlink(f.c_str());
    rmdir(dir_.c_str());
  }

  std::string path(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }

  std::string write_plain(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string file = path(name);
    std::ofstream out(file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    EXPECT_TRUE(out.good());
    return file;
  }

  std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string file = path(name);
    gzFile f = gzopen(file.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
    gzclose(f);
    return file;
  }

  // Expects load_idx to throw a runtime_error whose message contains every one of `parts`.
  void expect_error(const std::string& images, const std::string& labels,
                    const std::vector<std::string>& parts, int64_t classes = 10) {
    try {
      kiln::data::load_idx(images, labels, classes);
      ADD_FAILURE() << "load_idx did not throw";
    } catch (const std::runtime_error& e) {
      for (const auto& p : parts) {
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "message '" << e.what() << "' lacks '" << p << "'";
      }
    }
  }

  std::string dir_;
  std::vector<std::string> files_;
};

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(start + i * 7);
  return v;
}

}  // namespace

TEST_F(IdxTest, ReadsGzipAndPlainAlike) {
  const auto pixels = iota_bytes(3 * 2 * 4);
  const std::vector<uint8_t> labels{2, 0, 9};
  for (bool gz : {true, false}) {
    SCOPED_TRACE(gz ? "gzip" : "plain");
    auto write = [&](const std::string& n, const std::vector<uint8_t>& b) {
      return gz ? write_gz(n + ".gz", b) : write_plain(n, b);
    };
    const Dataset d = kiln::data::load_idx(write("img", idx_images(3, 2, 4, pixels)),
                                           write("lab", idx_labels(labels)), 10);
    ASSERT_EQ(d.images.sizes(), (std::vector<int64_t>{3, 1, 2, 4}));
    EXPECT_EQ(d.images.scalar_type(), at::kByte);
    EXPECT_TRUE(d.images.is_contiguous());
    EXPECT_EQ(d.labels.scalar_type(), at::kLong);
    EXPECT_EQ(d.size(), 3);
    EXPECT_EQ(d.num_classes, 10);
    const uint8_t* p = d.images.data_ptr<uint8_t>();
    for (size_t i = 0; i < pixels.size(); ++i) ASSERT_EQ(p[i], pixels[i]) << i;
    for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(d.labels[i].item<int64_t>(), labels[i]);
  }
}

TEST_F(IdxTest, MissingFile) {
  const std::string missing = dir_ + "/nope.gz";
  const std::string labels = write_gz("lab.gz", idx_labels({1}));
  expect_error(missing, labels, {missing + ": cannot open: No such file or directory"});
}

TEST_F(IdxTest, BadMagic) {
  const std::string labels = write_gz("lab.gz", idx_labels({1}));
  const std::string images = write_gz("img.gz", idx_images(1, 2, 2, iota_bytes(4)));
  // Label file passed as images, and an image file passed as labels.
  expect_error(labels, labels, {labels + ": not an IDX image file (magic 0x00000801)"});
  expect_error(images, images, {images + ": not an IDX label file (magic 0x00000803)"});
}

TEST_F(IdxTest, Truncated) {
  const std::string labels = write_gz("lab.gz", idx_labels({1, 2}));
  const std::string images = write_gz("img.gz", idx_images(2, 3, 3, iota_bytes(11)));
  expect_error(images, labels, {images + ": truncated: expected 18 bytes of pixel data, got 11"});
  const std::string short_labels = write_plain("lab_short", {0, 0, 8, 1, 0, 0, 0, 5, 1, 2});
  const std::string good_images = write_plain("img_good", idx_images(5, 1, 1, iota_bytes(5)));
  expect_error(good_images, short_labels,
               {short_labels + ": truncated: expected 5 bytes of label data, got 2"});
  const std::string stub = write_plain("stub", {0, 0, 8});
  expect_error(stub, labels, {stub + ": truncated", "header"});
}

TEST_F(IdxTest, CountMismatch) {
  const std::string images = write_gz("img.gz", idx_images(3, 1, 2, iota_bytes(6)));
  const std::string labels = write_gz("lab.gz", idx_labels({1, 2}));
  expect_error(images, labels, {images + ": 3 images but " + labels + " has 2 labels"});
}

TEST_F(IdxTest, LabelOutOfRange) {
  const std::string images = write_gz("img.gz", idx_images(3, 1, 2, iota_bytes(6)));
  const std::string labels = write_gz("lab.gz", idx_labels({1, 12, 3}));
  expect_error(images, labels, {labels + ": label 12 out of range for 10 classes"});
  // The same file is fine with more classes.
  EXPECT_EQ(kiln::data::load_idx(images, labels, 13).labels[1].item<int64_t>(), 12);
}

namespace {

// Runs `load` in a child process whose address space may grow by at most `cap` bytes, so a reader
// that allocates what a header claims, rather than what the file holds, fails there. Returns the
// message of what `load` threw ("" when it returned), or why the child did not report.
std::string error_under_memory_cap(const std::function<void()>& load, size_t cap) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::ifstream statm("/proc/self/statm");
    size_t pages = 0;
    statm >> pages;
    const rlim_t limit = pages * static_cast<size_t>(sysconf(_SC_PAGESIZE)) + cap;
    const rlimit rl{limit, limit};
    setrlimit(RLIMIT_AS, &rl);
    std::string message;
    try {
      load();
    } catch (const std::exception& e) {
      message = e.what();
    }
    if (write(fds[1], message.data(), message.size()) < 0) _exit(2);
    _exit(0);
  }
  close(fds[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the child crashed: " + message;
  return message;
}

}  // namespace

// A header that claims far more than the file holds costs no more memory than the file: the data
// is read as it arrives (before, 64 GiB of pixels or 4 GiB of labels were allocated up front).
TEST_F(IdxTest, AHeaderClaimingMoreThanTheFileCostsNoMemory) {
  const std::string images =
      write_plain("img_claims", idx_images(65535, 1024, 1024, iota_bytes(10)));
  const std::string labels = write_plain("lab_claims", {0, 0, 8, 1, 0xff, 0xff, 0xff, 0xff, 1, 2});
  const std::string good_images = write_plain("img_good", idx_images(2, 1, 1, iota_bytes(2)));
  const std::string good_labels = write_plain("lab_good", idx_labels({1, 2}));
  constexpr size_t kCap = size_t{256} << 20;
  EXPECT_EQ(error_under_memory_cap([&] { kiln::data::load_idx(images, good_labels); }, kCap),
            images + ": truncated: expected 68718428160 bytes of pixel data, got 10");
  EXPECT_EQ(error_under_memory_cap([&] { kiln::data::load_idx(good_images, labels); }, kCap),
            labels + ": truncated: expected 4294967295 bytes of label data, got 2");
}

TEST_F(IdxTest, DimensionsThatOverflowAreRefused) {
  const std::string images =
      write_plain("img_overflow", idx_images(0xffffffff, 0xffffffff, 0xffffffff, iota_bytes(8)));
  const std::string labels = write_gz("lab.gz", idx_labels({1}));
  expect_error(images, labels,
               {images + ": dimensions 4294967295x4294967295x4294967295 overflow 64 bits"});
  const std::string flat = write_plain("img_flat", idx_images(4, 0, 3, {}));
  expect_error(flat, labels, {flat + ": image dimensions 4x0x3: rows and columns must be > 0"});
}

// Bytes past what the header describes mean the header and the file disagree.
TEST_F(IdxTest, DataBeyondTheHeaderIsRefused) {
  const std::string labels = write_gz("lab.gz", idx_labels({1, 2}));
  const std::string images = write_gz("img.gz", idx_images(2, 2, 2, iota_bytes(9)));
  expect_error(images, labels, {images + ": more data than the header's 8 bytes of pixel data"});
  const std::string good_images = write_plain("img_good", idx_images(2, 1, 1, iota_bytes(2)));
  std::vector<uint8_t> extra = idx_labels({1, 2});
  extra.push_back(3);
  const std::string long_labels = write_plain("lab_long", extra);
  expect_error(good_images, long_labels,
               {long_labels + ": more data than the header's 2 bytes of label data"});
}

// A gzip file whose CRC fails is corrupt, even when every byte the header claims arrived.
TEST_F(IdxTest, AGzipStreamFailingItsCrcIsRefused) {
  const std::string good_images = write_plain("img_good", idx_images(2, 1, 1, iota_bytes(2)));
  const std::string labels = write_gz("lab.gz", idx_labels({1, 2}));
  std::vector<char> bytes;
  {
    std::ifstream in(labels, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 8u);
  bytes[bytes.size() - 8] ^= 0x55;  // the trailer's CRC-32
  std::ofstream(labels, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), std::streamsize(bytes.size()));
  expect_error(good_images, labels, {labels + ": read error", "incorrect data check"});
}

TEST(FashionMnist, RealData) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  struct stat st {};
  if (stat((root + "/train-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << "Fashion-MNIST not installed at " << root;
  }
  for (auto [split, n] : {std::pair<std::string, int64_t>{"train", 60000}, {"test", 10000}}) {
    SCOPED_TRACE(split);
    const Dataset d = kiln::data::load_fashion_mnist(root, split);
    EXPECT_EQ(d.images.sizes(), (std::vector<int64_t>{n, 1, 28, 28}));
    EXPECT_EQ(d.size(), n);
    EXPECT_EQ(d.labels.min().item<int64_t>(), 0);
    EXPECT_EQ(d.labels.max().item<int64_t>(), 9);
    // Fashion-MNIST is balanced: every class appears n/10 times.
    const at::Tensor counts = at::bincount(d.labels);
    EXPECT_TRUE(at::equal(counts, at::full({10}, n / 10, at::kLong)));
    EXPECT_GT(d.images.to(at::kFloat).mean().item<double>(), 10.0);  // not all zeros
  }
  EXPECT_THROW(kiln::data::load_fashion_mnist(root, "valid"), std::runtime_error);
}

TEST(Synthetic, DeterministicBalancedAndLearnable) {
  kiln::data::SyntheticSpec spec;
  spec.samples = 200;
  spec.num_classes = 4;
  spec.channels = 3;
  spec.height = 8;
  spec.width = 6;
  spec.seed = 7;
  const Dataset a = kiln::data::make_synthetic(spec);
  const Dataset b = kiln::data::make_synthetic(spec);
  ASSERT_EQ(a.images.sizes(), (std::vector<int64_t>{200, 3, 8, 6}));
  EXPECT_EQ(a.images.scalar_type(), at::kByte);
  EXPECT_EQ(a.labels.scalar_type(), at::kLong);
  EXPECT_EQ(a.num_classes, 4);
  EXPECT_TRUE(at::equal(a.images, b.images));
  EXPECT_TRUE(at::equal(a.labels, b.labels));
  EXPECT_TRUE(at::equal(at::bincount(a.labels), at::full({4}, 50, at::kLong)));
  // Shuffled, not 0,1,2,3,0,...
  EXPECT_FALSE(at::equal(a.labels, at::arange(200, at::kLong).remainder(4)));

  spec.seed = 8;
  const Dataset c = kiln::data::make_synthetic(spec);
  EXPECT_FALSE(at::equal(a.images, c.images));

  // Learnable: nearest class mean (from the first half) classifies the second half well.
  const at::Tensor x = a.images.to(at::kFloat).reshape({200, -1});
  std::vector<at::Tensor> means;
  for (int64_t k = 0; k < 4; ++k) {
    const at::Tensor rows = a.labels.slice(0, 0, 100).eq(k).nonzero().squeeze(1);
    means.push_back(x.slice(0, 0, 100).index_select(0, rows).mean(0));
  }
  const at::Tensor centroids = at::stack(means);
  const at::Tensor pred = at::cdist(x.slice(0, 100), centroids).argmin(1);
  const double acc = pred.eq(a.labels.slice(0, 100)).to(at::kFloat).mean().item<double>();
  EXPECT_GT(acc, 0.95);
}

TEST(Synthetic, RejectsBadSpec) {
  kiln::data::SyntheticSpec spec;
  spec.num_classes = 0;
  EXPECT_THROW(kiln::data::make_synthetic(spec), std::runtime_error);
}
