#include "fused_cpu.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

// The loops are written on GCC's vector extension (16 float lanes, lowered to whatever the
// clone's instruction set has) and compiled once per x86-64 level, picked at load time: the
// library itself is built for the baseline, where these loops would be four times narrower.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The helpers pass 64-byte vectors by value; they are internal and inlined, so the calling
// convention GCC warns about never crosses a library boundary.
#pragma GCC diagnostic ignored "-Wpsabi"
#define KILN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KILN_CLONES
#endif

namespace kiln::norm::fused {
namespace {

using Vec = float __attribute__((vector_size(64)));
using Half = float __attribute__((vector_size(32)));
using Wide = double __attribute__((vector_size(64)));  // 8 doubles: half a Vec's lanes
constexpr int64_t kLanes = 16;
// Float lanes sum at most this many values each before they are added into doubles: float sums
// of a few dozen values stay within a few ulps, so a layer's statistics are as accurate as
// ATen's whatever the batch size.
constexpr int64_t kLaneValues = 64;
constexpr int64_t kFlushValues = kLaneValues * kLanes;  // per channel plane
// Rows of a channels-last block (each lane sums one value per row).
constexpr int64_t kBlockRows = kLaneValues;

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
inline Vec splat(float f) { return Vec{} + f; }
// x > 0 ? x : x · slope, lane by lane (NaN stays NaN, as torch's relu and leaky_relu).
inline Vec act(Vec x, Vec slope) { return x > 0.0F ? x : x * slope; }
inline float act(float x, float slope) { return x > 0.0F ? x : x * slope; }

// A float Vec added lane by lane into two double accumulators (lanes 0-7, 8-15).
struct WideSum {
  Wide lo{}, hi{};
  void add(Vec v) {
    Half l, h;
    std::memcpy(&l, &v, sizeof l);
    std::memcpy(&h, reinterpret_cast<const char*>(&v) + sizeof l, sizeof h);
    lo += __builtin_convertvector(l, Wide);
    hi += __builtin_convertvector(h, Wide);
  }
  double total() const {
    double s = 0.0;
    for (int i = 0; i < 8; ++i) s += lo[i] + hi[i];
    return s;
  }
  // Adds the 16 lanes into out[0..15].
  void add_to(double* out) const {
    Wide a, b;
    std::memcpy(&a, out, sizeof a);
    std::memcpy(&b, out + 8, sizeof b);
    a += lo;
    b += hi;
    std::memcpy(out, &a, sizeof a);
    std::memcpy(out + 8, &b, sizeof b);
  }
};

// ---- channel planes (NCHW): one channel's `inner` values per sample, samples `stride` apart ----

KILN_CLONES void plane_sums(const float* x, int64_t n, int64_t stride, int64_t inner, float k,
                            double* s_out, double* q_out) {
  WideSum s, q;
  double ts = 0.0, tq = 0.0;  // the tails
  const Vec kv = splat(k);
  for (int64_t i = 0; i < n; ++i) {
    const float* p = x + i * stride;
    int64_t j = 0;
    while (j + kLanes <= inner) {
      const int64_t end = std::min(inner - kLanes, j + kFlushValues - kLanes);
      Vec vs{}, vq{};
      for (; j <= end; j += kLanes) {
        const Vec d = load(p + j) - kv;
        vs += d;
        vq += d * d;
      }
      s.add(vs);
      q.add(vq);
    }
    for (; j < inner; ++j) {
      const double d = p[j] - k;
      ts += d;
      tq += d * d;
    }
  }
  *s_out = s.total() + ts;
  *q_out = q.total() + tq;
}

KILN_CLONES void plane_normalise(const float* x, float* y, int64_t inner, float mean, float scale,
                                 float bias, float slope) {
  const Vec m = splat(mean), a = splat(scale), b = splat(bias), sl = splat(slope);
  int64_t j = 0;
  for (; j + kLanes <= inner; j += kLanes) store(y + j, act((load(x + j) - m) * a + b, sl));
  for (; j < inner; ++j) y[j] = act((x[j] - mean) * scale + bias, slope);
}

KILN_CLONES void plane_grad_sums(const float* dy, const float* x, int64_t n, int64_t stride,
                                 int64_t inner, float scale, float bias, float slope, float mean,
                                 double* s_out, double* q_out) {
  WideSum s, q;
  double ts = 0.0, tq = 0.0;
  const Vec a = splat(scale), b = splat(bias), sl = splat(slope), m = splat(mean);
  const Vec one = splat(1.0F);
  for (int64_t i = 0; i < n; ++i) {
    const float* g = dy + i * stride;
    const float* p = x + i * stride;
    int64_t j = 0;
    while (j + kLanes <= inner) {
      const int64_t end = std::min(inner - kLanes, j + kFlushValues - kLanes);
      Vec vs{}, vq{};
      for (; j <= end; j += kLanes) {
        const Vec xv = load(p + j);
        const Vec dz = load(g + j) * ((xv - m) * a + b > 0.0F ? one : sl);
        vs += dz;
        vq += dz * (xv - m);
      }
      s.add(vs);
      q.add(vq);
    }
    for (; j < inner; ++j) {
      const float dz = g[j] * ((p[j] - mean) * scale + bias > 0.0F ? 1.0F : slope);
      ts += dz;
      tq += static_cast<double>(dz) * (p[j] - mean);
    }
  }
  *s_out = s.total() + ts;
  *q_out = q.total() + tq;
}

KILN_CLONES void plane_grad_input(const float* dy, const float* x, float* dx, int64_t inner,
                                  float scale, float bias, float slope, float mean, float ca,
                                  float cb, float cc) {
  const Vec a = splat(scale), b = splat(bias), sl = splat(slope), one = splat(1.0F);
  const Vec m = splat(mean), va = splat(ca), vb = splat(cb), vc = splat(cc);
  int64_t j = 0;
  for (; j + kLanes <= inner; j += kLanes) {
    const Vec xv = load(x + j);
    const Vec dz = load(dy + j) * ((xv - m) * a + b > 0.0F ? one : sl);
    store(dx + j, dz * va + (xv - m) * vb + vc);
  }
  for (; j < inner; ++j) {
    const float dz = dy[j] * ((x[j] - mean) * scale + bias > 0.0F ? 1.0F : slope);
    dx[j] = dz * ca + (x[j] - mean) * cb + cc;
  }
}

// ---- channels-last rows: C values per row ------------------------------------------------------
// Rows go in blocks of kBlockRows; within a block each group of 16 channels is swept down the
// rows with its per-channel values held in registers (the block stays in L1 between groups).
// Channels past the last full group (C % 16) take scalar loops.

// Sums over rows [r0, r1) into s and q (per channel, added to): Σ (x − k) and Σ (x − k)².
KILN_CLONES void rows_sums(const float* x, int64_t r0, int64_t r1, int64_t c, const float* k,
                           double* s, double* q) {
  for (int64_t b0 = r0; b0 < r1; b0 += kBlockRows) {
    const int64_t b1 = std::min(r1, b0 + kBlockRows);
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const Vec kv = load(k + ch);
      Vec vs{}, vq{};
      for (int64_t r = b0; r < b1; ++r) {
        const Vec d = load(x + r * c + ch) - kv;
        vs += d;
        vq += d * d;
      }
      WideSum ws, wq;
      ws.add(vs);
      wq.add(vq);
      ws.add_to(s + ch);
      wq.add_to(q + ch);
    }
    for (; ch < c; ++ch) {
      double ts = 0.0, tq = 0.0;
      for (int64_t r = b0; r < b1; ++r) {
        const double d = x[r * c + ch] - k[ch];
        ts += d;
        tq += d * d;
      }
      s[ch] += ts;
      q[ch] += tq;
    }
  }
}

KILN_CLONES void rows_normalise(const float* x, float* y, int64_t r0, int64_t r1, int64_t c,
                                const float* mean, const float* scale, const float* bias,
                                float slope) {
  const Vec sl = splat(slope);
  for (int64_t b0 = r0; b0 < r1; b0 += kBlockRows) {
    const int64_t b1 = std::min(r1, b0 + kBlockRows);
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const Vec m = load(mean + ch), a = load(scale + ch), b = load(bias + ch);
      for (int64_t r = b0; r < b1; ++r) {
        store(y + r * c + ch, act((load(x + r * c + ch) - m) * a + b, sl));
      }
    }
    for (; ch < c; ++ch) {
      for (int64_t r = b0; r < b1; ++r) {
        y[r * c + ch] = act((x[r * c + ch] - mean[ch]) * scale[ch] + bias[ch], slope);
      }
    }
  }
}

