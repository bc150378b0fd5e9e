// The residual add, RMSNorm and cast of a decoding step in one call (engine/kernels.py: add_rms_norm).
#include "vector_math.h"

using namespace atgrpo_attention;

namespace {

// One row of C values: h += delta (if any), then x = h * rstd * w, rstd = 1 / sqrt(mean(h^2) + eps).
template <typename TD, typename TO>
void row(float* h, const TD* delta, const float* w, int64_t C, float eps, TO* x) {
  int64_t c = 0;
  float ss = 0.0f;
#ifdef __AVX512F__
  __m512 vss = _mm512_setzero_ps();
  for (; c + 16 <= C; c += 16) {
    __m512 hv = _mm512_loadu_ps(h + c);
    if (delta != nullptr) {
      hv = _mm512_add_ps(hv, load16(delta + c));
      _mm512_storeu_ps(h + c, hv);
    }
    vss = _mm512_fmadd_ps(hv, hv, vss);
  }
  ss = _mm512_reduce_add_ps(vss);
#endif
  for (; c < C; ++c) {
    if (delta != nullptr) h[c] += to_float(delta[c]);
    ss += h[c] * h[c];
  }
  const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
  c = 0;
#ifdef __AVX512F__
  const __m512 r = _mm512_set1_ps(rstd);
  for (; c + 16 <= C; c += 16) {
    const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(h + c), r), _mm512_loadu_ps(w + c));
    if constexpr (std::is_same_v<TO, float>) {
      _mm512_storeu_ps(x + c, y);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + c), to_bf16(y));
    }
  }
#endif
  for (; c < C; ++c) x[c] = static_cast<TO>(h[c] * rstd * w[c]);
}

template <typename TD, typename TO>
void run(float* h, const TD* delta, const float* w, int64_t A, int64_t C, float eps, TO* x) {
  for (int64_t a = 0; a < A; ++a) row(h + a * C, delta == nullptr ? nullptr : delta + a * C, w, C, eps, x + a * C);
}

template <typename TO>
void dispatch(float* h, const c10::optional<at::Tensor>& delta, const float* w, int64_t A, int64_t C, float eps,
              TO* x) {
  if (!delta.has_value() || !delta->defined()) return run<float, TO>(h, nullptr, w, A, C, eps, x);
  if (delta->scalar_type() == at::kBFloat16) return run(h, delta->data_ptr<c10::BFloat16>(), w, A, C, eps, x);
  TORCH_CHECK(delta->scalar_type() == at::kFloat, "add_rms_norm: delta float32 or bfloat16");
  run(h, delta->data_ptr<float>(), w, A, C, eps, x);
}

}  // namespace

// The residual add and the RMSNorm of a decoding step in one call: h += delta (h float32 (A, C), delta float32 or
// bfloat16 or undefined), then x = h / rms(h) * w (w float32 (C)), returned as float32 or bfloat16 (`to_bf16`).
// The rows are few (the live rows of a step), so one thread; each row's sum of squares in float32.
at::Tensor add_rms_norm(at::Tensor h, c10::optional<at::Tensor> delta, at::Tensor w, double eps, bool to_bf16) {
  TORCH_CHECK(h.is_contiguous() && h.scalar_type() == at::kFloat && h.dim() == 2 && w.is_contiguous() &&
              w.scalar_type() == at::kFloat && w.numel() == h.size(1), "add_rms_norm: float32 (A, C) and (C)");
  if (delta.has_value() && delta->defined())
    TORCH_CHECK(delta->is_contiguous() && delta->numel() == h.numel(), "add_rms_norm: delta's shape");
  const int64_t A = h.size(0), C = h.size(1);
  at::Tensor x = at::empty({A, C}, h.options().dtype(to_bf16 ? at::kBFloat16 : at::kFloat));
  if (to_bf16) {
    dispatch(h.data_ptr<float>(), delta, w.data_ptr<float>(), A, C, static_cast<float>(eps),
             x.data_ptr<c10::BFloat16>());
  } else {
    dispatch(h.data_ptr<float>(), delta, w.data_ptr<float>(), A, C, static_cast<float>(eps), x.data_ptr<float>());
  }
  return x;
}
