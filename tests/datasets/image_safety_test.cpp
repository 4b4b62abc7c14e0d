// Images and folders from elsewhere, through the image_folder plugin's vtable: decompression
// bombs refused from their headers under kiln_dataset_open.max_pixels (PIL's
// MAX_IMAGE_PIXELS rule), color = "auto" past an unreadable first image, a folder link back up
// the tree not followed, and samples named by their files (the sample_name slot, ABI 1.13).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "image_folder_harness.hpp"
#include "scratch.hpp"

namespace kiln::dataset_test {
namespace {

constexpr uint64_t kPilLimit = 89478485;  // PIL's Image.MAX_IMAGE_PIXELS

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void make_dir(const std::string& path) { ASSERT_EQ(mkdir(path.c_str(), 0755), 0) << path; }

// The oracle's sample `i` of the training split (0: an RGB JPEG; 2: a PNG).
std::string oracle_sample(size_t i) {
  return oracle().manifest["splits"]["train"]["samples"][i]["path"];
}

// `jpeg` with the size in its frame header (SOF0..SOF2) set to `height` x `width`.
std::vector<uint8_t> jpeg_claiming(std::vector<uint8_t> jpeg, uint16_t height, uint16_t width) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] >= 0xC0 && jpeg[i + 1] <= 0xC2) {
      jpeg[i + 5] = static_cast<uint8_t>(height >> 8);
      jpeg[i + 6] = static_cast<uint8_t>(height);
      jpeg[i + 7] = static_cast<uint8_t>(width >> 8);
      jpeg[i + 8] = static_cast<uint8_t>(width);
      return jpeg;
    }
  }
  ADD_FAILURE() << "no frame header";
  return jpeg;
}

// `png` with the size in its IHDR chunk set to `height` x `width` (its CRC left stale: the
// header is read, and refused, before libpng checks it).
std::vector<uint8_t> png_claiming(std::vector<uint8_t> png, uint32_t height, uint32_t width) {
  for (int k = 0; k < 4; ++k) {
    png[16 + k] = static_cast<uint8_t>(width >> (24 - 8 * k));
    png[20 + k] = static_cast<uint8_t>(height >> (24 - 8 * k));
  }
  return png;
}

// A 700-byte JPEG claiming 65000 x 65000 and a PNG claiming 100000 x 100000 are refused from
// their headers, naming the file and the size it claims: by probe, and by decode before it
// allocates anything, whatever buffer it is given. Without a limit (0) the header is reported.
TEST(HostileImages, ABombIsRefusedFromItsHeaderNamingTheFileAndTheSize) {
  kiln::test::Scratch dir;
  make_dir(dir.path("root"));
  make_dir(dir.path("root/c"));
  const std::string jpeg = dir.path("root/c/bomb.jpg"), png = dir.path("root/c/bomb.png");
  write_bytes(jpeg, jpeg_claiming(read_bytes(oracle_sample(0)), 65000, 65000));
  write_bytes(png, png_claiming(read_bytes(oracle_sample(2)), 100000, 100000));
  Config c;
  c.root = dir.path("root");
  Dataset d;
  ASSERT_EQ(d.create(c), nullptr);
  const struct {
    int64_t index;
    std::string path, size;
  } bombs[] = {{0, jpeg, "65000 x 65000"}, {1, png, "100000 x 100000"}};
  for (const auto& bomb : bombs) {
    SCOPED_TRACE(bomb.path);
    kiln_sample_header h;
    std::string message = refusal(d.probe(bomb.index, &h), KILN_ERR_DATA_LOSS);
    EXPECT_NE(message.find(bomb.path), std::string::npos) << message;
    EXPECT_NE(message.find("claims " + bomb.size), std::string::npos) << message;
    EXPECT_NE(message.find("max_image_pixels (89478485)"), std::string::npos) << message;
    for (size_t capacity : {size_t{64}, size_t{1} << 20}) {
      Sample s;
      message = refusal(d.decode(bomb.index, 8, &s, capacity), KILN_ERR_DATA_LOSS);
      EXPECT_NE(message.find(bomb.path), std::string::npos) << message;
      EXPECT_NE(message.find("claims " + bomb.size), std::string::npos) << message;
    }
  }
  c.max_pixels = 0;  // no limit: the header is what the file claims
  ASSERT_EQ(d.create(c), nullptr);
  kiln_sample_header h;
  ASSERT_EQ(d.probe(0, &h), nullptr);
  EXPECT_EQ(h.height, 65000);
  EXPECT_EQ(h.width, 65000);
}

