// Pipeline configuration: schema, validation messages (checked whole), overrides, defaults,
// round trips through to_toml, and the C view handed to plugins.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "config/pipeline.hpp"
#include "config/suggest.hpp"

namespace kiln::config {
namespace {

namespace fs = std::filesystem;

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

kiln_option_spec opt(const char* name, int32_t type, const char* default_value, double min = kNone,
                     double max = kNone) {
  kiln_option_spec s{};
  s.struct_size = sizeof(kiln_option_spec);
  s.name = name;
  s.type = type;
  s.has_min = min == min;
  s.has_max = max == max;
  s.min = s.has_min ? min : 0.0;
  s.max = s.has_max ? max : 0.0;
  s.default_value = default_value;
  s.doc = "test option";
  return s;
}

const kiln_capabilities kCaps = {sizeof(kiln_capabilities), KILN_CAP_DEVICE_CPU, 0, nullptr};

kiln_component_descriptor component(int32_t kind, const char* name,
                                    const std::vector<kiln_option_spec>& options) {
  kiln_component_descriptor d{};
  d.struct_size = sizeof(kiln_component_descriptor);
  d.kind = kind;
  d.name = name;
  d.version = {1, 0, 0};
  d.summary = "fake";
  d.capabilities = &kCaps;
  d.option_count = options.size();
  d.options = options.empty() ? nullptr : options.data();
  return d;
}

// Fake components: the shapes of the real plugins' schemas, no code behind them.
const std::vector<kiln_option_spec> kMlp = {opt("hidden", KILN_OPT_INT_LIST, "[128]", 1)};
const std::vector<kiln_option_spec> kBatchnorm = {opt("momentum", KILN_OPT_FLOAT, "0.1", 0, 1),
                                                  opt("affine", KILN_OPT_BOOL, "true")};
const std::vector<kiln_option_spec> kSgd = {opt("momentum", KILN_OPT_FLOAT, "0.9", 0, 1),
                                            opt("nesterov", KILN_OPT_BOOL, "false")};
const std::vector<kiln_option_spec> kAdamw = {
    opt("betas", KILN_OPT_FLOAT_LIST, "[0.9, 0.999]", 0, 1),
    opt("eps", KILN_OPT_FLOAT, "1e-08", kNone, 1), opt("tags", KILN_OPT_STRING_LIST, "[]")};
const std::vector<kiln_option_spec> kStep = {opt("steps", KILN_OPT_INT_LIST, "[]", 0),
                                             opt("gamma", KILN_OPT_FLOAT, "0.1")};

const kiln_component_descriptor kMlpDesc = component(KILN_COMPONENT_MODEL, "mlp", kMlp);
const kiln_component_descriptor kBatchnormDesc =
    component(KILN_COMPONENT_NORM, "batchnorm", kBatchnorm);
const kiln_component_descriptor kSgdDesc = component(KILN_COMPONENT_OPTIMIZER, "sgd", kSgd);
const kiln_component_descriptor kAdamwDesc = component(KILN_COMPONENT_OPTIMIZER, "adamw", kAdamw);
const kiln_component_descriptor kStepDesc = component(KILN_COMPONENT_LR_POLICY, "constant", kStep);
const kiln_component_descriptor kFp32Desc = component(KILN_COMPONENT_PRECISION, "fp32", {});
// [data]'s default dataset, whose options sit in [data] beside the loader's keys.
const std::vector<kiln_option_spec> kFashion = {
    opt("root", KILN_OPT_STRING, "\"/usr/share/datasets/fashion-mnist\""),
    opt("num_classes", KILN_OPT_INT, "10", 0)};
const kiln_component_descriptor kFashionDesc =
    component(KILN_COMPONENT_DATASET, "fashion-mnist", kFashion);

plugin::Registry make_registry() {
  plugin::Registry registry;
  const auto add = [&](const kiln_component_descriptor& d, const std::string& lib) {
    registry.add(plugin::Component{&d, nullptr, "/fake/" + lib});
  };
  add(kMlpDesc, "libkiln-mlp.so");
  add(kBatchnormDesc, "libkiln-batchnorm.so");
  add(kSgdDesc, "libkiln-sgd.so");
  add(kAdamwDesc, "libkiln-adamw.so");
  add(kStepDesc, "libkiln_lr_schedules.so");
  add(kFp32Desc, "libkiln-fp32.so");
  add(kFashionDesc, "libkiln_datasets.so");
  return registry;
}

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("kiln_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
    // Set up front: EXPECT_EQ may evaluate at() before error_of() writes the file.
    path_ = (dir_ / "pipe.toml").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  // The message of the ConfigError that loading `text` (as file `name`) throws.
  std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
    path_ = write("pipe.toml", text);
    const auto registry = make_registry();
    try {
      load_pipeline(path_, overrides, registry);
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no ConfigError for:\n" << text;
    return "";
  }

  // "<file>:<line>:<col>" of the last file error_of wrote.
  std::string at(int line, int column) const {
    return path_ + ":" + std::to_string(line) + ":" + std::to_string(column);
  }

  fs::path dir_;
  std::string path_;
  plugin::Registry registry_ = make_registry();
};

// ---- resolution -------------------------------------------------------------------------------

TEST_F(ConfigTest, ValidFileResolvesWithDefaultsAndPositions) {
  const std::string path = write("ok.toml",
                                 "[run]\n"
                                 "epochs = 3\n"
                                 "\n"
                                 "[model]\n"
                                 "name = \"mlp\"\n"
                                 "hidden = [256, 128]\n"
                                 "\n"
                                 "[optimizer]\n"
                                 "name = \"sgd\"\n"
                                 "lr = 1\n"
                                 "momentum = 0.8\n"
                                 "\n"
                                 "[plugins]\n"
                                 "paths = [\"/opt/kiln\"]\n");
  const Pipeline p = load_pipeline(path, {}, registry_);
  EXPECT_EQ(p.path, path);

  EXPECT_EQ(p.run.get_int("epochs"), 3);
  EXPECT_EQ(p.run.get("epochs").pos.file, path);
  EXPECT_EQ(p.run.get("epochs").pos.line, 2);
  EXPECT_EQ(p.run.get("epochs").pos.column, 10);
  EXPECT_FALSE(p.run.get("epochs").is_default);
  EXPECT_EQ(p.run.get_string("device"), "auto");
  EXPECT_TRUE(p.run.get("device").is_default);
  EXPECT_EQ(p.run.get("device").pos.file, "<default>");
  EXPECT_EQ(p.run.get_int("max_steps"), 0);
  EXPECT_EQ(p.run.get_int("log_interval"), 50);
  EXPECT_TRUE(p.run.get_bool("eval"));
  EXPECT_EQ(p.run.entries().size(), core_schema("run").size());

  EXPECT_EQ(p.data.get_string("dataset"), "fashion-mnist");
  EXPECT_EQ(p.dataset.component, registry_.find(KILN_COMPONENT_DATASET, "fashion-mnist"));
  EXPECT_EQ(p.dataset.options.get_string("root"), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(p.data.get_int("batch_size"), 128);
  EXPECT_EQ(p.data.get_int("eval_batch_size"), 1000);
  EXPECT_EQ(p.data.get_float_list("mean"), std::vector<double>{0.286});
  EXPECT_EQ(p.data.get_float_list("std"), std::vector<double>{0.353});
  EXPECT_FALSE(p.data.get_bool("random_flip"));
  EXPECT_EQ(p.dataset.options.get_int("num_classes"), 10);

  EXPECT_EQ(p.model.section, "model");
  EXPECT_EQ(p.model.component, registry_.find(KILN_COMPONENT_MODEL, "mlp"));
  EXPECT_EQ(p.model.core.get_string("name"), "mlp");
  EXPECT_EQ(p.model.name_pos.line, 5);
  EXPECT_EQ(p.model.name_pos.column, 8);
  EXPECT_EQ(p.model.options.get_int_list("hidden"), (std::vector<int64_t>{256, 128}));

  EXPECT_EQ(p.optimizer.component, registry_.find(KILN_COMPONENT_OPTIMIZER, "sgd"));
  EXPECT_EQ(p.optimizer.core.get("lr").type, KILN_OPT_FLOAT);  // integer literal converted
  EXPECT_DOUBLE_EQ(p.optimizer.core.get_float("lr"), 1.0);
  EXPECT_EQ(p.optimizer.core.get("lr").pos.line, 10);
  EXPECT_EQ(p.optimizer.core.get("lr").pos.column, 6);
  EXPECT_DOUBLE_EQ(p.optimizer.core.get_float("weight_decay"), 0.0);
  EXPECT_DOUBLE_EQ(p.optimizer.options.get_float("momentum"), 0.8);
  EXPECT_FALSE(p.optimizer.options.get_bool("nesterov"));
  EXPECT_TRUE(p.optimizer.options.get("nesterov").is_default);
  EXPECT_FALSE(p.optimizer.core.has("momentum"));
  EXPECT_FALSE(p.optimizer.options.has("lr"));

  // Sections absent from the file: defaults throughout, components found by their default name.
  EXPECT_EQ(p.norm.component, registry_.find(KILN_COMPONENT_NORM, "batchnorm"));
  EXPECT_EQ(p.norm.name_pos.file, "<default>");
  EXPECT_DOUBLE_EQ(p.norm.options.get_float("momentum"), 0.1);
  EXPECT_TRUE(p.norm.options.get_bool("affine"));
  EXPECT_EQ(p.lr_policy.component, registry_.find(KILN_COMPONENT_LR_POLICY, "constant"));
  EXPECT_EQ(p.lr_policy.core.get_string("warmup"), "none");
  EXPECT_DOUBLE_EQ(p.lr_policy.core.get_float("warmup_factor"), 0.1);
  EXPECT_TRUE(p.lr_policy.options.get_int_list("steps").empty());
  EXPECT_DOUBLE_EQ(p.lr_policy.options.get_float("gamma"), 0.1);
  EXPECT_EQ(p.precision.component, registry_.find(KILN_COMPONENT_PRECISION, "fp32"));
  EXPECT_TRUE(p.precision.options.entries().empty());
  EXPECT_EQ(p.plugin_paths, (std::vector<std::string>{"/opt/kiln"}));
}

TEST_F(ConfigTest, ComponentOptionsFollowSchemaOrder) {
  const Pipeline p = load_pipeline_text(
      "[model]\nname = \"mlp\"\n[optimizer]\nname = \"adamw\"\ntags = [\"b\"]\neps = 2e-8\n",
      "t.toml", {}, registry_);
  ASSERT_EQ(p.optimizer.options.entries().size(), 3u);
  EXPECT_EQ(p.optimizer.options.entries()[0].first, "betas");
  EXPECT_EQ(p.optimizer.options.entries()[1].first, "eps");
  EXPECT_EQ(p.optimizer.options.entries()[2].first, "tags");
  EXPECT_EQ(p.optimizer.options.get_float_list("betas"), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(p.optimizer.options.get_string_list("tags"), (std::vector<std::string>{"b"}));
  // name, lr, weight_decay, group rules, clipping
  ASSERT_EQ(p.optimizer.core.entries().size(), 13u);
  EXPECT_EQ(p.optimizer.core.entries()[0].first, "name");
}

TEST_F(ConfigTest, OptionSetAccessors) {
  OptionSet set;
  Value v;
  v.type = KILN_OPT_INT;
  v.int_value = 4;
  set.set("n", v);
  v.int_value = 5;
  set.set("n", v);  // replaces, keeps one entry
  EXPECT_EQ(set.entries().size(), 1u);
  EXPECT_EQ(set.get_int("n"), 5);
  EXPECT_DOUBLE_EQ(set.get_float("n"), 5.0);
  EXPECT_THROW(set.get("missing"), std::out_of_range);
  EXPECT_THROW(set.get_string("n"), std::logic_error);
}

TEST_F(ConfigTest, CViewPointsIntoTheOptionSet) {
  const Pipeline p = load_pipeline_text(
      "[model]\nname = \"mlp\"\nhidden = [7, 8, 9]\n"
      "[optimizer]\nname = \"adamw\"\ntags = [\"x\", \"yz\"]\nbetas = [0.5, 0.25]\n",
      "t.toml", {}, registry_);
  const kiln_options* m = p.model.options.c_view();
  ASSERT_EQ(m->struct_size, sizeof(kiln_options));
  ASSERT_EQ(m->count, 1u);
  const kiln_option_value* hidden = kiln_options_find(m, "hidden");
  ASSERT_NE(hidden, nullptr);
  EXPECT_EQ(hidden->struct_size, sizeof(kiln_option_value));
  EXPECT_EQ(hidden->type, KILN_OPT_INT_LIST);
  ASSERT_EQ(hidden->list_length, 3u);
  EXPECT_EQ(hidden->int_list[2], 9);

  const kiln_options* o = p.optimizer.options.c_view();
  const kiln_option_value* tags = kiln_options_find(o, "tags");
  ASSERT_NE(tags, nullptr);
  ASSERT_EQ(tags->list_length, 2u);
  EXPECT_STREQ(tags->string_list[0], "x");
  EXPECT_STREQ(tags->string_list[1], "yz");
  const kiln_option_value* betas = kiln_options_find(o, "betas");
  ASSERT_EQ(betas->list_length, 2u);
  EXPECT_DOUBLE_EQ(betas->float_list[1], 0.25);
  EXPECT_DOUBLE_EQ(kiln_options_float(o, "eps", 0.0), 1e-8);

  const kiln_options* core = p.optimizer.core.c_view();
  EXPECT_STREQ(kiln_options_string(core, "name", ""), "adamw");
  EXPECT_DOUBLE_EQ(kiln_options_float(core, "lr", 0.0), 0.1);
  const kiln_options* run = p.run.c_view();
  EXPECT_EQ(kiln_options_int(run, "log_interval", -1), 50);
  EXPECT_EQ(kiln_options_bool(run, "eval", 0), 1);
}

TEST_F(ConfigTest, CoreSchemaIsDocumented) {
  EXPECT_EQ(core_sections(),
            (std::vector<std::string>{"run", "data", "model", "norm", "optimizer", "lr_policy",
                                      "lr_scaling", "precision", "dist", "memory", "loss", "ema",
                                      "plugins"}));
  for (const auto& section : core_sections()) {
    for (const auto& spec : core_schema(section)) {
      EXPECT_EQ(spec.struct_size, sizeof(kiln_option_spec));
      ASSERT_NE(spec.doc, nullptr) << section << "." << spec.name;
      EXPECT_GT(std::strlen(spec.doc), 0u) << section << "." << spec.name;
    }
  }
  // name, init, init_skip, norm, memory_format
  EXPECT_EQ(core_schema("model").size(), 5u);
  EXPECT_EQ(core_schema("model")[0].default_value, nullptr);  // required
  EXPECT_EQ(core_schema("data").size(), 23u);  // the dataset's own options (root, ...) are its own
  EXPECT_THROW(core_schema("nope"), std::out_of_range);
}

// ---- messages, each checked whole ---------------------------------------------------------------

TEST_F(ConfigTest, SyntaxError) {
  const std::string m = error_of("[model\nname = \"mlp\"\n");
  EXPECT_EQ(m, at(1, 7) +
                   ": TOML syntax error: Error while parsing table header: expected ']', "
                   "saw '\\n'");
}

TEST_F(ConfigTest, UnknownSection) {
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimzer]\nlr = 0.1\n"),
            at(3, 2) + ": optimzer: unknown section; did you mean 'optimizer'?");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n\n[zzzzzzzz]\nx = 1\n"),
            at(4, 2) +
                ": zzzzzzzz: unknown section; valid sections: run, data, model, norm, optimizer, "
                "lr_policy, lr_scaling, precision, dist, memory, loss, ema, plugins");
}

TEST_F(ConfigTest, LossSectionIsTypedCheckedAndSuggested) {
  const Pipeline p = load_pipeline_text(
      "[model]\nname = \"mlp\"\n[loss]\nname = \"bce_with_logits\"\nlabel_smoothing = 0.1\n"
      "class_weights = [1, 2.5]\n",
      "a.toml", {}, registry_);
  EXPECT_EQ(p.settings.loss.name, "bce_with_logits");
  EXPECT_EQ(p.settings.loss.label_smoothing, 0.1);
  EXPECT_EQ(p.settings.loss.class_weights, (std::vector<double>{1.0, 2.5}));
  EXPECT_TRUE(p.settings.loss.pos_weight.empty());
  const Pipeline d = load_pipeline_text("[model]\nname = \"mlp\"\n", "d.toml", {}, registry_);
  EXPECT_EQ(d.settings.loss.name, "cross_entropy");
  EXPECT_EQ(d.settings.loss.label_smoothing, 0.0);
  EXPECT_TRUE(d.settings.loss.class_weights.empty());
  EXPECT_NE(to_toml(p).find("[loss]\nname = \"bce_with_logits\"\nlabel_smoothing = 0.1\n"),
            std::string::npos)
      << to_toml(p);
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[loss]\nlabel_smothing = 0.1\n"),
            at(4, 1) + ": loss.label_smothing: unknown key; did you mean 'label_smoothing'?");
  EXPECT_NE(error_of("[model]\nname = \"mlp\"\n[loss]\nlabel_smoothing = 1.5\n")
                .find(at(4, 19) + ": loss.label_smoothing:"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nname = \"mlp\"\n[loss]\nname = \"focal\"\n")
                .find(at(4, 8) + ": loss.name:"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nname = \"mlp\"\n[loss]\nclass_weights = [1, -1]\n")
                .find("loss.class_weights"),
            std::string::npos);
}

