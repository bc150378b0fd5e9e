// The rotary embedding of a decoding step's queries and keys, and the write of its keys and values into the
// branches' own cache, in one call (engine/kernels.py: rotate_write).
#include <torch/extension.h>
#include <ATen/Parallel.h>

namespace {

// y = x cos + roll(x) sin in float32 with both products rounded before the sum (the build has no fused
// multiply-add contraction: -ffp-contract=off in kernels.py), as torch's elementwise operations compute it, so the
// result is the decoder's torch path bit for bit. roll(x)[d] = x[d + D/2] in the first half, x[d - D/2] after.
template <typename TI, typename TO>
void rotate(const TI* x, const float* cos, const float* sin, int D, TO* y) {
  const int half = D / 2;
  for (int d = 0; d < half; ++d)
    y[d] = static_cast<TO>(static_cast<float>(x[d]) * cos[d] + static_cast<float>(x[d + half]) * sin[d]);
  for (int d = half; d < D; ++d)
    y[d] = static_cast<TO>(static_cast<float>(x[d]) * cos[d] + static_cast<float>(x[d - half]) * sin[d]);
}

template <typename TI, typename TO>
void run(const at::Tensor& qk, const at::Tensor& v, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& own_k,
         at::Tensor& own_v, int64_t t, int64_t H, at::Tensor& q) {
  const int64_t A = qk.size(0), Hkv = v.size(1), T = own_k.size(2);
  const int D = static_cast<int>(qk.size(2));
  const TI* qkp = qk.data_ptr<TI>();
  const TI* vp = v.data_ptr<TI>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  TO* kp = own_k.data_ptr<TO>();
  TO* ovp = own_v.data_ptr<TO>();
  TO* qp = q.data_ptr<TO>();
  const int64_t qs0 = qk.stride(0), qs1 = qk.stride(1), vs0 = v.stride(0), vs1 = v.stride(1);
  for (int64_t a = 0; a < A; ++a) {
    const float* c = cp + a * D;
    const float* s = sp + a * D;
    for (int64_t h = 0; h < H; ++h) rotate(qkp + a * qs0 + h * qs1, c, s, D, qp + (a * H + h) * D);
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t at = ((a * Hkv + h) * T + t) * D;
      rotate(qkp + a * qs0 + (H + h) * qs1, c, s, D, kp + at);
      const TI* vr = vp + a * vs0 + h * vs1;
      for (int d = 0; d < D; ++d) ovp[at + d] = static_cast<TO>(vr[d]);
    }
  }
}

}  // namespace

// qk (A, H + Hkv, D) queries then keys, v (A, Hkv, D) (float32 or bfloat16, each row's D values contiguous);
// cos, sin (A, 1, D) float32 (rotate_half's signs folded into sin); own_k, own_v (A, Hkv, T, D) contiguous in the
// attention dtype: writes the rotated keys and the values at position t, returns the rotated queries (A, H, D)
// in the attention dtype.
at::Tensor rotate_write(at::Tensor qk, at::Tensor v, at::Tensor cos, at::Tensor sin, at::Tensor own_k,
                        at::Tensor own_v, int64_t t) {
  TORCH_CHECK(qk.dim() == 3 && v.dim() == 3 && qk.stride(2) == 1 && v.stride(2) == 1 && qk.size(0) == v.size(0) &&
              v.size(2) == qk.size(2) && qk.scalar_type() == v.scalar_type(), "rotate_write: qk and v");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
              sin.scalar_type() == at::kFloat && cos.numel() == qk.size(0) * qk.size(2) && sin.numel() == cos.numel(),
              "rotate_write: cos and sin float32 (A, 1, D)");
  TORCH_CHECK(own_k.is_contiguous() && own_v.is_contiguous() && own_k.dim() == 4 && own_k.sizes() == own_v.sizes() &&
              own_k.size(0) == qk.size(0) && own_k.size(1) == v.size(1) && own_k.size(3) == qk.size(2) &&
              own_k.scalar_type() == own_v.scalar_type() && t >= 0 && t < own_k.size(2), "rotate_write: own cache");
  const int64_t H = qk.size(1) - v.size(1);
  auto q = at::empty({qk.size(0), H, qk.size(2)}, own_k.options());
  const bool in_bf16 = qk.scalar_type() == at::kBFloat16, out_bf16 = own_k.scalar_type() == at::kBFloat16;
  TORCH_CHECK((in_bf16 || qk.scalar_type() == at::kFloat) && (out_bf16 || own_k.scalar_type() == at::kFloat),
              "rotate_write: float32 or bfloat16");
  if (in_bf16 && out_bf16) run<c10::BFloat16, c10::BFloat16>(qk, v, cos, sin, own_k, own_v, t, H, q);
  else if (in_bf16) run<c10::BFloat16, float>(qk, v, cos, sin, own_k, own_v, t, H, q);
  else if (out_bf16) run<float, c10::BFloat16>(qk, v, cos, sin, own_k, own_v, t, H, q);
  else run<float, float>(qk, v, cos, sin, own_k, own_v, t, H, q);
  return q;
}
