#!/usr/bin/env bash
# Issue 10's budgets on a CUDA GPU, with inductor and the CUDA allocator (results in BENCHMARKS.md).
#
#   benchmarks/cuda_budgets.sh OUT_DIR [check|capture|gpt2|llama]...
#
# check: byte budgets on small models (measured peak within the budget, gradients; convolution
#        scratch measured by remat.capture.workspace's CUDA branch), the host<->device link;
# capture: each model's CUDA graph (remat JSON) and PyTorch's saved sets under its knob;
# gpt2:  benchmarks/budgets_vs_torch.py on GPT-2 small, batch 8 x 1024, bf16;
# llama: the same on a Llama with Llama-3.2-1B's widths (4 of its 16 layers), batch 8 x 1024, bf16.
# Each stage's JSON rows go to OUT_DIR/<stage>.json (copy them to benchmarks/results/ to keep them).
# Budgets 1.0, 0.6, 0.4, 0.2 (BUDGETS=...), without the eager and 'min' rows: both models fit one
# 10-minute call.
# Inductor's kernel caches stay on (identical kernels compile once across methods); its FX-graph
# and AOTAutograd caches are off in budgets_vs_torch.py, so every method plans afresh.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: cuda_budgets.sh OUT_DIR [check|capture|gpt2|llama]...}
shift
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=0
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(check gpt2 llama)
for stage in "${stages[@]}"; do
  case $stage in
    check)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
      python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
      python3 benchmarks/link_bandwidth.py --results "$out/link_bandwidth.json"
      timeout "${CHECK_SECONDS:-240}" python3 benchmarks/budget_torch.py --device cuda --compiler inductor \
        --models mlp,gpt2,resnet18,unet --results "$out/budget_torch.json" 2>&1 | tee "$out/budget_torch.md"
      ;;
    capture)  # the models' CUDA graphs and PyTorch's saved sets, to plan offline
      timeout "${STAGE_SECONDS:-560}" python3 benchmarks/budgets_vs_torch.py --size gpu --models gpt2,llama \
        --device cuda --dtype bfloat16 --budgets 0.4 --capture --out "$out/capture" 2>&1 | tail -5
      ;;
    gpt2|llama)
      timeout "${STAGE_SECONDS:-560}" python3 benchmarks/budgets_vs_torch.py --size gpu --models "$stage" \
        --device cuda --compiler inductor --dtype bfloat16 --repeats 5 --at-torch-peak none \
        --budgets "${BUDGETS:-1.0,0.6,0.4,0.2}" --skip eager,min \
        --out "$out/$stage" --results "$out/$stage.json" 2>&1 | tee "$out/$stage.log"
      ;;
    *) echo "unknown stage $stage (check, capture, gpt2, llama)"; exit 2 ;;
  esac
done
