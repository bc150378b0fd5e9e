"""Performance benchmarks (``atgrpo bench rollout|update|step|all``): measured, side by side, never faked.

- ``rollout``: tree-style K-way ``generate`` vs one request per branch vs ``num_return_sequences`` (rollout.py);
- ``update``: shared-prefix loss vs one sequence per sample, forward + backward, with MFU (update.py);
- ``step``: a whole single-agent GRPO step vs TRL's ``GRPOTrainer`` on the same tiny model (step.py).

Each writes ``<out>/<bench>_<tag>.json`` and ``.md``. Importing this package is light; the benchmarks import
torch and transformers when they run. See docs/performance.md for the measured numbers.
"""
