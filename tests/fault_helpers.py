"""Faults injected into real runs, and what two runs are compared on (no Ray needed; ``ray_helpers`` adds
the Ray workers' faults)."""


NOT_COMPARED = ("time/", "perf/", "ray/recoveries")  # timings, memory, and the recovery log itself


def run_rows(run_dir) -> list[dict]:
    """metrics.jsonl without the keys that differ between any two runs, or that log the recoveries."""
    import json
    import os

    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(NOT_COMPARED)} for line in f
                if line.strip()]


def before_step(monkeypatch, step: int, action) -> list:
    """Fault injection into a real run: ``action(state)`` once, just before the run's step ``step`` starts (the
    run's ``train_step`` is the real one, called right after). Returns a list that gets ``step`` when it ran."""
    import atgrpo.trainer.run as run_module

    real, done = run_module.train_step, []

    def train_step(state, n):
        if n == step and not done:
            done.append(n)
            action(state)
        return real(state, n)
    monkeypatch.setattr(run_module, "train_step", train_step)
    return done
