"""The local runner: set up, warm start, evaluate, train for ``train.steps`` steps, evaluate, write outputs.

Run directory: config.yaml, metrics.jsonl, summary.json, rollouts/step_<N>.jsonl, eval_transcripts.jsonl (the
latest held-out evaluation's episodes; eval_transcripts_start.jsonl the one before RL), report.html
(``atgrpo.report``; both written at each held-out evaluation), tensorboard/, learning_curves.png,
checkpoint/step_<N>/ (step_0 after the warm start and the first evaluation, then every ``train.checkpoint_every``
steps and at the end: what ``--resume`` continues from, see checkpoint.py), checkpoint/final/<policy>/
(transformers format), config.step_<N>.yaml (only after a resume at step N under a changed config), .lock.

Reliability: one run per directory (a lock held for the run's life); a resumed run continues from its last
checkpoint and writes the same metrics rows as an uninterrupted one (everything random in a step comes from
the restored generator and ``problem_seed``); SIGINT / SIGTERM stop between steps after a checkpoint; a run
stops with ``NonFiniteError`` after ``train.max_nonfinite`` skipped non-finite updates; a file of the run that
cannot be written (a full disk, an I/O error, a read-only directory, a directory in its place) stops it with one
line (``write_faults.RunWriteError``; a checkpoint: ``CheckpointWriteError``), what was written before intact
(report.html and the plot, views made again from the run's files, only warn). ``failpoints.py`` names the points
a test crashes a run at. On the Ray backend a lost rollout or update worker or node is recovered from without a
person (``recovery.py``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import time
from typing import Any, Callable

import yaml

from ..config import Config
from .active_run import CheckpointWriteError, NonFiniteError, Run, refresh_report
from .atomic_files import atomic_write_text, write_dir_atomically
from .checkpoint import (CHECKPOINT_DIR, Checkpoint, drop_old_checkpoints, load_references, remove_leftovers,
                         restore_newest_intact, save_policies, save_references)
from .evaluate import run_eval
from .failpoints import failpoint
from .memory import peak_rss_mib, phase
from .metrics import MetricsLogger, plot_curves
from .recovery import RecoveryExhausted, recover
from .run_settings import pin_model, sandbox_note, set_precision, set_threads
from .run_dir import (LOCK_FILE, RESOLVED_AT_START, ResumeError, RunError, RunLock, StopOnSignal, config_changes,
                      key_list, one_line, warn)
from .state import TrainState, build_state_checked, check_model_path
from .step import train_step
from .warmstart import warm_start
from .write_faults import stop_on_write_error, warn_on_write_error

__all__ = ["train", "NonFiniteError", "TrainingInterrupted", "CheckpointWriteError", "RecoveryExhausted"]


class TrainingInterrupted(Exception):
    """The run stopped on SIGINT / SIGTERM after writing a checkpoint; ``atgrpo train --resume`` continues it."""

    def __init__(self, step: int, checkpoint: str, run_dir: str):
        super().__init__(f"stopped after step {step}; checkpoint {checkpoint}; continue with: "
                         f"atgrpo train --resume {run_dir}")
        self.step, self.checkpoint, self.run_dir = step, checkpoint, run_dir


def check_run_dir(run_dir: str) -> None:
    """The run directory can be one: a directory or nothing yet (the lock checks that no other run holds it)."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RunError(f"run directory {run_dir!r} is a file, not a directory; choose another --out")


