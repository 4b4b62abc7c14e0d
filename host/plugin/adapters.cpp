#include "plugin/adapters.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kiln/torch.hpp"
#include "plugin/plugin_call.hpp"
#include "plugin/status.hpp"

namespace kiln::plugin {
namespace {

template <typename Vtable>
const Vtable* vtable_of(const Component& c) {
  return static_cast<const Vtable*>(c.descriptor->vtable);
}

std::string context(const Component& c, const char* what) {
  return std::string(kind_name(c.kind())) + " '" + std::string(c.name()) + "' " + what;
}

// "<kind> '<name>' <entry> (<library>)": where an escaped exception came from.
std::string entry_of(const Component& c, const char* entry) {
  return context(c, entry) + " (" + c.library_path + ")";
}

}  // namespace

std::string capability_problem(const Component& component, c10::DeviceType device,
                               at::ScalarType dtype) {
  const uint64_t flags = component.descriptor->capabilities->flags;
  const std::string who =
      std::string(kind_name(component.kind())) + " '" + std::string(component.name()) + "'";
  auto devices = [&] {
    std::string s;
    if (flags & KILN_CAP_DEVICE_CPU) s += "cpu";
    if (flags & KILN_CAP_DEVICE_CUDA) s += s.empty() ? "cuda" : ", cuda";
    return s.empty() ? std::string("none") : s;
  };
  if (device == c10::DeviceType::CPU && !(flags & KILN_CAP_DEVICE_CPU)) {
    return who + " supports devices: " + devices() + "; the pipeline runs on cpu";
  }
  if (device == c10::DeviceType::CUDA && !(flags & KILN_CAP_DEVICE_CUDA)) {
    return who + " supports devices: " + devices() + "; the pipeline runs on cuda";
  }
  uint64_t need = 0;
  switch (dtype) {
    case at::kFloat:
      need = KILN_CAP_DTYPE_F32;
      break;
    case at::kHalf:
      need = KILN_CAP_DTYPE_F16;
      break;
    case at::kBFloat16:
      need = KILN_CAP_DTYPE_BF16;
      break;
    case at::kDouble:
      need = KILN_CAP_DTYPE_F64;
      break;
    default:
      break;
  }
  if (need != 0 && !(flags & need)) {
    return who + " does not support dtype " + std::string(c10::toString(dtype)) +
           " which the pipeline's precision uses";
  }
  return {};
}

// ---- optimizer --------------------------------------------------------------------------------

OptimizerAdapter::OptimizerAdapter(const Component& component, const config::OptionSet& options,
                                   dist::ProcessGroup* group, const Component* inner,
                                   const config::OptionSet* inner_options)
    : name_(component.name()),
      library_(component.library_path),
      vtable_(vtable_of<kiln_optimizer_vtable>(component)),
      group_(group) {
  // A plugin built before 1.4 never reads lr_tensor or found_inf, whatever bits it sets.
  capturable_ = component.plugin->abi_minor >= 4 &&
                (component.descriptor->capabilities->flags & KILN_CAP_CAPTURABLE) != 0;
  steps_all_ = plugin::steps_all_groups(component);
  eval_weights_ = plugin::has_eval_weights(component);
  if (wraps_optimizer(component) != (inner != nullptr)) {
    throw std::logic_error("optimizer '" + name_ + "': an inner optimizer is given exactly to " +
                           "a wrapper (the configuration checks this)");
  }
  if (inner != nullptr) {
    inner_ = std::make_unique<OptimizerAdapter>(*inner, *inner_options, group);
    // A wrapper's step is not captured: the inner's capturability does not carry over.
    capturable_ = false;
  }
  check_options(
      call_plugin([&] { return entry_of(component, "create"); },
                  [&] { return vtable_->create(host_api(), options.c_view(), &instance_); }),
      context(component, "refused its options"), kind_name(component.kind()));
}

OptimizerAdapter::~OptimizerAdapter() {
  if (instance_ == nullptr) return;
  call_plugin_noexcept([&] { return where("destroy"); }, [&] { vtable_->destroy(instance_); });
}

std::string OptimizerAdapter::where(const char* entry) const {
  return "optimizer '" + name_ + "' " + entry + " (" + library_ + ")";
}

OptimizerAdapter::LiveGroup& OptimizerAdapter::live_group(const GroupStep& group) {
  if (live_.size() <= group.group_index) live_.resize(group.group_index + 1);
  LiveGroup& live = live_[group.group_index];
  // Parameters without a gradient this step (unused branches) are left alone, as in torch.
  key_scratch_.clear();
  for (const at::Tensor& p : *group.params) {
    if (p.grad().defined()) {
      key_scratch_.emplace_back(p.unsafeGetTensorImpl(), p.const_data_ptr());
    } else {
      key_scratch_.emplace_back(nullptr, nullptr);
    }
  }
  if (key_scratch_ == live.key && live.names_source == group.names &&
      live.state_epoch == state_epoch_) {
    return live;
  }
  live.key = key_scratch_;
  live.names_source = group.names;
  live.state_epoch = state_epoch_;
  live.token = ++last_token_;
  live.params.clear();
  live.param_views.clear();
  live.state.clear();
  live.names.clear();
  for (size_t i = 0; i < group.params->size(); ++i) {
    if (live.key[i].first == nullptr) continue;
    const std::string& name = (*group.names)[i];
    live.params.push_back((*group.params)[i]);
    live.param_views.push_back(kiln::as_dltensor(live.params.back()));
    live.state.push_back(&state_[name]);
    live.names.push_back(name.c_str());
  }
  return live;
}

kiln_param_group OptimizerAdapter::group_view(const GroupStep& group, const LiveGroup& live,
                                              std::vector<DLTensor>& grad_views) const {
  grad_views.clear();
  for (const at::Tensor& p : live.params) grad_views.push_back(kiln::as_dltensor(p.grad()));
  kiln_param_group view{};
  view.struct_size = sizeof(view);
  view.count = live.params.size();
  view.params = live.param_views.data();
  view.grads = grad_views.data();
  view.names = live.names.data();
  view.group_index = group.group_index;
  view.step = group.step;
  view.lr = group.lr;
  view.weight_decay = group.weight_decay;
  view.stream = host_api()->current_stream(live.param_views[0].device);
  view.reuse_token = live.token;
  return view;
}

void OptimizerAdapter::inner_step(const GroupStep& group, const kiln_param_group& given) {
  LiveGroup& live = inner_->live_group(group);
  if (given.count != live.params.size()) {
    throw std::invalid_argument("inner_step: the group has " + std::to_string(given.count) +
                                " parameters; the host gave the wrapper " +
                                std::to_string(live.params.size()));
  }
  // The wrapper's view, with the inner's promise about its own state.
  kiln_param_group view{};
  std::memcpy(&view, &given, std::min(sizeof(view), given.struct_size));
  view.struct_size = std::min(sizeof(view), given.struct_size);
  if (KILN_HAS_FIELD(&view, kiln_param_group, reuse_token)) view.reuse_token = live.token;
  kiln_call_context ctx;
  ctx.params = &live.params;
  ctx.state = &live.state;
  ctx.group = group_;
  OptimizerAdapter& inner = *inner_;
  kiln_status* status =
      call_plugin([&] { return inner.where("step"); },
                  [&] { return inner.vtable_->step(inner.instance_, &ctx, &view); });
  if (status != nullptr) check(status, "optimizer '" + inner.name_ + "' step (inner)");
}

void OptimizerAdapter::step(const GroupStep& group) {
  if (steps_all_) throw std::logic_error("optimizer '" + name_ + "' takes the whole step");
  const LiveGroup& live = live_group(group);
  if (live.params.empty()) return;
  kiln_param_group view = group_view(group, live, grad_views_);
  DLTensor lr_view{}, found_inf_view{};
  if (group.lr_tensor.defined()) {
    if (!capturable_ || !group.found_inf.defined()) {
      throw std::logic_error("optimizer '" + name_ + "': a capturable step needs a capturable " +
                             "plugin and both lr_tensor and found_inf");
    }
    lr_view = kiln::as_dltensor(group.lr_tensor);
    found_inf_view = kiln::as_dltensor(group.found_inf);
    view.lr_tensor = &lr_view;
    view.found_inf = &found_inf_view;
  }
  kiln_call_context ctx;
  ctx.params = &live.params;
  ctx.state = &live.state;
  ctx.group = group_;
  const std::function<void(const kiln_param_group&)> inner = [&](const kiln_param_group& g) {
    inner_step(group, g);
  };
  if (inner_) ctx.inner_step = &inner;
  // Hot paths build the error's context only when there is an error.
  kiln_status* status = call_plugin([&] { return where("step"); },
                                    [&] { return vtable_->step(instance_, &ctx, &view); });
  if (status != nullptr) check(status, "optimizer '" + name_ + "' step");
}

void OptimizerAdapter::step_all(const std::vector<GroupStep>& groups, double loss,
                                const Reevaluate& reevaluate) {
  if (!steps_all_) throw std::logic_error("optimizer '" + name_ + "' steps one group at a time");
  // Everything the call points into lives until it returns: live_ grows here, once, so that
  // live_group() never moves the groups already taken.
  size_t groups_seen = live_.size();
  for (const GroupStep& g : groups) groups_seen = std::max(groups_seen, g.group_index + 1);
  live_.resize(groups_seen);
  std::vector<const GroupStep*> stepped;
  std::vector<LiveGroup*> lives;
  for (const GroupStep& g : groups) {
    LiveGroup& live = live_group(g);
    if (live.params.empty()) continue;
    stepped.push_back(&g);
    lives.push_back(&live);
  }
  if (stepped.empty()) return;
  std::vector<std::vector<DLTensor>> grad_views(stepped.size());
  std::vector<kiln_param_group> views;
  std::vector<kiln_call_context> contexts(stepped.size());
  std::vector<kiln_call_context*> context_ptrs;
  std::vector<std::function<void(const kiln_param_group&)>> inners;
  inners.reserve(stepped.size());
  for (size_t k = 0; k < stepped.size(); ++k) {
    views.push_back(group_view(*stepped[k], *lives[k], grad_views[k]));
    contexts[k].params = &lives[k]->params;
    contexts[k].state = &lives[k]->state;
    contexts[k].group = group_;
    if (inner_) {
      const GroupStep* g = stepped[k];
      inners.emplace_back([this, g](const kiln_param_group& v) { inner_step(*g, v); });
      contexts[k].inner_step = &inners.back();
    }
    context_ptrs.push_back(&contexts[k]);
  }
  kiln_call_context step_ctx;
  step_ctx.group = group_;
  step_ctx.reevaluate = &reevaluate;
  kiln_optimizer_step_args args{};
  args.struct_size = sizeof(args);
  args.group_count = views.size();
  args.groups = views.data();
  args.group_contexts = context_ptrs.data();
  args.ctx = &step_ctx;
  args.loss = loss;
  kiln_status* status = call_plugin([&] { return where("step_all"); },
                                    [&] { return vtable_->step_all(instance_, &args); });
  if (status != nullptr) check(status, "optimizer '" + name_ + "' step_all");
}

void OptimizerAdapter::eval_weights(const GroupStep& group, const std::vector<at::Tensor>& out) {
  if (!eval_weights_) throw std::logic_error("optimizer '" + name_ + "' has no eval weights");
  if (out.size() != group.params->size()) {
    throw std::logic_error("eval_weights: one output per parameter of the group");
  }
  // The plugin sees the parameters it has stepped (those whose state it keeps); the others
  // are evaluated as they are.
  std::vector<at::Tensor> params;
  std::vector<ParamState*> state;
  std::vector<const char*> names;
  std::vector<DLTensor> param_views, out_views;
  for (size_t i = 0; i < group.params->size(); ++i) {
    const std::string& name = (*group.names)[i];
    const auto it = state_.find(name);
    if (it == state_.end() || it->second.empty()) {
      out[i].copy_((*group.params)[i]);
      continue;
    }
    params.push_back((*group.params)[i]);
    state.push_back(&it->second);
    names.push_back(name.c_str());
    param_views.push_back(kiln::as_dltensor(params.back()));
    out_views.push_back(kiln::as_dltensor(out[i]));
  }
  if (params.empty()) return;
  kiln_param_group view{};
  view.struct_size = sizeof(view);
  view.count = params.size();
  view.params = param_views.data();
  view.grads = nullptr;
  view.names = names.data();
  view.group_index = group.group_index;
  view.step = group.step;
  view.lr = group.lr;
  view.weight_decay = group.weight_decay;
  view.stream = host_api()->current_stream(param_views[0].device);
  view.reuse_token = 0;
  kiln_call_context ctx;
  ctx.params = &params;
  ctx.state = &state;
  ctx.group = group_;
  kiln_status* status =
      call_plugin([&] { return where("eval_weights"); },
                  [&] { return vtable_->eval_weights(instance_, &ctx, &view, out_views.data()); });
  if (status != nullptr) check(status, "optimizer '" + name_ + "' eval_weights");
}

// ---- LR policy --------------------------------------------------------------------------------

LrPolicyAdapter::LrPolicyAdapter(const Component& component, const config::OptionSet& options,
                                 const kiln_lr_schedule& schedule)
    : name_(component.name()),
      library_(component.library_path),
      vtable_(vtable_of<kiln_lr_policy_vtable>(component)) {
  check_options(
      call_plugin(
          [&] { return entry_of(component, "create"); },
          [&] { return vtable_->create(host_api(), options.c_view(), &schedule, &instance_); }),
      context(component, "refused its options"), kind_name(component.kind()));
  observes_ = observes_evaluations(component);
  keeps_state_ = keeps_lr_state(component);
}

LrPolicyAdapter::~LrPolicyAdapter() {
  if (instance_ == nullptr) return;
  call_plugin_noexcept([&] { return where("destroy"); }, [&] { vtable_->destroy(instance_); });
}

std::string LrPolicyAdapter::where(const char* entry) const {
  return "lr_policy '" + name_ + "' " + entry + " (" + library_ + ")";
}

double LrPolicyAdapter::lr_at(int64_t iter) const {
  double lr = 0.0;
  kiln_status* status = call_plugin([&] { return where("lr_at"); },
                                    [&] { return vtable_->lr_at(instance_, iter, &lr); });
  if (status != nullptr) {
    check(status, "lr_policy '" + name_ + "' at iteration " + std::to_string(iter));
  }
  return lr;
}

void LrPolicyAdapter::observe(int64_t iter, int64_t epoch,
                              const std::vector<std::pair<std::string, double>>& metrics) {
  if (!observes_) return;
  std::vector<const char*> names;
  std::vector<double> values;
  for (const auto& [name, value] : metrics) {
    names.push_back(name.c_str());
    values.push_back(value);
  }
  kiln_lr_observation o{};
  o.struct_size = sizeof(o);
  o.iter = iter;
  o.epoch = epoch;
  o.count = names.size();
  o.names = names.data();
  o.values = values.data();
  kiln_status* status = call_plugin([&] { return where("observe"); },
                                    [&] { return vtable_->observe(instance_, &o); });
  if (status != nullptr) {
    check(status,
          "lr_policy '" + name_ + "' observing the evaluation after step " + std::to_string(iter));
  }
}

namespace {

// A plugin's state as numbers through a get_state(instance, values, capacity, &count) slot (the
// precision and LR policy vtables have the same one): asked for the count, then filled.
template <typename GetState, typename Where>
std::vector<double> state_values(GetState get, void* instance, const Where& where,
                                 const std::string& what) {
  size_t count = 0;
  check(call_plugin(where, [&] { return get(instance, nullptr, 0, &count); }), what);
  std::vector<double> values(count);
  check(call_plugin(where, [&] { return get(instance, values.data(), values.size(), &count); }),
        what);
  values.resize(std::min(count, values.size()));
  return values;
}

}  // namespace

std::vector<double> LrPolicyAdapter::state() const {
  if (!keeps_state_) return {};
  return state_values(
      vtable_->get_state, instance_, [&] { return where("get_state"); },
      "lr_policy '" + name_ + "' get_state");
}

void LrPolicyAdapter::restore_state(const std::vector<double>& values) {
  if (!keeps_state_) {
    if (values.empty()) return;
    throw ComponentError(KILN_ERR_UNSUPPORTED, "lr_policy '" + name_ +
                                                   "' cannot restore its state (no set_state), "
                                                   "but the checkpoint holds some");
  }
  check(call_plugin([&] { return where("set_state"); },
                    [&] { return vtable_->set_state(instance_, values.data(), values.size()); }),
        "lr_policy '" + name_ + "' set_state");
}

// ---- precision --------------------------------------------------------------------------------

PrecisionAdapter::PrecisionAdapter(const Component& component, const config::OptionSet& options,
                                   c10::DeviceType device)
    : name_(component.name()),
      library_(component.library_path),
      vtable_(vtable_of<kiln_precision_vtable>(component)) {
  DLDevice dl{};
  dl.device_type = device == c10::DeviceType::CUDA ? kDLCUDA : kDLCPU;
  check_options(
      call_plugin([&] { return entry_of(component, "create"); },
                  [&] { return vtable_->create(host_api(), options.c_view(), dl, &instance_); }),
      context(component, "refused its options"), kind_name(component.kind()));
  // Fields a 1.0 plugin does not know keep these presets.
  policy_.struct_size = sizeof(policy_);
  policy_.initial_scale = 1.0;
  policy_.min_scale = 1.0;
  policy_.at_min_scale = KILN_AT_MIN_SCALE_STOP;
  check(call_plugin([&] { return where("policy"); },
                    [&] { return vtable_->policy(instance_, &policy_); }),
        context(component, "policy"));
}

std::vector<double> PrecisionAdapter::scale_rule_state() const {
  if (!KILN_HAS_FIELD(vtable_, kiln_precision_vtable, get_state) || vtable_->get_state == nullptr) {
    return {};
  }
  return state_values(
      vtable_->get_state, instance_, [&] { return where("get_state"); },
      "precision '" + name_ + "' get_state");
}

void PrecisionAdapter::restore_scale_rule_state(const std::vector<double>& values) {
  const bool has =
      KILN_HAS_FIELD(vtable_, kiln_precision_vtable, set_state) && vtable_->set_state != nullptr;
  if (!has) {
    if (values.empty()) return;
    throw ComponentError(KILN_ERR_UNSUPPORTED, "precision '" + name_ +
                                                   "' cannot restore its scale-rule state (no "
                                                   "set_state), but the checkpoint holds some");
  }
  check(call_plugin([&] { return where("set_state"); },
                    [&] { return vtable_->set_state(instance_, values.data(), values.size()); }),
        "precision '" + name_ + "' set_state");
}

bool PrecisionAdapter::has_scale_rule() const { return vtable_->update_scale != nullptr; }

double PrecisionAdapter::update_scale(bool grads_finite, double scale) {
  if (vtable_->update_scale == nullptr) return scale;
  kiln_status* status =
      call_plugin([&] { return where("update_scale"); },
                  [&] { return vtable_->update_scale(instance_, grads_finite ? 1 : 0, &scale); });
  if (status != nullptr) check(status, "precision '" + name_ + "' update_scale");
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    throw ComponentError(KILN_ERR_INTERNAL, "precision '" + name_ +
                                                "' update_scale produced a loss scale of " +
                                                std::to_string(scale) + " (must be finite, > 0)");
  }
  return scale;
}

