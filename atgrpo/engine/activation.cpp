// The MLP's activation of a decoding step, silu(gate) * up, in one call (engine/kernels.py: silu_mul).

#include "vector_math.h"

using namespace atgrpo_attention;

namespace {

inline float silu(float g) { return g / (1.0f + exp_scalar(-g)); }

// One row: y = silu(g) * u over C values. In bfloat16 silu's result is rounded to bfloat16 before the product and
// the product rounded again, as torch's two operations (F.silu, then *) round.
template <typename T>
void row(const T* g, const T* u, int64_t C, T* y) {
  int64_t c = 0;
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (; c + 16 <= C; c += 16) {
      const __m512 gv = load16(g + c);
      const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(
                                                                                   _mm512_setzero_ps(), gv))));
      const __m512 sr = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(s)), 16));  // rounded
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + c), to_bf16(_mm512_mul_ps(sr, load16(u + c))));
    }
  }
#endif
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    for (; c + 16 <= C; c += 16) {
      const __m512 gv = _mm512_loadu_ps(g + c);
      const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(_mm512_sub_ps(
                                                                                   _mm512_setzero_ps(), gv))));
      _mm512_storeu_ps(y + c, _mm512_mul_ps(s, _mm512_loadu_ps(u + c)));
    }
  }
#endif
  for (; c < C; ++c) {
    const T s = static_cast<T>(silu(static_cast<float>(g[c])));
    y[c] = static_cast<T>(static_cast<float>(s) * static_cast<float>(u[c]));
  }
}

}  // namespace

// gu (A, 2C): gate_up's output, the gate then the up projection (float32 or bfloat16, contiguous). Returns
// silu(gate) * up (A, C) in its dtype.
at::Tensor silu_mul(at::Tensor gu) {
  TORCH_CHECK(gu.is_contiguous() && gu.dim() == 2 && gu.size(1) % 2 == 0, "silu_mul: contiguous (A, 2C)");
  const int64_t A = gu.size(0), C = gu.size(1) / 2;
  auto y = at::empty({A, C}, gu.options());
  if (gu.scalar_type() == at::kBFloat16) {
    const c10::BFloat16* p = gu.data_ptr<c10::BFloat16>();
    c10::BFloat16* yp = y.data_ptr<c10::BFloat16>();
    for (int64_t a = 0; a < A; ++a) row(p + a * 2 * C, p + a * 2 * C + C, C, yp + a * C);
  } else {
    TORCH_CHECK(gu.scalar_type() == at::kFloat, "silu_mul: float32 or bfloat16");
    const float* p = gu.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t a = 0; a < A; ++a) row(p + a * 2 * C, p + a * 2 * C + C, C, yp + a * C);
  }
  return y;
}
