// The building blocks of the native engine's CPU attention kernels (decode_attention.cpp, prefill_attention.cpp):
// blocks of 16 keys, each block transposed (D x 16; with AVX512-BF16, bfloat16 keys as (D / 2, 16, 2)), scored
// for up to QB queries at once; an online softmax per query (a running max and sum); the values' weighted sum for
// several queries per value row read. With AVX-512 (-march=native on a CPU that has it) the loops are intrinsics;
// elsewhere plain loops that the compiler vectorises as it can. exp is Cephes' expf polynomial (~1 ulp) with the
// power of two by scalef.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace atgrpo_attention {

constexpr int BLOCK = 16;  // prompt keys per block: one 512-bit vector of float32
constexpr int QB = 12;     // queries whose scores are accumulated together (12 vector registers)

inline float exp_scalar(float x) {
  x = std::fmin(std::fmax(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float f = x - n * 0.693359375f + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * f + 1.3981999507e-3f;
  y = y * f + 8.3334519073e-3f;
  y = y * f + 4.1665795894e-2f;
  y = y * f + 1.6666665459e-1f;
  y = y * f + 5.0000001201e-1f;
  y = y * f * f + f + 1.0f;
  return std::scalbnf(y, static_cast<int>(n));
}

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}
#endif

// One query's online softmax over new scores s[0..n): the running max m and sum l updated, s overwritten with the
// probabilities under the new max; returns the factor the query's accumulator must be scaled by.
inline float softmax_update(float* s, int n, float& m, float& l) {
  float mx = m;
#ifdef __AVX512F__
  if (n == 16) {
    mx = std::fmax(mx, _mm512_reduce_max_ps(_mm512_loadu_ps(s)));
  } else {
    for (int j = 0; j < n; ++j) mx = std::fmax(mx, s[j]);
  }
#else
  for (int j = 0; j < n; ++j) mx = std::fmax(mx, s[j]);
#endif
  const float alpha = exp_scalar(m - mx);
  float sum = 0.0f;
  int j = 0;
#ifdef __AVX512F__
  __m512 vsum = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), _mm512_set1_ps(mx)));
    _mm512_storeu_ps(s + j, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  sum = _mm512_reduce_add_ps(vsum);
#endif
  for (; j < n; ++j) {
    s[j] = exp_scalar(s[j] - mx);
    sum += s[j];
  }
  m = mx;
  l = l * alpha + sum;
  return alpha;
}

// acc[i] = alpha[i] acc[i] + sum_j p[i][j] v[j] for queries i < nq (p rows `pstride` apart, acc rows D apart) and
// keys j < n (v rows D apart): each value row is read and converted once for all the queries.
template <typename T>
inline void accumulate(const float* p, int64_t pstride, const float* alpha, int nq, const T* v, int n, int D,
                       float* acc) {
  for (int i = 0; i < nq; ++i)
    for (int d = 0; d < D; ++d) acc[i * D + d] *= alpha[i];
#ifdef __AVX512F__
  if (D == 64) {  // four queries' accumulators (16 registers) held across the keys
    for (int i0 = 0; i0 < nq; i0 += 4) {
      const int qb = std::min(4, nq - i0);
      __m512 a[4][4];
      for (int i = 0; i < 4; ++i)
        for (int c = 0; c < 4; ++c)
          a[i][c] = i < qb ? _mm512_loadu_ps(acc + (i0 + i) * D + 16 * c) : _mm512_setzero_ps();
      for (int j = 0; j < n; ++j) {
        const T* vr = v + static_cast<int64_t>(j) * D;
        const __m512 v0 = load16(vr), v1 = load16(vr + 16), v2 = load16(vr + 32), v3 = load16(vr + 48);
        for (int i = 0; i < qb; ++i) {
          const __m512 pj = _mm512_set1_ps(p[(i0 + i) * pstride + j]);
          a[i][0] = _mm512_fmadd_ps(pj, v0, a[i][0]);
          a[i][1] = _mm512_fmadd_ps(pj, v1, a[i][1]);
          a[i][2] = _mm512_fmadd_ps(pj, v2, a[i][2]);
          a[i][3] = _mm512_fmadd_ps(pj, v3, a[i][3]);
        }
      }
      for (int i = 0; i < qb; ++i)
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc + (i0 + i) * D + 16 * c, a[i][c]);
    }
    return;
  }
#endif
  for (int j = 0; j < n; ++j) {
    const T* vr = v + static_cast<int64_t>(j) * D;
    for (int i = 0; i < nq; ++i) {
      const float pj = p[i * pstride + j];
      float* a = acc + i * D;
      for (int d = 0; d < D; ++d) a[d] += pj * to_float(vr[d]);
    }
  }
}