KILN_CLONES void rows_grad_sums(const float* dy, const float* x, int64_t r0, int64_t r1, int64_t c,
                                const float* scale, const float* bias, float slope,
                                const float* mean, double* s, double* q) {
  const Vec sl = splat(slope), one = splat(1.0F);
  for (int64_t b0 = r0; b0 < r1; b0 += kBlockRows) {
    const int64_t b1 = std::min(r1, b0 + kBlockRows);
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const Vec a = load(scale + ch), b = load(bias + ch), m = load(mean + ch);
      Vec vs{}, vq{};
      for (int64_t r = b0; r < b1; ++r) {
        const Vec xv = load(x + r * c + ch);
        const Vec dz = load(dy + r * c + ch) * ((xv - m) * a + b > 0.0F ? one : sl);
        vs += dz;
        vq += dz * (xv - m);
      }
      WideSum ws, wq;
      ws.add(vs);
      wq.add(vq);
      ws.add_to(s + ch);
      wq.add_to(q + ch);
    }
    for (; ch < c; ++ch) {
      double ts = 0.0, tq = 0.0;
      for (int64_t r = b0; r < b1; ++r) {
        const float xv = x[r * c + ch];
        const float dz =
            dy[r * c + ch] * ((xv - mean[ch]) * scale[ch] + bias[ch] > 0.0F ? 1.0F : slope);
        ts += dz;
        tq += static_cast<double>(dz) * (xv - mean[ch]);
      }
      s[ch] += ts;
      q[ch] += tq;
    }
  }
}

