// Cache-blocked sweeps for the optimizers that follow torch's _multi_tensor_* order of _foreach
// ops (header-only, beside multi_tensor.hpp).
//
// One _foreach op over a whole group streams every value through memory before the next op
// starts: ResNet-50's 25.5 M values are about 100 MB per list, so a ten-op update reads and
// writes each list from DRAM about ten times, and torch's per-parameter loop, which runs all of a
// tensor's ops while it is in cache, beats the multi-tensor order on a CPU. sweep_chunks() cuts a
// bucket into chunks of about kChunkElements values (small tensors whole and together, large ones
// as flat slices) and runs the whole update on one chunk at a time, the chunks shared among the
// intra-op threads with each chunk's ops on one thread. The ops are element-wise and every value
// sees the same ops with the same scalars as over the whole list, so the result is the same; the
// slices start on multiples of kChunkAlign values so that the vector kernels' lanes and tails fall
// where they fall over the whole tensor.
#ifndef KILN_PLUGINS_OPTIMIZER_COMMON_CHUNKED_HPP_
#define KILN_PLUGINS_OPTIMIZER_COMMON_CHUNKED_HPP_

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::optim {

// 512 KiB of float32 per list. Smaller chunks would fit a core's 2 MiB L2 with all their lists,
// but every op on a chunk costs a few microseconds of dispatch: on the 2-core VM of
// docs/benchmarks.md, Adadelta over ResNet-50 took 149, 132, 67, 58 and 62 ms a step with chunks
// of 16, 32, 64, 128 and 256 Ki values (bench/optimizer_step.py; torch's loop about 80 ms).
constexpr int64_t kChunkElements = int64_t{1} << 17;
// Slice boundaries in values: a multiple of every vector width ATen's CPU kernels use (their
// unrolled AVX-512 loop steps 32 float32 values).
constexpr int64_t kChunkAlign = 64;

// One piece of a chunk: the values [offset, offset + length) of the bucket's tensor `tensor`, or
// all of it when `whole`.
struct ChunkPiece {
  size_t tensor;
  int64_t offset;
  int64_t length;
  bool whole;
};

// Whether every list's tensor at `i` can be cut into flat slices that correspond value by value:
// all on the CPU, dense, with the sizes and strides of the first list's.
inline bool sliceable(const std::vector<std::vector<at::Tensor>*>& lists, size_t i) {
  const at::Tensor& first = (*lists.front())[i];
  for (const std::vector<at::Tensor>* list : lists) {
    const at::Tensor& t = (*list)[i];
    if (!t.is_cpu() || !t.is_non_overlapping_and_dense() || t.sizes() != first.sizes() ||
        t.strides() != first.strides()) {
      return false;
    }
  }
  return true;
}

// The chunks of a bucket whose tensors are all on the CPU, in order. A tensor larger than
// `chunk` values (and sliceable) is cut into slices of `chunk` values, each a chunk of its own,
// and its last slice joins the tensors after it; smaller tensors are gathered until the next
// would pass `chunk`.
inline std::vector<std::vector<ChunkPiece>> plan_chunks(
    const std::vector<std::vector<at::Tensor>*>& lists, int64_t chunk) {
  chunk = std::max(kChunkAlign, chunk / kChunkAlign * kChunkAlign);
  std::vector<std::vector<ChunkPiece>> chunks;
  std::vector<ChunkPiece> open;
  int64_t open_values = 0;
  auto add = [&](ChunkPiece piece) {
    if (open_values > 0 && open_values + piece.length > chunk) {
      chunks.push_back(std::move(open));
      open.clear();
      open_values = 0;
    }
    open.push_back(piece);
    open_values += piece.length;
  };
  const size_t n = lists.front()->size();
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = (*lists.front())[i].numel();
    if (numel <= chunk || !sliceable(lists, i)) {
      add({i, 0, numel, true});
      continue;
    }
    int64_t offset = 0;
    for (; numel - offset > chunk; offset += chunk) chunks.push_back({{i, offset, chunk, false}});
    add({i, offset, numel - offset, false});
  }
  if (!open.empty()) chunks.push_back(std::move(open));
  return chunks;
}

// `t`'s values [offset, offset + length) in memory order, as a 1-D view.
inline at::Tensor flat_slice(const at::Tensor& t, int64_t offset, int64_t length) {
  return t.as_strided({length}, {1}, t.storage_offset() + offset);
}

// The per-tensor values `values` of a chunk's pieces (`which`: their tensors' bucket positions),
// as a ScalarList for the _foreach ops.
inline std::vector<at::Scalar> chunk_scalars(const std::vector<double>& values,
                                             const std::vector<size_t>& which) {
  std::vector<at::Scalar> out;
  out.reserve(which.size());
  for (size_t i : which) out.emplace_back(values[i]);
  return out;
}

// Runs `update(lists, tensors)` over `lists` (parallel lists of one bucket's tensors: the
// parameters, their gradients, their state) one chunk at a time. `update` gets each list cut to
// the chunk and, per piece, the bucket position of its tensor (to pick per-tensor scalars); it
// must only run element-wise ops on them. Off the CPU the bucket is one chunk: the device's
// multi-tensor kernels already take the whole list in one launch.
template <typename Update>
void sweep_chunks(const std::vector<std::vector<at::Tensor>*>& lists, Update&& update,
                  int64_t chunk = kChunkElements) {
  const size_t n = lists.front()->size();
  if (n == 0) return;
  bool on_cpu = true;
  for (const at::Tensor& t : *lists.front()) on_cpu = on_cpu && t.is_cpu();
  if (!on_cpu) {
    std::vector<std::vector<at::Tensor>> whole;
    for (const std::vector<at::Tensor>* list : lists) whole.push_back(*list);
    std::vector<size_t> tensors(n);
    for (size_t i = 0; i < n; ++i) tensors[i] = i;
    update(whole, tensors);
    return;
  }
  const std::vector<std::vector<ChunkPiece>> chunks = plan_chunks(lists, chunk);
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    // The intra-op workers start with grad mode on; the updates write leaves that need grads.
    const c10::NoGradGuard no_grad;
    for (int64_t c = begin; c < end; ++c) {
      std::vector<std::vector<at::Tensor>> cut(lists.size());
      std::vector<size_t> tensors;
      for (const ChunkPiece& piece : chunks[static_cast<size_t>(c)]) {
        tensors.push_back(piece.tensor);
        for (size_t l = 0; l < lists.size(); ++l) {
          const at::Tensor& t = (*lists[l])[piece.tensor];
          cut[l].push_back(piece.whole ? t : flat_slice(t, piece.offset, piece.length));
        }
      }
      update(cut, tensors);
    }
  });
}

}  // namespace kiln::optim

#endif  // KILN_PLUGINS_OPTIMIZER_COMMON_CHUNKED_HPP_
