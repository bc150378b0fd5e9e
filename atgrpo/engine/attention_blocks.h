// The building blocks of the native engine's CPU attention kernels (decode_attention.cpp, prefill_attention.cpp):
// blocks of 16 keys, each block transposed (D x 16; with AVX512-BF16, bfloat16 keys as (D / 2, 16, 2)), scored
// for up to QB queries at once into each query's row of scores; the softmax in two passes over the whole row (its
// max, then exp and sum: a task's rows fit the L2 cache, and no running rescale per block); the values' weighted
// sum for several queries per value row read. With AVX-512 (-march=native on a CPU that has it) the loops are intrinsics;
// elsewhere plain loops that the compiler vectorises as it can.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "vector_math.h"

namespace atgrpo_attention {

constexpr int BLOCK = 16;  // prompt keys per block: one 512-bit vector of float32
constexpr int QB = 12;     // queries whose scores are accumulated together (12 vector registers)
// Prefetch distances. A step's keys and values come from memory, not the caches (each layer's are read once per
// step), and one core's stream of misses is slower than its arithmetic: at a table cell's shape in float32 the
// kernel took ~370 us per call with its keys and values in memory against ~190 with them in the caches; ~300 with
// these prefetches (benchmarks/attention_kernel.py).
constexpr int PF_BLOCKS = 4;  // key blocks ahead
constexpr int PF_KEYS = 32;   // value rows ahead

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// Each 64-byte line of ``bytes`` bytes at ``p``, asked for ahead.
inline void prefetch_lines(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) prefetch(static_cast<const char*>(p) + b);
}

// Each query's softmax over its row of scores, in place: rows i < nq of S (``stride`` apart), the first n entries
// of each (a masked score is -inf: probability 0). Leaves the unnormalised exp(s - max) and puts each row's sum in
// l: the weighted sum of values is divided once, at the end (Queries::write).
inline void softmax_rows(float* S, int64_t stride, int nq, int64_t n, float* l) {
  for (int i = 0; i < nq; ++i) {
    float* s = S + i * stride;
#ifdef __AVX512F__
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16)
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, tail_mask(n - j), s + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 k = tail_mask(n - j);
      const __m512 p = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mx)));
      _mm512_mask_storeu_ps(s + j, k, p);
      vsum = _mm512_add_ps(vsum, p);
    }
    l[i] = _mm512_reduce_add_ps(vsum);
#else
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, s[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = exp_scalar(s[j] - mx);
      sum += s[j];
    }
    l[i] = sum;
#endif
  }
}

