"""Math: a tool agent and a reasoner answer a math problem together.

Roles, in turn order:
- ``tool`` writes a Python program that prints the answer. The program is the last fenced ```python block of its
  output, else the whole output; it runs in ``atgrpo.sandbox.run_python`` (``timeout`` seconds, default limits).
  Its answer is the last non-empty line of stdout.
- ``reasoner`` reasons step by step and ends with ``\\boxed{answer}``; its answer is the last ``\\boxed{}``.
Every prompt shows the problem and the latest solution and answer of each agent, with the tool's execution result
(exit status, timeout flag, stdout / stderr tails), so from turn 1 on each agent sees the other's previous work.
``roles=("reasoner",)`` gives the single-agent (L0) variant. Compact prompts (tiny policies) read
``R1 Q:12+7*3=? T:33 E:... R:34\n>``: role letter and turn, question, the latest tool (T) and reasoner (R)
answers and the tool's error; chat prompts give the same in words, with the solutions and execution output.

Data (``math_data``): ``dataset="arithmetic"`` / ``"gsm"``: seeded reasoning-gym problems, train / eval disjoint
by content (``dataset_kwargs`` go to ``reasoning_gym.create_dataset``, e.g. ``{"max_terms": 3}``);
``dataset="jsonl"`` with ``data_path``: local evaluation records (AIME, OlympiadBench, MATH), ``split="eval"``
only, seed i -> record i mod the number of records (``dataset_kwargs`` unused).

End of the episode: ``terminated`` as soon as the latest answers of all agents are parsable and equivalent
(math-verify, not string equality: ``1/2``, ``0.5``, ``\\frac{1}{2}`` agree), checked after every step; else
``truncated`` after ``max_turns`` turns. With one agent, its first parsable answer ends the episode.
Success: the reasoner's final (latest) answer is correct, ``verify(parse(gold), parse(answer))``.

Rewards (``FORMAT_PENALTY`` = 0.1):
- ``local`` = 1.0 if the acting agent's own answer is correct, else 0.0; minus ``FORMAT_PENALTY`` if it has no
  parsable answer (reasoner: no ``\\boxed{}`` or an unparsable one; tool: no stdout line or an unparsable one) or,
  for the tool, if the program crashed (no code, non-zero exit, killed, timeout). One penalty at most per step.
- ``team`` = 1.0 if the reasoner's latest answer is correct after the step, else 0.0 (the same for both roles; for
  the tool in turn 0 the reasoner has not answered yet, so it is 0.0).
Answer parsing and checking: ``math_data`` (exception-safe, guarded against sympy blow-ups; for problems with a
plain-number gold, answers must be plain numbers).

Departures from the paper: the agents act in turn order, so in turn 0 the reasoner already sees the tool's
result of the same turn (as the plan agent does in Plan-Path); agreement is checked after every step, so a tool
that comes round to the reasoner's previous answer ends the episode before the reasoner's next turn. Identical
programs are executed once per process (a cache of sandbox results: programs are taken
to be deterministic; the one cache of ``programs``, shared with the code task and the games), which makes K
identical tree candidates cheap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .base import Messages, MultiAgentEnv, Reward
from .math_data import (DATASETS, GENERATED, MAX_ANSWER_CHARS, Problem, draw_problem, equivalent, is_correct,
                        last_boxed, load_files, load_jsonl, parse_answer)
from .programs import ProgramRun, program_info, program_output, run_program

FORMAT_PENALTY = 0.1
SOLUTION_CHARS = 1500  # previous solutions shown in chat prompts
COMPACT_ANSWER_CHARS = 24


@dataclass(frozen=True)
class Attempt:
    """One agent's latest output: the solution (reasoning or program), its answer, and for the tool the run."""

    text: str
    answer: str | None  # raw answer string (boxed content / last stdout line), None if there is none
    parsed: bool  # the answer parsed (math_data.parse_answer)
    correct: bool
    run: ProgramRun | None = None  # tool only: the program's run

    @property
    def crashed(self) -> bool:
        return self.run is not None and self.run.crashed


