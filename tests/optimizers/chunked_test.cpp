// kiln::optim::sweep_chunks (plugins/optimizer/common/chunked.hpp): an update run chunk by chunk
// gives bit for bit what it gives over the whole lists, with tensors larger than a chunk (cut into
// slices, their last slice sharing a chunk with the next tensors), channels_last tensors (sliced
// in memory order), tensors that cannot be sliced (a transposed view, stepped whole), per-tensor
// scalars picked by the chunk's tensor positions, and a tensor of zero values. The chunk is made
// small here so that a few thousand values take every path that ResNet-50 takes at full size.
#include "common/chunked.hpp"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::optim {
namespace {

// Parameters, gradients and two state lists alike: row-major tensors of several sizes around the
// chunk, a channels_last one, a transposed (non-dense-in-order but dense) view, and an empty one.
struct Lists {
  std::vector<at::Tensor> p, g, m, v;
};

at::Tensor shaped(const std::vector<int64_t>& sizes, int kind) {
  at::Tensor t = at::randn(sizes, at::kFloat);
  if (kind == 1) return t.contiguous(at::MemoryFormat::ChannelsLast);
  if (kind == 2) return t.t();  // dense, but its strides differ from a fresh gradient's
  return t;
}

Lists make_lists() {
  at::manual_seed(7);
  struct Spec {
    std::vector<int64_t> sizes;
    int kind;
  };
  const std::vector<Spec> specs = {{{3}, 0},         {{1000}, 0},       {{70, 50}, 0},
                                   {{0}, 0},         {{4, 8, 5, 5}, 1}, {{90, 40}, 2},
                                   {{17, 3, 31}, 0}, {{513}, 0},        {{2, 2}, 0}};
  Lists l;
  for (const Spec& s : specs) {
    l.p.push_back(shaped(s.sizes, s.kind));
    // Gradients and state in the parameter's memory format (row-major for the transposed one).
    l.g.push_back(
        at::randn(l.p.back().sizes(), at::kFloat).contiguous(l.p.back().suggest_memory_format()));
    l.m.push_back(at::randn(l.p.back().sizes(), at::kFloat)
                      .abs()
                      .contiguous(l.p.back().suggest_memory_format()));
    l.v.push_back(at::randn(l.p.back().sizes(), at::kFloat)
                      .abs()
                      .contiguous(l.p.back().suggest_memory_format()));
  }
  return l;
}

Lists copy(const Lists& l) {
  Lists out;
  for (size_t i = 0; i < l.p.size(); ++i) {
    out.p.push_back(l.p[i].clone(at::MemoryFormat::Preserve));
    out.g.push_back(l.g[i].clone(at::MemoryFormat::Preserve));
    out.m.push_back(l.m[i].clone(at::MemoryFormat::Preserve));
    out.v.push_back(l.v[i].clone(at::MemoryFormat::Preserve));
  }
  return out;
}

// An Adam-like update with a temporary, in-place ops and per-tensor scalars.
void update(const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>& which,
            const std::vector<double>& step_size) {
  const std::vector<at::Tensor>&p = l[0], &m = l[2], &v = l[3];
  const std::vector<at::Tensor> g = at::_foreach_add(l[1], p, 0.01);
  at::_foreach_lerp_(m, g, 0.1);
  at::_foreach_mul_(v, 0.999);
  at::_foreach_addcmul_(v, g, g, 0.001);
  std::vector<at::Tensor> denom = at::_foreach_sqrt(v);
  at::_foreach_add_(denom, 1e-8);
  at::_foreach_addcdiv_(p, m, denom, chunk_scalars(step_size, which));
}

std::vector<double> step_sizes(size_t n) {
  std::vector<double> out;
  for (size_t i = 0; i < n; ++i) out.push_back(-1e-3 * static_cast<double>(i + 1) / 3.0);
  return out;
}

void expect_equal(const Lists& a, const Lists& b) {
  for (size_t i = 0; i < a.p.size(); ++i) {
    EXPECT_TRUE(at::equal(a.p[i], b.p[i])) << "parameter " << i;
    EXPECT_TRUE(at::equal(a.m[i], b.m[i])) << "first state of " << i;
    EXPECT_TRUE(at::equal(a.v[i], b.v[i])) << "second state of " << i;
  }
}

TEST(ChunkedSweep, EqualsTheWholeListsBitForBitAtEveryChunkSize) {
  const Lists start = make_lists();
  const std::vector<double> sizes = step_sizes(start.p.size());
  Lists whole = copy(start);
  std::vector<size_t> all(start.p.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  for (int step = 0; step < 3; ++step) update({whole.p, whole.g, whole.m, whole.v}, all, sizes);

  for (int64_t chunk : {64, 128, 1000, 2048, 1 << 20}) {
    Lists cut = copy(start);
    for (int step = 0; step < 3; ++step) {
      sweep_chunks(
          {&cut.p, &cut.g, &cut.m, &cut.v},
          [&](const std::vector<std::vector<at::Tensor>>& l, const std::vector<size_t>& which) {
            update(l, which, sizes);
          },
          chunk);
    }
    SCOPED_TRACE("chunk of " + std::to_string(chunk) + " values");
    expect_equal(whole, cut);
  }
}

TEST(ChunkedSweep, PlanCutsLargeTensorsAndKeepsUnsliceableOnesWhole) {
  Lists l = make_lists();
  const std::vector<std::vector<ChunkPiece>> chunks = plan_chunks({&l.p, &l.g, &l.m, &l.v}, 128);
  std::vector<int64_t> covered(l.p.size(), 0);
  for (const auto& chunk : chunks) {
    int64_t values = 0;
    for (const ChunkPiece& piece : chunk) {
      values += piece.length;
      covered[piece.tensor] += piece.length;
      if (!piece.whole) {
        EXPECT_EQ(piece.offset % kChunkAlign, 0) << "tensor " << piece.tensor;
      }
      // The transposed parameter (position 5) has other strides than its gradient: whole.
      if (piece.tensor == 5) {
        EXPECT_TRUE(piece.whole);
      }
    }
    // Only a piece that is whole and alone may pass the chunk.
    if (chunk.size() > 1 || !chunk.front().whole) {
      EXPECT_LE(values, 128);
    }
  }
  for (size_t i = 0; i < l.p.size(); ++i) EXPECT_EQ(covered[i], l.p[i].numel()) << "tensor " << i;
}

TEST(ChunkedSweep, ChunksRunOnTheIntraOpThreadsWithoutGradMode) {
  Lists l = make_lists();
  for (at::Tensor& p : l.p) p.requires_grad_(true);
  // In-place ops on leaves that need grads fail under grad mode: the sweep must turn it off on
  // every thread it runs a chunk on, not just the caller's.
  std::set<bool> grad_mode_seen;
  std::mutex seen;
  sweep_chunks(
      {&l.p, &l.g},
      [&](const std::vector<std::vector<at::Tensor>>& c, const std::vector<size_t>&) {
        {
          const std::lock_guard<std::mutex> lock(seen);
          grad_mode_seen.insert(c10::GradMode::is_enabled());
        }
        at::_foreach_add_(c[0], c[1], -0.1);
      },
      64);
  EXPECT_EQ(grad_mode_seen, std::set<bool>{false});
}

TEST(ChunkedSweep, AnErrorInAChunkReachesTheCaller) {
  Lists l = make_lists();
  EXPECT_THROW(
      sweep_chunks(
          {&l.p, &l.g},
          [&](const std::vector<std::vector<at::Tensor>>&, const std::vector<size_t>& which) {
            for (size_t i : which) {
              if (i == 6) throw std::runtime_error("chunk failed");
            }
          },
          64),
      std::runtime_error);
}

}  // namespace
}  // namespace kiln::optim
