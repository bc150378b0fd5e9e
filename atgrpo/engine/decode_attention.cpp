// Cascade attention of one decoding step on the CPU, both parts and their merge in one pass (engine/kernels.py).
//
// Each live row attends its prompt's keys (one copy per prompt, shared by the prompt's rows) and its own keys.
// One task per (prompt, key/value head): the queries of all the prompt's rows and of the head's query heads read
// each block of 16 prompt keys once. The prompt's keys come in transposed blocks, (D, 16) per 16 keys, so that 16
// keys are one vector and a query's 16 scores are 64 fused multiply-adds with no horizontal sums. Then each row
// reads its own keys (a few hundred at most), into the same row of scores, so one softmax covers both parts and
// they need no merge. Scores, the softmax and the weighted sum of values are float32; the output is float32.
#include "attention_blocks.h"

using namespace atgrpo_attention;

namespace {

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
    Queries<T> Q;
    std::vector<int64_t> rows;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / Hkv, h = task % Hkv;
      rows.clear();
      for (int64_t r = 0; r < A; ++r)
        if (rp[r] == g) rows.push_back(r);
      if (rows.empty()) continue;
      const int nq = static_cast<int>(rows.size() * n_rep);  // query ri * n_rep + e: row rows[ri], head h * n_rep + e
      // each query's row of scores: the prompt's blocks (positions past its length masked), then its own keys
      const int64_t Pn = lens[g], Pb = (Pn + BLOCK - 1) / BLOCK * BLOCK;
      Q.reset(nq, D, Pb + own_len);
      for (size_t ri = 0; ri < rows.size(); ++ri)
        for (int64_t e = 0; e < n_rep; ++e)
          Q.load(static_cast<int>(ri * n_rep + e), qp + (rows[ri] * H + h * n_rep + e) * D, static_cast<float>(scale));
      const T* kt = pktp + (g * Hkv + h) * NB * D * BLOCK;
      const T* vv = pvp + (g * Hkv + h) * Pv * D;
      scores<T>(Q.qf.data(), Q.qraw.data(), nq, kt, Pb / BLOCK, D, static_cast<float>(scale), Q.row(0),
                Q.stride);  // the prompt part: all the task's queries against each block
      for (int i = 0; i < nq; ++i)
        for (int64_t j = Pn; j < Pb; ++j) Q.row(i)[j] = -INFINITY;
      for (size_t ri = 0; ri < rows.size(); ++ri)  // the own part: each row's queries against its own keys
        row_scores<T>(Q.qf.data() + ri * n_rep * D, static_cast<int>(n_rep), okp + (rows[ri] * Hkv + h) * Tmax * D,
                      own_len, D, Q.row(static_cast<int>(ri * n_rep)) + Pb, Q.stride);
      softmax_rows(Q.S.data(), Q.stride, nq, Pb + own_len, Q.l.data());
      accumulate_values<T>(Q.S.data(), Q.stride, nq, vv, Pn, D, Q.acc.data(), Q.pb);
      for (size_t ri = 0; ri < rows.size(); ++ri) {
        const int i0 = static_cast<int>(ri * n_rep);
        accumulate<T>(Q.row(i0) + Pb, Q.stride, static_cast<int>(n_rep), ovp + (rows[ri] * Hkv + h) * Tmax * D,
                      own_len, D, Q.acc.data() + i0 * D);
        for (int64_t e = 0; e < n_rep; ++e)
          Q.write(static_cast<int>(i0 + e), op + (rows[ri] * H + h * n_rep + e) * D);
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
  TORCH_CHECK(!(q.scalar_type() == at::kBFloat16 && value_pairs<c10::BFloat16>(static_cast<int>(q.size(2)))) ||
              pv.size(2) % 2 == 0, "decode_attention: bfloat16 values in pairs of keys (kernels.pair_values)");
  if (q.scalar_type() == at::kBFloat16) {
    run<c10::BFloat16>(q, pkt, pv, plen, ok, ov, own_len, row_prompt, scale, out);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kFloat, "decode_attention: float32 or bfloat16");
    run<float>(q, pkt, pv, plen, ok, ov, own_len, row_prompt, scale, out);
  }
  return out;
}

// Whether bfloat16 prompt keys come in pairs of dimensions ((D / 2, 16, 2) per block: AVX512-BF16 built in).
bool bf16_pairs() { return kBf16Pairs; }
