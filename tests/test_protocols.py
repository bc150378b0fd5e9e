"""The policy and backend protocols (``policies/protocol.py``, ``trainer/backend.py``): every implementation has
the calls, with parameters the protocol's callers can pass; and the one tokenizer code path of ``CausalLMPolicy``
gives the token ids the former per-tokenizer branches gave (byte tokenizer: BOS-prefixed prompts; Hugging Face:
no special token added, whether or not the tokenizer adds BOS by default)."""

from __future__ import annotations

import inspect

import pytest
import torch

from atgrpo.policies import (ByteTokenizer, CausalLMPolicy, Policy, TinyModelConfig, TrainablePolicy,
                             build_tiny_model)
from atgrpo.policies.tokenizer import BOS, EOS
from atgrpo.engine.vllm_engine import EnginePolicy
from atgrpo.trainer.backend import Backend, LocalBackend

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
TEXTS = ["", "hello", "héllo wörld ✓ 🤖 中文", "tab\tnew\nline \x00 nul", "#.A\nG>", " <s> </s> <|im_end|>"]
CHATS = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo\nmove?"}],
         [{"role": "user", "content": "#.A\nG>"}]]


def _tiny() -> CausalLMPolicy:
    return CausalLMPolicy("p", build_tiny_model(TINY, 0), ByteTokenizer())


def _conforms(obj, proto) -> None:
    """``isinstance`` (the members exist) and every protocol method accepts the protocol's parameters by name."""
    assert isinstance(obj, proto), f"{type(obj).__name__} is not a {proto.__name__}"
    for klass in proto.__mro__:
        if not getattr(klass, "_is_protocol", False):
            continue
        for name, fn in vars(klass).items():
            if not inspect.isfunction(fn) or name.startswith("_"):
                continue
            params = list(inspect.signature(fn).parameters.values())[1:]  # without self
            impl = inspect.signature(getattr(obj, name))
            try:
                impl.bind(*[object() for p in params if p.default is inspect.Parameter.empty])
                impl.bind(**{p.name: object() for p in params})
            except TypeError as e:
                raise AssertionError(f"{type(obj).__name__}.{name}{impl} does not take {proto.__name__}'s "
                                     f"parameters {[p.name for p in params]}: {e}") from None


# ---- policies -------------------------------------------------------------------------------------------------
def test_causal_lm_policy_is_trainable():
    _conforms(_tiny(), TrainablePolicy)
    _conforms(_tiny(), Policy)


