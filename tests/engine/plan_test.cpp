// Which segments memory.checkpoint installs: the sqrt(n) schedule, names, and the refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/activation_checkpoint.hpp"
#include "engine/checks.hpp"
#include "toy_model.hpp"

namespace {

using kiln::engine::apply_activation_checkpointing;
using kiln::engine::PipelineError;
using kiln::engine::sqrt_segments;
using kiln_test::NestedModel;
using kiln_test::ToyModel;
using Segments = std::vector<kiln::BlockChain::Segment>;

// The PipelineError message of `spec` on `model`; fails the test when nothing is thrown.
std::string refusal(kiln::Model& model, const std::vector<std::string>& spec,
                    const std::string& name = "toy") {
  try {
    apply_activation_checkpointing(model, spec, name);
  } catch (const PipelineError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no refusal";
  return "";
}

TEST(SqrtSegments, NineBlocksGiveThreeOfThree) {
  EXPECT_EQ(sqrt_segments({9}), (std::vector<Segments>{{{0, 3}, {3, 6}, {6, 9}}}));
}

TEST(SqrtSegments, TenBlocksGiveRunsOfFour) {
  EXPECT_EQ(sqrt_segments({10}), (std::vector<Segments>{{{0, 4}, {4, 8}, {8, 10}}}));
}

TEST(SqrtSegments, SegmentsNeverCrossChains) {
  // ResNet-50's stages: n = 16, k = 4; a chain of m blocks gets ceil(m / 4) segments.
  EXPECT_EQ(sqrt_segments({3, 4, 6, 3}),
            (std::vector<Segments>{{{0, 3}}, {{0, 4}}, {{0, 4}, {4, 6}}, {{0, 3}}}));
  // n = 10, k = 4: every chain of two is a single segment.
  EXPECT_EQ(sqrt_segments({2, 2, 2, 2, 2}),
            (std::vector<Segments>{{{0, 2}}, {{0, 2}}, {{0, 2}}, {{0, 2}}, {{0, 2}}}));
  // n = 5, k = 3; an empty chain gets none.
  EXPECT_EQ(sqrt_segments({0, 5}), (std::vector<Segments>{{}, {{0, 3}, {3, 5}}}));
}

TEST(SqrtSegments, EdgeSizes) {
  EXPECT_EQ(sqrt_segments({1}), (std::vector<Segments>{{{0, 1}}}));
  EXPECT_EQ(sqrt_segments({}), (std::vector<Segments>{}));
  EXPECT_EQ(sqrt_segments({0}), (std::vector<Segments>{{}}));
  // Perfect squares and their neighbours: k = ceil(sqrt(n)).
  EXPECT_EQ(sqrt_segments({16})[0].size(), 4u);
  EXPECT_EQ(sqrt_segments({17})[0].front(), (kiln::BlockChain::Segment{0, 5}));
  EXPECT_EQ(sqrt_segments({1024})[0].size(), 32u);
}

TEST(ApplyCheckpointing, SqrtOverSeveralChains) {
  ToyModel model(4, {{"stem", 1}, {"layer1", 3}, {"layer2", 6}});  // n = 10, k = 4
  const std::string log = apply_activation_checkpointing(model, {"sqrt"}, "toy");
  EXPECT_EQ(model.chain(0)->checkpointed_segments(), (Segments{{0, 1}}));
  EXPECT_EQ(model.chain(1)->checkpointed_segments(), (Segments{{0, 3}}));
  EXPECT_EQ(model.chain(2)->checkpointed_segments(), (Segments{{0, 4}, {4, 6}}));
  EXPECT_EQ(log,
            "sqrt (n=10, k=4): stem 1 segment [0] of 1; layer1 1 segment [0-2] of 3; layer2 2 "
            "segments [0-3 4-5] of 6");
}

TEST(ApplyCheckpointing, NamesPickBlocksAndWholeChains) {
  ToyModel model(4, {{"layer1", 3}, {"layer2", 4}});
  const std::string log =
      apply_activation_checkpointing(model, {"layer1.2", "layer2", "layer1.0"}, "toy");
  EXPECT_EQ(model.chain(0)->checkpointed_segments(), (Segments{{0, 1}, {2, 3}}));
  EXPECT_EQ(model.chain(1)->checkpointed_segments(), (Segments{{0, 4}}));
  EXPECT_EQ(log, "named: layer1 2 segments [0 2] of 3; layer2 1 segment [0-3] of 4");
}

TEST(ApplyCheckpointing, NoneAndEmptyTurnItOff) {
  ToyModel model(4, {{"layers", 4}});
  for (const std::vector<std::string>& off :
       {std::vector<std::string>{"none"}, std::vector<std::string>{}}) {
    apply_activation_checkpointing(model, {"sqrt"});
    ASSERT_FALSE(model.chain(0)->checkpointed_segments().empty());
    EXPECT_EQ(apply_activation_checkpointing(model, off), "");
    EXPECT_TRUE(model.chain(0)->checkpointed_segments().empty());
  }
  // Off is fine for a model without chains.
  ToyModel plain(4, {});
  EXPECT_EQ(apply_activation_checkpointing(plain, {"none"}), "");
}

TEST(ApplyCheckpointing, SqrtCountsOnlyOutermostChains) {
  NestedModel model(4, 4, 9);  // outer: 4 blocks (k = 2); outer.0.inner: 9, not counted
  apply_activation_checkpointing(model, {"sqrt"});
  EXPECT_EQ(model.outer->checkpointed_segments(), (Segments{{0, 2}, {2, 4}}));
  EXPECT_EQ(model.block_names().size(), 13u);
  // A nested chain's blocks can still be named.
  apply_activation_checkpointing(model, {"outer.0.inner.3"});
  EXPECT_TRUE(model.outer->checkpointed_segments().empty());
}

TEST(ApplyCheckpointing, UnknownNameSuggestsTheNearestAndListsTheAvailable) {
  ToyModel model(4, {{"layers", 2}, {"blocks", 6}});
  const std::string m = refusal(model, {"layer.1"}, "mlp");
  EXPECT_NE(m.find("memory.checkpoint: model 'mlp' has no block or chain 'layer.1' (did you mean "
                   "'layers.1'?)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("available: layers (layers.0, layers.1), blocks (blocks.0 … blocks.5)"),
            std::string::npos)
      << m;
  const std::string far = refusal(model, {"classifier"});
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
  EXPECT_NE(far.find("has no block or chain 'classifier'"), std::string::npos) << far;
  // A block past the end is no block either (ties go to the first candidate).
  EXPECT_NE(refusal(model, {"layers.2"}).find("did you mean 'layers.0'"), std::string::npos);
}

TEST(ApplyCheckpointing, KeywordsStandAlone) {
  ToyModel model(4, {{"layers", 2}});
  for (const std::vector<std::string>& spec :
       {std::vector<std::string>{"sqrt", "layers.0"}, {"layers.0", "none"}, {"sqrt", "sqrt"}}) {
    const std::string m = refusal(model, spec);
    EXPECT_NE(m.find("'none' and 'sqrt' stand alone"), std::string::npos) << m;
  }
}

TEST(ApplyCheckpointing, RefusesModelsWithoutBlocks) {
  ToyModel none(4, {});
  std::string m = refusal(none, {"sqrt"}, "linear");
  EXPECT_NE(m.find("memory.checkpoint: model 'linear' exposes no blocks to checkpoint"),
            std::string::npos)
      << m;
  ToyModel empty(4, {{"layers", 0}});
  m = refusal(empty, {"layers.0"});
  EXPECT_NE(m.find("model 'toy' exposes no blocks"), std::string::npos) << m;
  m = refusal(none, {"sqrt"}, "");
  EXPECT_NE(m.find("the model exposes no blocks"), std::string::npos) << m;
}

TEST(ApplyCheckpointing, RefusesRepeatsAndOverlaps) {
  ToyModel model(4, {{"layers", 3}, {"head", 0}});
  std::string m = refusal(model, {"layers.1", "layers.1"});
  EXPECT_NE(m.find("'layers.1' is named twice"), std::string::npos) << m;
  m = refusal(model, {"layers", "layers.2"});
  EXPECT_NE(m.find("'layers.2' overlaps 'layers'; name either a whole chain or some of its blocks"),
            std::string::npos)
      << m;
  m = refusal(model, {"layers.0", "layers"});
  EXPECT_NE(m.find("'layers' overlaps 'layers.0'"), std::string::npos) << m;
  m = refusal(model, {"head"});
  EXPECT_NE(m.find("chain 'head' has no blocks"), std::string::npos) << m;
  // A refused spec leaves nothing installed.
  EXPECT_TRUE(model.chain(0)->checkpointed_segments().empty());
}

}  // namespace