PrecisionAdapter::~PrecisionAdapter() {
  if (instance_ == nullptr) return;
  call_plugin_noexcept([&] { return where("destroy"); }, [&] { vtable_->destroy(instance_); });
}

std::string PrecisionAdapter::where(const char* entry) const {
  return "precision '" + name_ + "' " + entry + " (" + library_ + ")";
}

// ---- model ------------------------------------------------------------------------------------

std::shared_ptr<kiln::Model> create_model(const Component& component,
                                          const config::OptionSet& options,
                                          const kiln_model_input& input,
                                          const NormFactory* norm_factory) {
  const auto* vt = vtable_of<kiln_model_vtable>(component);
  kiln_call_context ctx;
  ctx.norm_factory = norm_factory;
  kiln_model_input with_ctx = input;
  with_ctx.struct_size = sizeof(with_ctx);
  with_ctx.ctx = &ctx;
  kiln_torch_module* handle = nullptr;
  {
    const ModelCreateBinding binding(&ctx);  // for models that ask without the context (< 1.6)
    check_options(
        call_plugin([&] { return entry_of(component, "create"); },
                    [&] { return vt->create(host_api(), options.c_view(), &with_ctx, &handle); }),
        context(component, "could not be built"), kind_name(component.kind()));
  }
  if (handle == nullptr) {
    throw ComponentError(KILN_ERR_INTERNAL, context(component, "returned no module"));
  }
  std::shared_ptr<kiln::Model> model = kiln::model_from_handle(handle);
  call_plugin_noexcept([&] { return entry_of(component, "destroy"); },
                       [&] { vt->destroy(handle); });
  return model;
}

