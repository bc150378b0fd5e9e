"""`atgrpo --help`, `atgrpo envs` and the sub-commands' --help start without importing torch (each is a fresh
process; torch alone takes seconds to import)."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from atgrpo.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "numpy", "ray") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize("args", [["--help"], ["envs"], ["train", "--help"], ["eval", "--help"],
                                  ["bench", "--help"], ["report", "--help"]])
def test_light_commands_do_not_import_torch(args):
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    heavy = [line for line in r.stderr.splitlines() if line.startswith("HEAVY=")]
    assert heavy == ["HEAVY="], f"atgrpo {' '.join(args)} imported {heavy}"