// PIL's rule: above the limit an image is still decoded (PIL warns), above twice it refused.
TEST(HostileImages, AnImageAboveTheLimitButNotTwiceItDecodes) {
  Config c;
  c.root = oracle().manifest["splits"]["train"]["root"];
  const auto& zebra = oracle().manifest["splits"]["train"]["samples"][1];  // 375 x 500 JPEG
  const int64_t height = zebra["height"], width = zebra["width"];
  c.max_pixels = static_cast<uint64_t>(height * width) / 2;  // exactly twice: not more
  Dataset d;
  ASSERT_EQ(d.create(c), nullptr);
  Sample s;
  ASSERT_EQ(d.decode(1, 1, &s), nullptr);
  EXPECT_EQ(s.height, height);
  EXPECT_EQ(s.width, width);
  c.max_pixels -= 1;
  ASSERT_EQ(d.create(c), nullptr);
  const std::string claim =
      "claims " + std::to_string(width) + " x " + std::to_string(height) + " pixels";
  kiln_sample_header h;
  EXPECT_NE(refusal(d.probe(1, &h), KILN_ERR_DATA_LOSS).find(claim), std::string::npos);
  EXPECT_NE(refusal(d.decode(1, 1, &s), KILN_ERR_DATA_LOSS).find(claim), std::string::npos);
}

// color = "auto" takes the channels of the first image that can be read: an empty file or a
// text file named .jpg sorted first is the loader's to stop at or skip, not a refusal of the
// folder. When none of the first images can be read the folder is refused, naming the first.
TEST(HostileImages, AutoColorTakesTheFirstReadableImage) {
  kiln::test::Scratch dir;
  for (const char* sub : {"root", "root/c0", "root/c1", "bad", "bad/c0"}) make_dir(dir.path(sub));
  const std::vector<uint8_t> gray = read_bytes(oracle().tree("mismatch/train/a/x.png"));
  write_bytes(dir.path("root/c0/0_empty.jpg"), {});
  dir.write_text("root/c0/1_text.jpg", "not an image\n");
  write_bytes(dir.path("root/c0/2_gray.png"), gray);
  write_bytes(dir.path("root/c1/x.png"), gray);
  Config c;
  c.root = dir.path("root");
  c.val_root = dir.path("root");
  c.color = "auto";
  Dataset d;
  for (int32_t split : {KILN_SPLIT_TRAIN, KILN_SPLIT_VAL}) {
    const Status status = d.create(c, split);
    ASSERT_EQ(status, nullptr) << describe(status.get());
    EXPECT_EQ(d.info().channels, 1);
    EXPECT_EQ(d.info().num_samples, 4);
  }
  write_bytes(dir.path("bad/c0/a.jpg"), {});
  c.root = dir.path("bad");
  c.val_root = "";
  const std::string message = refusal(d.create(c), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("option 'root': cannot read the first image: "), std::string::npos)
      << message;
  EXPECT_NE(message.find(dir.path("bad/c0/a.jpg")), std::string::npos) << message;
}

// A folder link back to the root (c0/up -> ..) or to a class folder itself is not followed:
// following it would list class c1's images again under label 0. Links elsewhere are followed,
// as torchvision's os.walk(followlinks=True) follows them.
TEST(HostileImages, AFolderLinkBackUpIsNotFollowed) {
  kiln::test::Scratch dir;
  for (const char* sub : {"root", "root/c0", "root/c1", "elsewhere"}) make_dir(dir.path(sub));
  const std::vector<uint8_t> gray = read_bytes(oracle().tree("mismatch/train/a/x.png"));
  for (const char* name :
       {"root/c0/a.png", "root/c0/b.png", "root/c1/c.png", "root/c1/d.png", "elsewhere/e.png"}) {
    write_bytes(dir.path(name), gray);
  }
  ASSERT_EQ(symlink("..", dir.path("root/c0/up").c_str()), 0);
  ASSERT_EQ(symlink(".", dir.path("root/c1/self").c_str()), 0);
  ASSERT_EQ(symlink("../..", dir.path("root/c1/above").c_str()), 0);  // the root's parent
  ASSERT_EQ(symlink(dir.path("elsewhere").c_str(), dir.path("root/c1/more").c_str()), 0);
  Config c;
  c.root = dir.path("root");
  Dataset d;
  ASSERT_EQ(d.create(c), nullptr);
  const kiln_dataset_info info = d.info();
  ASSERT_EQ(info.num_samples, 5);  // a, b | c, d, more/e
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < info.num_samples; ++i) {
    kiln_sample_header h;
    ASSERT_EQ(d.probe(i, &h), nullptr);
    labels.push_back(h.label);
  }
  EXPECT_EQ(labels, (std::vector<int64_t>{0, 0, 1, 1, 1}));
}

// The sample_name slot (ABI 1.13) writes a sample's path, cut short to the buffer, for the
// host's messages.
TEST(HostileImages, SamplesAreNamedByTheirFiles) {
  ASSERT_NE(vtable().sample_name, nullptr);
  Config c;
  c.root = oracle().manifest["splits"]["train"]["root"];
  Dataset d;
  ASSERT_EQ(d.create(c), nullptr);
  char name[4096];
  ASSERT_EQ(Status(vtable().sample_name(d.instance(), 0, name, sizeof name)), nullptr);
  EXPECT_EQ(std::string(name), oracle_sample(0));
  char shorter[8];
  ASSERT_EQ(Status(vtable().sample_name(d.instance(), 0, shorter, sizeof shorter)), nullptr);
  EXPECT_EQ(std::string(shorter), oracle_sample(0).substr(0, 7));
  refusal(Status(vtable().sample_name(d.instance(), d.info().num_samples, name, sizeof name)),
          KILN_ERR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace kiln::dataset_test
