"""Any model output is data, never an exception: every registered environment parses random and adversarial
text for every agent, in both prompt styles, at turn 0 and turn 1, and scores it with finite rewards; text that
cannot be an answer sets ``info["parse_error"]`` or gets a negative local reward (a format penalty).

The code and math environments run programs in the sandbox at every step, and so does a game's tool agent in
``code`` mode (the chat style's default): those get few examples.
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atgrpo.envs import PROMPT_STYLES, make, registered

ENVS = list(registered())
SANDBOXED = {"code", "math", "code_review", "math_verify"}  # their step() runs the text as a program

# text that is no answer in any environment: no letters or digits (no move, cell, number or Python name), no
# brackets, quotes or '#' (no list, string or comment), only control characters, symbols and odd spaces
JUNK_CHARS = "\x00\x01\x02\x07\x08\x0b\x0c\x1b\x7f\u00a0\u200b\ufffd\u2603@$%^&*~|;:?!<>=+ \t\n"
ADVERSARIAL = [
    "", " ", "\n" * 50, "\x00\xff\x10garbage\x00", "\ufffd" * 300, "x" * 100_000, "UUDDLLRR " * 12_000,
    "[" * 5000, "]" * 5000, "[U, R", "[[1, 2], [3]]", '["U", 5, null]', "[U, R][D][", "[]", "[,,,]",
    "[1, 2, 3" + ", 4" * 30_000, "(" * 3000, "9" * 5000, "1e999999", "nan", "-inf", "\\boxed{", "\\boxed{}",
    "\\boxed{" * 1000, "\\boxed{\\frac{1}{0}}", "```python\n", "```python\nprint(1/0)\n```", "```\n```\n```",
    "def f(:\n  pass", "input()\n" * 3, "print('x' * 10**6)", "r1c1=5 r9c9=0 r0c0=x", "1 2 3 4\n" * 400,
    "<think>" + "reasoning " * 5000 + "</think>", "assert False", "up down left right sideways",
]

ANY_TEXT = st.one_of(
    st.text(max_size=400),
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace")),  # like a byte tokenizer's output
    st.lists(st.sampled_from(["U", "D", "L", "R", "up", "left", "1", "9", "0", "-1", "10", "null", "[", "]", ",",
                              "(", ")", '"', "'", ":", "=", "\\boxed{", "}", "```", "```python", "print(",
                              "input()", "\n", " ", "r1c2", "x"]), max_size=60).map("".join),
    st.sampled_from(ADVERSARIAL),
)
JUNK_TEXT = st.text(alphabet=st.sampled_from(JUNK_CHARS), max_size=300)


def _prestates(name, style):
    """For every agent, at turn 0 and (if the episode lasts) turn 1: an env whose acting agent is that agent,
    reached with the earlier agents acting as the expert would, else with empty text. The episode is followed
    as the env runs it, so a chosen turn order (a verifier sending the turn back) is covered too."""
    out = {}
    for filler in ("expert", ""):
        e = make(name, style=style)
        e.reset(3)
        while not e.done and e.turn < 2:
            out.setdefault((e.turn, e.current_agent), e.clone())
            e.step(_expert(e) if filler == "expert" else "")
    assert {agent for _, agent in out} == set(make(name, style=style).agents), f"{name}: could not reach every agent"
    return list(out.values())


def _expert(env):
    try:
        return env.expert_action(env.current_agent)
    except NotImplementedError:
        return ""


def _step(pre, text):
    env = pre.clone()
    agent = env.current_agent
    res = env.step(text)  # must not raise
    assert res.agent == agent
    assert math.isfinite(float(res.reward.team)) and math.isfinite(float(res.reward.local)), res
    assert isinstance(res.info, dict)
    env.observe(agent) if not env.done else None  # the next prompt renders, with the text in it
    return res


def _sandboxed(name, style):
    return name in SANDBOXED or getattr(make(name, style=style), "tool_mode", None) == "code"


def _fuzz_settings(name, style, scale=1.0):
    n = 30 if _sandboxed(name, style) else 200
    return settings(max_examples=max(4, int(n * scale)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("style", PROMPT_STYLES)
@pytest.mark.parametrize("name", ENVS)
def test_adversarial_text_is_parsed_by_every_agent(name, style):
    for pre in _prestates(name, style):
        for text in ADVERSARIAL if not _sandboxed(name, style) else ADVERSARIAL[::3]:
            _step(pre, text)


@pytest.mark.parametrize("style", PROMPT_STYLES)
@pytest.mark.parametrize("name", ENVS)
def test_random_text_never_raises_and_scores_finite(name, style):
    pres = _prestates(name, style)

    @_fuzz_settings(name, style)
    @given(text=ANY_TEXT, which=st.integers(0, len(pres) - 1))
    def check(text, which):
        _step(pres[which], text)
    check()


@pytest.mark.parametrize("style", PROMPT_STYLES)
@pytest.mark.parametrize("name", ENVS)
def test_unparsable_text_is_flagged_or_penalised(name, style):
    pres = _prestates(name, style)

    @_fuzz_settings(name, style, scale=0.5)
    @given(text=JUNK_TEXT, which=st.integers(0, len(pres) - 1))
    def check(text, which):
        res = _step(pres[which], text)
        assert res.info.get("parse_error") or res.reward.local < 0, (name, res.agent, repr(text), res)
    check()
