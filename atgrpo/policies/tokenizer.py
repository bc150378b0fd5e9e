"""A byte-level tokenizer for the built-in tiny policy: no files, no training, every string encodable.

Ids 0..2 are PAD, BOS, EOS; byte b is id b + 3. Decoding drops special ids and replaces invalid UTF-8.
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

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [b + OFFSET for b in text.encode("utf-8", errors="replace")]
        return [BOS] + ids if add_bos else ids

    def decode(self, ids) -> str:
        return bytes(int(i) - OFFSET for i in ids if int(i) >= OFFSET).decode("utf-8", errors="replace")
