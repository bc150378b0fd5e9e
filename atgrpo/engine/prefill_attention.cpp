// The prefill's causal attention of all a node's prompts in one call (engine/kernels.py: prefill_attention), on
// the blocks of attention_blocks.h: one task per (prompt, key/value head, block of 16 positions), its positions'
// queries against the key blocks up to its own, the keys after each query's position masked.
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
      const int64_t n = t0 + BLOCK;  // the key blocks up to the task's own
      Q.reset(nq, D, n);
      for (int i = 0; i < nq; ++i) Q.load(i, qp + row(i), static_cast<float>(scale));
      const T* kt = pktp + (g * Hkv + h) * NB * D * BLOCK;
      const T* vv = pvp + (g * Hkv + h) * Pv * D;
      scores<T>(Q.qf.data(), Q.qraw.data(), nq, kt, qb + 1, D, static_cast<float>(scale), Q.row(0), Q.stride);
      for (int i = 0; i < nq; ++i)  // keys after the query's own position
        for (int64_t j = t0 + i / n_rep + 1; j < n; ++j) Q.row(i)[j] = -INFINITY;
      softmax_rows(Q.S.data(), Q.stride, nq, n, Q.l.data());
      accumulate_values<T>(Q.S.data(), Q.stride, nq, vv, t0 + nt, D, Q.acc.data(), Q.pb);
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
  TORCH_CHECK(!(q.scalar_type() == at::kBFloat16 && value_pairs<c10::BFloat16>(static_cast<int>(q.size(2)))) ||
              pv.size(2) % 2 == 0, "prefill_attention: bfloat16 values in pairs of keys (kernels.pair_values)");
  if (q.scalar_type() == at::kBFloat16) {
    run_prefill<c10::BFloat16>(q, pkt, pv, plen, starts, scale, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "prefill_attention: float32 or bfloat16");
    run_prefill<float>(q, pkt, pv, plen, starts, scale, out);
  }
  return out;
}
