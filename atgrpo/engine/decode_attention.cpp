// Cascade attention of one decoding step on the CPU, both parts and their merge in one pass (engine/kernels.py).
//
// Each live row attends its prompt's keys (one copy per prompt, shared by the prompt's rows) and its own keys.
// One task per (prompt, key/value head): the queries of all the prompt's rows and of the head's query heads read
// each block of 16 prompt keys once. The prompt's keys come in transposed blocks, (D, 16) per 16 keys, so that 16
// keys are one vector and a query's 16 scores are 64 fused multiply-adds with no horizontal sums. Then each row reads its own
// keys (a few hundred at most). Scores, the softmax (online: a running max and sum per query, so the two parts
// need no merge) and the weighted sum of values are float32; the output is float32.
//
// With AVX-512 (-march=native on a CPU that has it) the loops are intrinsics; elsewhere plain loops that the
// compiler vectorises as it can. exp is Cephes' expf polynomial (~1 ulp) with the power of two by scalef.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

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

template <typename T>
void run(const at::Tensor& q, const at::Tensor& pkt, const at::Tensor& pv, const at::Tensor& plen,
         const at::Tensor& ok, const at::Tensor& ov, int64_t own_len, const at::Tensor& row_prompt, double scale,
         at::Tensor& out) {
  const int64_t A = q.size(0), H = q.size(1);
  const int D = static_cast<int>(q.size(2));
  const int64_t G = pkt.size(0), Hkv = pkt.size(1), NB = pkt.size(2), Pv = pv.size(2), Tmax = ok.size(2);
  const int64_t n_rep = H / Hkv;
  const T* qp = q.data_ptr<T>();
  const T* pktp = pkt.data_ptr<T>();
  const T* pvp = pv.data_ptr<T>();
  const T* okp = ok.data_ptr<T>();
  const T* ovp = ov.data_ptr<T>();
  const int64_t* lens = plen.data_ptr<int64_t>();
  const int64_t* rp = row_prompt.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, G * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf, m, l, acc, s, so, alpha;
    std::vector<T> qraw;
    std::vector<int64_t> rows;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / Hkv, h = task % Hkv;
      rows.clear();
      for (int64_t r = 0; r < A; ++r)
        if (rp[r] == g) rows.push_back(r);
      if (rows.empty()) continue;
      const int nq = static_cast<int>(rows.size() * n_rep);
      qf.assign(static_cast<size_t>(nq) * D, 0.0f);
      m.assign(nq, -1e30f);
      l.assign(nq, 0.0f);
      acc.assign(static_cast<size_t>(nq) * D, 0.0f);
      s.assign(static_cast<size_t>(nq) * BLOCK, 0.0f);
      so.assign(static_cast<size_t>(n_rep) * own_len, 0.0f);
      alpha.assign(nq, 1.0f);
      qraw.resize(static_cast<size_t>(nq) * D);
      for (size_t ri = 0; ri < rows.size(); ++ri)
        for (int64_t e = 0; e < n_rep; ++e) {
          const T* src = qp + (rows[ri] * H + h * n_rep + e) * D;
          float* dst = qf.data() + (ri * n_rep + e) * D;
          for (int d = 0; d < D; ++d) dst[d] = to_float(src[d]) * static_cast<float>(scale);
          std::memcpy(qraw.data() + (ri * n_rep + e) * D, src, D * sizeof(T));
        }
      // the prompt part: blocks of BLOCK keys, all the task's queries at once
      const T* kt = pktp + (g * Hkv + h) * NB * D * BLOCK;
      const T* vv = pvp + (g * Hkv + h) * Pv * D;
      for (int64_t j0 = 0; j0 < lens[g]; j0 += BLOCK) {
        const int n = static_cast<int>(std::min<int64_t>(BLOCK, lens[g] - j0));
        scores<T>(qf.data(), qraw.data(), nq, kt + (j0 / BLOCK) * D * BLOCK, n, D, static_cast<float>(scale),
                  s.data());
        for (int i = 0; i < nq; ++i) alpha[i] = softmax_update(s.data() + i * BLOCK, n, m[i], l[i]);
        accumulate<T>(s.data(), BLOCK, alpha.data(), nq, vv + j0 * D, n, D, acc.data());
      }
      // the own part: each row's queries against its own keys
      for (size_t ri = 0; ri < rows.size(); ++ri) {
        const int64_t own = (rows[ri] * Hkv + h) * Tmax * D;
        const int i0 = static_cast<int>(ri * n_rep);
        row_scores<T>(qf.data() + i0 * D, static_cast<int>(n_rep), okp + own, static_cast<int>(own_len), D,
                      so.data());
        for (int64_t e = 0; e < n_rep; ++e)
          alpha[i0 + e] = softmax_update(so.data() + e * own_len, static_cast<int>(own_len), m[i0 + e], l[i0 + e]);
        accumulate<T>(so.data(), own_len, alpha.data() + i0, static_cast<int>(n_rep), ovp + own,
                      static_cast<int>(own_len), D, acc.data() + i0 * D);
        for (int64_t e = 0; e < n_rep; ++e) {
          const float inv = 1.0f / l[i0 + e];
          const float* a = acc.data() + (i0 + e) * D;
          float* dst = op + (rows[ri] * H + h * n_rep + e) * D;
          for (int d = 0; d < D; ++d) dst[d] = a[d] * inv;
        }
      }
    }
  });
}


