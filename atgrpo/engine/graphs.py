"""CUDA graphs of the decoding step: one capture per live batch size, replayed at every step until rows are dropped.

A decoding step of a small model launches a few hundred kernels that each run for microseconds, so on a GPU the
step is bound by launching them, not by the arithmetic. A CUDA graph records the step's kernels once and replays
them with one launch. ``Decoder.step(static=True)`` is written for it: fixed shapes for a given number of live rows
(the whole own-key buffer attended, unwritten positions hidden by a bias from the step tensor ``t``), no host
synchronisation, every buffer at a fixed address for the life of a ``generate`` call (``DecodeState``).

``StepGraphs.step`` copies the tokens, positions and step number into the graph's input buffers, replays, and
returns the graph's logits buffer. A graph is captured the first time a batch size is seen in a call (after one
eager warm-up step on a side stream, as torch requires); dropping finished rows (``native.py``, every
``compact_every`` steps) gives a new batch size and so one more capture. Captures share one memory pool.
"""

from __future__ import annotations

import torch

from .decoder import Decoder, DecodeState


class StepGraphs:
    """Captured decoding steps of one ``generate`` call on CUDA, by number of live rows."""

    def __init__(self, decoder: Decoder, st: DecodeState):
        self.decoder = decoder
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        self.own = st.own
        self.t = torch.zeros((), dtype=torch.long, device=st.own.device)

    def step(self, st: DecodeState, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """``Decoder.step``'s logits for ``tok``, ``pos`` at own position ``st.t``, from a replayed graph."""
        if st.own is not self.own:  # rows were dropped: a new own buffer, so new graphs (the old ones freed)
            self.graphs, self.own = {}, st.own
        key = tok.shape[0]
        if key not in self.graphs:
            self.graphs[key] = self._capture(st, tok, pos)
        graph, io = self.graphs[key]
        io["tok"].copy_(tok)
        io["pos"].copy_(pos)
        self.t.fill_(st.t)
        graph.replay()
        st.t += 1
        return io["logits"]

    def _capture(self, st: DecodeState, tok: torch.Tensor, pos: torch.Tensor):
        io = {"tok": tok.clone(), "pos": pos.clone()}
        self.t.fill_(st.t)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy initialisations happen outside the capture
            self.decoder.step(st, io["tok"], io["pos"], static=True, t=self.t)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            io["logits"] = self.decoder.step(st, io["tok"], io["pos"], static=True, t=self.t)
        return graph, io


def graphs_available(device) -> bool:
    """Whether steps on ``device`` can be captured: CUDA only."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()