KILN_CLONES void rows_grad_input(const float* dy, const float* x, float* dx, int64_t r0, int64_t r1,
                                 int64_t c, const float* scale, const float* bias, float slope,
                                 const float* mean, const float* ca, const float* cb,
                                 const float* cc) {
  const Vec sl = splat(slope), one = splat(1.0F);
  for (int64_t b0 = r0; b0 < r1; b0 += kBlockRows) {
    const int64_t b1 = std::min(r1, b0 + kBlockRows);
    int64_t ch = 0;
    for (; ch + kLanes <= c; ch += kLanes) {
      const Vec a = load(scale + ch), b = load(bias + ch), m = load(mean + ch);
      const Vec va = load(ca + ch), vb = load(cb + ch), vc = load(cc + ch);
      for (int64_t r = b0; r < b1; ++r) {
        const Vec xv = load(x + r * c + ch);
        const Vec dz = load(dy + r * c + ch) * ((xv - m) * a + b > 0.0F ? one : sl);
        store(dx + r * c + ch, dz * va + (xv - m) * vb + vc);
      }
    }
    for (; ch < c; ++ch) {
      for (int64_t r = b0; r < b1; ++r) {
        const float xv = x[r * c + ch];
        const float dz =
            dy[r * c + ch] * ((xv - mean[ch]) * scale[ch] + bias[ch] > 0.0F ? 1.0F : slope);
        dx[r * c + ch] = dz * ca[ch] + (xv - mean[ch]) * cb[ch] + cc[ch];
      }
    }
  }
}

// Grain of the parallel loops: below about this many values a thread costs more than it saves.
constexpr int64_t kGrainFloats = 32768;

// Rows split into one range per thread; fn(task, r0, r1) sums into the task's own partials.
template <typename Fn>
int64_t for_row_tasks(int64_t rows, int64_t c, const Fn& fn) {
  const int64_t by_size = std::max<int64_t>(1, rows * c / kGrainFloats);
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), by_size));
  const int64_t per = (rows + tasks - 1) / tasks;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) fn(t, t * per, std::min(rows, (t + 1) * per));
  });
  return tasks;
}

// The two per-channel sums of a reducing pass, s and q (set, not added to): channels-last rows
// split into one range per thread, each summing into its own partials with
// rows(r0, r1, s_part, q_part); NCHW planes one channel at a time with plane(ch, &s, &q).
template <typename Rows, typename Plane>
void channel_sums(const Layout& l, const Rows& rows, const Plane& plane, double* s, double* q) {
  const int64_t c = l.channels;
  std::fill(s, s + c, 0.0);
  std::fill(q, q + c, 0.0);
  if (l.channels_last) {
    std::vector<double> partials(2 * c * std::max<int64_t>(1, at::get_num_threads()), 0.0);
    const int64_t tasks = for_row_tasks(l.rows(), c, [&](int64_t t, int64_t r0, int64_t r1) {
      rows(r0, r1, &partials[t * 2 * c], &partials[(t * 2 + 1) * c]);
    });
    for (int64_t t = 0; t < tasks; ++t) {
      for (int64_t ch = 0; ch < c; ++ch) {
        s[ch] += partials[(t * 2) * c + ch];
        q[ch] += partials[(t * 2 + 1) * c + ch];
      }
    }
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / std::max<int64_t>(1, l.rows()));
  at::parallel_for(0, c, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t ch = c0; ch < c1; ++ch) plane(ch, &s[ch], &q[ch]);
  });
}

}  // namespace

