// The residual add, RMSNorm and cast of a decoding step in one call (engine/kernels.py: add_rms_norm).
#include <torch/extension.h>

#include <cmath>

// The residual add and the RMSNorm of a decoding step in one call: h += delta (h float32 (A, C), delta float32 or
// bfloat16 or undefined), then x = h / rms(h) * w (w float32 (C)), returned as float32 or bfloat16 (`to_bf16`).
// The rows are few (the live rows of a step), so one thread; each row's sum of squares in float32.
at::Tensor add_rms_norm(at::Tensor h, c10::optional<at::Tensor> delta, at::Tensor w, double eps, bool to_bf16) {
  TORCH_CHECK(h.is_contiguous() && h.scalar_type() == at::kFloat && h.dim() == 2 && w.is_contiguous() &&
              w.scalar_type() == at::kFloat && w.numel() == h.size(1), "add_rms_norm: float32 (A, C) and (C)");
  const int64_t A = h.size(0), C = h.size(1);
  float* hp = h.data_ptr<float>();
  if (delta.has_value() && delta->defined()) {
    const at::Tensor d = delta->contiguous();
    TORCH_CHECK(d.numel() == h.numel(), "add_rms_norm: delta's shape");
    if (d.scalar_type() == at::kBFloat16) {
      const c10::BFloat16* dp = d.data_ptr<c10::BFloat16>();
      for (int64_t i = 0; i < A * C; ++i) hp[i] += static_cast<float>(dp[i]);
    } else {
      TORCH_CHECK(d.scalar_type() == at::kFloat, "add_rms_norm: delta float32 or bfloat16");
      const float* dp = d.data_ptr<float>();
      for (int64_t i = 0; i < A * C; ++i) hp[i] += dp[i];
    }
  }
  at::Tensor x = at::empty({A, C}, h.options().dtype(to_bf16 ? at::kBFloat16 : at::kFloat));
  const float* wp = w.data_ptr<float>();
  for (int64_t r = 0; r < A; ++r) {
    const float* hr = hp + r * C;
    float ss = 0.0f;
    for (int64_t c = 0; c < C; ++c) ss += hr[c] * hr[c];
    const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(C) + static_cast<float>(eps));
    if (to_bf16) {
      c10::BFloat16* xr = x.data_ptr<c10::BFloat16>() + r * C;
      for (int64_t c = 0; c < C; ++c) xr[c] = static_cast<c10::BFloat16>(hr[c] * rstd * wp[c]);
    } else {
      float* xr = x.data_ptr<float>() + r * C;
      for (int64_t c = 0; c < C; ++c) xr[c] = hr[c] * rstd * wp[c];
    }
  }
  return x;
}