def train(cfg: Config, run_dir: str, progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Run a whole training (``resume``: continue the run in ``run_dir`` from its last checkpoint); returns the
    summary (also written to summary.json). Raises ``RunDirInUse`` when another run holds ``run_dir``,
    ``TrainingInterrupted`` after a stop signal, ``NonFiniteError`` after too many non-finite updates."""
    check_model_path(cfg)
    check_run_dir(run_dir)
    note = sandbox_note(cfg)
    if note:
        warn(note)
    created = not os.path.exists(run_dir)
    had_lock = os.path.exists(os.path.join(run_dir, LOCK_FILE))
    with RunLock(run_dir) as lock, StopOnSignal() as stop:
        if lock.previous_owner and progress:
            print(f"atgrpo: took over the lock of a dead run (pid {lock.previous_owner}) in {run_dir}")
        started: list[bool] = []  # _train appends once the directory holds something of this run
        try:
            return _train(cfg, run_dir, progress, resume, stop, started)
        except BaseException:
            if not started:  # failed while setting up: leave no trace of this attempt
                _remove_setup(run_dir, created, had_lock)
            raise


def _remove_setup(run_dir: str, created: bool, had_lock: bool) -> None:
    """Remove what a run that failed before any work left: the directory it created, or its lock file."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif not had_lock:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(run_dir, LOCK_FILE))


def _keep_changed_config(run_dir: str, cfg: Config, step: int) -> None:
    """A resume under a config that differs from the run's own (besides ``train.steps``, which extends a run, and
    the keys resolved per machine) mixes two recipes in one run: say which keys changed, and keep the config the
    first ``step`` steps ran under as ``config.step_<step>.yaml`` (config.yaml is the config from here on)."""
    changed = config_changes(run_dir, cfg, ignore=RESOLVED_AT_START + ("train.steps",))
    if not changed:
        return
    kept = os.path.join(run_dir, f"config.step_{step}.yaml")
    shutil.copyfile(os.path.join(run_dir, "config.yaml"), kept)
    warn(f"atgrpo: warning: resuming {run_dir} at step {step} under a changed config ({key_list(changed)}); the run "
         f"up to that step ran under {kept}")


def _ray_note(cfg: Config, state: TrainState) -> str | None:
    """How a local Ray cluster's CPUs will be shared (when atgrpo chooses), before the warm start."""
    import ray

    from ..config import local_ray_cpus
    from .ray.driver import ray_note

    if ray.is_initialized():
        return None
    return ray_note(cfg, len(state.policies), local_ray_cpus(cfg.system.ray))


def _train(cfg: Config, run_dir: str, progress: bool, resume: bool, stop: StopOnSignal,
           started: list[bool]) -> dict[str, Any]:
    start = time.time()
    say = print if progress else (lambda *a, **k: None)
    cfg = set_precision(set_threads(pin_model(cfg, say), say), say)
    opened = _open(cfg, run_dir, resume, started, say, progress, stop)
    if isinstance(opened, dict):  # the run had already finished
        return opened
    run = opened
    try:
        _start_backend(run)
        if run.saved is None and cfg.train.steps > 0 and (cfg.system.backend == "ray" or cfg.train.checkpoint_every):
            run.checkpoint()  # step 0: a recovery or --resume before the first scheduled one keeps the warm start
        _loop(run, stop)
        if run.saved != run.state.step:  # the end of the run (train.steps=0) or a stop before the next scheduled one
            run.checkpoint()
        if stop.requested:
            raise TrainingInterrupted(run.state.step, os.path.join(run_dir, CHECKPOINT_DIR, f"step_{run.state.step}"),
                                      run_dir)
        if run.state.step == 0 and run.before_episodes is not None:  # train.steps=0: the policies evaluated before
            after, episodes = run.before, run.before_episodes
        else:
            run.say(f"eval after: {cfg.eval.problems} held-out problems ...")
            with phase("eval_after", run.summary.setdefault("peak_rss_mb", {})):
                after, episodes = run_eval(run.state, cfg.seed)
        run.evals.append((cfg.train.steps, after["success_rate"]))
        run.log_row(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
    except BaseException:
        _close(run, failing=True)
        raise
    _close(run, failing=False)
    return _finish(run, after, episodes, start)


def _close(run: Run, failing: bool) -> None:
    """Close the loggers, then the backend (Ray workers, vLLM engines). While the run is failing, a logger that
    cannot close (its disk failed too) is a warning: the error that stopped the run is the one to report."""
    try:
        run.logger.close()
    except Exception as e:
        if not failing:
            raise
        warn(f"atgrpo: warning: the loggers of {run.run_dir} did not close: {one_line(e)}")
    finally:
        run.state.backend.close()


def _open(cfg: Config, run_dir: str, resume: bool, started: list[bool], say: Callable[..., None],
          progress: bool, stop: StopOnSignal) -> Run | dict[str, Any]:
    """Build the state and either restore the newest checkpoint (resume) or warm-start and evaluate (fresh run);
    returns the run, or the summary of a resumed run that had already finished."""
    if not resume and (os.path.exists(os.path.join(run_dir, "metrics.jsonl"))
                       or os.path.isdir(os.path.join(run_dir, CHECKPOINT_DIR))):
        raise RunError(f"{run_dir} already holds a run; continue it with `atgrpo train --resume {run_dir}` "
                       f"or choose another --out")
    state = build_state_checked(cfg)
    ckpt: Checkpoint | None = None
    if resume:
        started.append(True)  # the directory is the user's run: never removed
        remove_leftovers(run_dir)
        found = restore_newest_intact(run_dir, state, warn=warn)
        done = _finished_summary(run_dir)
        if found is not None:
            ckpt, prog = found
            with stop_on_write_error(os.path.join(run_dir, CHECKPOINT_DIR), run_dir, "while resuming"):
                drop_old_checkpoints(run_dir, cfg.train.keep_checkpoints)  # a kill may have left one too many
            if ckpt.step > cfg.train.steps:
                raise ResumeError(f"train.steps={cfg.train.steps} is below the step of the last checkpoint "
                                  f"({ckpt.step}, {ckpt.path})")
            if done is not None and done.get("steps") == ckpt.step == cfg.train.steps:
                say(f"atgrpo: {run_dir} already finished at step {ckpt.step}; pass train.steps=N to extend it")
                refresh_report(run_dir)  # a run killed after summary.json, before its last report.html
                return done
        elif done is not None:  # no checkpoint: a finished run whose checkpoints were removed is never started over
            if done.get("steps") == cfg.train.steps:
                say(f"atgrpo: {run_dir} already finished at step {cfg.train.steps} (its checkpoints were removed)")
                return done
            raise ResumeError(f"{run_dir} finished at step {done.get('steps')} and holds no checkpoint to "
                              f"continue from (they were removed); start the longer run with another --out")
    where = "while resuming" if resume else "before its first step"
    with stop_on_write_error(os.path.join(run_dir, "rollouts"), run_dir, where, kept=resume):
        os.makedirs(os.path.join(run_dir, "rollouts"), exist_ok=True)
    if ckpt is not None:
        _keep_changed_config(run_dir, cfg, ckpt.step)
    with stop_on_write_error(os.path.join(run_dir, "config.yaml"), run_dir, where, kept=resume):
        atomic_write_text(os.path.join(run_dir, "config.yaml"), yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    started.append(True)
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    n_params = {pid: p.num_parameters() for pid, p in state.policies.items()}
    say(f"atgrpo: env={cfg.env.name} sharing={cfg.policy.sharing} agents->policies={state.agent_to_policy} "
        f"params={n_params} run_dir={run_dir}")
    if cfg.system.backend == "ray" and progress:
        note = _ray_note(cfg, state)
        if note:
            say(note)
    summary: dict[str, Any] = {"run_dir": run_dir, "steps": cfg.train.steps, "agent_to_policy": state.agent_to_policy}
    if ckpt is not None:  # resume: everything the steps so far produced comes from the checkpoint
        if cfg.algo.kl_coef > 0:
            state.references = load_references(run_dir, state)
        if prog.get("warmstart") is not None:
            summary["warmstart"] = prog["warmstart"]
        summary["resumed_from_step"] = ckpt.step
        summary["eval_before"] = prog["eval_before"]
        with stop_on_write_error(metrics_path, run_dir, where):
            logger = MetricsLogger(run_dir, cfg.train.tensorboard, rows=prog["rows"], purge_step=ckpt.step + 1,
                                   logging=cfg.logging, params=cfg.to_dict())
        say(f"resumed from {ckpt.path} (step {ckpt.step} of {cfg.train.steps})")
        return Run(cfg, run_dir, state, logger, summary, prog["eval_before"], prog["rows"],
                   [tuple(e) for e in prog["evals"]], int(prog.get("nonfinite", 0)), ckpt.step, say)
    with stop_on_write_error(metrics_path, run_dir, where):
        logger = MetricsLogger(run_dir, cfg.train.tensorboard, rows=[], purge_step=0 if resume else None,
                               logging=cfg.logging, params=cfg.to_dict())
    stop.stop_point = "the warm start and the evaluation before RL"
    if cfg.warmstart.enabled and cfg.warmstart.episodes > 0:
        t = time.time()
        with phase("warmstart", summary.setdefault("peak_rss_mb", {})):
            losses = warm_start(state.make_env, state.agent_to_policy, state.policies, cfg.warmstart, cfg.seed,
                                progress)
        summary["warmstart"] = {"loss": losses, "seconds": time.time() - t}
        say(f"warm start done in {time.time() - t:.0f}s; final loss " +
            ", ".join(f"{p}={v[-1]:.3f}" for p, v in losses.items() if v))
    failpoint("run.warmstarted", 0)
    if cfg.algo.kl_coef > 0:
        state.references = {pid: copy.deepcopy(p) for pid, p in state.policies.items()}
        with stop_on_write_error(os.path.join(run_dir, CHECKPOINT_DIR, "reference"), run_dir, where):
            save_references(run_dir, state, lambda stage: failpoint(f"reference.{stage}", 0))
    t = time.time()
    say(f"eval before: {cfg.eval.problems} held-out problems, one greedy episode each ...")
    with phase("eval_before", summary.setdefault("peak_rss_mb", {})):
        before, episodes = run_eval(state, cfg.seed)
    say(f"eval before ({time.time() - t:.0f}s): success {before['success_rate']:.3f} on "
        f"{int(before['problems'])} held-out problems")
    summary["eval_before"] = before
    stop.stop_point = stop.AFTER_STEP
    run = Run(cfg, run_dir, state, logger, summary, before, [], [(0, before["success_rate"])], 0, None, say,
              before_episodes=episodes)
    run.evaluated(0, episodes)
    failpoint("run.evaluated", 0)
    return run


def _start_backend(run: Run) -> None:
    """Ray workers and vLLM engines start after the warm start (or the resume), with its weights."""
    cfg, state = run.cfg, run.state
    if cfg.system.backend == "ray":
        from .ray.driver import RayBackend

        state.backend = RayBackend(cfg)
    elif cfg.rollout.engine == "vllm":
        from .vllm_backend import VLLMBackend

        state.backend = VLLMBackend(cfg, state)


def _loop(run: Run, stop: StopOnSignal) -> None:
    """The training loop; on the Ray backend a lost worker or node is recovered from (``recovery.recover``:
    back to the last checkpoint, the steps since redone), up to ``system.ray.max_failures`` times."""
    from .ray.faults import WorkerLost

    at, lost = [run.state.step], None  # the step in progress; the loss to recover from
    while True:
        try:
            if lost is not None:  # a worker lost while the pools start again is one more loss
                recover(run, lost, at[0])
                lost = None
            return _steps(run, stop, at)
        except WorkerLost as e:
            lost = e


def _steps(run: Run, stop: StopOnSignal, at: list[int]) -> None:
    """The steps from the state's: a step, its metrics (and the held-out evaluation when due), a checkpoint when
    due. ``at[0]``: the step in progress (for a recovery)."""
    cfg, state = run.cfg, run.state
    for step in range(state.step + 1, cfg.train.steps + 1):
        if stop.requested:
            break
        at[0] = step
        failpoint("step.start", step)
        result = train_step(state, step)
        state.step = step
        eval_episodes = None
        metrics, skipped = result.metrics(), result.skipped_nonfinite
        metrics["update/skipped_nonfinite_total"] = float(run.nonfinite + skipped)
        if cfg.system.backend == "ray":  # the recoveries so far, and the seconds they lost since the last row
            metrics["ray/recoveries"] = float(len(run.recoveries))
            metrics["time/ray_recovery_lost"], run.lost_s = run.lost_s, 0.0
        if cfg.eval.every and step % cfg.eval.every == 0 and step != cfg.train.steps:
            peaks: dict[str, float] = {}
            with phase("eval", peaks):
                ev, eval_episodes = run_eval(state, cfg.seed)
            metrics.update({f"eval/{k}": v for k, v in ev.items()})
            metrics.update({f"perf/peak_rss_mb/{k}": v for k, v in peaks.items()})
            run.evals.append((step, ev["success_rate"]))
        run.log(step, metrics, result.samples)
        del result  # the samples: free them before the checkpoint
        if eval_episodes is not None:
            run.evaluated(step, eval_episodes)
            failpoint("step.eval", step)
        run.count_nonfinite(step, skipped)
        if (cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0) or step == cfg.train.steps:
            run.checkpoint()


def _finish(run: Run, after: dict[str, float], episodes: list, start: float) -> dict[str, Any]:
    """The final outputs: the final policies, the plot, summary.json, evaluation transcripts and report.html."""
    cfg, run_dir, summary = run.cfg, run.run_dir, run.summary
    summary["eval_after"] = after
    summary["wall_seconds"] = time.time() - start
    peak = peak_rss_mib()
    if peak is not None:  # the whole process's (on a resume: since it resumed)
        summary.setdefault("peak_rss_mb", {})["process"] = peak
    if cfg.system.backend == "ray":
        summary["recoveries"] = [vars(r) for r in run.recoveries]
    final, end = os.path.join(run_dir, CHECKPOINT_DIR, "final"), "after its last step"
    with run.writing(final, where=end):
        write_dir_atomically(final, lambda d: save_policies(run.state, d),
                             lambda stage: failpoint(f"final.{stage}", cfg.train.steps))
    if cfg.train.plot and run.rows:
        plot = os.path.join(run_dir, "learning_curves.png")
        with warn_on_write_error(plot, "the plot is a view of metrics.jsonl; report.html shows the same curves"):
            summary["plot"] = plot_curves(run_dir, run.rows, run.evals)
    run.write_transcripts(cfg.train.steps, episodes, where=end)
    failpoint("run.transcripts", cfg.train.steps)
    with run.writing(os.path.join(run_dir, "summary.json"), where=end):  # last: it marks the run finished
        atomic_write_text(os.path.join(run_dir, "summary.json"), json.dumps(summary, indent=1))
    failpoint("run.summary", cfg.train.steps)
    refresh_report(run_dir)  # with the summary
    failpoint("run.end", cfg.train.steps)
    run.say(f"eval after: success {after['success_rate']:.3f} (before {run.before['success_rate']:.3f}); "
            f"{summary['wall_seconds']:.0f}s; outputs in {run_dir}")
    return summary


def _finished_summary(run_dir: str) -> dict[str, Any] | None:
    """summary.json of a finished run; None when there is none, or it is damaged (the resume rewrites it)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            done = json.load(f)
        if not isinstance(done, dict):
            raise ValueError("not a JSON object")
        return done
    except (OSError, ValueError) as e:
        warn(f"atgrpo: warning: {path} is damaged ({one_line(e)}); ignoring it (the resumed run writes it again)")
        return None