bool layout_of(const at::Tensor& x, std::initializer_list<at::Tensor> same, Layout& out) {
  if (x.dim() < 2 || !x.device().is_cpu() || x.scalar_type() != at::kFloat) return false;
  for (const at::Tensor& t : same) {
    if (!t.defined() || !t.device().is_cpu() || t.scalar_type() != at::kFloat ||
        t.sizes() != x.sizes() || t.strides() != x.strides()) {
      return false;
    }
  }
  Layout l;
  l.n = x.size(0);
  l.channels = x.size(1);
  l.inner = 1;
  for (int64_t d = 2; d < x.dim(); ++d) l.inner *= x.size(d);
  if (x.is_contiguous()) {
    l.channels_last = l.inner == 1;  // N x C: rows, the faster loop over channels
  } else if ((x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
             (x.dim() == 5 && x.is_contiguous(at::MemoryFormat::ChannelsLast3d))) {
    l.channels_last = true;
  } else {
    return false;
  }
  out = l;
  return true;
}

void moments(const float* x, const Layout& l, double* mean, double* m2) {
  const int64_t c = l.channels;
  std::vector<double> s(c, 0.0), q(c, 0.0);
  // Sums of x − k with k a value of the channel: shifted sums keep E[x²] − E[x]² from cancelling
  // when the mean is large against the spread.
  std::vector<float> k(c, 0.0F);
  if (l.n > 0 && l.inner > 0) {
    for (int64_t ch = 0; ch < c; ++ch) k[ch] = l.channels_last ? x[ch] : x[ch * l.inner];
  }
  channel_sums(
      l,
      [&](int64_t r0, int64_t r1, double* sp, double* qp) {
        rows_sums(x, r0, r1, c, k.data(), sp, qp);
      },
      [&](int64_t ch, double* sp, double* qp) {
        plane_sums(x + ch * l.inner, l.n, c * l.inner, l.inner, k[ch], sp, qp);
      },
      s.data(), q.data());
  const double n = l.count();
  for (int64_t ch = 0; ch < c; ++ch) {
    if (n == 0) {
      mean[ch] = m2[ch] = 0.0;
      continue;
    }
    const double d = s[ch] / n;
    mean[ch] = k[ch] + d;
    m2[ch] = std::max(0.0, q[ch] - s[ch] * d);
  }
}

void normalise(const float* x, float* y, const Layout& l, const float* mean, const float* scale,
               const float* bias, float slope) {
  const int64_t c = l.channels;
  if (l.channels_last) {
    const int64_t grain = std::max<int64_t>(1, kGrainFloats / std::max<int64_t>(1, c));
    at::parallel_for(0, l.rows(), grain, [&](int64_t r0, int64_t r1) {
      rows_normalise(x, y, r0, r1, c, mean, scale, bias, slope);
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / std::max<int64_t>(1, l.inner));
  at::parallel_for(0, l.n * c, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t ch = p % c;
      plane_normalise(x + p * l.inner, y + p * l.inner, l.inner, mean[ch], scale[ch], bias[ch],
                      slope);
    }
  });
}

void grad_sums(const float* dy, const float* x, const Layout& l, const float* scale,
               const float* bias, float slope, const float* mean, double* sum_dz,
               double* sum_dz_xc) {
  const int64_t c = l.channels;
  channel_sums(
      l,
      [&](int64_t r0, int64_t r1, double* sp, double* qp) {
        rows_grad_sums(dy, x, r0, r1, c, scale, bias, slope, mean, sp, qp);
      },
      [&](int64_t ch, double* sp, double* qp) {
        plane_grad_sums(dy + ch * l.inner, x + ch * l.inner, l.n, c * l.inner, l.inner, scale[ch],
                        bias[ch], slope, mean[ch], sp, qp);
      },
      sum_dz, sum_dz_xc);
}

void grad_input(const float* dy, const float* x, float* dx, const Layout& l, const float* scale,
                const float* bias, float slope, const float* mean, const float* a, const float* b,
                const float* c) {
  const int64_t ch_count = l.channels;
  if (l.channels_last) {
    const int64_t grain = std::max<int64_t>(1, kGrainFloats / std::max<int64_t>(1, ch_count));
    at::parallel_for(0, l.rows(), grain, [&](int64_t r0, int64_t r1) {
      rows_grad_input(dy, x, dx, r0, r1, ch_count, scale, bias, slope, mean, a, b, c);
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrainFloats / std::max<int64_t>(1, l.inner));
  at::parallel_for(0, l.n * ch_count, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t ch = p % ch_count;
      plane_grad_input(dy + p * l.inner, x + p * l.inner, dx + p * l.inner, l.inner, scale[ch],
                       bias[ch], slope, mean[ch], a[ch], b[ch], c[ch]);
    }
  });
}

}  // namespace kiln::norm::fused