// Scores of queries q[0..nq) (float32, pre-scaled, D each) against one block of keys, transposed (D x BLOCK,
// contiguous), of which the first n are real, into s (nq x BLOCK).
template <typename T>
inline void block_scores(const float* q, int nq, const T* kt, int n, int D, float* s) {
#ifdef __AVX512F__
  if (n == BLOCK) {
    for (int i0 = 0; i0 < nq; i0 += QB) {
      const int qb = std::min(QB, nq - i0);
      __m512 acc[QB];
      for (int i = 0; i < QB; ++i) acc[i] = _mm512_setzero_ps();
      for (int d = 0; d < D; ++d) {
        const __m512 kv = load16(kt + d * BLOCK);
        for (int i = 0; i < qb; ++i)
          acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[(i0 + i) * D + d]), kv, acc[i]);
      }
      for (int i = 0; i < qb; ++i) _mm512_storeu_ps(s + (i0 + i) * BLOCK, acc[i]);
    }
    return;
  }
#endif
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < n; ++j) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += q[i * D + d] * to_float(kt[d * BLOCK + j]);
      s[i * BLOCK + j] = dot;
    }
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
constexpr bool kBf16Pairs = true;
// block_scores for bfloat16 with AVX512-BF16: the block's keys as (D / 2, BLOCK, 2), each pair of dimensions of 16
// keys one vector; q the queries' own bfloat16 values (nq x D, unscaled), so each step is one dot-product
// instruction per query over two dimensions: products exact, sums float32. Scores times scale into s.
inline void block_scores_bf16(const c10::BFloat16* q, int nq, const c10::BFloat16* kt, int n, int D, float scale,
                              float* s) {
  for (int i0 = 0; i0 < nq; i0 += QB) {
    const int qb = std::min(QB, nq - i0);
    __m512 acc[QB];
    for (int i = 0; i < QB; ++i) acc[i] = _mm512_setzero_ps();
    for (int dp = 0; dp < D / 2; ++dp) {
      const __m512bh kv = (__m512bh)_mm512_loadu_si512(kt + dp * 2 * BLOCK);
      for (int i = 0; i < qb; ++i) {
        int32_t pair;
        std::memcpy(&pair, q + (i0 + i) * D + 2 * dp, sizeof(pair));
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_set1_epi32(pair), kv);
      }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < qb; ++i) _mm512_storeu_ps(s + (i0 + i) * BLOCK, _mm512_mul_ps(acc[i], sc));
  }
  (void)n;
}
#else
constexpr bool kBf16Pairs = false;
#endif


// One block's scores for queries given as float32 (pre-scaled, ``qf``) and as their own values (``qraw``): the
// bfloat16 dot-product path where it is built, else block_scores.
template <typename T>
inline void scores(const float* qf, const T* qraw, int nq, const T* block, int n, int D, float scale, float* s) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    block_scores_bf16(qraw, nq, block, n, D, scale, s);
    return;
  }
#endif
  (void)qraw;
  (void)scale;
  block_scores<T>(qf, nq, block, n, D, s);
}

// Scores of queries q[0..nq) against keys k (n rows of D, contiguous), into s (nq x n).
template <typename T>
inline void row_scores(const float* q, int nq, const T* k, int n, int D, float* s) {
  for (int j = 0; j < n; ++j) {
    const T* kr = k + j * D;
#ifdef __AVX512F__
    if (D % 16 == 0) {
      for (int i = 0; i < nq; ++i) {
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * D + d), load16(kr + d), acc);
        s[i * n + j] = _mm512_reduce_add_ps(acc);
      }
      continue;
    }
#endif
    for (int i = 0; i < nq; ++i) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += q[i * D + d] * to_float(kr[d]);
      s[i * n + j] = dot;
    }
  }
}

// The queries of one task and their online softmax: each query as float32 (pre-scaled, ``qf``) and as its own
// values (``qraw``, for the bfloat16 dot products), its running max ``m`` and sum ``l``, its accumulator ``acc``
// (D floats), the block's scores ``s`` and each query's rescaling factor ``alpha``.
template <typename T>
struct Queries {
  int nq = 0, D = 0;
  std::vector<float> qf, m, l, acc, s, alpha;
  std::vector<T> qraw;

  void reset(int n, int dim) {
    nq = n;
    D = dim;
    qf.assign(static_cast<size_t>(n) * dim, 0.0f);
    qraw.resize(static_cast<size_t>(n) * dim);
    m.assign(n, -1e30f);
    l.assign(n, 0.0f);
    acc.assign(static_cast<size_t>(n) * dim, 0.0f);
    s.assign(static_cast<size_t>(n) * BLOCK, 0.0f);
    alpha.assign(n, 1.0f);
  }

  void load(int i, const T* src, float scale) {
    for (int d = 0; d < D; ++d) qf[i * D + d] = to_float(src[d]) * scale;
    std::memcpy(qraw.data() + static_cast<size_t>(i) * D, src, D * sizeof(T));
  }

  // Query i's output: its accumulator over its softmax's sum.
  void write(int i, float* dst) const {
    const float inv = 1.0f / l[i];
    for (int d = 0; d < D; ++d) dst[d] = acc[i * D + d] * inv;
  }
};

}  // namespace atgrpo_attention
