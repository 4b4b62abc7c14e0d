// Fine-tuning through the `kiln` command: weights trained for 1000 classes start a 10-class run.
// Without model.init_skip the new head is refused before anything runs (exit 2, the pattern to
// add named), by `kiln validate` too; with it and optimizer.freeze on everything but the head,
// the frozen parameters stay the file's to the bit while the head trains.
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/filesystem.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "io/safetensors.hpp"
#include "kiln_test_paths.h"
#include "shell.hpp"

namespace fs = boost::filesystem;  // libtorch exports clashing std::filesystem symbols

namespace {

using Result = kiln::test::ShellResult;

Result kiln(const std::string& args) {
  return kiln::test::shell(std::string(KILN_CLI) + " " + args);
}

fs::path temp_dir() {
  fs::path dir =
      fs::temp_directory_path() / ("kiln_finetune_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The small ResNet on synthetic 3×12×12 images (fc: 10×16), one thread, checkpoints every step.
std::string pipeline(const fs::path& out) {
  return std::string(KILN_SOURCE_DIR) +
         "/tests/pipelines/synthetic_resnet.toml --set run.threads=1 --set run.checkpoints=true "
         "--set run.checkpoint_every=1 --set run.output_dir=" +
         out.string();
}

std::string checkpoint(const fs::path& out, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%09d", step);
  return (out / "version_0" / "checkpoints" / name).string();
}

std::map<std::string, at::Tensor> exported(const std::string& checkpoint, const fs::path& to) {
  const Result r = kiln("export " + checkpoint + " --to " + to.string());
  EXPECT_EQ(r.code, 0) << r.output;
  std::map<std::string, at::Tensor> out;
  for (auto& [name, t] : kiln::io::read_safetensors(to.string()).tensors) out[name] = t;
  return out;
}

TEST(Finetune, NewHeadWithInitSkipAndFrozenBackbone) {
  const fs::path dir = temp_dir();
  // "Pretrained" weights: a short run's, with a 1000-class head and torch's batch counters, as a
  // torchvision state_dict has them.
  Result pre = kiln("run " + pipeline(dir / "pre") + " --set run.max_steps=2");
  ASSERT_EQ(pre.code, 0) << pre.output;
  std::map<std::string, at::Tensor> file = exported(checkpoint(dir / "pre", 2), dir / "p.st");
  file["fc.weight"] = at::randn({1000, 16});
  file["fc.bias"] = at::randn({1000});
  file["bn1.num_batches_tracked"] = at::scalar_tensor(2, at::kLong);
  const std::string weights = (dir / "pretrained.safetensors").string();
  kiln::io::write_safetensors(weights, {file.begin(), file.end()});

  // The new head is refused before anything runs, with the key to add; validate says the same.
  const std::string init = " --set model.init=" + weights;
  for (const char* command : {"run ", "validate "}) {
    const Result refused = kiln(command + pipeline(dir / "refused") + init);
    EXPECT_EQ(refused.code, 2) << refused.output;
    EXPECT_NE(refused.output.find("model.init: " + weights +
                                  ": fc.weight has 1000x16 in the file, the model's is 10x16"),
              std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find("add model.init_skip = [\"^fc\\\\.\"]"), std::string::npos)
        << refused.output;
  }
  const std::string skip = " --set 'model.init_skip=[\"^fc\\\\.\"]'";
  const Result validated = kiln("validate " + pipeline(dir / "v") + init + skip);
  EXPECT_EQ(validated.code, 0) << validated.output;

  // Frozen backbone (every parameter but fc's: ECMAScript's negative lookahead), new head.
  const Result tuned = kiln("run " + pipeline(dir / "tuned") + init + skip +
                            " --set 'optimizer.freeze=[\"^(?!fc\\\\.)\"]' --set run.max_steps=3");
  ASSERT_EQ(tuned.code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("initial weights from " + weights +
                              ": 30 tensors loaded; 2 left at the model's initialisation by "
                              "model.init_skip (fc.weight, fc.bias); 2 in the file skipped; 1 "
                              "num_batches_tracked counters ignored"),
            std::string::npos)
      << tuned.output;
  const auto first = exported(checkpoint(dir / "tuned", 1), dir / "t1.st");
  const auto last = exported(checkpoint(dir / "tuned", 3), dir / "t3.st");
  int frozen = 0;
  for (const auto& [name, t] : last) {
    if (name.rfind("fc.", 0) == 0) {
      EXPECT_FALSE(at::equal(t, first.at(name))) << name << " did not train";
      EXPECT_EQ(t.size(0), 10) << name;
    } else if (name.find("running_") == std::string::npos) {
      // Parameters; the norm layers' running statistics still follow the data in train mode.
      EXPECT_TRUE(at::equal(t, file.at(name))) << name << " moved although frozen";
      ++frozen;
    }
  }
  // conv1, bn1 (2); layer1.0: 2 convs, 2 norms (4); layer2.0: the same and the downsample (3).
  EXPECT_EQ(frozen, 18);
  fs::remove_all(dir);
}

}  // namespace
