"""Code: a coder and a unit tester solve a programming problem, with programs run in the sandbox.

Turn order: ``coder`` then ``tester``. ``roles=("coder",)`` is the single-agent (L0) variant.

- The coder writes a stdin/stdout Python program (the last fenced python block of its answer, or the whole text;
  ``programs.extract_code``). It is run in ``atgrpo.sandbox`` on the problem's hidden ground-truth tests, in parallel.
  ``local`` = the pass ratio; an empty program or one that does not compile scores ``FORMAT_PENALTY`` instead
  (``info["parse_error"]``; it is not run). Success = every hidden test passes.
- The tester writes up to 5 test cases (input + expected output; format in ``code_exec``). Each case is judged
  against the problem's reference solution, run in the sandbox on the case's input: a case is VALID iff the
  reference runs cleanly and its output matches the expected output (``code_exec.outputs_match``). The coder's
  current program is run on every case; a valid case it fails EXPOSES it. Tester
  ``local = n_valid / n_cases + EXPOSE_BONUS * [at least one valid case exposes the program]`` (in [0, 1.5]);
  no readable case scores ``FORMAT_PENALTY`` (``info["parse_error"]``).
- ``team`` = the hidden-test pass ratio of the coder's current program (1.0 exactly on success), for both roles.
- Feedback: the mismatches (input, expected, got) of the coder's program on the tester's cases, all of them,
  valid or not (validity comes from the hidden reference and is never shown), appear in both roles' prompts of
  the next turn. Single-agent variant: the mismatches on the problem's public examples instead (generated
  problems only; HumanEval and JSONL records have no separate examples).
- The episode terminates on success, or when the current program passes every valid case of the tester and
  there is at least one (the team agrees), else truncates after ``max_turns`` turns.

Datasets (``code_data``): ``generated`` (seeded toy problems, train and eval), ``humaneval`` (eval only; the
tester writes function calls: an argument list and the expected return value), ``jsonl`` (local APPS /
CodeContests / LiveCodeBench records; the tester needs records with a ``solution``).

Departures from the paper: up to 3 turns by default (paper: 5); the tester's reward formula is not given in the
paper and is defined here; results of one program on one input are cached (a nondeterministic program is
judged once per input; one cache, ``programs``, for every task that runs programs); on HumanEval the coder
sees the function prompt and is scored by the official check.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from . import splits
from .base import Messages, MultiAgentEnv, Reward
from .code_data import (DATASETS, Problem, generated_problem, humaneval_problems, load_files, load_jsonl,
                        sibling_program)
from .code_exec import MAX_TESTS, Test, describe_failure, format_tests, outputs_match, parse_tests, passed, syntax_error
from .programs import extract_code, run_jobs

FORMAT_PENALTY = -0.5
EXPOSE_BONUS = 0.5
SHOW_CHARS = 300  # per shown input / expected / got
SHOW_CODE_CHARS = 3000
SHOW_MISMATCHES = 5

DEMO_MISTAKES = ("line", "sibling")

Mismatch = tuple[str, str, str]  # (input, expected, got)


class CodeEnv(MultiAgentEnv):
    """Code: coder + unit tester write and test a stdin/stdout program, run in a sandbox."""

    name = "code"
    team_roles = ("coder", "tester")
    single_agent_roles = ("coder",)

    def __init__(self, dataset: str = "generated", max_turns: int = 3, style: str = "chat", split: str = "train",
                 roles: tuple[str, ...] | None = None, timeout: float = 2.0, data_path: str | None = None,
                 parallel: bool = True, cache: bool = True, data_files: str | list[str] | None = None,
                 eval_data_files: str | list[str] | None = None, columns: dict[str, str] | None = None,
                 packages: list[str] | None = None, demo_mistake: str = "line"):
        """``timeout``: seconds per program run (hidden test, tester case, reference); ``data_path``: the file of
        ``dataset="jsonl"``; ``parallel``: run the cases of one step on the shared sandbox pool (else one by
        one); ``cache``: reuse results of (program, input) pairs already run. ``dataset="files"``: problems from
        ``data_files`` (JSON, JSONL, Parquet or CSV, read with ``datasets``; ``eval_data_files`` for the
        evaluation split, else the same files), columns question, inputs, outputs, solution renamed by
        ``columns`` ({field: column}). ``packages``: installed packages the programs may import in the sandbox
        (none by default: the standard library only). ``demo_mistake``: the scripted coder's mistake in the warm
        start's noisy demonstrations, ``line`` (a line of the reference dropped) or ``sibling`` (the program of
        another statement from the same template, ``code_data.sibling_program``; a dropped line for problems
        without one): after a sibling, the demonstration's next coder turn is a different program, where after
        a dropped line it is the same one with the line back."""
        super().__init__(max_turns=max_turns, style=style, roles=roles)
        if dataset not in DATASETS:
            raise ValueError(f"unknown code dataset {dataset!r}; valid: {', '.join(DATASETS)}")
        if split not in splits.SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(splits.SPLITS)}")
        if demo_mistake not in DEMO_MISTAKES:
            raise ValueError(f"unknown demo_mistake {demo_mistake!r}; valid: {', '.join(DEMO_MISTAKES)}")
        if not timeout > 0:
            raise ValueError(f"code timeout must be > 0 seconds, got {timeout}")
        if (data_path is not None) != (dataset == "jsonl"):
            raise ValueError("data_path is needed for dataset='jsonl' and only there")
        if (data_files is not None) != (dataset == "files"):
            raise ValueError("data_files is needed for dataset='files' and only there")
        if (eval_data_files is not None or columns is not None) and dataset != "files":
            raise ValueError("eval_data_files and columns go with dataset='files'")
        self.dataset, self.split, self.timeout = dataset, split, float(timeout)
        self.packages = tuple(packages or ())
        self.parallel, self.cache, self.demo_mistake = parallel, cache, demo_mistake
        self._problems: tuple[Problem, ...] = ()
        if dataset in ("jsonl", "files"):
            source = data_path if dataset == "jsonl" else (eval_data_files if split == "eval" and eval_data_files
                                                           else data_files)
            self._problems = (load_jsonl(data_path) if dataset == "jsonl"  # type: ignore[arg-type]
                              else load_files(source, columns))
            missing = sum(p.reference is None for p in self._problems)
            if "tester" in self.agents and missing:
                raise ValueError(f"{source}: {missing} of {len(self._problems)} records have no 'solution'; the "
                                 "tester's reward needs a reference solution: add them, drop those records, or "
                                 "use roles=('coder',)")
        elif dataset == "humaneval":
            self._problems = humaneval_problems()

    # ---- episode --------------------------------------------------------------------------------------
    def _reset(self, seed: int) -> None:
        if self.dataset == "generated":
            self.problem = generated_problem(seed, self.split)
        elif self.dataset == "humaneval" and self.split != "eval":
            raise ValueError("HumanEval has evaluation problems only: use split='eval' (train on dataset="
                             "'generated' or 'jsonl')")
        else:
            self.problem = self._problems[seed % len(self._problems)]
        self.problem_id = f"code/{self.dataset}/{self.split}/{seed}"
        self.code: str | None = None  # the coder's latest code as written (None before its first answer)
        self.program = ""  # the full program run for it
        self.program_error: str | None = None  # why the program cannot run (empty, syntax error)
        self.hidden_pass = 0.0
        self.tests: list[Test] = []  # the tester's latest cases
        self.feedback: tuple[str, int, list[Mismatch]] | None = None  # (what was tested, n cases, mismatches)
        self.agreed = False

    def clone(self) -> "CodeEnv":
        """An independent copy, cheaper than a deep copy: the problem (and the dataset) are immutable and shared;
        the only mutable state, ``tests`` and ``feedback``, is copied."""
        twin = copy.copy(self)
        twin.tests = list(self.tests)
        twin.feedback = None if self.feedback is None else (self.feedback[0], self.feedback[1], list(self.feedback[2]))
        return twin

    @property
    def success(self) -> bool:
        return self.hidden_pass == 1.0

    def _ends_early(self) -> bool:
        """The episode ends early by agreement: the program passes the tester's cases."""
        return self.agreed

    # ---- running ------------------------------------------------------------------------------------
    def _run(self, tests: list[Test]) -> list[tuple[bool, str]]:
        """(passed, output or why not) of the current program on (input, expected) ``tests``."""
        if self.program_error is not None:
            return [(False, self.program_error)] * len(tests)
        fm = self.problem.function_mode
        code = self.problem.io_program(self.program)
        results = run_jobs([(code, inp, self.timeout) for inp, _ in tests], self.parallel, self.cache,
                           packages=self.packages)
        return [(passed(r, exp, fm), describe_failure(r)) for r, (_, exp) in zip(results, tests)]

    def _hidden_pass_ratio(self) -> float:
        p = self.problem
        if self.program_error is not None:
            return 0.0
        if p.check is not None:
            r = run_jobs([(p.check_program(self.program), "", self.timeout)], self.parallel, self.cache,
                         packages=self.packages)[0]
            return 1.0 if r.ok else 0.0
        return sum(ok for ok, _ in self._run(list(p.tests))) / len(p.tests)

    # ---- dynamics -----------------------------------------------------------------------------------
    def _apply(self, agent: str, text: str) -> tuple[Reward, dict[str, Any]]:
        return self._apply_coder(text) if agent == "coder" else self._apply_tester(text)

    def _apply_coder(self, text: str) -> tuple[Reward, dict[str, Any]]:
        code, fenced = extract_code(text)
        self.code, self.program = code, self.problem.program(code)
        self.program_error = syntax_error(self.program)
        self.hidden_pass = self._hidden_pass_ratio()
        info: dict[str, Any] = {"parse_error": self.program_error is not None, "code_block": fenced,
                                "pass_ratio": self.hidden_pass}
        if "tester" not in self.agents and self.problem.examples:
            examples = list(self.problem.examples)
            runs = self._run(examples)
            self.feedback = ("the public examples", len(examples),
                             [(i, e, got) for (i, e), (ok, got) in zip(examples, runs) if not ok])
        local = FORMAT_PENALTY if self.program_error is not None else self.hidden_pass
        return Reward(team=self.hidden_pass, local=local), info

    def _apply_tester(self, text: str) -> tuple[Reward, dict[str, Any]]:
        p, fm = self.problem, self.problem.function_mode
        tests, info = parse_tests(text, fm)
        self.tests, self.agreed = tests, False
        info.update(parse_error=not tests, tests=len(tests), valid=0, exposing=0, agreed=False)
        if not tests:
            self.feedback = ("the tester's cases", 0, [])
            return Reward(team=self.hidden_pass, local=FORMAT_PENALTY), info
        assert p.reference is not None, "the tester needs a reference solution (checked in __init__)"
        ref_code, prog_code = p.io_program(p.reference), p.io_program(self.program)
        jobs = [(ref_code, inp, self.timeout) for inp, _ in tests]
        if self.program_error is None:
            jobs += [(prog_code, inp, self.timeout) for inp, _ in tests]
        results = run_jobs(jobs, self.parallel, self.cache, packages=self.packages)
        valid = [r.ok and outputs_match(exp, r.stdout, fm) for r, (_, exp) in zip(results, tests)]
        if self.program_error is None:
            runs = [(passed(r, exp, fm), describe_failure(r)) for r, (_, exp) in zip(results[len(tests):], tests)]
        else:
            runs = [(False, self.program_error)] * len(tests)
        exposing = [v and not ok for v, (ok, _) in zip(valid, runs)]
        self.agreed = any(valid) and not any(exposing)
        self.feedback = ("the tester's cases", len(tests),
                         [(i, e, got) for (i, e), (ok, got) in zip(tests, runs) if not ok])
        info.update(valid=sum(valid), exposing=sum(exposing), agreed=self.agreed)
        local = sum(valid) / len(tests) + (EXPOSE_BONUS if any(exposing) else 0.0)
        return Reward(team=self.hidden_pass, local=local), info

    # ---- scripted agents ------------------------------------------------------------------------------
    def expert_action(self, agent: str) -> str:
        """Coder: the reference solution. Tester: valid cases from the problem's data (generator / dataset)."""
        if agent == "coder":
            if self.problem.reference is None:
                raise NotImplementedError(f"code: problem {self.problem.pid} has no reference solution")
            return f"```python\n{self.problem.reference.rstrip()}\n```"
        return format_tests(self.problem.tester_tests[:MAX_TESTS])

    def demo_action(self, agent: str, rng: random.Random, noise: float) -> str:
        """A noisy expert: with probability ``noise`` the coder makes its mistake (``demo_mistake``: a line of
        the program lost, or a sibling template's program); each expected output of the tester is corrupted (a
        digit or letter appended) with probability ``noise``."""
        if agent == "coder":
            expert = self.expert_action("coder")
            if rng.random() >= noise:
                return expert
            sibling = sibling_program(self.problem, rng) if self.demo_mistake == "sibling" else None
            if sibling is not None:
                return f"```python\n{sibling.rstrip()}\n```"
            lines = expert.split("\n")
            if len(lines) > 3:
                del lines[rng.randrange(1, len(lines) - 1)]
            return "\n".join(lines)
        cases = [(i, o + rng.choice("0123456789x") if rng.random() < noise else o)
                 for i, o in self.problem.tester_tests[:MAX_TESTS]]
        return format_tests(cases)

    # ---- prompts --------------------------------------------------------------------------------------
    def _observe(self, agent: str, style: str) -> str | Messages:
        return self._compact(agent) if style == "compact" else self._chat(agent)

    def _compact(self, agent: str) -> str:
        """Short fixed-format text: header, statement, first example, the current code (tester) or previous code
        (coder), mismatches as ``M:input|expected|got``, then '>'."""
        short = lambda s: repr(s[:60])[1:-1]  # noqa: E731
        lines = [f"{agent[0].upper()}{self.turn}", self.problem.statement]
        for inp, out in self.problem.examples[:1]:
            lines.append(f"E:{short(inp)}|{short(out)}")
        if self.code is not None:
            lines.append("P:" + self.code[:600].strip())
        if self.feedback is not None:
            _, n, mism = self.feedback
            lines.append(f"R:{n - len(mism)}/{n}")
            lines += [f"M:{short(i)}|{short(e)}|{short(g)}" for i, e, g in mism[:3]]
        return "\n".join(lines) + "\n>"

    def _chat(self, agent: str) -> Messages:
        p, pair = self.problem, "tester" in self.agents
        team = "a two-agent team (a coder and a unit tester)" if pair else "a team of one"
        if agent == "coder":
            if p.function_mode:
                task = ("Complete the Python function below. Give the whole function, with the imports it needs, "
                        "in one ```python code block at the end of your answer.")
            else:
                task = ("Write a complete Python 3 program that reads the input from standard input and prints the "
                        "answer to standard output. End your answer with the whole program in one ```python code "
                        "block.")
            role = (f"You are the coder in {team} solving a programming problem. Your program is judged on hidden "
                    f"tests. {task}")
            if pair:
                role += " The unit tester's test cases can be wrong: check them against the problem statement."
        else:
            fmt = ("**Input:**\n```\n<the arguments of one call, as Python literals separated by commas>\n```\n"
                   "**Output:**\n```\n<the Python literal the call returns>\n```" if p.function_mode else
                   "**Input:**\n```\n<the complete standard input>\n```\n**Output:**\n```\n<the exact expected "
                   "standard output>\n```")
            role = (f"You are the unit tester in {team} solving a programming problem. Write up to {MAX_TESTS} test "
                    "cases, each an input and the output a correct solution gives for it. Cases are checked against "
                    "a correct solution; correct cases that make the coder's current program fail are the most "
                    "valuable. Think briefly, then give each case in this format:\n" + fmt +
                    '\n(or one JSON list: [{"input": "...", "output": "..."}]).')
        statement = f"```python\n{p.statement.strip()}\n```" if p.function_mode else p.statement.strip()
        body = [f"Turn {self.turn + 1} of {self.max_turns}.", "", "Problem:", statement]
        for inp, out in p.examples:
            body += ["", "Example input:", _fence(inp), "Example output:", _fence(out)]
        if self.code is not None:
            label = "Your previous program:" if agent == "coder" else "The coder's current program:"
            body += ["", label, "```python\n" + self.code[:SHOW_CODE_CHARS].rstrip() + "\n```"]
        if self.feedback is not None:
            body += ["", self._feedback_text(agent)]
        return [{"role": "system", "content": role}, {"role": "user", "content": "\n".join(body)}]

    def _feedback_text(self, agent: str) -> str:
        what, n, mism = self.feedback  # type: ignore[misc]
        whose = "your previous program" if agent == "coder" else "the coder's previous program"
        if n == 0:
            return "The unit tester gave no readable test cases last turn."
        head = f"Results of {whose} on {what}: {n - len(mism)} of {n} passed."
        parts = [head] + [f"Mismatch {k + 1}:\nInput:\n{_fence(i)}\nExpected:\n{_fence(e)}\nGot:\n{_fence(g)}"
                          for k, (i, e, g) in enumerate(mism[:SHOW_MISMATCHES])]
        return "\n".join(parts)


def _fence(s: str) -> str:
    s = s if len(s) <= SHOW_CHARS else s[:SHOW_CHARS] + "..."
    return "```\n" + s.rstrip("\n") + "\n```"