// acc[i] += sum_j p[i][j] v[j] for queries i < nq (p rows `pstride` apart, acc rows D apart) and keys j < n (v rows
// D apart): each value row is read and converted once for all the queries.
template <typename T>
inline void accumulate(const float* p, int64_t pstride, int nq, const T* v, int64_t n, int D, float* acc) {
#ifdef __AVX512F__
  if (D == 64) {  // four queries' accumulators (16 registers) held across the keys
    for (int i0 = 0; i0 < nq; i0 += 4) {
      const int qb = std::min(4, nq - i0);
      __m512 a[4][4];
      for (int i = 0; i < 4; ++i)
        for (int c = 0; c < 4; ++c)
          a[i][c] = i < qb ? _mm512_loadu_ps(acc + (i0 + i) * D + 16 * c) : _mm512_setzero_ps();
      for (int64_t j = 0; j < n; ++j) {
        const T* vr = v + j * D;
        if (i0 == 0) prefetch_lines(vr + PF_KEYS * D, D * sizeof(T));
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
  for (int64_t j = 0; j < n; ++j) {
    const T* vr = v + j * D;
    for (int i = 0; i < nq; ++i) {
      const float pj = p[i * pstride + j];
      float* a = acc + i * D;
      for (int d = 0; d < D; ++d) a[d] += pj * to_float(vr[d]);
    }
  }
}

// Scores of QT queries q (float32, pre-scaled, D each) against NB blocks of BLOCK keys (each transposed, D x BLOCK,
// contiguous, one after the other; zeros past the real keys), into s (QT rows ``sstride`` apart, NB * BLOCK
// each). The QT x NB accumulators stay in registers; each query's value is broadcast once for the NB blocks.
template <typename T, int QT, int NB>
inline void scores_tile(const float* q, const T* kt, int D, float* s, int64_t sstride) {
#ifdef __AVX512F__
  __m512 acc[NB][QT];
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < QT; ++i) acc[b][i] = _mm512_setzero_ps();
  for (int d = 0; d < D; ++d) {
    __m512 kv[NB];
    for (int b = 0; b < NB; ++b) {
      const T* row = kt + b * D * BLOCK + d * BLOCK;
      if (d * BLOCK * sizeof(T) % 64 == 0) prefetch(row + PF_BLOCKS * D * BLOCK);
      kv[b] = load16(row);
    }
    for (int i = 0; i < QT; ++i) {
      const __m512 qv = _mm512_set1_ps(q[i * D + d]);
      for (int b = 0; b < NB; ++b) acc[b][i] = _mm512_fmadd_ps(qv, kv[b], acc[b][i]);
    }
  }
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < QT; ++i) _mm512_storeu_ps(s + i * sstride + b * BLOCK, acc[b][i]);
#else
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < QT; ++i)
      for (int j = 0; j < BLOCK; ++j) {
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += q[i * D + d] * to_float(kt[b * D * BLOCK + d * BLOCK + j]);
        s[i * sstride + b * BLOCK + j] = dot;
      }
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
constexpr bool kBf16Pairs = true;
// scores_tile for bfloat16 with AVX512-BF16: each block's keys as (D / 2, BLOCK, 2), each pair of dimensions of 16
// keys one vector; q the queries' own bfloat16 values (QT x D, unscaled), so each step is one dot-product
// instruction per query and block over two dimensions: products exact, sums float32. Scores times scale into s.
template <int QT, int NB>
inline void scores_tile_bf16(const c10::BFloat16* q, const c10::BFloat16* kt, int D, float scale, float* s,
                             int64_t sstride) {
  __m512 acc[NB][QT];
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < QT; ++i) acc[b][i] = _mm512_setzero_ps();
  for (int dp = 0; dp < D / 2; ++dp) {
    __m512bh kv[NB];
    for (int b = 0; b < NB; ++b) {
      const c10::BFloat16* row = kt + b * D * BLOCK + dp * 2 * BLOCK;
      prefetch(row + PF_BLOCKS * D * BLOCK);
      kv[b] = (__m512bh)_mm512_loadu_si512(row);
    }
    for (int i = 0; i < QT; ++i) {
      int32_t pair;
      std::memcpy(&pair, q + i * D + 2 * dp, sizeof(pair));
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[b][i] = _mm512_dpbf16_ps(acc[b][i], qv, kv[b]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int b = 0; b < NB; ++b)
    for (int i = 0; i < QT; ++i) _mm512_storeu_ps(s + i * sstride + b * BLOCK, _mm512_mul_ps(acc[b][i], sc));
}
#else
constexpr bool kBf16Pairs = false;
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// A query's probabilities (n floats) rounded to bfloat16 into dst, rounding to nearest even (as torch's fused
// attention rounds them before its matmul with the values); dst[n] = 0 when n is odd, to fill the last pair.
inline void round_bf16(const float* src, int64_t n, c10::BFloat16* dst) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + j)));
  for (; j < n; ++j) dst[j] = static_cast<c10::BFloat16>(src[j]);
  if (n % 2) dst[n] = static_cast<c10::BFloat16>(0.0f);
}

// accumulate() for bfloat16 values in pairs of keys, (n / 2, D, 2): keys 2j and 2j + 1 side by side in each
// dimension, so that with the probabilities in bfloat16 (``pb``, rows ``pbstride`` apart) one dot-product
// instruction adds two keys' terms to 16 dimensions of a query: products exact, sums float32. QT queries' C
// vectors of accumulators stay in registers across the keys.
template <int C, int QT>
inline void accumulate_pairs_tiled(const c10::BFloat16* pb, int64_t pbstride, int nq, const c10::BFloat16* vp,
                                   int64_t npairs, float* acc) {
  constexpr int D = 16 * C;
  for (int i0 = 0; i0 < nq; i0 += QT) {
    const int qt = std::min(QT, nq - i0);
    __m512 a[QT][C];
    for (int i = 0; i < QT; ++i)
      for (int c = 0; c < C; ++c)
        a[i][c] = i < qt ? _mm512_loadu_ps(acc + (i0 + i) * D + 16 * c) : _mm512_setzero_ps();
    for (int64_t jp = 0; jp < npairs; ++jp) {
      if (i0 == 0) prefetch_lines(vp + (jp + PF_KEYS / 2) * 2 * D, 2 * D * sizeof(c10::BFloat16));
      __m512bh v[C];
      for (int c = 0; c < C; ++c) v[c] = (__m512bh)_mm512_loadu_si512(vp + jp * 2 * D + 32 * c);
      for (int i = 0; i < qt; ++i) {
        int32_t pair;
        std::memcpy(&pair, pb + (i0 + i) * pbstride + 2 * jp, sizeof(pair));
        const __m512bh pp = (__m512bh)_mm512_set1_epi32(pair);
        for (int c = 0; c < C; ++c) a[i][c] = _mm512_dpbf16_ps(a[i][c], pp, v[c]);
      }
    }
    for (int i = 0; i < qt; ++i)
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + (i0 + i) * D + 16 * c, a[i][c]);
  }
}