TEST_F(ConfigTest, UnknownKey) {
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer]\nmomentun = 0.5\n"),
            at(4, 1) + ": optimizer.momentun: unknown key; did you mean 'momentum'?");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[norm]\n  zzzzzzzz = 1\n"),
            at(4, 3) +
                ": norm.zzzzzzzz: unknown key; valid keys: name, running_stats_update, momentum, "
                "affine");
  EXPECT_EQ(
      error_of("[model]\nname = \"mlp\"\n[run]\nzzzzzzzz = 1\n"),
      at(4, 1) +
          ": run.zzzzzzzz: unknown key; valid keys: device, epochs, max_steps, seed, "
          "log_interval, eval, threads, tf32, cuda_graph, cudnn_benchmark, accumulation_steps, "
          "grad_check, max_nonfinite_steps, "
          "output_dir, checkpoints, checkpoint_every, checkpoint_keep, checkpoint_best, "
          "early_stop_patience, resume_fallback, "
          "tensorboard, profile_steps, profile_start");
  // The keys of the chosen component only: nesterov belongs to sgd, not adamw.
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer]\nname = \"adamw\"\nnesterov = true\n"),
            at(5, 1) +
                ": optimizer.nesterov: unknown key; valid keys: name, lr, weight_decay, "
                "bias_lr_mult, bias_double_lr, bias_decay_mult, bias_weight_decay, "
                "norm_decay_mult, weight_decay_norm, freeze, clip_grad_norm, clip_norm_type, "
                "clip_grad_value, betas, eps, "
                "tags");
}