// Causal attention of the prefill: the queries of prompt g's positions [t0, t0 + BLOCK) and kv head h against the
// prompt's keys up to each query's own position. Queries and output rows of the packed prompts (q: N x H x D).
template <typename T>
void run_prefill(const at::Tensor& q, const at::Tensor& pkt, const at::Tensor& pv, const at::Tensor& plen,
                 const at::Tensor& starts, double scale, at::Tensor& out) {
  const int64_t H = q.size(1);
  const int D = static_cast<int>(q.size(2));
  const int64_t G = pkt.size(0), Hkv = pkt.size(1), NB = pkt.size(2), Pv = pv.size(2);
  const int64_t n_rep = H / Hkv;
  const T* qp = q.data_ptr<T>();
  const T* pktp = pkt.data_ptr<T>();
  const T* pvp = pv.data_ptr<T>();
  const int64_t* lens = plen.data_ptr<int64_t>();
  const int64_t* st = starts.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, G * Hkv * NB, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf, m, l, acc, s, alpha;
    std::vector<T> qraw;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / (Hkv * NB), h = (task / NB) % Hkv, qb = task % NB;
      const int64_t t0 = qb * BLOCK;
      if (t0 >= lens[g]) continue;
      const int nt = static_cast<int>(std::min<int64_t>(BLOCK, lens[g] - t0));
      const int nq = static_cast<int>(nt * n_rep);  // query i: position t0 + i / n_rep, head h * n_rep + i % n_rep
      qf.assign(static_cast<size_t>(nq) * D, 0.0f);
      qraw.resize(static_cast<size_t>(nq) * D);
      m.assign(nq, -1e30f);
      l.assign(nq, 0.0f);
      acc.assign(static_cast<size_t>(nq) * D, 0.0f);
      s.assign(static_cast<size_t>(nq) * BLOCK, 0.0f);
      alpha.assign(nq, 1.0f);
      for (int i = 0; i < nq; ++i) {
        const T* src = qp + ((st[g] + t0 + i / n_rep) * H + h * n_rep + i % n_rep) * D;
        for (int d = 0; d < D; ++d) qf[i * D + d] = to_float(src[d]) * static_cast<float>(scale);
        std::memcpy(qraw.data() + static_cast<size_t>(i) * D, src, D * sizeof(T));
      }
      const T* kt = pktp + (g * Hkv + h) * NB * D * BLOCK;
      const T* vv = pvp + (g * Hkv + h) * Pv * D;
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t j0 = kb * BLOCK;
        const int n = static_cast<int>(std::min<int64_t>(BLOCK, lens[g] - j0));
        scores<T>(qf.data(), qraw.data(), nq, kt + kb * D * BLOCK, n, D, static_cast<float>(scale), s.data());
        for (int i = 0; i < nq; ++i) {
          float* si = s.data() + i * BLOCK;
          const int valid = kb < qb ? n : std::min(n, i / static_cast<int>(n_rep) + 1);  // keys up to its position
          alpha[i] = softmax_update(si, valid, m[i], l[i]);
          for (int j = valid; j < BLOCK; ++j) si[j] = 0.0f;
        }
        accumulate<T>(s.data(), BLOCK, alpha.data(), nq, vv + j0 * D, n, D, acc.data());
      }
      for (int i = 0; i < nq; ++i) {
        const float inv = 1.0f / l[i];
        float* dst = op + ((st[g] + t0 + i / n_rep) * H + h * n_rep + i % n_rep) * D;
        for (int d = 0; d < D; ++d) dst[d] = acc[i * D + d] * inv;
      }
    }
  });
}

}  // namespace

