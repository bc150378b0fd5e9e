"""Drawing tokens: plain temperature sampling by inverting the cumulative distribution, one uniform number per row.

Nothing else (no top-p, top-k or repetition penalty), so the log-probabilities stored at sampling time and those the
loss computes come from the same distribution ``softmax(logits / T)`` (docs/method.md). ``temperature=0`` is
greedy decoding.

The uniform numbers of a ``generate`` call are drawn up front, one per (step, row) in a ``(max_new_tokens, R)``
tensor (``draw_uniforms``): row ``r`` at step ``t`` always uses ``u[t, r]``, whatever rows are still decoding.
So the tokens are a function of the seed and the model only, not of when finished rows are dropped or how rows are
batched; and since the CPU generator gives ``rand((T, R))`` the same numbers as ``T`` calls of ``rand((R, 1))``,
they equal those of a loop that draws one number per row at each step while no row has finished.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SAMPLE_BLOCK = 256  # tokens per block of the two-level inverse CDF in ``sample_from``


def draw_uniforms(steps: int, rows: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """``(steps, rows)`` uniform numbers in [0, 1), float64, on ``device`` (drawn on the generator's device)."""
    gdev = generator.device if generator is not None else torch.device("cpu")
    return torch.rand((steps, rows), generator=generator, dtype=torch.float64, device=gdev).to(device)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs  # (A, V)`` (rows need not sum to 1) for the uniform numbers ``u  # (A,)``,
    by inverting the cumulative distribution in two levels: the row's blocks of ``SAMPLE_BLOCK`` tokens by their
    summed mass, then the token inside the chosen block; the blocks' running sum and the running sum inside the
    chosen block in float64, so that a token of probability 1e-12 keeps an interval of its own size (a block's
    own sum is float32: converting every probability to float64 first cost more than the rest of the draw). A token of probability 0 is never drawn (its interval is
    empty). ``torch.multinomial`` draws V exponential numbers per row instead, and a one-level running sum writes V
    float64 numbers per row: on SmolLM2's 49k-token vocabulary they cost 16-25x the two levels per decoding step of
    64 rows (``python benchmarks/sample_tokens_cost.py``). No host synchronisation (static shapes)."""
    A, V = probs.shape
    pad = (-V) % SAMPLE_BLOCK
    blocks = (F.pad(probs, (0, pad)) if pad else probs).view(A, -1, SAMPLE_BLOCK)  # (A, nb, S)
    block_cdf = blocks.sum(-1).double().cumsum(-1)  # (A, nb)
    u = u.view(A, 1) * block_cdf[:, -1:]
    b = torch.searchsorted(block_cdf, u, right=True).clamp_(max=block_cdf.shape[1] - 1)  # (A, 1)
    before = torch.where(b > 0, block_cdf.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(u))
    inner = blocks.gather(1, b[:, :, None].expand(-1, -1, SAMPLE_BLOCK)).squeeze(1).double().cumsum(-1)  # (A, S)
    last = (inner < inner[:, -1:]).sum(-1, keepdim=True)  # the block's last token of positive probability
    t = torch.minimum(torch.searchsorted(inner, u - before, right=True), last)  # rounding may not pass it
    return (b * SAMPLE_BLOCK + t).squeeze(1)


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``sample_from`` with one fresh uniform number per row from ``generator``."""
    return sample_from(probs, draw_uniforms(1, probs.shape[0], generator, probs.device)[0])


def next_tokens(logits: torch.Tensor, temperature: float, u: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next token of each row of ``logits  # (A, V)`` and its log-probability under ``softmax(logits / T)``
    (None when greedy: ``temperature == 0`` takes the argmax and ignores ``u``). Two passes over the vocabulary:
    torch's fused softmax and the probabilities' block sums; the log-probability is the log of the drawn token's
    probability (a full log-softmax, or torch's unfused log-sum-exp, cost 3-4x more at 64 rows)."""
    if temperature <= 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits if temperature == 1.0 else logits / temperature, -1)
    tok = sample_from(probs, u)
    return tok, probs.gather(1, tok[:, None]).squeeze(1).log()