TEST_F(ConfigTest, WrongType) {
  const std::string head = "[model]\nname = \"mlp\"\n";
  EXPECT_EQ(error_of(head + "[run]\nepochs = \"3\"\n"),
            at(4, 10) + ": run.epochs: expected integer, found string");
  EXPECT_EQ(error_of(head + "[run]\nepochs = 2.5\n"),
            at(4, 10) + ": run.epochs: expected integer, found float");
  EXPECT_EQ(error_of(head + "[run]\neval = 1\n"),
            at(4, 8) + ": run.eval: expected boolean, found integer");
  EXPECT_EQ(error_of(head + "[optimizer]\nlr = \"fast\"\n"),
            at(4, 6) + ": optimizer.lr: expected float, found string");
  EXPECT_EQ(error_of(head + "[run]\ndevice = [\"cpu\"]\n"),
            at(4, 10) + ": run.device: expected string, found array");
  EXPECT_EQ(error_of(head + "[run]\nepochs = { a = 1 }\n"),
            at(4, 10) + ": run.epochs: expected integer, found table");
  EXPECT_EQ(error_of(head + "[lr_policy]\ngamma = 2020-01-02\n"),
            at(4, 9) + ": lr_policy.gamma: expected float, found date");
  EXPECT_EQ(error_of(head + "[lr_policy]\ngamma = 10:30:00\n"),
            at(4, 9) + ": lr_policy.gamma: expected float, found time");
  EXPECT_EQ(error_of(head + "[lr_policy]\ngamma = 2020-01-02T10:30:00Z\n"),
            at(4, 9) + ": lr_policy.gamma: expected float, found date-time");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\nhidden = 5\n"),
            at(3, 10) + ": model.hidden: expected array of integers, found integer");
  EXPECT_EQ(
      error_of("[model]\nname = \"mlp\"\nhidden = [1, \"a\"]\n"),
      at(3, 10) + ": model.hidden: expected array of integers, found array containing string");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\nhidden = [1, 2.0]\n"),
            at(3, 10) + ": model.hidden: expected array of integers, found array containing float");
  EXPECT_EQ(
      error_of(head + "[optimizer]\nname = \"adamw\"\nbetas = [0.9, true]\n"),
      at(5, 9) + ": optimizer.betas: expected array of numbers, found array containing boolean");
  EXPECT_EQ(
      error_of(head + "[plugins]\npaths = [1]\n"),
      at(4, 9) + ": plugins.paths: expected array of strings, found array containing integer");
  EXPECT_EQ(error_of(head + "[plugins]\npaths = [[\"a\"]]\n"),
            at(4, 9) + ": plugins.paths: expected array of strings, found array containing array");
  EXPECT_EQ(error_of("run = 5\n" + head), at(1, 1) + ": run: expected table, found integer");
}

