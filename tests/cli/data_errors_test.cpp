// Data from elsewhere through `kiln` end to end (issue 51): a decompression bomb and files that
// are not images where they sort first, under data.on_error "stop" and "skip"; images of two
// sizes; a dataset plugin that breaks its contract (exit 3, from validate too); configuration
// values a run could not use (lr = inf) and an integer for a string option; a data file's
// refusal located at the key that names it; no C++ stack trace in what a user reads. The
// folders come from tests/oracle/hostile_folder.py, which also asks PIL what it makes of them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kiln_cli.hpp"
#include "kiln_test_paths.h"
#include "scratch.hpp"
#include "shell.hpp"

namespace {

using Result = kiln::test::ShellResult;

using kiln::test::kiln_cli;
using kiln::test::pipeline;

// The hostile folders, made once for the process.
const kiln::test::Scratch& folders() {
  static const kiln::test::Scratch* dir = [] {
    auto* d = new kiln::test::Scratch();
    d->run("hostile_folder.py");
    return d;
  }();
  return *dir;
}

// A two-step run over image_folder `root` (8x8 images), an mlp, nothing written but the run
// folder in `out`; `extra` lines go into [data].
std::string image_pipeline(const kiln::test::Scratch& dir, const std::string& root,
                           const std::string& extra = "") {
  dir.write_text("p.toml",
                 "[run]\ndevice = \"cpu\"\nepochs = 1\nmax_steps = 2\neval = false\n"
                 "checkpoints = false\ntensorboard = false\noutput_dir = \"" +
                     dir.path("out") + "\"\n[data]\ndataset = \"image_folder\"\nroot = \"" + root +
                     "\"\nbatch_size = 2\nworkers = 0\nshuffle = false\n" + extra +
                     "\n[model]\nname = \"mlp\"\nhidden = [8]\n[optimizer]\nname = "
                     "\"sgd\"\nlr = 0.1\n");
  return dir.path("p.toml");
}

bool has(const Result& r, const std::string& text) {
  return r.output.find(text) != std::string::npos;
}

// PIL refuses the 700-byte JPEG claiming 65000 x 65000 (DecompressionBombError above twice
// MAX_IMAGE_PIXELS); so does Kiln, from its header, before allocating: sorted first it stops the
// run naming the file and the size, and under skip it is skipped and the batches take the size
// of the first image that decodes.
TEST(DataErrors, ADecompressionBombIsRefusedOrSkippedNeverDecoded) {
  const nlohmann::json expected = nlohmann::json::parse(folders().read_text("expected.json"));
  ASSERT_FALSE(expected["bomb"].is_null()) << "PIL opened the bomb";
  kiln::test::Scratch dir;
  const std::string root = folders().path("bomb");
  const std::string bomb = root + "/c0/0_bomb.jpg";
  Result stop = kiln_cli("run " + image_pipeline(dir, root));
  EXPECT_EQ(stop.code, 1) << stop.output;
  EXPECT_TRUE(has(stop, "error: image_folder: '" + bomb +
                            "' claims 65000 x 65000 pixels, more "
                            "than twice data.max_image_pixels (89478485)"))
      << stop.output;
  EXPECT_FALSE(has(stop, "frame #")) << stop.output;
  Result skip = kiln_cli("run " + image_pipeline(dir, root, "on_error = \"skip\""));
  EXPECT_EQ(skip.code, 0) << skip.output;
  EXPECT_TRUE(has(skip, "samples 3x8x8")) << skip.output;
  EXPECT_TRUE(has(skip, bomb + "' claims 65000 x 65000")) << skip.output;
}

// A zero-byte file, a text file named .jpg, a GIF and a WEBP named .png, sorted first: under
// skip they are skipped (the sample size comes from the first image that decodes); under stop
// the run stops naming the first.
TEST(DataErrors, FilesThatAreNotImagesAreSkippedUnderSkipWhereverTheySort) {
  kiln::test::Scratch dir;
  const std::string root = folders().path("junk");
  Result skip = kiln_cli("run " + image_pipeline(dir, root, "on_error = \"skip\""));
  EXPECT_EQ(skip.code, 0) << skip.output;
  EXPECT_TRUE(has(skip, "samples 3x8x8")) << skip.output;
  for (const char* name : {"0_empty.jpg", "1_text.jpg", "2_gif.png"}) {
    EXPECT_TRUE(has(skip, root + "/c0/" + name)) << name << "\n" << skip.output;
  }
  Result stop = kiln_cli("run " + image_pipeline(dir, root));
  EXPECT_EQ(stop.code, 1) << stop.output;
  EXPECT_TRUE(has(stop, "error: image_folder: '" + root + "/c0/0_empty.jpg'")) << stop.output;
}

// `validate` (and a run's log) say what each split holds.
TEST(DataErrors, ValidateSaysHowManySamplesAndClassesEachSplitHas) {
  kiln::test::Scratch dir;
  const std::string root = folders().path("bomb");
  Result r = kiln_cli(
      "validate " + image_pipeline(dir, root, "val_root = \"" + root + "\"\non_error = \"skip\"") +
      " --set run.eval=true");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r,
                  "data: 'image_folder', training split 5 samples of 2 classes, validation "
                  "split 5 samples; samples 3x8x8 as batched"))
      << r.output;
}

// Images of two sizes without a transform that makes them one: both files are named.
TEST(DataErrors, ImagesOfDifferentSizesAreNamedBoth) {
  kiln::test::Scratch dir;
  const std::string root = folders().path("sizes");
  Result r = kiln_cli("run " + image_pipeline(dir, root));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(has(r, "sample 1 (" + root + "/c1/b.png) is 9x12, sample 0 (" + root +
                         "/c0/a.png) 8x8: samples differ in size"))
      << r.output;
}

