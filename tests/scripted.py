"""Scripted stand-ins for a model: policies with the ``Policy`` protocol whose answers the test chooses.

Byte-level ids (``ByteTokenizer``, prompts with BOS as the tiny policy encodes them); every answer ends with EOS
and carries the log-prob -0.5 per token. A subclass says what to answer in ``answers``."""

from __future__ import annotations

from atgrpo.policies import ByteTokenizer, Completion
from atgrpo.policies.tokenizer import EOS


def completion(text: str) -> Completion:
    """``text`` as a finished completion: its byte ids, then EOS."""
    ids = ByteTokenizer().encode(text) + [EOS]
    return Completion(ids, [-0.5] * len(ids), text, True)


class ScriptedBytePolicy:
    policy_id = "shared"

    def __init__(self, policy_id: str | None = None):
        if policy_id is not None:
            self.policy_id = policy_id
        self.tok = ByteTokenizer()

    def answers(self, prompts: list[str], n: int) -> list[list[str]]:
        """The ``n`` answer texts of each prompt (text as decoded from its ids) of one ``generate`` call."""
        raise NotImplementedError

    def render(self, prompt):
        return prompt

    def encode(self, text):
        return self.tok.encode(text, add_bos=True)

    def decode(self, ids):
        return self.tok.decode(ids)

    def generate(self, prompt_ids, n, temperature, max_new_tokens, generator=None):
        return [[completion(s) for s in row] for row in self.answers([self.tok.decode(p) for p in prompt_ids], n)]