TEST_F(ConfigTest, IntegerListsOfNumbersAreAccepted) {
  const Pipeline p =
      load_pipeline_text("[model]\nname = \"mlp\"\n[optimizer]\nname = \"adamw\"\nbetas = [0, 1]\n",
                         "t.toml", {}, registry_);
  EXPECT_EQ(p.optimizer.options.get_float_list("betas"), (std::vector<double>{0.0, 1.0}));
}

TEST_F(ConfigTest, OutOfRange) {
  const std::string head = "[model]\nname = \"mlp\"\n";
  EXPECT_EQ(error_of(head + "[run]\nepochs = 0\n"),
            at(4, 10) + ": run.epochs: value 0 is out of range; expected >= 1");
  EXPECT_EQ(error_of(head + "[data]\nworkers = 65\n"),
            at(4, 11) + ": data.workers: value 65 is out of range; expected in [0, 64]");
  EXPECT_EQ(error_of(head + "[lr_policy]\nwarmup_factor = 1.5\n"),
            at(4, 17) + ": lr_policy.warmup_factor: value 1.5 is out of range; expected in [0, 1]");
  EXPECT_EQ(error_of(head + "[optimizer]\nweight_decay = -1e-8\n"),
            at(4, 16) + ": optimizer.weight_decay: value -1e-08 is out of range; expected >= 0");
  EXPECT_EQ(error_of(head + "[optimizer]\nname = \"adamw\"\neps = 2.5\n"),
            at(5, 7) + ": optimizer.eps: value 2.5 is out of range; expected <= 1");
  EXPECT_EQ(error_of(head + "[optimizer]\nname = \"adamw\"\nbetas = [0.9, 1.5]\n"),
            at(5, 9) + ": optimizer.betas: value 1.5 is out of range; expected in [0, 1]");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\nhidden = [64, 0]\n"),
            at(3, 10) + ": model.hidden: value 0 is out of range; expected >= 1");
  // "> 0" options: zero and NaN are refused.
  EXPECT_EQ(error_of(head + "[optimizer]\nlr = 0.0\n"),
            at(4, 6) + ": optimizer.lr: value 0 is out of range; expected > 0");
  EXPECT_EQ(error_of(head + "[data]\nstd = nan\n"),
            at(4, 7) + ": data.std: value nan is out of range; expected > 0");
  // Infinity is not in a range because nothing caps that side: lr = inf would fail at step 1.
  EXPECT_EQ(error_of(head + "[optimizer]\nlr = inf\n"),
            at(4, 6) + ": optimizer.lr: value inf is out of range; expected a finite number > 0");
  EXPECT_EQ(error_of(head + "[optimizer]\nweight_decay = -inf\n"),
            at(4, 16) +
                ": optimizer.weight_decay: value -inf is out of range; expected a finite number "
                ">= 0");
  // Where the bound itself is infinite, infinity is in range (the max norm); an option without
  // bounds takes any number.
  const Pipeline p =
      load_pipeline_text(head + "[optimizer]\nclip_norm_type = inf\n[data]\nmean = [0.5, inf]\n",
                         "t.toml", {}, registry_);
  EXPECT_TRUE(std::isinf(p.optimizer.core.get_float("clip_norm_type")));
  EXPECT_TRUE(std::isinf(p.data.get_float_list("mean")[1]));
}