// ---- a model's own loss -----------------------------------------------------------------------

bool has_model_loss(const Component& component) {
  if (component.kind() != KILN_COMPONENT_MODEL) return false;
  const auto* vt = vtable_of<kiln_model_vtable>(component);
  return KILN_HAS_FIELD(vt, kiln_model_vtable, loss) && vt->loss != nullptr;
}

ModelLossAdapter::ModelLossAdapter(const Component& component, std::shared_ptr<kiln::Model> model,
                                   dist::ProcessGroup* group)
    : component_(component),
      name_(component.name()),
      vtable_(vtable_of<kiln_model_vtable>(component)),
      handle_(kiln::release_model(std::move(model))) {
  ctx_.group = group;
}

ModelLossAdapter::~ModelLossAdapter() { kiln::destroy_model_handle(handle_); }

at::Tensor ModelLossAdapter::operator()(const at::Tensor& output, const at::Tensor& target,
                                        bool training) const {
  at::Tensor loss;
  kiln_model_loss_args args{};
  args.struct_size = sizeof(args);
  args.training = training ? 1 : 0;
  args.ctx = &ctx_;
  args.output = kiln::tensor_handle(output);
  args.target = kiln::tensor_handle(target);
  args.loss = kiln::tensor_handle(loss);
  kiln_status* status = call_plugin([&] { return entry_of(component_, "loss"); },
                                    [&] { return vtable_->loss(handle_, &args); });
  if (status != nullptr) check(status, context(component_, "loss"));
  // Metadata only: no read-back, so the step stays asynchronous.
  if (!loss.defined() || loss.numel() != 1 || !at::isFloatingType(loss.scalar_type()) ||
      loss.device() != output.device()) {
    throw ComponentError(
        KILN_ERR_INTERNAL,
        context(component_, "loss") +
            " gave no floating scalar tensor on the output's device (kiln::set_tensor(args->loss, "
            "...) with the batch's mean loss)");
  }
  return loss.scalar_type() == at::kFloat ? loss.reshape({}) : loss.reshape({}).to(at::kFloat);
}

}  // namespace kiln::plugin
