"""``atgrpo bench scale --quick``: the output's shape, and the design's claim that it can refute: the tree
sampler's cost grows more slowly in K than the per-branch baseline's (one prefill per prompt, not K)."""

import json

from atgrpo.bench import scale
from atgrpo.cli import main


def test_quick_scale_on_k_writes_its_outputs_and_the_tree_grows_slower(tmp_path, capsys):
    out = tmp_path / "scale"
    assert main(["bench", "scale", "--quick", "--axes", "K", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads((out / "scale.json").read_text())
    k = result["axes"]["K"]
    assert [p["value"] for p in k["points"]] == scale.QUICK["K"]
    assert all(p[m]["seconds"] > 0 for p in k["points"] for m in scale.METHODS)
    assert (out / "scale_K.png").stat().st_size > 1000 and "| K | rollout_tree |" in (out / "scale.md").read_text()
    assert k["slopes"]["rollout_tree"] < k["slopes"]["rollout_per_branch"], k["slopes"]
    assert k["slopes"]["update_shared_prefix"] < k["slopes"]["update_per_sample"], k["slopes"]


def test_slope_is_the_log_log_least_squares():
    assert abs(scale.slope([1, 2, 4, 8], [3, 6, 12, 24]) - 1.0) < 1e-12
    assert abs(scale.slope([1, 4, 16], [5, 10, 20]) - 0.5) < 1e-12
    assert scale.slope([2, 2], [1, 3]) is None