TEST_F(ConfigTest, BadChoice) {
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[run]\ndevice = \"tpu\"\n"),
            at(4, 10) + ": run.device: 'tpu' is not one of: auto, cpu, cuda; did you mean 'cpu'?");
  // Nothing near enough: the list alone.
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[lr_policy]\nwarmup = \"cosine\"\n"),
            at(4, 10) +
                ": lr_policy.warmup: 'cosine' is not one of: none, constant, linear, torch_linear");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\nmemory_format = \"chanels_last\"\n"),
            at(3, 17) +
                ": model.memory_format: 'chanels_last' is not one of: auto, contiguous, "
                "channels_last; did you mean 'channels_last'?");
}

TEST_F(ConfigTest, UnknownComponent) {
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer]\nname = \"adam\"\n"),
            at(4, 8) +
                ": optimizer.name: unknown optimizer 'adam'; did you mean 'adamw'? available: sgd, "
                "adamw");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer]\nname = \"lbfgs\"\n"),
            at(4, 8) + ": optimizer.name: unknown optimizer 'lbfgs'; available: sgd, adamw");
  // A name of another kind is still unknown for this slot.
  EXPECT_EQ(error_of("[model]\nname = \"sgd\"\n"),
            at(2, 8) + ": model.name: unknown model 'sgd'; available: mlp");
}

TEST_F(ConfigTest, UnknownDefaultComponentPointsAtTheFile) {
  plugin::Registry registry;
  registry.add(plugin::Component{&kMlpDesc, nullptr, "/fake/libkiln-mlp.so"});
  registry.add(plugin::Component{&kSgdDesc, nullptr, "/fake/libkiln-sgd.so"});
  registry.add(plugin::Component{&kStepDesc, nullptr, "/fake/libkiln_lr_schedules.so"});
  registry.add(plugin::Component{&kFp32Desc, nullptr, "/fake/libkiln-fp32.so"});
  registry.add(plugin::Component{&kFashionDesc, nullptr, "/fake/libkiln_datasets.so"});
  try {
    load_pipeline_text("[model]\nname = \"mlp\"\n", "p.toml", {}, registry);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "p.toml: norm.name: unknown norm 'batchnorm'; available: (none)");
  }
}

TEST_F(ConfigTest, MissingRequired) {
  EXPECT_EQ(error_of("[run]\nepochs = 2\n"), path_ + ": model.name: required key is missing");
  // The missing key is pointed at its table's header.
  EXPECT_EQ(error_of("[model]\nhidden = [3]\n"),
            at(1, 2) + ": model.name: required key is missing");
}

TEST_F(ConfigTest, MalformedOverride) {
  const std::string ok = "[model]\nname = \"mlp\"\n";
  EXPECT_EQ(error_of(ok, {"epochs=3"}),
            "--set epochs=3: expected KEY=VALUE with KEY like section.key");
  EXPECT_EQ(error_of(ok, {"run.epochs"}),
            "--set run.epochs: expected KEY=VALUE with KEY like section.key");
  EXPECT_EQ(error_of(ok, {"run.epochs.x=1"}),
            "--set run.epochs.x=1: expected KEY=VALUE with KEY like section.key");
  EXPECT_EQ(error_of(ok, {".epochs=1"}),
            "--set .epochs=1: expected KEY=VALUE with KEY like section.key");
}