// acc[i] += sum_j p[i][j] v[j] over keys j < n, the values ``vp`` in pairs of keys (D a multiple of 16), the
// probabilities ``p`` (float32 rows ``pstride`` apart; entries up to n rounded up to even readable) rounded to
// bfloat16 first, in ``pb``.
inline void accumulate_pairs(const float* p, int64_t pstride, int nq, const c10::BFloat16* vp, int64_t n, int D,
                             float* acc, std::vector<c10::BFloat16>& pb) {
  const int64_t npairs = (n + 1) / 2, pbstride = 2 * npairs;
  if (pb.size() < static_cast<size_t>(nq) * pbstride) pb.resize(static_cast<size_t>(nq) * pbstride);
  for (int i = 0; i < nq; ++i) round_bf16(p + i * pstride, n, pb.data() + i * pbstride);
  if (D == 64) return accumulate_pairs_tiled<4, 4>(pb.data(), pbstride, nq, vp, npairs, acc);
  if (D == 128) return accumulate_pairs_tiled<8, 2>(pb.data(), pbstride, nq, vp, npairs, acc);
  for (int i = 0; i < nq; ++i)  // other head sizes: one query, one vector at a time
    for (int c = 0; c < D / 16; ++c) {
      __m512 a = _mm512_loadu_ps(acc + i * D + 16 * c);
      for (int64_t jp = 0; jp < npairs; ++jp) {
        int32_t pair;
        std::memcpy(&pair, pb.data() + i * pbstride + 2 * jp, sizeof(pair));
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_set1_epi32(pair),
                             (__m512bh)_mm512_loadu_si512(vp + jp * 2 * D + 32 * c));
      }
      _mm512_storeu_ps(acc + i * D + 16 * c, a);
    }
}
#endif

// Whether values of dtype T and head size D come in pairs of keys (kernels.py: pair_values) and are summed by
// accumulate_pairs: bfloat16 with AVX512-BF16, D a multiple of 16.
template <typename T>
constexpr bool value_pairs(int D) {
  return std::is_same_v<T, c10::BFloat16> && kBf16Pairs && D % 16 == 0;
}

// The prompt part's weighted sum of values, in whichever layout value_pairs says the values come in.
template <typename T>
inline void accumulate_values(const float* p, int64_t pstride, int nq, const T* v, int64_t n, int D, float* acc,
                              std::vector<c10::BFloat16>& pb) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (value_pairs<T>(D)) return accumulate_pairs(p, pstride, nq, v, n, D, acc, pb);
  }
#endif
  (void)pb;
  accumulate<T>(p, pstride, nq, v, n, D, acc);
}


// Scores of QT queries against NB blocks: the bfloat16 dot-product tile where it is built, else the float32 one.
template <typename T, int QT, int NB>
inline void scores_qt(const float* qf, const T* qraw, const T* kt, int D, float scale, float* s, int64_t sstride) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    scores_tile_bf16<QT, NB>(qraw, kt, D, scale, s, sstride);
    return;
  }
#endif
  (void)qraw;
  (void)scale;
  scores_tile<T, QT, NB>(qf, kt, D, s, sstride);
}

