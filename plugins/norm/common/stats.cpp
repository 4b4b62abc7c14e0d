#include "stats.hpp"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <string>

#include "fused_cpu.hpp"

namespace kiln::norm {

at::Tensor optional_view(const DLTensor* t) {
  return t != nullptr ? kiln::as_tensor(*t) : at::Tensor();
}

void check_input(const at::Tensor& x, int64_t features, const char* plugin) {
  if (x.dim() < 2 || x.size(1) != features) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": expected input N x " + std::to_string(features) +
                    " x ..., got " + std::to_string(x.dim()) + "-d input with " +
                    (x.dim() >= 2 ? std::to_string(x.size(1)) : std::string("no")) + " channels");
  }
}

std::vector<int64_t> reduce_dims(const at::Tensor& x) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

at::Tensor per_channel(const at::Tensor& v, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = v.numel();
  return v.view(shape);
}

void for_each_chunk(const at::Tensor& x, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = x.size(0);
  if (n == 0) return;
  const int64_t per_sample = std::max<int64_t>(1, x.numel() / n);
  const int64_t step = std::max<int64_t>(1, kChunkElements / per_sample);
  for (int64_t first = 0; first < n; first += step) fn(first, std::min(step, n - first));
}

at::Tensor channel_f32(const DLTensor* t, int64_t channels, double fallback,
                       const at::Tensor& like) {
  auto options = like.options().dtype(at::kFloat);
  if (t == nullptr) return at::full({channels}, fallback, options);
  return kiln::as_tensor(*t).to(options);
}

Moments local_moments(const at::Tensor& x) {
  const int64_t channels = x.size(1);
  const auto options = x.options().dtype(at::kDouble);
  Moments total;
  total.mean = at::zeros({channels}, options);
  total.m2 = at::zeros({channels}, options);
  if (x.numel() == 0) return total;
  const std::vector<int64_t> dims = reduce_dims(x);
  // Adds one part's moments to the total with the two-part form of Chan's formula.
  auto add = [&](const at::Tensor& part) {
    auto [var_f, mean_f] = at::var_mean(part, dims, /*unbiased=*/false, /*keepdim=*/false);
    at::Tensor var = var_f.to(at::kDouble), mean = mean_f.to(at::kDouble);
    const int64_t count_per_channel = part.numel() / channels;  // exact
    const double n = static_cast<double>(count_per_channel);
    if (total.count == 0) {
      total = Moments{n, mean, var * n};
      return;
    }
    const double sum = total.count + n;
    at::Tensor delta = mean - total.mean;
    total.mean = total.mean + delta * (n / sum);
    total.m2 = total.m2 + var * n + delta.square() * (total.count * n / sum);
    total.count = sum;
  };
  fused::Layout l;
  if (fused::layout_of(x, {}, l)) {
    // Float32 on the CPU, dense: one pass of the fused kernels (fused_cpu.hpp).
    total.count = l.count();
    fused::moments(x.data_ptr<float>(), l, total.mean.data_ptr<double>(),
                   total.m2.data_ptr<double>());
  } else if (x.scalar_type() == at::kFloat) {
    add(x);  // Welford over the whole batch, no temporary
  } else {
    // Half inputs: float32 copies of one chunk at a time.
    for_each_chunk(
        x, [&](int64_t first, int64_t count) { add(x.narrow(0, first, count).to(at::kFloat)); });
  }
  return total;
}

at::Tensor pack(const Moments& m) {
  at::Tensor count = at::full({1}, m.count, m.mean.options());
  return at::cat({count, m.mean, m.m2}).to(at::kFloat);
}

Moments combine(const at::Tensor& packed_rows) {
  at::Tensor rows = packed_rows.to(at::kDouble);
  const int64_t channels = (rows.size(1) - 1) / 2;
  at::Tensor counts = rows.select(1, 0);
  Moments out;
  out.count = counts.sum().item<double>();
  at::Tensor means = rows.narrow(1, 1, channels);
  at::Tensor m2s = rows.narrow(1, 1 + channels, channels);
  if (out.count == 0) {
    out.mean = at::zeros({channels}, rows.options());
    out.m2 = at::zeros({channels}, rows.options());
    return out;
  }
  at::Tensor n = counts.unsqueeze(1);
  out.mean = (means * (n / out.count)).sum(0);
  out.m2 = m2s.sum(0) + (n * (means - out.mean).square()).sum(0);
  return out;
}

void update_running(const at::Tensor& running_mean, const at::Tensor& running_var, const Moments& m,
                    double momentum) {
  if (running_mean.defined()) {
    running_mean.copy_(running_mean.to(at::kDouble) * (1.0 - momentum) + m.mean * momentum);
  }
  if (running_var.defined()) {
    at::Tensor unbiased = m.m2 / (m.count - 1.0);
    running_var.copy_(running_var.to(at::kDouble) * (1.0 - momentum) + unbiased * momentum);
  }
}

void check_count(const Moments& m, const at::Tensor& x, int32_t world, const char* plugin) {
  if (m.count <= 1) {
    std::string shape;
    for (int64_t d = 0; d < x.dim(); ++d) shape += (d ? " x " : "") + std::to_string(x.size(d));
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": expected more than 1 value per channel when training, " +
                    "got " + std::to_string(static_cast<int64_t>(m.count)) + " over " +
                    std::to_string(world) + " rank(s) (this rank's input " + shape +
                    "); batch statistics need at least two values");
  }
}

}  // namespace kiln::norm
