// The library's descriptor and schemas, and the refusals: options out of their domain are
// refused at create with KILN_ERR_INVALID_ARGUMENT naming the value, and lr_at refuses
// iterations below 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lr_harness.hpp"

namespace kiln::lr_test {
namespace {

const std::vector<std::string> kComponents = {"constant",  "step",   "multistep", "cosine",
                                              "poly",      "exp",    "plateau",   "cosine_restarts",
                                              "one_cycle", "cyclic", "linear"};

TEST(LrLibrary, DescriptorAndSchemasAreWellFormed) {
  EXPECT_EQ(library_probe(), KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR));
  const kiln_plugin_descriptor& d = library();
  EXPECT_EQ(d.struct_size, sizeof(kiln_plugin_descriptor));
  EXPECT_EQ(d.abi_major, KILN_ABI_MAJOR);
  EXPECT_EQ(d.abi_minor, KILN_ABI_MINOR);
  EXPECT_EQ(d.torch_version, nullptr);  // plain C: no LibTorch across the boundary
  EXPECT_EQ(d.torch_cxx11_abi, -1);
  ASSERT_EQ(d.component_count, kComponents.size());
  for (size_t i = 0; i < kComponents.size(); ++i) {
    const kiln_component_descriptor& c = *d.components[i];
    SCOPED_TRACE(kComponents[i]);
    EXPECT_EQ(c.name, kComponents[i]);
    EXPECT_EQ(c.struct_size, sizeof(kiln_component_descriptor));
    EXPECT_EQ(c.kind, KILN_COMPONENT_LR_POLICY);
    ASSERT_NE(c.summary, nullptr);
    ASSERT_NE(c.capabilities, nullptr);
    EXPECT_NE(c.capabilities->flags & KILN_CAP_DEVICE_CPU, 0u);
    const auto* vt = static_cast<const kiln_lr_policy_vtable*>(c.vtable);
    ASSERT_NE(vt, nullptr);
    EXPECT_EQ(vt->struct_size, sizeof(kiln_lr_policy_vtable));
    EXPECT_TRUE(vt->create != nullptr && vt->destroy != nullptr && vt->lr_at != nullptr);
    // ABI 1.15: a policy that observes keeps its state for checkpoints, and only then.
    EXPECT_EQ(vt->observe != nullptr, c.name == std::string("plateau"));
    EXPECT_EQ(vt->get_state != nullptr, vt->observe != nullptr);
    EXPECT_EQ(vt->set_state != nullptr, vt->observe != nullptr);
    vt->destroy(nullptr);  // NULL is ignored
    for (size_t o = 0; o < c.option_count; ++o) {
      const kiln_option_spec& spec = c.options[o];
      SCOPED_TRACE(spec.name);
      EXPECT_EQ(spec.struct_size, sizeof(kiln_option_spec));
      ASSERT_NE(spec.doc, nullptr);
      EXPECT_GT(std::string(spec.doc).size(), 10u);
      EXPECT_EQ(std::string(spec.doc).find('\n'), std::string::npos);
      if (spec.type == KILN_OPT_STRING) {
        EXPECT_NE(spec.choices, nullptr);  // a closed set of words
      } else if (spec.type != KILN_OPT_BOOL) {
        EXPECT_TRUE(spec.has_min || spec.has_max);
      }
      EXPECT_EQ(spec.reserved, 0);
    }
  }
}

struct Refusal {
  std::string component;
  std::function<void(Options&)> options;
  kiln_lr_schedule schedule;
  std::string named;  // the message must contain it
};

TEST(LrRefusals, CreateRefusesOptionsOutOfTheirDomain) {
  const kiln_lr_schedule ok = make_schedule(0.1, 400, 20, 37);
  const kiln_lr_schedule no_epochs = make_schedule(0.1, 400, 20, 0);
  const kiln_lr_schedule no_span = make_schedule(0.1, 20, 20, 37);
  const int64_t huge = INT64_MAX / 4;
  const std::vector<Refusal> refusals = {
      // step: exactly one of steps and step_size.
      {"step", [](Options& o) { o.set_int_list("steps", {10}).set_int("step_size", 5); }, ok,
       "not both"},
      {"step", [](Options& o) { o.set_int_list("steps", {}).set_int("step_size", 0); }, ok,
       "both are unset"},
      {"step", [](Options&) {}, ok, "both are unset"},
      {"step",
       [](Options& o) {
         o.set_int_list("steps", {30, 20});
       },
       ok, "20 after 30"},
      {"step",
       [](Options& o) {
         o.set_int_list("steps", {10, 10});
       },
       ok, "strictly increasing"},
      {"step",
       [](Options& o) {
         o.set_int_list("steps", {0, 5});
       },
       ok, "got 0"},
      {"step", [](Options& o) { o.set_int_list("steps", {-3}); }, ok, "-3"},
      {"step", [](Options& o) { o.set_int("step_size", -2); }, ok, "-2"},
      {"step", [](Options& o) { o.set_int("step_size", 5).set_float("gamma", 0.0); }, ok,
       "gamma must be in (0, 1], got 0"},
      {"step", [](Options& o) { o.set_int("step_size", 5).set_float("gamma", 1.5); }, ok, "1.5"},
      {"step", [](Options& o) { o.set_int("step_size", 5).set_bool("by_epoch", true); }, no_epochs,
       "iters_per_epoch"},
      {"step",
       [=](Options& o) {
         o.set_int_list("steps", {1, huge}).set_bool("by_epoch", true);
       },
       ok, "overflows"},
      // multistep
      {"multistep", [](Options&) {}, ok, "milestones is required"},
      {"multistep",
       [](Options& o) {
         o.set_int_list("milestones", {50, 40});
       },
       ok, "40 after 50"},
      {"multistep", [](Options& o) { o.set_int_list("milestones", {0}); }, ok, "got 0"},
      {"multistep", [](Options& o) { o.set_int_list("milestones", {5}).set_float("gamma", -1); },
       ok, "-1"},
      {"multistep",
       [](Options& o) { o.set_int_list("milestones", {5}).set_bool("by_epoch", true); }, no_epochs,
       "iters_per_epoch"},
      // cosine
      {"cosine", [](Options& o) { o.set_float("min_lr", -0.5); }, ok, "-0.5"},
      {"cosine", [](Options& o) { o.set_float("min_lr", 0.25); }, ok, "0.25"},
      {"cosine", [](Options&) {}, no_span, "max_iters (20) must exceed warmup_iters (20)"},
      // poly
      {"poly", [](Options& o) { o.set_float("power", 0.0); }, ok, "power must be in (0, 100]"},
      {"poly", [](Options& o) { o.set_float("power", 250.0); }, ok, "250"},
      {"poly", [](Options& o) { o.set_float("min_lr", 0.3); }, ok, "0.3"},
      {"poly", [](Options&) {}, no_span, "must exceed warmup_iters"},
      // exp
      {"exp", [](Options&) {}, ok, "gamma is required"},
      {"exp", [](Options& o) { o.set_float("gamma", 0.0); }, ok, "got 0"},
      {"exp", [](Options& o) { o.set_float("gamma", 1.01); }, ok, "1.01"},
      // cosine_restarts
      {"cosine_restarts", [](Options&) {}, ok, "t_0 is required"},
      {"cosine_restarts", [](Options& o) { o.set_int("t_0", 0); }, ok, "got 0"},
      {"cosine_restarts", [](Options& o) { o.set_int("t_0", 5).set_float("min_lr", 0.25); }, ok,
       "0.25"},
      {"cosine_restarts", [](Options& o) { o.set_int("t_0", 5).set_bool("by_epoch", true); },
       no_epochs, "iters_per_epoch"},
      // one_cycle, cyclic, linear, plateau
      {"one_cycle", [](Options&) {}, no_span, "must exceed warmup_iters"},
      {"cyclic", [](Options&) {}, ok, "max_lr is required"},
      {"linear", [](Options& o) { o.set_float("start_factor", 0.0); }, ok,
       "start_factor must be > 0, got 0"},
      {"linear", [](Options& o) { o.set_int("total_iters", 0); }, ok, "got 0"},
      {"plateau", [](Options& o) { o.set_float("factor", 1.0); }, ok, "factor must be < 1, got 1"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.component + " refusing with '" + r.named + "'");
    Options options;
    r.options(options);
    Policy policy(r.component);
    Status status = policy.create(options, r.schedule);
    ASSERT_NE(status, nullptr) << "accepted";
    EXPECT_EQ(status->code, KILN_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(status->message.rfind(r.component + ": ", 0), 0u) << status->message;
    EXPECT_NE(status->message.find(r.named), std::string::npos) << status->message;
    EXPECT_EQ(policy.instance(), nullptr);
  }
}

TEST(LrRefusals, LrAtRefusesIterationsBelowOne) {
  const kiln_lr_schedule frame = make_schedule(0.1, 400, 0, 37);
  for (const std::string& name : kComponents) {
    SCOPED_TRACE(name);
    Options options;
    if (name == "step") options.set_int("step_size", 10);
    if (name == "multistep") options.set_int_list("milestones", {10});
    if (name == "exp") options.set_float("gamma", 0.9);
    if (name == "cosine_restarts") options.set_int("t_0", 10);
    if (name == "cyclic") options.set_float("max_lr", 0.5);
    Policy policy(name);
    Status created = policy.create(options, frame);
    ASSERT_EQ(created, nullptr) << describe(created.get());
    for (int64_t iter : {int64_t{0}, int64_t{-5}}) {
      double lr = -1.0;
      Status status = policy.try_at(iter, &lr);
      ASSERT_NE(status, nullptr) << "iter " << iter;
      EXPECT_EQ(status->code, KILN_ERR_INVALID_ARGUMENT);
      EXPECT_NE(status->message.find(std::to_string(iter)), std::string::npos) << status->message;
      EXPECT_EQ(lr, -1.0);
    }
  }
}

}  // namespace
}  // namespace kiln::lr_test