// A dataset plugin that breaks its contract is refused (exit 3), by validate as by run, naming
// the plugin and its library; one that decodes another size than it reported, during the run.
TEST(DataErrors, ADatasetPluginThatBreaksItsContractIsRefused) {
  kiln::test::Scratch dir;
  const std::string good = std::string(KILN_TEST_PLUGIN_DIR) + "/good";
  dir.write_text("g.toml",
                 "[run]\ndevice = \"cpu\"\nmax_steps = 2\neval = false\ncheckpoints = "
                 "false\ntensorboard = false\noutput_dir = \"" +
                     dir.path("out") +
                     "\"\n[data]\ndataset = \"gradients\"\nbatch_size = 4\nworkers = "
                     "0\nshuffle = false\nresize = 8\ncenter_crop = 8\n[model]\nname = "
                     "\"mlp\"\nhidden = [8]\n[optimizer]\nname = \"sgd\"\n[plugins]\n"
                     "paths = [\"" +
                     good + "\"]\n");
  const std::string library = good + "/libgood_c_dataset.so";
  for (const char* command : {"validate", "run"}) {
    Result r = kiln_cli(std::string(command) + " " + dir.path("g.toml") +
                        " --set data.breach=negative_samples");
    EXPECT_EQ(r.code, 3) << command << "\n" << r.output;
    EXPECT_TRUE(has(r, "error: plugin refused: dataset 'gradients' (" + library +
                           ") broke the dataset contract: info reports -24 samples"))
        << r.output;
  }
  Result decoded = kiln_cli("run " + dir.path("g.toml") + " --set data.breach=decode_size");
  EXPECT_EQ(decoded.code, 3) << decoded.output;
  EXPECT_TRUE(has(decoded, "error: plugin refused: dataset 'gradients' (" + library +
                               ") broke the dataset contract: sample 1 (gradients.bin: record 1) "
                               "decoded as "))
      << decoded.output;
  EXPECT_TRUE(kiln_cli("run " + dir.path("g.toml")).code == 0);
}

// Configuration values: an infinite lr is refused at its key before anything runs (as nan is);
// inf stays a valid clip_norm_type (the max norm); an integer is the text of a string option
// (depth = 18 in a file as --set model.depth=18).
TEST(DataErrors, ValuesARunCouldNotUseAreRefusedAtTheirKey) {
  const std::string mlp = pipeline("synthetic_mlp.toml");
  Result inf = kiln_cli("validate " + mlp + " --set optimizer.lr=inf");
  EXPECT_EQ(inf.code, 2) << inf.output;
  EXPECT_EQ(inf.output,
            "--set optimizer.lr=inf: optimizer.lr: value inf is out of range; "
            "expected a finite number > 0\n");
  EXPECT_EQ(kiln_cli("validate " + mlp + " --set optimizer.clip_norm_type=inf").code, 0);
  kiln::test::Scratch dir;
  dir.write_text("r18.toml",
                 "[data]\ndataset = \"synthetic\"\nchannels = 3\nheight = 32\nwidth = 32\n"
                 "[model]\nname = \"resnet\"\ndepth = 18\n[optimizer]\nname = \"sgd\"\n");
  Result depth = kiln_cli("validate " + dir.path("r18.toml"));
  EXPECT_EQ(depth.code, 0) << depth.output;
  Result wrong = kiln_cli("validate " + dir.path("r18.toml") + " --set model.depth=19");
  EXPECT_EQ(wrong.code, 2) << wrong.output;
  EXPECT_TRUE(has(wrong,
                  "model.depth: '19' is not one of: small, 18, 34, 50, 101, 152; did you "
                  "mean '18'?"))
      << wrong.output;
}

// A data file's refusal that names no option is located at the option holding its path (here
// data.root), not at a key that does not exist; a label below zero with num_classes = 0 says so.
TEST(DataErrors, ADataFilesRefusalIsLocatedAtTheKeyNamingIt) {
  kiln::test::Scratch dir;
  for (int b = 1; b <= 5; ++b) dir.write_text("data_batch_" + std::to_string(b) + ".bin", "x");
  dir.write_text("c.toml", "[data]\ndataset = \"cifar10\"\nroot = \"" + dir.path("") +
                               "\"\n[model]\nname = \"mlp\"\n[optimizer]\nname = \"sgd\"\n");
  Result r = kiln_cli("validate " + dir.path("c.toml"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.rfind(dir.path("c.toml") + ":3:8: data.root: ", 0), 0u) << r.output;
  EXPECT_TRUE(has(r, "data_batch_1.bin: 1 bytes is not a whole number")) << r.output;
}

// A component's failure that LibTorch reports (c10::Error, whose what() carries a C++ stack
// trace): the user reads the message alone; -v logs the trace.
TEST(DataErrors, NoStackTraceInAUserFacingMessage) {
  const std::string args =
      "validate " + pipeline("synthetic_mlp.toml") + " --set 'model.hidden=[4611686018427387904]'";
  Result r = kiln_cli(args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "model 'mlp' could not be built")) << r.output;
  EXPECT_FALSE(has(r, "frame #")) << r.output;
  EXPECT_FALSE(has(r, "Exception raised from")) << r.output;
  Result verbose = kiln_cli("-v " + args);
  EXPECT_TRUE(has(verbose, "Exception raised from")) << verbose.output;
}

}  // namespace
