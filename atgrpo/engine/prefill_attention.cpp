// The prefill's causal attention of all a node's prompts in one call (engine/kernels.py: prefill_attention), on
// the blocks of attention_blocks.h: one task per (prompt, key/value head, block of 16 positions), its positions'
// queries against the key blocks up to its own, the last one masked by position.
#include "attention_blocks.h"

using namespace atgrpo_attention;

namespace {

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
    Queries<T> Q;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / (Hkv * NB), h = (task / NB) % Hkv, qb = task % NB;
      const int64_t t0 = qb * BLOCK;
      if (t0 >= lens[g]) continue;
      const int nt = static_cast<int>(std::min<int64_t>(BLOCK, lens[g] - t0));
      const int nq = static_cast<int>(nt * n_rep);  // query i: position t0 + i / n_rep, head h * n_rep + i % n_rep
      auto row = [&](int i) { return ((st[g] + t0 + i / n_rep) * H + h * n_rep + i % n_rep) * D; };
      Q.reset(nq, D);
      for (int i = 0; i < nq; ++i) Q.load(i, qp + row(i), static_cast<float>(scale));
      const T* kt = pktp + (g * Hkv + h) * NB * D * BLOCK;
      const T* vv = pvp + (g * Hkv + h) * Pv * D;
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t j0 = kb * BLOCK;
        const int n = static_cast<int>(std::min<int64_t>(BLOCK, lens[g] - j0));
        scores<T>(Q.qf.data(), Q.qraw.data(), nq, kt + kb * D * BLOCK, n, D, static_cast<float>(scale), Q.s.data());
        for (int i = 0; i < nq; ++i) {
          float* si = Q.s.data() + i * BLOCK;
          const int valid = kb < qb ? n : std::min(n, i / static_cast<int>(n_rep) + 1);  // keys up to its position
          Q.alpha[i] = softmax_update(si, valid, Q.m[i], Q.l[i]);
          for (int j = valid; j < BLOCK; ++j) si[j] = 0.0f;
        }
        accumulate<T>(Q.s.data(), BLOCK, Q.alpha.data(), nq, vv + j0 * D, n, D, Q.acc.data());
      }
      for (int i = 0; i < nq; ++i) Q.write(i, op + row(i));
    }
  });
}

}  // namespace

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