TEST_F(ConfigTest, AllErrorsCollectedInFileOrderOverridesLast) {
  const std::string m = error_of(
      "[run]\n"             // 1
      "epochs = 0\n"        // 2
      "device = \"tpu\"\n"  // 3
      "[optimizer]\n"       // 4
      "lr = \"x\"\n"        // 5
      "momentun = 0.1\n"    // 6
      "[data]\n"            // 7
      "batch_size = 0\n"    // 8
      "[norn]\n"            // 9
      "a = 1\n",            // 10
      {"run.seed=-1", "bogus", "data.workers=3"});
  EXPECT_EQ(m, at(2, 10) + ": run.epochs: value 0 is out of range; expected >= 1\n" + at(3, 10) +
                   ": run.device: 'tpu' is not one of: auto, cpu, cuda; did you mean 'cpu'?\n" +
                   at(5, 6) + ": optimizer.lr: expected float, found string\n" + at(6, 1) +
                   ": optimizer.momentun: unknown key; did you mean 'momentum'?\n" + at(8, 14) +
                   ": data.batch_size: value 0 is out of range; expected >= 1\n" + at(9, 2) +
                   ": norn: unknown section; did you mean 'norm'?\n" + path_ +
                   ": model.name: required key is missing\n"
                   "--set run.seed=-1: run.seed: value -1 is out of range; expected >= 0\n"
                   "--set bogus: expected KEY=VALUE with KEY like section.key");
}

// ---- overrides ----------------------------------------------------------------------------------

TEST_F(ConfigTest, OverridesReplaceAddAndCreate) {
  const Pipeline p = load_pipeline_text(
      "[model]\nname = \"mlp\"\n[optimizer]\nlr = 0.5\n", "p.toml",
      {"optimizer.lr=1", "run.device=cpu", "norm.momentum=0.25", "model.hidden=[4, 5]",
       "data.root = /tmp/my data", "plugins.paths=[\"/a\", \"/b\"]"},
      registry_);
  EXPECT_DOUBLE_EQ(p.optimizer.core.get_float("lr"), 1.0);  // integer override of a float
  EXPECT_EQ(p.optimizer.core.get("lr").pos.file, "--set");
  EXPECT_EQ(p.run.get_string("device"), "cpu");                  // a bare string
  EXPECT_DOUBLE_EQ(p.norm.options.get_float("momentum"), 0.25);  // a section the file lacks
  EXPECT_EQ(p.model.options.get_int_list("hidden"), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(p.dataset.options.get_string("root"), "/tmp/my data");
  EXPECT_EQ(p.plugin_paths, (std::vector<std::string>{"/a", "/b"}));
}

// A string option given a number on the command line takes the text: the shell already took
// the quotes TOML would need (`--set model.depth=18`). The file keeps TOML's types.
TEST_F(ConfigTest, AnOverrideOfAStringOptionTakesItsTextAsTyped) {
  const Pipeline p =
      load_pipeline_text("[model]\nname = \"mlp\"\n", "p.toml",
                         {"run.output_dir=2024", "data.root=1.5", "model.init=true"}, registry_);
  EXPECT_EQ(p.run.get_string("output_dir"), "2024");
  EXPECT_EQ(p.dataset.options.get_string("root"), "1.5");
  EXPECT_EQ(p.model.core.get_string("init"), "true");
  EXPECT_EQ(p.run.get("output_dir").pos.argument, "run.output_dir=2024");
  // From a file an integer is a string option's text too (resnet's depth = 18 as "18"); other
  // types stay refused.
  const Pipeline file = load_pipeline_text("[model]\nname = \"mlp\"\n[run]\noutput_dir = 2024\n",
                                           "p.toml", {}, registry_);
  EXPECT_EQ(file.run.get_string("output_dir"), "2024");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[run]\noutput_dir = 20.24\n"),
            at(4, 14) + ": run.output_dir: expected string, found float");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[run]\ndevice = 1\n")
                .rfind(at(4, 10) + ": run.device: '1' is not one of: auto, cpu, cuda", 0),
            0u);
  // Other types are unchanged: an integer option still refuses text.
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n", {"run.epochs=ten"}),
            "--set run.epochs=ten: run.epochs: expected integer, found string");
}

TEST_F(ConfigTest, OverrideCanSupplyTheRequiredModel) {
  const Pipeline p = load_pipeline_text("", "empty.toml", {"model.name=mlp"}, registry_);
  EXPECT_EQ(p.model.component, registry_.find(KILN_COMPONENT_MODEL, "mlp"));
  EXPECT_EQ(p.model.name_pos.file, "--set");
}

TEST_F(ConfigTest, OverrideErrors) {
  const std::string ok = "[model]\nname = \"mlp\"\n[run]\nepochs = 2\n";
  // The file's valid value is replaced by one of the wrong type.
  EXPECT_EQ(error_of(ok, {"run.epochs=many"}),
            "--set run.epochs=many: run.epochs: expected integer, found string");
  EXPECT_EQ(error_of(ok, {"run.epochs=2.5"}),
            "--set run.epochs=2.5: run.epochs: expected integer, found float");
  EXPECT_EQ(error_of(ok, {"optimizer.momentun=0.5"}),
            "--set optimizer.momentun=0.5: optimizer.momentun: unknown key; did you mean "
            "'momentum'?");
  EXPECT_EQ(error_of(ok, {"optimiser.lr=0.5"}),
            "--set optimiser.lr=0.5: optimiser: unknown section; did you mean 'optimizer'?");
  EXPECT_EQ(error_of(ok, {"optimizer.name=adamx"}),
            "--set optimizer.name=adamx: optimizer.name: unknown optimizer 'adamx'; did you mean "
            "'adamw'? available: sgd, adamw");
  // A file error and the override that would not fix it.
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[run]\nepochs = 0\n", {"run.seed=x"}),
            at(4, 10) + ": run.epochs: value 0 is out of range; expected >= 1\n" +
                "--set run.seed=x: run.seed: expected integer, found string");
}

