"""Problem sets from local files through Hugging Face datasets (JSON, JSONL, Parquet, CSV) for the code and math
tasks: column mapping, one clear error naming missing columns, and a Parquet file of problems trained two steps."""

from __future__ import annotations

import json

import pytest

from atgrpo.cli import main
from atgrpo.config import ConfigError, load_config
from atgrpo.envs import check_env, make

CODE = [
    {"question": "Read an integer n and print n + 1.", "inputs": ["1\n", "41\n"], "outputs": ["2\n", "42\n"],
     "solution": "print(int(input()) + 1)"},
    {"question": "Read a word and print it reversed.", "inputs": ["abc\n", "xy\n"], "outputs": ["cba\n", "yx\n"],
     "solution": "print(input()[::-1])"},
    {"question": "Read two integers a b and print a * b.", "inputs": ["2 3\n", "5 7\n"], "outputs": ["6\n", "35\n"],
     "solution": "a, b = map(int, input().split())\nprint(a * b)"},
]


def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))


def test_parquet_of_code_problems_loads_passes_check_env_and_trains_two_steps(tmp_path, fast_overrides):
    data = tmp_path / "problems.parquet"
    _parquet(data, CODE)
    env = make("code", dataset="files", data_files=str(data), style="compact")
    env.reset(1)
    assert "reversed" in env.problem.statement and env.problem.tests[0] == ("abc\n", "cba\n")
    env.step(env.expert_action("coder"))
    assert env.hidden_pass == 1.0  # the file's solution passes the file's tests, run in the sandbox
    check_env(make("code", dataset="files", data_files=str(data), style="compact"), episodes=1)
    out = tmp_path / "run"
    assert main(["train", *fast_overrides, "env.name=code", "env.style=compact", "env.kwargs.dataset=files",
                 f"env.kwargs.data_files={data}", "env.kwargs.max_turns=1", "rollout.problems_per_step=2",
                 "warmstart.enabled=false", "eval.problems=2", "--out", str(out), "--quiet"]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rollout/reward/coder" in r] == [1, 2]
    samples = [json.loads(x) for x in (out / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert all(s["problem"].startswith("code/files/train/") for s in samples)
    assert any(q["question"].split()[0] in s["prompt"] for s in samples for q in CODE)


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "parquet"])
def test_math_problems_in_every_format_with_a_column_mapping(tmp_path, fmt):
    rows = [{"prompt": f"What is {a} + {a}?", "gold": 2 * a} for a in range(1, 4)]
    path = tmp_path / f"sums.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        path.write_text("prompt,gold\n" + "".join(f"{r['prompt']},{r['gold']}\n" for r in rows))
    else:
        _parquet(path, rows)
    cfg = load_config(None, ["env.name=math", "env.style=compact", "env.kwargs.dataset=files",
                             f"env.kwargs.data_files=[{path}]", "env.kwargs.columns={problem: prompt, answer: gold}"])
    kw = cfg.env.kwargs
    for split in ("train", "eval"):
        env = make("math", style="compact", split=split, **kw)
        env.reset(4)  # seed 4 -> row 1 of 3
        assert env.problem.question == "What is 2 + 2?" and env.problem.answer == "4"
        assert env.problem_id == f"math/files/{split}/4"


def test_missing_columns_are_named_with_the_columns_the_file_has(tmp_path, capsys):
    path = tmp_path / "bad.parquet"
    _parquet(path, [{"question": "q", "stdin": ["1\n"], "stdout": ["1\n"]}])
    assert main(["train", "env.name=code", "env.style=compact", "env.kwargs.dataset=files",
                 f"env.kwargs.data_files={path}", "env.kwargs.roles=[coder]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert ("missing columns 'inputs', 'outputs'; the file has 'question', 'stdin', 'stdout'; map a column to a "
            "field with env.kwargs.columns={field: column}") in err[0]
    # mapped, it loads (the coder alone needs no reference solution)
    env = make("code", dataset="files", data_files=str(path), columns={"inputs": "stdin", "outputs": "stdout"},
               roles=("coder",), style="compact")
    env.reset(0)
    assert env.problem.tests == (("1\n", "1\n"),)


@pytest.mark.parametrize("kwargs, message", [
    ({"data_files": "x.txt"}, "unknown extension '.txt'"),
    ({"data_files": "nope.parquet"}, "data file 'nope.parquet' not found"),
    ({"data_files": "a.csv", "columns": {"prompt": "q"}}, "'prompt' not a field of this task"),
])
def test_bad_file_settings(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.csv").write_text("problem,answer\n1+1,2\n")
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        load_config(None, ["env.name=math", "env.kwargs.dataset=files",
                           *[f"env.kwargs.{k}={json.dumps(v)}" for k, v in kwargs.items()]])