class MathEnv(MultiAgentEnv):
    """Math: tool agent (Python) + reasoner (\\boxed{}) answer arithmetic, GSM or local JSONL problems."""

    name = "math"
    team_roles = ("tool", "reasoner")
    single_agent_roles = ("reasoner",)

    def __init__(self, dataset: str = "arithmetic", max_turns: int = 3, style: str = "chat", split: str = "train",
                 roles: tuple[str, ...] | None = None, timeout: float = 2.0, data_path: str | None = None,
                 dataset_kwargs: dict[str, Any] | None = None, data_files: str | list[str] | None = None,
                 eval_data_files: str | list[str] | None = None, columns: dict[str, str] | None = None,
                 packages: list[str] | None = None):
        """``dataset_kwargs``: passed to ``reasoning_gym.create_dataset`` (e.g. ``{"max_terms": 3,
        "max_digits": 2}`` for arithmetic); ``data_path``: the JSONL file of ``dataset="jsonl"``.
        ``dataset="files"``: problems for training and evaluation from ``data_files`` (JSON, JSONL, Parquet or
        CSV, read with ``datasets``; ``eval_data_files`` for the evaluation split, else the same files), columns
        problem and answer renamed by ``columns`` ({field: column}). ``packages``: installed packages the tool
        agent's programs may import in the sandbox (none by default: the standard library only)."""
        super().__init__(max_turns=max_turns, style=style, roles=roles)
        if dataset not in DATASETS:
            raise ValueError(f"unknown math dataset {dataset!r}; valid: {', '.join(DATASETS)}")
        if not timeout > 0:
            raise ValueError(f"math timeout must be > 0 seconds, got {timeout}")
        self.dataset, self.split, self.timeout = dataset, split, float(timeout)
        self.packages = tuple(packages or ())
        self.dataset_kwargs = dict(dataset_kwargs or {})
        self.records: tuple[Problem, ...] = ()
        if dataset == "jsonl":
            if not data_path:
                raise ValueError("math dataset='jsonl' needs data_path (a JSONL file of {problem, answer} records)")
            self.records = load_jsonl(data_path)  # raises FileNotFoundError naming the path and the layout
        elif data_path:
            raise ValueError(f"data_path is only used with dataset='jsonl' (dataset={dataset!r})")
        if (data_files is not None) != (dataset == "files"):
            raise ValueError("data_files is needed for dataset='files' and only there")
        if (eval_data_files is not None or columns is not None) and dataset != "files":
            raise ValueError("eval_data_files and columns go with dataset='files'")
        if dataset == "files":
            self.records = load_files(eval_data_files if split == "eval" and eval_data_files else data_files,
                                      columns)

    # ---- episode --------------------------------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        if self.dataset in GENERATED:
            self.problem = draw_problem(self.dataset, seed, self.split, self.dataset_kwargs)
        elif self.dataset == "jsonl" and self.split != "eval":
            raise ValueError("math dataset='jsonl' holds evaluation problems only; use split='eval' "
                             "(train on 'arithmetic' or 'gsm')")
        else:
            self.problem = self.records[seed % len(self.records)]  # seed i -> record i (mod the file's length)
        self.numeric = self.problem.numeric
        self.problem_id = f"math/{self.dataset}/{self.split}/{seed}"
        self.last: dict[str, Attempt] = {}
        self.agreed = False

    @property
    def success(self) -> bool:
        """The reasoner's final answer is correct (read once the episode is over; False before)."""
        final = self.last.get("reasoner")
        return final is not None and final.correct and (self.agreed or self.truncated)

    def _ends_early(self) -> bool:
        """The episode ends early by agreement: the agents' answers agree (right or wrong)."""
        return self.agreed

    def _answers_agree(self) -> bool:
        tries = [self.last.get(a) for a in self.agents]
        if not all(t is not None and t.parsed for t in tries):
            return False
        return all(equivalent(tries[0].answer, t.answer, self.numeric) for t in tries[1:])

    # ---- acting ---------------------------------------------------------------------------------------
    def _apply(self, agent: str, text: str) -> tuple[Reward, dict[str, Any]]:
        info: dict[str, Any] = {}
        run = None
        if agent == "tool":
            run = run_program(text, self.timeout, packages=self.packages)
            code, answer, crashed = run.code, run.last_line and run.last_line[:MAX_ANSWER_CHARS + 1], run.crashed
            info.update(crashed=crashed, exit_code=run.exit_code, timed_out=run.timed_out)
        else:
            code, answer, crashed = text, last_boxed(text), False
        parsed = answer is not None and parse_answer(answer, self.numeric) is not None
        correct = parsed and is_correct(self.problem.answer, answer, self.numeric)
        if run is not None:
            info.update(program_info(run, parsed), **program_output(run))
        self.last[agent] = Attempt(code, answer, parsed, correct, run)
        self.agreed = self._answers_agree()
        local = (1.0 if correct else 0.0) - (FORMAT_PENALTY if crashed or not parsed else 0.0)
        reasoner = self.last.get("reasoner")
        team = 1.0 if reasoner is not None and reasoner.correct else 0.0
        info.update(answer=answer, parse_error=not parsed, correct=correct, agree=self.agreed)
        return Reward(team=team, local=local), info

    def expert_action(self, agent: str) -> str:
        """Tool: ``print(<expression>)`` (arithmetic; ``/`` as ``//``, exact here) or ``print(<gold>)``;
        reasoner: ``\\boxed{<gold>}``. Chat style puts the program in a ```python block."""
        gold = self.problem.answer
        if agent == "reasoner":
            return f"\\boxed{{{gold}}}"
        if self.problem.expression:
            value = self.problem.expression.replace("/", "//")
        else:
            value = gold if re.fullmatch(r"-?\d+(\.\d+)?", gold) else repr(gold)
        program = f"print({value})"
        return program if self.style == "compact" else f"```python\n{program}\n```"

    def answer_alphabet(self) -> str:
        return "0123456789-./"

    # ---- prompts --------------------------------------------------------------------------------------
    def _observe(self, agent: str, style: str) -> str | Messages:
        return self._compact(agent) if style == "compact" else self._chat(agent)

    def _compact(self, agent: str) -> str:
        """``R1 Q:12+7*3=? T:33 R:34\\n>``: role and turn, question, the tool's (T) and reasoner's (R) latest
        answers ('?' if none) and the tool's error (E:timeout, E:ZeroDivisionError, ...)."""
        parts = [f"{agent[0].upper()}{self.turn} Q:{self.problem.compact}"]
        tool, reasoner = self.last.get("tool"), self.last.get("reasoner")
        if tool is not None:
            parts.append(f"T:{(tool.answer or '?')[:COMPACT_ANSWER_CHARS]}")
            if tool.crashed:
                parts.append(f"E:{tool.run.error()}")
        if reasoner is not None:
            parts.append(f"R:{(reasoner.answer or '?')[:COMPACT_ANSWER_CHARS]}")
        return " ".join(parts) + "\n>"

    def _chat(self, agent: str) -> Messages:
        team = "a two-agent team" if len(self.agents) > 1 else "a math task, working alone"
        if agent == "tool":
            task = (f"You are the tool agent of {team} solving a math problem. Write a Python program that "
                    "computes the answer and prints it on the last line of its output. Put the program in a "
                    f"```python code block. It runs with a {self.timeout:g} s time limit and no network; use the "
                    "Python standard library.")
        else:
            task = (f"You are the reasoning agent of {team} solving a math problem. Reason step by step, then "
                    "give your final answer as \\boxed{answer} at the end.")
        if self.numeric:
            task += " The answer is a number: give it as a plain number (no units, no expression)."
        body = [f"Problem:\n{self.problem.question}", f"Turn {self.turn + 1} of {self.max_turns}."]
        tool, reasoner = self.last.get("tool"), self.last.get("reasoner")
        if tool is not None:
            body.append(self._tool_report(tool, agent == "tool"))
        if reasoner is not None:
            who = "Your" if agent == "reasoner" else "The reasoning agent's"
            shown = reasoner.answer if reasoner.answer is not None else "none (no \\boxed{} answer)"
            body.append(f"{who} previous solution (end):\n{reasoner.text[-SOLUTION_CHARS:]}\n"
                        f"{who} answer: {shown}")
        if tool is not None and reasoner is not None and tool.answer and reasoner.answer and not self.agreed:
            body.append("The answers do not agree yet. Check both solutions and give your corrected answer.")
        return [{"role": "system", "content": task}, {"role": "user", "content": "\n\n".join(body)}]

    def _tool_report(self, tool: Attempt, own: bool) -> str:
        who = "Your" if own else "The tool agent's"
        code = tool.text[-SOLUTION_CHARS:].rstrip()
        out = [f"{who} previous program:\n```python\n{code}\n```", f"Execution: {tool.run.status(self.timeout)}."]
        if tool.run.stdout.strip():
            out.append(f"stdout (end):\n{tool.run.stdout}")
        if tool.run.stderr.strip():
            out.append(f"stderr (end):\n{tool.run.stderr}")
        out.append(f"{who} answer (last printed line): "
                   f"{tool.answer if tool.answer is not None else 'none (nothing printed)'}")
        return "\n".join(out)