TEST_F(ConfigTest, OverrideFixesAFileError) {
  const Pipeline p = load_pipeline_text("[model]\nname = \"mlp\"\n[run]\nepochs = 0\n", "p.toml",
                                        {"run.epochs=4"}, registry_);
  EXPECT_EQ(p.run.get_int("epochs"), 4);
}

TEST_F(ConfigTest, ReadPluginPaths) {
  const std::string path =
      write("p.toml", "[model]\nname = \"not-loaded-yet\"\n[plugins]\npaths = [\"/x\", \"y\"]\n");
  EXPECT_EQ(read_plugin_paths(path, {}), (std::vector<std::string>{"/x", "y"}));
  EXPECT_EQ(read_plugin_paths(path, {"plugins.paths=[\"/z\"]", "run.epochs=oops", "junk"}),
            (std::vector<std::string>{"/z"}));
  const std::string none = write("n.toml", "[model]\nname = \"mlp\"\n");
  EXPECT_TRUE(read_plugin_paths(none, {}).empty());
  // A lone string reads as a one-element list; a number is an error.
  const std::string one = write("o.toml", "[plugins]\npaths = \"/x\"\n");
  EXPECT_EQ(read_plugin_paths(one, {}), (std::vector<std::string>{"/x"}));
  const std::string bad = write("b.toml", "[plugins]\npaths = 3\n");
  try {
    read_plugin_paths(bad, {});
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              bad + ":2:9: plugins.paths: expected array of strings, found integer");
  }
  EXPECT_THROW(read_plugin_paths((dir_ / "absent.toml").string(), {}), ConfigError);
}

TEST_F(ConfigTest, MissingFile) {
  const std::string path = (dir_ / "absent.toml").string();
  try {
    load_pipeline(path, {}, registry_);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot open file: No such file or directory");
  }
}

// ---- to_toml ------------------------------------------------------------------------------------

void expect_same(const OptionSet& a, const OptionSet& b, const std::string& where) {
  ASSERT_EQ(a.entries().size(), b.entries().size()) << where;
  for (std::size_t i = 0; i < a.entries().size(); ++i) {
    const auto& [name_a, va] = a.entries()[i];
    const auto& [name_b, vb] = b.entries()[i];
    EXPECT_EQ(name_a, name_b) << where;
    EXPECT_EQ(va.type, vb.type) << where << "." << name_a;
    EXPECT_EQ(va.bool_value, vb.bool_value) << where << "." << name_a;
    EXPECT_EQ(va.int_value, vb.int_value) << where << "." << name_a;
    // Bit-exact round trip (a NaN default, as weight_decay_norm's, reads back as NaN).
    EXPECT_TRUE(va.float_value == vb.float_value ||
                (std::isnan(va.float_value) && std::isnan(vb.float_value)))
        << where << "." << name_a << ": " << va.float_value << " vs " << vb.float_value;
    EXPECT_EQ(va.string_value, vb.string_value) << where << "." << name_a;
    EXPECT_EQ(va.int_list, vb.int_list) << where << "." << name_a;
    EXPECT_EQ(va.float_list, vb.float_list) << where << "." << name_a;
    EXPECT_EQ(va.string_list, vb.string_list) << where << "." << name_a;
  }
}

TEST_F(ConfigTest, ToTomlRoundTrips) {
  const Pipeline a = load_pipeline_text(
      "[run]\ndevice = \"cpu\"\nseed = 7\neval = false\n"
      "[data]\nroot = \"odd \\\"dir\\\"\\\\\\ttab\"\nmean = 0.1\nstd = 3\n"
      "[model]\nname = \"mlp\"\nhidden = [300, 100, 10]\n"
      "[optimizer]\nname = \"adamw\"\nlr = 1e-3\nweight_decay = 5e-4\neps = 1e-300\n"
      "betas = [0.8, 0.95]\ntags = [\"a b\", \"\"]\n"
      "[lr_policy]\nsteps = [30, 60]\ngamma = 0.3333333333333333\nwarmup = \"linear\"\n"
      "[memory]\ncheckpoint = [\"layers.0\"]\n[ema]\ndecay = 0.999\nbuffers = \"copy\"\n"
      "[plugins]\npaths = [\"/p\"]\n",
      "a.toml", {}, registry_);
  const std::string text = to_toml(a);
  EXPECT_NE(text.find("[optimizer]\nname = \"adamw\"\nlr = 0.001\nweight_decay = 5e-04\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nbetas = [0.8, 0.95]\neps = 1e-300\ntags = [\"a b\", \"\"]\n"),
            std::string::npos)
      << text;
  // A lone number is a one-element list of a float-list key.
  EXPECT_NE(text.find("std = [3.0]\n"), std::string::npos) << text;
  const Pipeline b = load_pipeline_text(text, "plan.toml", {}, registry_);
  expect_same(a.run, b.run, "run");
  expect_same(a.data, b.data, "data");
  expect_same(a.memory, b.memory, "memory");
  expect_same(a.ema, b.ema, "ema");
  EXPECT_NE(text.find("[memory]\ncheckpoint = [\"layers.0\"]\n"), std::string::npos) << text;
  for (const auto* pair : {&a.model, &a.norm, &a.optimizer, &a.lr_policy, &a.precision}) {
    const ComponentChoice& ca = *pair;
    const ComponentChoice& cb = ca.section == "model"       ? b.model
                                : ca.section == "norm"      ? b.norm
                                : ca.section == "optimizer" ? b.optimizer
                                : ca.section == "lr_policy" ? b.lr_policy
                                                            : b.precision;
    EXPECT_EQ(ca.component, cb.component) << ca.section;
    expect_same(ca.core, cb.core, ca.section);
    expect_same(ca.options, cb.options, ca.section);
  }
  EXPECT_EQ(a.plugin_paths, b.plugin_paths);
  // Values read back from the plan are no longer defaults, but print the same.
  std::string again = to_toml(b);
  EXPECT_EQ(again.substr(again.find('\n')), text.substr(text.find('\n')));
}

