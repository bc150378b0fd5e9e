"""Problem sets from local files through Hugging Face ``datasets``: JSON, JSON Lines, Parquet, CSV.

``load_table(data_files, fields, columns)`` reads the files (one format, by extension) with
``datasets.load_dataset`` and returns one dict per row holding ``fields`` under their atgrpo names. ``columns``
maps an atgrpo field to the file's column when the names differ (``{"question": "prompt"}``). A field that no
column provides is one error naming the missing columns and the columns the file has. Nothing is downloaded:
the files are local, and ``datasets`` is imported only here.

Used by the code task (``dataset="files"``: fields question, inputs, outputs, solution) and the math task
(``dataset="files"``: fields problem, answer); the environments check each row's values.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Sequence

FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def as_list(data_files: str | Sequence[str]) -> list[str]:
    files = [data_files] if isinstance(data_files, str) else list(data_files)
    if not files or not all(isinstance(f, str) and f for f in files):
        raise ValueError(f"data_files={data_files!r} must be a file path or a list of them")
    return files


def file_format(files: Sequence[str]) -> str:
    """The ``datasets`` builder of the files (all of one format), by extension."""
    kinds = set()
    for f in files:
        ext = os.path.splitext(f)[1].lower()
        if ext not in FORMATS:
            raise ValueError(f"data file {f!r}: unknown extension {ext or '(none)'!r}; use one of "
                             f"{', '.join(FORMATS)}")
        if not os.path.isfile(f):
            raise ValueError(f"data file {f!r} not found")
        kinds.add(FORMATS[ext])
    if len(kinds) > 1:
        raise ValueError(f"data_files mix formats ({', '.join(sorted(kinds))}); give files of one format")
    return kinds.pop()


def load_table(data_files: str | Sequence[str], fields: Sequence[str], optional: Sequence[str] = (),
               columns: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Rows of the files with the atgrpo ``fields`` (and ``optional`` ones, None when absent), renamed by
    ``columns`` (atgrpo field -> file column)."""
    given = as_list(data_files)
    fmt = file_format(given)  # errors name the paths as given
    files = [os.path.abspath(f) for f in given]
    columns = dict(columns or {})
    unknown = sorted(set(columns) - set(fields) - set(optional))
    if unknown:
        raise ValueError(f"columns: {', '.join(map(repr, unknown))} not a field of this task; fields: "
                         f"{', '.join([*fields, *optional])} (map each to a column of the file: {{field: column}})")
    stamp = tuple((f, os.path.getmtime(f), os.path.getsize(f)) for f in files)
    table = _read(tuple(files), fmt, stamp)
    have = list(table)
    source = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} files)"
    missing = [f"{f!r}" + (f" (mapped to column {columns[f]!r})" if f in columns else "")
               for f in fields if columns.get(f, f) not in table]
    if missing:
        raise ValueError(f"{source}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; the file "
                         f"has {', '.join(map(repr, have)) or 'no columns'}; map a column to a field with "
                         f"env.kwargs.columns={{field: column}}")
    n = len(next(iter(table.values()))) if table else 0
    if n == 0:
        raise ValueError(f"{source}: no rows")
    out = []
    for i in range(n):
        row = {f: table[columns.get(f, f)][i] for f in fields}
        for f in optional:
            col = columns.get(f, f)
            row[f] = table[col][i] if col in table else None
        out.append(row)
    return out


@functools.lru_cache(maxsize=8)
def _read(files: tuple[str, ...], fmt: str, stamp: tuple) -> dict[str, list]:
    """The files as columns (cached per path, modification time and size)."""
    try:
        import datasets
    except ImportError:
        raise ValueError("dataset='files' reads the files with Hugging Face datasets, which is not installed here: "
                         "pip install -e '.[data]'") from None
    datasets.disable_progress_bars()
    ds = datasets.load_dataset(fmt, data_files=list(files), split="train")
    return ds.to_dict()


def text_list(value: Any, field: str, where: str) -> list[str]:
    """A list of strings from a list column, or from a JSON-encoded list in a text column (CSV)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: {field} must be a list of strings (a CSV cell holds it as JSON)") from None
    if not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
        raise ValueError(f"{where}: {field} must be a list of strings, got {type(value).__name__}")
    return value
