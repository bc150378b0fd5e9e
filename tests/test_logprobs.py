"""``token_logprobs``: the loss's log-probs and their hand-written backward, against log_softmax + gather."""

import pytest
import torch

from atgrpo.policies.logprobs import LOGPROB_CHUNK_ROWS, token_logprobs


def _reference(logits, targets, temperature, rows=None):
    flat = logits.reshape(-1, logits.shape[-1])
    idx = torch.arange(flat.shape[0]).view(targets.shape) if rows is None else rows
    x = flat[idx].to(torch.promote_types(flat.dtype, torch.float32))  # float64 stays float64
    return torch.log_softmax(x / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_equal_log_softmax_gather_across_chunks(temperature):
    """The chunked target log-probabilities (and their gradients) equal log_softmax + gather, on more rows than
    one chunk holds."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, LOGPROB_CHUNK_ROWS // 2 + 7, 50, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (3, LOGPROB_CHUNK_ROWS // 2 + 7), generator=g)
    ours = token_logprobs(logits, targets, temperature)
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    w = torch.randn(ref.shape, generator=g)
    (ga,) = torch.autograd.grad((ours * w).sum(), logits)
    (gb,) = torch.autograd.grad((ref * w).sum(), logits)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)
    assert token_logprobs(logits[:, :0], targets[:, :0], temperature).shape == (3, 0)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_shared_rows_equal_reference_values_and_gradients(temperature):
    """Several targets read one position (K responses predicting their first token from one prompt), over more
    positions than one chunk holds: values and gradients equal those of copying the row for each target."""
    g = torch.Generator().manual_seed(1)
    N, V = LOGPROB_CHUNK_ROWS + 37, 64
    logits = torch.randn(N, V, generator=g, dtype=torch.float64).mul(4).float().requires_grad_()
    rows = torch.randint(0, N, (3, 150), generator=g)
    rows[:, :5] = 7  # one position read by 15 targets
    targets = torch.randint(0, V, rows.shape, generator=g)
    w = torch.randn(rows.shape, generator=g)
    ours = token_logprobs(logits, targets, temperature, rows=rows)
    ref = _reference(logits, targets, temperature, rows)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    (ga,) = torch.autograd.grad((ours * w).sum(), logits)
    (gb,) = torch.autograd.grad((ref * w).sum(), logits)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)
    assert ga[7].abs().sum() > 0 and ga.sum(-1).abs().max() < 1e-4  # each row's gradient sums to 0 (softmax)


def test_float64_gradcheck_and_bfloat16_logits():
    """The backward is the derivative of the float64 reference (itself checked by finite differences); bfloat16
    logits give float32 log-probs and a bfloat16 gradient, matching float32 on the same (rounded) logits."""
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    rows, targets = torch.tensor([0, 0, 3, 4, 4, 4]), torch.tensor([1, 2, 10, 0, 0, 5])
    for k in range(3):  # fresh forwards: the backward runs once per forward
        w = torch.randn(rows.shape, generator=g, dtype=torch.float64)
        (ours,) = torch.autograd.grad((token_logprobs(logits, targets, 0.8, rows=rows).double() * w).sum(), logits)
        (ref,) = torch.autograd.grad((_reference(logits, targets, 0.8, rows) * w).sum(), logits)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-6)  # float32 inside
    assert torch.autograd.gradcheck(lambda x: _reference(x, targets, 0.8, rows), (logits,))  # the reference is exact
    lb = torch.randn(4, 9, 50, generator=g).bfloat16().requires_grad_()
    t = torch.randint(0, 50, (4, 9), generator=g)
    out = token_logprobs(lb, t, 1.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _reference(lb.detach().float(), t, 1.0), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert lb.grad.dtype == torch.bfloat16


def test_no_grad_path_and_single_backward():
    """Without gradients nothing is kept and the values are the same; the backward reuses the kept softmax in
    place, so a second backward through one forward is refused instead of returning a wrong gradient."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 30, 40, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (2, 30), generator=g)
    with torch.no_grad():
        a = token_logprobs(logits, targets, 1.0)
    b = token_logprobs(logits, targets, 1.0)
    torch.testing.assert_close(a, b)
    b.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        b.sum().backward()
    with pytest.raises(ValueError, match="must match"):
        token_logprobs(logits, targets[:, :3], 1.0)
    assert token_logprobs(logits[:, :0], targets[:, :0], 1.0).shape == (2, 0)


def test_head_cost_script_times_both_ways_and_checks_the_copys_top_logits():
    """benchmarks/head_cost.py at small sizes: both ways of each part run, and the copy's head gives the float32
    head's logits at the top of each row (float32 rounding) and bfloat16-close ones below."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "head_cost.py"
    out = runpy.run_path(str(script))["main"](["--vocab", "700", "--positions", "300", "--rows", "4", "--reps", "1",
                                               "--threads", "1"])
    assert out["loss"]["autograd"] > 0 and out["loss"]["token_logprobs"] > 0
    c = out["copy_head"]
    assert c["max_diff_top"] < 1e-4 and 0 < c["max_diff_all"] < 0.5


# ---- the LM head fused into the log-probs ----------------------------------------------------------------------

def _head_case(dtype=torch.float32, bias=True, seed=4, N=70, E=12, V=90):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(E, V, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, E, generator=g))
        if bias:
            head.bias.copy_(torch.randn(V, generator=g))
    hidden = torch.randn(N, E, generator=g).to(dtype).requires_grad_()
    rows = torch.randint(0, N, (2, 60), generator=g)
    rows[:, :6] = 3  # one position read by 12 targets
    targets = torch.randint(0, V, rows.shape, generator=g)
    return head, hidden, rows, targets, torch.randn(rows.shape, generator=g)


@pytest.mark.parametrize("vocab_block", [8192, 32])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("bias", [True, False])
def test_head_logprobs_equal_the_logits_path_across_chunks(monkeypatch, temperature, bias, vocab_block):
    """float32: the fused head's log-probs and the gradients of the hidden states, the weight and the bias equal
    those of the head's logits through ``token_logprobs``, with positions read by many targets, over several
    chunks (a chunk of 16 positions) and, in the backward, one or several blocks of the 90-token vocabulary."""
    from atgrpo.policies import logprobs

    monkeypatch.setattr(logprobs, "HEAD_CHUNK_BYTES", 16 * 4 * 90)
    monkeypatch.setattr(logprobs, "HEAD_VOCAB_BLOCK", vocab_block)
    head, hidden, rows, targets, w = _head_case(bias=bias)
    ours = logprobs.head_logprobs(hidden, head, targets, temperature, rows=rows)
    ref = token_logprobs(head(hidden), targets, temperature, rows=rows)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    params = (hidden, head.weight) + ((head.bias,) if bias else ())
    ga = torch.autograd.grad((ours * w).sum(), params)
    gb = torch.autograd.grad((ref * w).sum(), params)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vocab_block", [8192, 32])
def test_head_logprobs_bfloat16_head_within_the_logits_paths_rounding(monkeypatch, vocab_block):
    """A bfloat16 head (``model.dtype: bfloat16``): float32 log-probs from bfloat16 logits, as the logits path
    gives them, and bfloat16 gradients close to its (the backward in one or several blocks of the vocabulary)."""
    from atgrpo.policies import logprobs
    from atgrpo.policies.logprobs import head_logprobs

    monkeypatch.setattr(logprobs, "HEAD_VOCAB_BLOCK", vocab_block)
    head, hidden, rows, targets, w = _head_case(torch.bfloat16)
    ours = head_logprobs(hidden, head, targets, 1.0, rows=rows)
    ref = token_logprobs(head(hidden), targets, 1.0, rows=rows)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    ga = torch.autograd.grad((ours * w).sum(), (hidden, head.weight))
    gb = torch.autograd.grad((ref * w).sum(), (hidden, head.weight))
    for a, b in zip(ga, gb):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=0.1)


def test_model_logprobs_fuses_only_a_plain_head():
    """``model_logprobs`` runs the model with its head bypassed where the head is a plain linear layer (also
    under ``apply_autocast``'s exact head) and gives the logits path's values; a hooked head runs as it is."""
    from atgrpo.policies import TinyModelConfig, build_tiny_model
    from atgrpo.policies.logprobs import fusable_head, model_logprobs
    from atgrpo.policies.precision import apply_autocast

    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), 0)
    ids = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(1))
    ref = token_logprobs(model(input_ids=ids).logits, targets, 1.0)
    seen = []
    out = model_logprobs(model, lambda: seen.append(model(input_ids=ids).logits.shape) or model(input_ids=ids).logits,
                         targets, 1.0)
    assert seen[0][-1] == 32 and fusable_head(model) is model.lm_head  # the head's input came out
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert "forward" not in model.lm_head.__dict__  # the bypass was undone
    apply_autocast(model, "bfloat16")
    assert fusable_head(model) is model.lm_head
    handle = model.lm_head.register_forward_hook(lambda mod, inp, o: o + 1.0)
    try:
        assert fusable_head(model) is None
    finally:
        handle.remove()


def test_head_logprobs_under_autocast_exact_values_bfloat16_gradient_matmuls():
    """``grad_dtype`` (a ``model.autocast`` run): the log-probs are the float32 head's exactly; the gradients
    come from bfloat16 matmuls, within bfloat16 rounding of the float32 ones, in the parameters' dtype."""
    from atgrpo.policies.logprobs import head_logprobs

    head, hidden, rows, targets, w = _head_case(bias=False)
    ours = head_logprobs(hidden, head, targets, 1.0, rows=rows, grad_dtype=torch.bfloat16)
    ref = head_logprobs(hidden, head, targets, 1.0, rows=rows)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    ga = torch.autograd.grad((ours * w).sum(), (hidden, head.weight))
    gb = torch.autograd.grad((ref * w).sum(), (hidden, head.weight))
    for a, b in zip(ga, gb):
        assert a.dtype == torch.float32
        assert (a - b).abs().max() <= 2e-2 * b.abs().max()