TEST(ValueToToml, Literals) {
  Value v;
  v.type = KILN_OPT_FLOAT;
  v.float_value = 5;
  EXPECT_EQ(v.to_toml(), "5.0");
  v.float_value = 1e-8;
  EXPECT_EQ(v.to_toml(), "1e-08");
  v.float_value = -std::numeric_limits<double>::infinity();
  EXPECT_EQ(v.to_toml(), "-inf");
  v.type = KILN_OPT_STRING;
  v.string_value = "a\"b\\c\n";
  EXPECT_EQ(v.to_toml(), "\"a\\\"b\\\\c\\n\"");
  v.type = KILN_OPT_INT_LIST;
  v.int_list = {1, -2};
  EXPECT_EQ(v.to_toml(), "[1, -2]");
  v.type = KILN_OPT_BOOL;
  EXPECT_EQ(v.to_toml(), "false");
}

// ---- nearest ------------------------------------------------------------------------------------

TEST(Nearest, Cases) {
  const std::vector<std::string> keys = {"momentum", "nesterov", "lr", "weight_decay"};
  EXPECT_EQ(nearest("mometnum", keys), "momentum");   // a swap costs 1
  EXPECT_EQ(nearest("momentumm", keys), "momentum");  // insertion
  EXPECT_EQ(nearest("momntum", keys), "momentum");    // deletion
  EXPECT_EQ(nearest("weight_decya", keys), "weight_decay");
  EXPECT_EQ(nearest("zzzzzzzzzz", keys), std::nullopt);
  EXPECT_EQ(nearest("batch", {"run", "data"}), std::nullopt);
  // Ties go to the earlier candidate.
  EXPECT_EQ(nearest("ab", {"ax", "ay"}), "ax");
  EXPECT_EQ(nearest("ab", {"ay", "ax"}), "ay");
  // The limit grows with the word: 3 edits are fine for a 9+ letter word, not for a 6 letter one.
  EXPECT_EQ(nearest("learnxxxrate", {"learning_rate"}), "learning_rate");
  EXPECT_EQ(nearest("abcxyz", {"abcdef"}), std::nullopt);
  EXPECT_EQ(edit_distance("ca", "ac"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
}

}  // namespace
}  // namespace kiln::config

namespace kiln::config {
namespace {

TEST_F(ConfigTest, CustomKeysAreParsedInFileOrder) {
  const Pipeline p = load_pipeline_text(
      "[model]\nname = \"mlp\"\n[optimizer.custom_keys]\n\"^head\\\\.\" = { lr_mult = 10 }\n"
      "backbone = { decay_mult = 0, lr_mult = 0.1 }\n",
      "ck.toml", {}, registry_);
  ASSERT_EQ(p.param_rules.size(), 2u);
  EXPECT_EQ(p.param_rules[0].pattern, "^head\\.");
  EXPECT_EQ(p.param_rules[0].lr_mult, 10.0);
  EXPECT_EQ(p.param_rules[0].decay_mult, 1.0);
  EXPECT_EQ(p.param_rules[1].pattern, "backbone");
  EXPECT_EQ(p.param_rules[1].decay_mult, 0.0);
  EXPECT_EQ(p.param_rules[1].pos.line, 5);
  // Round trip through to_toml.
  const Pipeline q = load_pipeline_text(to_toml(p), "rt.toml", {}, registry_);
  ASSERT_EQ(q.param_rules.size(), 2u);
  EXPECT_EQ(q.param_rules[1].lr_mult, 0.1);
}

TEST_F(ConfigTest, CustomKeysErrors) {
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer.custom_keys]\n\"(\" = { lr_mult = 2 }\n"),
            at(4, 7) +
                ": optimizer.custom_keys.\"(\": invalid regular expression: Mismatched '(' "
                "and ')' in regular expression");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer.custom_keys]\nfc = { lr_mul = 2 }\n"),
            at(4, 17) + ": optimizer.custom_keys.fc.lr_mul: unknown key; did you mean 'lr_mult'?");
  EXPECT_EQ(
      error_of("[model]\nname = \"mlp\"\n[optimizer.custom_keys]\nfc = { lr_mult = -1 }\n"),
      at(4, 18) + ": optimizer.custom_keys.fc.lr_mult: value -1 is out of range; expected >= 0");
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer]\ncustom_keys = 3\n"),
            at(4, 15) + ": optimizer.custom_keys: expected table, found integer");
  // Found by the config fuzzer: libstdc++ compiles a regex recursively, so a very long pattern
  // would overflow the stack; and a bad freeze pattern used to fail only at run time.
  const std::string long_pattern(1001, 'a');
  EXPECT_NE(error_of("[model]\nname = \"mlp\"\n[optimizer.custom_keys]\n\"" + long_pattern +
                     "\" = { lr_mult = 2 }\n")
                .find("regular expression is 1001 characters long; at most 1000 are allowed"),
            std::string::npos);
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\n[optimizer]\nfreeze = [\"ok\", \"[\"]\n"),
            at(4, 10) +
                ": optimizer.freeze[1]: invalid regular expression: Unexpected character "
                "within '[...]' in regular expression");
  // model.init_skip likewise, at its value, before anything is built.
  EXPECT_EQ(error_of("[model]\nname = \"mlp\"\ninit_skip = [\"^fc\\\\.\", \"(\"]\n"),
            at(3, 13) +
                ": model.init_skip[1]: invalid regular expression: Mismatched '(' and ')' "
                "in regular expression");
}

}  // namespace
}  // namespace kiln::config
