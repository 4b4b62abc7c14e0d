// Compiled with OpenMP (host/CMakeLists.txt): ATen's parallel_for is inline and runs its loop
// on the calling thread alone in a translation unit without it.
#include "engine/cpu_grad_norm.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "engine/sum_of_squares.hpp"

namespace kiln::engine {

double cpu_float_norm2(const std::vector<at::Tensor>& grads) {
  constexpr int64_t kChunk = 1 << 14;  // elements per task
  std::vector<std::pair<const float*, int64_t>> chunks;
  int64_t total_elements = 0;
  for (const auto& g : grads) {
    const float* data = g.const_data_ptr<float>();
    const int64_t n = g.numel();
    total_elements += n;
    for (int64_t start = 0; start < n; start += kChunk) {
      chunks.emplace_back(data + start, std::min(kChunk, n - start));
    }
  }
  std::vector<double> partial(chunks.size(), 0.0);
  auto sum_chunks = [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      partial[c] = sum_of_squares(chunks[c].first, chunks[c].second);
    }
  };
  // Below a few chunks' worth, waking the other threads costs more than the pass.
  const auto count = static_cast<int64_t>(chunks.size());
  if (total_elements < 2 * kChunk) {
    sum_chunks(0, count);
  } else {
    at::parallel_for(0, count, 1, sum_chunks);
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return std::sqrt(total);
}

}  // namespace kiln::engine
