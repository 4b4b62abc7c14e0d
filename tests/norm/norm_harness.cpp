#include "norm_harness.hpp"

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <stdexcept>

#include "tensor_scratch.hpp"

namespace kiln::norm_test {
namespace {

DLTensor* dl_or_null(const at::Tensor& t, DLTensor& storage) {
  if (!t.defined()) return nullptr;
  storage = kiln::as_dltensor(t);
  return &storage;
}

std::string outcome(kiln_status* status) {
  test::Status owned = test::take(status);
  return test::describe(owned.get());
}

}  // namespace

const kiln_component_descriptor& descriptor(const std::string& library,
                                            const std::string& component) {
  const kiln_component_descriptor* c = test::builtin(library).component(component);
  if (c == nullptr) throw std::runtime_error(library + " has no component " + component);
  return *c;
}

const kiln_norm_vtable& vtable(const std::string& library, const std::string& component) {
  return *static_cast<const kiln_norm_vtable*>(descriptor(library, component).vtable);
}

Layer::~Layer() {
  if (vt != nullptr) vt->destroy(instance);
}

std::string create(Layer& layer, const std::string& library, const std::string& component,
                   test::Options& options, int64_t channels, int32_t activation,
                   double activation_param, int32_t device_type) {
  options.fill_defaults(descriptor(library, component));
  layer.vt = &vtable(library, component);
  kiln_norm_setup setup{};
  setup.struct_size = sizeof(setup);
  setup.num_features = channels;
  setup.activation = activation;
  setup.activation_param = activation_param;
  setup.device_type = device_type;
  layer.layout = kiln_norm_layout{};
  layer.layout.struct_size = sizeof(kiln_norm_layout);
  return outcome(
      layer.vt->create(thread_host(), options.get(), &setup, &layer.layout, &layer.instance));
}

State make_state(int64_t channels, const at::Tensor& w, const at::Tensor& b, at::Device device) {
  auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  State s;
  if (w.defined()) s.weight = w.to(device).clone();
  if (b.defined()) s.bias = b.to(device).clone();
  s.running_mean = at::zeros({channels}, f32);
  s.running_var = at::ones({channels}, f32);
  s.save_mean = at::empty({channels}, f32);
  s.save_invstd = at::empty({channels}, f32);
  return s;
}

std::string forward(const Layer& layer, kiln_call_context* ctx, bool training,
                    const at::Tensor& input, const at::Tensor& output, State& state) {
  DLTensor in = kiln::as_dltensor(input), out = kiln::as_dltensor(output);
  DLTensor w, b, rm, rv, sm, si;
  kiln_norm_forward_args args{};
  args.struct_size = sizeof(args);
  args.training = training ? 1 : 0;
  args.input = &in;
  args.output = &out;
  args.weight = dl_or_null(state.weight, w);
  args.bias = dl_or_null(state.bias, b);
  args.running_mean = dl_or_null(state.running_mean, rm);
  args.running_var = dl_or_null(state.running_var, rv);
  args.save_mean = dl_or_null(state.save_mean, sm);
  args.save_invstd = dl_or_null(state.save_invstd, si);
  return outcome(layer.vt->forward(layer.instance, ctx, &args));
}

std::string forward_reporting(const Layer& layer, kiln_call_context* ctx, const at::Tensor& input,
                              const at::Tensor& output, State& state, Report& report,
                              size_t args_size) {
  const int64_t channels = input.size(1);
  const auto f32 = input.options().dtype(at::kFloat);
  report.mean = at::full({channels}, -7.0, f32);  // not what any batch gives
  report.var = at::full({channels}, -7.0, f32);
  DLTensor in = kiln::as_dltensor(input), out = kiln::as_dltensor(output);
  DLTensor w, b, rm, rv, sm, si, bm, bv;
  kiln_norm_batch_stats stats{};
  stats.struct_size = sizeof(stats);
  stats.mean = dl_or_null(report.mean, bm);
  stats.var = dl_or_null(report.var, bv);
  kiln_norm_forward_args args{};
  args.struct_size = args_size;
  args.training = 1;
  args.input = &in;
  args.output = &out;
  args.weight = dl_or_null(state.weight, w);
  args.bias = dl_or_null(state.bias, b);
  // A host that updates the running statistics itself passes none; an older host does.
  const bool current = args_size >= KILN_SIZE_UP_TO(kiln_norm_forward_args, batch_stats);
  args.running_mean = current ? nullptr : dl_or_null(state.running_mean, rm);
  args.running_var = current ? nullptr : dl_or_null(state.running_var, rv);
  args.save_mean = dl_or_null(state.save_mean, sm);
  args.save_invstd = dl_or_null(state.save_invstd, si);
  args.batch_stats = &stats;
  const std::string status = outcome(layer.vt->forward(layer.instance, ctx, &args));
  report.count = stats.count;
  report.momentum = stats.momentum;
  report.reported = stats.reported;
  return status;
}

std::string backward(const Layer& layer, kiln_call_context* ctx, bool training,
                     const at::Tensor& grad_output, const at::Tensor& saved, State& state,
                     Grads& grads, bool frozen) {
  grads.input = at::empty_like(grad_output);
  if (!frozen && state.weight.defined()) grads.weight = at::empty_like(state.weight);
  if (!frozen && state.bias.defined()) grads.bias = at::empty_like(state.bias);
  DLTensor go = kiln::as_dltensor(grad_output), gi = kiln::as_dltensor(grads.input);
  DLTensor s, w, b, rm, rv, sm, si, gw, gb;
  kiln_norm_backward_args args{};
  args.struct_size = sizeof(args);
  args.training = training ? 1 : 0;
  args.grad_output = &go;
  args.saved = dl_or_null(saved, s);
  args.weight = dl_or_null(state.weight, w);
  args.bias = dl_or_null(state.bias, b);
  args.running_mean = dl_or_null(state.running_mean, rm);
  args.running_var = dl_or_null(state.running_var, rv);
  args.save_mean = dl_or_null(state.save_mean, sm);
  args.save_invstd = dl_or_null(state.save_invstd, si);
  args.grad_input = &gi;
  args.grad_weight = dl_or_null(grads.weight, gw);
  args.grad_bias = dl_or_null(grads.bias, gb);
  return outcome(layer.vt->backward(layer.instance, ctx, &args));
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                  const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  if (expected.numel() == 0) return;
  const double c = test::closeness(actual.to(at::kCPU).to(at::kDouble),
                                   expected.to(at::kCPU).to(at::kDouble), rtol, atol);
  EXPECT_LE(c, 1.0) << what << ": max |a - e| / (" << atol << " + " << rtol << " |e|) = " << c;
}

}  // namespace kiln::norm_test