template <typename T, int NB>
inline void scores_chunk(const float* qf, const T* qraw, int qt, const T* kt, int D, float scale, float* s,
                         int64_t sstride) {
  switch (qt) {  // the query count as a constant, so that the accumulators are registers
#define ATGRPO_QT(n) \
  case n: return scores_qt<T, n, NB>(qf, qraw, kt, D, scale, s, sstride);
    ATGRPO_QT(1) ATGRPO_QT(2) ATGRPO_QT(3) ATGRPO_QT(4) ATGRPO_QT(5) ATGRPO_QT(6)
    ATGRPO_QT(7) ATGRPO_QT(8) ATGRPO_QT(9) ATGRPO_QT(10) ATGRPO_QT(11) ATGRPO_QT(12)
#undef ATGRPO_QT
    default: TORCH_CHECK(false, "scores: at most QB queries per chunk");
  }
}

// Scores of queries nq (float32, pre-scaled: ``qf``; their own values: ``qraw``) against ``nblocks`` blocks of keys
// (transpose_keys' layout, one after the other), into s (nq rows ``sstride`` apart, nblocks * BLOCK each): QB
// queries at a time against two blocks at a time, so that each key vector and each query's broadcast serve two
// multiply-adds.
template <typename T>
inline void scores(const float* qf, const T* qraw, int nq, const T* kt, int64_t nblocks, int D, float scale,
                   float* s, int64_t sstride) {
  for (int i0 = 0; i0 < nq; i0 += QB) {
    const int qt = std::min(QB, nq - i0);
    const float* qfi = qf + static_cast<int64_t>(i0) * D;
    const T* qri = qraw + static_cast<int64_t>(i0) * D;
    float* si = s + i0 * sstride;
    int64_t b = 0;
    for (; b + 2 <= nblocks; b += 2)
      scores_chunk<T, 2>(qfi, qri, qt, kt + b * D * BLOCK, D, scale, si + b * BLOCK, sstride);
    if (b < nblocks) scores_chunk<T, 1>(qfi, qri, qt, kt + b * D * BLOCK, D, scale, si + b * BLOCK, sstride);
  }
}

// Scores of queries q[0..nq) against keys k (n rows of D, contiguous), into s (nq rows ``sstride`` apart).
template <typename T>
inline void row_scores(const float* q, int nq, const T* k, int64_t n, int D, float* s, int64_t sstride) {
  for (int64_t j = 0; j < n; ++j) {
    const T* kr = k + j * D;
    prefetch_lines(kr + PF_KEYS * D, D * sizeof(T));
#ifdef __AVX512F__
    if (D % 16 == 0) {
      for (int i = 0; i < nq; ++i) {
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * D + d), load16(kr + d), acc);
        s[i * sstride + j] = _mm512_reduce_add_ps(acc);
      }
      continue;
    }
#endif
    for (int i = 0; i < nq; ++i) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += q[i * D + d] * to_float(kr[d]);
      s[i * sstride + j] = dot;
    }
  }
}

// The queries of one task and their softmax: each query as float32 (pre-scaled, ``qf``) and as its own values
// (``qraw``, for the bfloat16 dot products), its row of scores in ``S`` (``stride`` apart; probabilities after
// softmax_rows), its sum of exps ``l`` and its accumulator ``acc`` (D floats).
template <typename T>
struct Queries {
  int nq = 0, D = 0;
  int64_t stride = 0;
  std::vector<float> qf, l, acc, S;
  std::vector<T> qraw;
  std::vector<c10::BFloat16> pb;  // the probabilities in bfloat16, for accumulate_pairs

  void reset(int n, int dim, int64_t row_len) {
    nq = n;
    D = dim;
    stride = (row_len + BLOCK - 1) / BLOCK * BLOCK;
    qf.assign(static_cast<size_t>(n) * dim, 0.0f);
    qraw.resize(static_cast<size_t>(n) * dim);
    l.assign(n, 0.0f);
    acc.assign(static_cast<size_t>(n) * dim, 0.0f);
    if (S.size() < static_cast<size_t>(n) * stride) S.resize(static_cast<size_t>(n) * stride);
  }

  void load(int i, const T* src, float scale) {
    for (int d = 0; d < D; ++d) qf[i * D + d] = to_float(src[d]) * scale;
    std::memcpy(qraw.data() + static_cast<size_t>(i) * D, src, D * sizeof(T));
  }

  float* row(int i) { return S.data() + static_cast<int64_t>(i) * stride; }

  // Query i's output: its accumulator over its softmax's sum.
  void write(int i, float* dst) const {
    const float inv = 1.0f / l[i];
    for (int d = 0; d < D; ++d) dst[d] = acc[i * D + d] * inv;
  }
};

}  // namespace atgrpo_attention
