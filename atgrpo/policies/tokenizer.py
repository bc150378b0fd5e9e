"""A byte-level tokenizer for the built-in tiny policy: no files, no training, every string encodable.

Ids 0..2 are PAD, BOS, EOS; byte b is id b + 3. Decoding drops special ids and replaces invalid UTF-8.

Besides its own ``encode`` / ``decode`` it has the calls of a Hugging Face tokenizer that ``CausalLMPolicy`` uses
(``tokenizer(text, add_special_tokens=...)``, ``decode(ids, skip_special_tokens=True)``, ``chat_template``,
``all_special_ids``), so the policy runs one code path for both kinds. It has no chat template (chat messages are
rendered as plain text, with no special token in them), so a prompt's BOS cannot come from the prompt text as a
Hugging Face chat template's specials do: ``prompt_prefix_ids`` (BOS) tells the policy to put it before every
prompt's tokens. Prompts are therefore ``[BOS] + bytes`` and responses ``bytes + [EOS]``.
"""

from __future__ import annotations

PAD, BOS, EOS = 0, 1, 2
OFFSET = 3
VOCAB_SIZE = 256 + OFFSET


class ByteTokenizer:
    pad_token_id = PAD
    bos_token_id = BOS
    eos_token_id = EOS
    vocab_size = VOCAB_SIZE
    all_special_ids = [PAD, BOS, EOS]
    chat_template = None  # no template: CausalLMPolicy.render writes chat messages as plain text
    prompt_prefix_ids = (BOS,)  # CausalLMPolicy.encode puts these before every prompt's tokens

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [b + OFFSET for b in text.encode("utf-8", errors="replace")]
        return [BOS] + ids if add_bos else ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """As a Hugging Face tokenizer that prepends BOS (Llama's): ``{"input_ids": ids}``, BOS first when
        ``add_special_tokens``."""
        return {"input_ids": self.encode(text, add_bos=add_special_tokens)}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a sequence or a tensor); special ids have no text and are dropped either way."""
        return bytes(int(i) - OFFSET for i in ids if int(i) >= OFFSET).decode("utf-8", errors="replace")