// q (A, H, D); the prompts' keys in transposed blocks of 16 (G, Hkv, P' / 16, D, 16), P' >= P, and values
// (G, Hkv, P, D), right-padded,
// plen (G,) int64 their real lengths; own keys/values (A, Hkv, Tmax, D), of which the first own_len positions are
// attended; row_prompt (A,) int64. Returns (A, H * D) float32.
at::Tensor decode_attention(at::Tensor q, at::Tensor pkt, at::Tensor pv, at::Tensor plen, at::Tensor ok,
                            at::Tensor ov, int64_t own_len, at::Tensor row_prompt, double scale) {
  TORCH_CHECK(q.is_contiguous() && pkt.is_contiguous() && pv.is_contiguous() && ok.is_contiguous() &&
              ov.is_contiguous(), "decode_attention: contiguous tensors expected");
  TORCH_CHECK(q.dim() == 3 && pkt.dim() == 5 && pv.dim() == 4 && ok.dim() == 4 && ok.size(0) == q.size(0) &&
              pkt.size(3) == q.size(2) && pkt.size(4) == BLOCK && pv.size(3) == q.size(2) &&
              pkt.size(2) * BLOCK >= pv.size(2), "decode_attention: shapes");
  TORCH_CHECK(own_len >= 1 && own_len <= ok.size(2), "decode_attention: own_len out of range");
  TORCH_CHECK(plen.scalar_type() == at::kLong && row_prompt.scalar_type() == at::kLong, "decode_attention: int64");
  auto out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kBFloat16) {
    run<c10::BFloat16>(q, pkt, pv, plen, ok, ov, own_len, row_prompt, scale, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "decode_attention: float32 or bfloat16");
    run<float>(q, pkt, pv, plen, ok, ov, own_len, row_prompt, scale, out);
  }
  return out;
}

// Causal self-attention of packed prompts: q (N, H, D), prompt g's rows starting at starts[g], plen[g] long; its
// keys in transposed blocks (G, Hkv, P' / 16, D, 16) and values (G, Hkv, P, D). Returns (N, H * D) float32.
at::Tensor prefill_attention(at::Tensor q, at::Tensor pkt, at::Tensor pv, at::Tensor plen, at::Tensor starts,
                             double scale) {
  TORCH_CHECK(q.is_contiguous() && pkt.is_contiguous() && pv.is_contiguous(), "prefill_attention: contiguous");
  TORCH_CHECK(q.dim() == 3 && pkt.dim() == 5 && pkt.size(3) == q.size(2) && pkt.size(4) == BLOCK &&
              pv.size(3) == q.size(2), "prefill_attention: shapes");
  TORCH_CHECK(plen.scalar_type() == at::kLong && starts.scalar_type() == at::kLong, "prefill_attention: int64");
  auto out = at::zeros({q.size(0), q.size(1) * q.size(2)}, q.options().dtype(at::kFloat));
  if (q.scalar_type() == at::kBFloat16) {
    run_prefill<c10::BFloat16>(q, pkt, pv, plen, starts, scale, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "prefill_attention: float32 or bfloat16");
    run_prefill<float>(q, pkt, pv, plen, starts, scale, out);
  }
  return out;
}