def test_hf_policy_is_trainable(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atgrpo.policies.hf import HFPolicy
    from hf_dirs import write_tiny_hf_dir

    d = write_tiny_hf_dir(str(tmp_path / "m"))
    pol = HFPolicy("p", AutoModelForCausalLM.from_pretrained(d, local_files_only=True),
                   AutoTokenizer.from_pretrained(d, local_files_only=True))
    _conforms(pol, TrainablePolicy)


def test_vllm_engine_policy_is_a_sampling_policy():
    view = EnginePolicy(_tiny(), engine=None)
    _conforms(view, Policy)
    assert view.encode("ab") == view.policy.encode("ab") and view.decode([100, EOS]) == "a"


def test_ray_remote_policy_is_a_sampling_policy():
    pytest.importorskip("ray")
    from atgrpo.trainer.ray.workers import RemotePolicy

    _conforms(RemotePolicy(_tiny(), []), Policy)


def test_the_tests_scripted_policies_are_sampling_policies():
    from test_eval_benchmarks import ScriptedPolicy as EvalScript
    from test_games_code_mode import ChatScript
    from test_tree import ScriptedPolicy

    for pol in (ScriptedPolicy("p", ["R"]), EvalScript({}, {}), ChatScript("p", lambda text, k: "R")):
        _conforms(pol, Policy)
        assert not isinstance(pol, TrainablePolicy)


# ---- backends -------------------------------------------------------------------------------------------------
def test_backends_conform():
    from atgrpo.trainer.ray.driver import RayBackend  # its top level imports neither ray nor torch
    from atgrpo.trainer.vllm_backend import VLLMBackend

    _conforms(LocalBackend(), Backend)
    for cls in (VLLMBackend, RayBackend):  # uninitialised: starting them needs vLLM / a Ray cluster
        _conforms(cls.__new__(cls), Backend)


# ---- one tokenizer code path, the same ids ------------------------------------------------------------------------
def test_byte_tokenizer_has_the_hugging_face_calls_the_policy_uses():
    tok = ByteTokenizer()
    assert tok("ab")["input_ids"] == [BOS, 100, 101] == tok.encode("ab", add_bos=True)
    assert tok("ab", add_special_tokens=False)["input_ids"] == [100, 101] == tok.encode("ab")
    assert tok.decode([BOS, 100, EOS], skip_special_tokens=True) == "a"
    assert tok.chat_template is None and tok.all_special_ids == [0, 1, 2]


def test_byte_policy_ids_are_those_of_the_former_byte_branches():
    """Former code: prompts ``tok.encode(text, add_bos=True)``, responses ``tok.encode(text) + [EOS]``, decode
    ``tok.decode(ids)``, chat messages as ``<role>\\ncontent\\n`` lines then ``<assistant>\\n``."""
    pol, tok = _tiny(), ByteTokenizer()
    assert pol.encode("ab\n") == [BOS, 100, 101, 13]
    assert pol.encode_response("hé") == [107, 198, 172, EOS]
    assert pol.render([{"role": "user", "content": "hi"}]) == "<user>\nhi\n<assistant>\n"
    for text in TEXTS + [pol.render(c) for c in CHATS]:
        assert pol.render(text) == text
        assert pol.encode(text) == tok.encode(text, add_bos=True)
        assert pol.encode_response(text) == tok.encode(text, add_bos=False) + [EOS]
        assert pol.decode(pol.encode(text)) == tok.decode(pol.encode(text)) == text.encode(
            "utf-8", errors="replace").decode("utf-8", errors="replace")
        assert pol.decode(torch.tensor(pol.encode_response(text))) == tok.decode(pol.encode_response(text))
    for chat in CHATS:
        assert pol.render(chat) == "".join(f"<{m['role']}>\n{m['content']}\n" for m in chat) + "<assistant>\n"


@pytest.mark.parametrize("add_bos", [False, True])
@pytest.mark.parametrize("template", ["chat", "none"])
def test_hf_policy_ids_are_those_of_the_former_hf_branches(tmp_path, add_bos, template):
    """Former code: prompts and responses ``tok(text, add_special_tokens=False)`` (responses + EOS), decode
    ``tok.decode(ids, skip_special_tokens=True)``; a tokenizer that adds BOS by default gets none."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atgrpo.policies.hf import HFPolicy
    from hf_dirs import write_tiny_hf_dir

    d = write_tiny_hf_dir(str(tmp_path / "m"), add_bos=add_bos)
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    if template == "none":
        tok.chat_template = None
    model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
    for pol in (CausalLMPolicy("p", model, tok), HFPolicy("p", model, tok)):
        assert pol.prompt_prefix_ids == []
        for text in TEXTS + [pol.render(c) for c in CHATS]:
            plain = tok(text, add_special_tokens=False)["input_ids"]
            assert pol.encode(text) == plain
            assert pol.encode_response(text) == plain + [tok.eos_token_id]
            assert pol.decode(pol.encode_response(text)) == tok.decode(plain + [tok.eos_token_id],
                                                                       skip_special_tokens=True)
        for chat in CHATS:
            ids = pol.encode(pol.render(chat))
            assert ids[0] == (tok.convert_tokens_to_ids("<|im_start|>") if template == "chat"
                              else tok(f"<{chat[0]['role']}>", add_special_tokens=False)["input_ids"][0])
            assert tok.bos_token_id not in ids
        if add_bos:
            assert tok("x")["input_ids"][0] == tok.bos_token_id  # the tokenizer's default would have added one
