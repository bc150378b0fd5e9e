"""The write faults the suite injects, one per (file a run writes, fault), and what each must do: the single list
that ``tests/test_write_faults.py`` runs and that docs/reliability.md's table is rendered from (``render_table``;
``python tests/write_fault_cases.py`` rewrites the table in the doc, and a test fails while the doc differs).

Every case runs a real 2-step run (``ITEMS``) in this process with the fault armed before ``Site.step`` (0: from
the start), on the first write of the site's file (``fault_inject.WriteFault``); outcomes:

    stops     exit 2, one line naming the file, the cause and what to do; nothing written before changed; once the
              fault is gone, ``atgrpo train --resume`` (or, when the run had not started, the same command again)
              ends with the rows of an uninterrupted run
    warns     a warning line naming the file and the cause; the run goes on and ends with the same rows
    replaced  a stale entry in the way of a checkpoint directory is replaced; the run goes on, same rows
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from conftest import FAST

ITEMS = FAST + ["warmstart.enabled=false", "train.steps=2", "train.checkpoint_every=1", "eval.problems=2"]

FAULTS = {  # column: the fault as the table names it
    "ENOSPC": "full disk (ENOSPC)",
    "torch": "full disk, as torch's `RuntimeError`",
    "EIO": "I/O error (EIO)",
    "EROFS": "read-only directory (EROFS)",
    "EISDIR": "a directory in the file's place",
}
CAUSE = {"ENOSPC": "No space left on device", "torch": "torch's writer failed", "EIO": "Input/output error",
         "EROFS": "Read-only file system", "EISDIR": "Is a directory"}  # in the line
REMEDY = {"ENOSPC": "make room on its disk", "torch": "check the disk", "EIO": "check the disk",
          "EROFS": "writable", "EISDIR": "move away what is in the way"}


@dataclass(frozen=True)
class Site:
    name: str  # the table's first column
    pattern: str  # the logical path (fnmatch) of the file the fault strikes, in the run directory
    shown: str  # the path the line names (and where EISDIR's directory goes), relative to the run directory
    step: int  # the fault is armed just before this step (0: from the start of the run)
    why: str  # the table's last column
    items: tuple[str, ...] = ()  # config overrides besides ITEMS
    warn: bool = False  # a view made again from the run's files: a warning, the run goes on
    started: bool = True  # the run had started when the fault strikes: its directory stays, --resume continues it


LOG = ("a log: a run that went on would end without this step's lines; stopping loses nothing (the resume redoes "
       "the step)")
CKPT = "the run's state: the previous checkpoint stays intact"
S = {s.name: s for s in [
    Site("`checkpoint/step_N/` (its directory: created, renamed into place)", "checkpoint/step_2", "checkpoint/step_2",
         2, CKPT + "; a stale entry of the same name is replaced"),
    Site("`checkpoint/step_N/<policy>/model.safetensors`", "checkpoint/step_2/*/model.safetensors",
         "checkpoint/step_2", 2, CKPT),
    Site("`checkpoint/step_N/trainer_state.pt` (torch)", "checkpoint/step_2/trainer_state.pt", "checkpoint/step_2",
         2, CKPT + "; torch's error has lost the errno: the free space decides if the line says the disk is full"),
    Site("`checkpoint/step_N/progress.json`", "checkpoint/step_2/progress.json", "checkpoint/step_2", 2, CKPT),
    Site("`checkpoint/step_N/manifest.json`", "checkpoint/step_2/manifest.json", "checkpoint/step_2", 2, CKPT),
    Site("`checkpoint/reference/` (`algo.kl_coef > 0`)", "checkpoint/reference*", "checkpoint/reference", 0,
         "written once, before step 1: the resume starts the run over", ("algo.kl_coef=0.05",)),
    Site("`checkpoint/final/`", "checkpoint/final*", "checkpoint/final", 2,
         "the result; the last step's checkpoint is intact, the resume writes it again"),
    Site("`metrics.jsonl`", "metrics.jsonl", "metrics.jsonl", 2, LOG),
    Site("`rollouts/step_N.jsonl`", "rollouts/step_2.jsonl", "rollouts/step_2.jsonl", 2, LOG),
    Site("`eval_transcripts.jsonl`", "eval_transcripts.jsonl", "eval_transcripts.jsonl", 2,
         "a result (the last evaluation's episodes); written before summary.json, which marks the run finished"),
    Site("`eval_transcripts_start.jsonl`", "eval_transcripts_start.jsonl", "eval_transcripts_start.jsonl", 0,
         "a result (the episodes before RL), written once before step 1: the resume starts the run over"),
    Site("`summary.json`", "summary.json", "summary.json", 2, "the result; written last"),
    Site("`config.yaml`", "config.yaml", "config.yaml", 0,
         "before any work: the run leaves nothing and is started again", started=False),
    Site("`report.html`", "report.html", "report.html", 2,
         "a view of the run's files: `atgrpo report RUN` writes it again", warn=True),
    Site("`learning_curves.png` (`train.plot`)", "learning_curves.png", "learning_curves.png", 2,
         "a view of metrics.jsonl; report.html has the same curves", ("train.plot=true",), warn=True),
]}


@dataclass(frozen=True)
class Case:
    site: Site
    fault: str
    op: str = "write"  # the operation the fault strikes: write | mkdir | rename (fault_inject.WriteFault)

    @property
    def outcome(self) -> str:
        if self.site.warn:
            return "warns"
        return "replaced" if self.fault == "EISDIR" and self.site.pattern.startswith("checkpoint/") else "stops"

    @property
    def id(self) -> str:
        return f"{self.site.shown}:{self.site.pattern.rsplit('/', 1)[-1]}:{self.fault}:{self.op}"


def _cases() -> list[Case]:
    ckpt_dir, files = S["`checkpoint/step_N/` (its directory: created, renamed into place)"], list(S.values())[1:5]
    out = [Case(ckpt_dir, "ENOSPC", "mkdir"), Case(ckpt_dir, "EIO", "rename"), Case(ckpt_dir, "EROFS", "mkdir"),
           Case(ckpt_dir, "EISDIR")]
    for site in files:  # inside a fresh .tmp-* directory: only the data written can fail
        out += [Case(site, "ENOSPC"), Case(site, "EIO")] + ([Case(site, "torch")] if "torch" in site.name else [])
    for name in ("`checkpoint/reference/` (`algo.kl_coef > 0`)", "`checkpoint/final/`"):
        out += [Case(S[name], "ENOSPC"), Case(S[name], "EIO"), Case(S[name], "EROFS", "mkdir")]
    out.append(Case(S["`checkpoint/final/`"], "EISDIR"))
    for site in list(S.values())[7:]:  # single files (all after the checkpoints): every fault
        out += [Case(site, f) for f in ("ENOSPC", "EIO", "EROFS", "EISDIR")]
    return out


CASES = _cases()
CELL = {"stops": "stops, exit 2", "warns": "warns, goes on", "replaced": "replaced, goes on"}
BEGIN, END = "<!-- write-faults: begin (generated by tests/write_fault_cases.py) -->", "<!-- write-faults: end -->"


def render_table(cases: list[Case] = CASES) -> str:
    """The table of docs/reliability.md: a row per site, a column per fault, the outcome each case checks."""
    cols = list(FAULTS)
    lines = ["| file the run writes | " + " | ".join(FAULTS[c] for c in cols) + " | why |",
             "|---|" + "---|" * len(cols) + "---|"]
    for site in S.values():
        mine = {c.fault: c for c in cases if c.site is site}
        if not mine:
            continue
        cells = [CELL[mine[c].outcome] + (f" ({mine[c].op})" if mine[c].op != "write" else "") if c in mine else "-"
                 for c in cols]
        lines.append(f"| {site.name} | " + " | ".join(cells) + f" | {site.why} |")
    return "\n".join(lines)


def doc_block(doc: str) -> str | None:
    """The generated table in the text of docs/reliability.md (between its markers), or None."""
    m = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), doc, re.S)
    return m.group(1).rstrip("\n") if m else None


if __name__ == "__main__":  # rewrite the table in docs/reliability.md
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "reliability.md")
    text = open(path).read()
    if doc_block(text) is None:
        sys.exit(f"{path} has no {BEGIN} ... {END} block")
    start, end = text.index(BEGIN) + len(BEGIN) + 1, text.index(END)
    open(path, "w").write(text[:start] + render_table() + "\n" + text[end:])
    print(f"rewrote the table in {path}: {len(CASES)} cases")
