#!/usr/bin/env bash
# The short GPU check (issue 28): bash benchmarks/gpu_check.sh OUT [--cpu] [driver options]
#
# On one GPU in about 10 minutes: preflight (versions, PyTorch's ao op schemas, the measured
# host link), an offload micro-test (MLP, U-Net; eager compiler and inductor) and GPT-2 with
# one process per variant (no-recompute, PyTorch's knob 0.4, PyTorch's offloading, remat auto
# 0.4, swap 0.7, swap-recompute 0.4, magis 0.4), then the eager stage (issue 32: GPT-2 without
# torch.compile: no checkpointing, full checkpointing, op SAC, offload-everything, remat.checkpoint;
# alone: --stages preflight,eager). --cpu runs the same stages on a CPU, with
# PyTorch's ao ops on CPU stand-ins. Writes OUT/preflight.json, OUT/rows.jsonl and prints a
# table; `python benchmarks/gpu_check.py --help` lists the options.
set -euo pipefail
export PYTHONUNBUFFERED=1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "usage: bash benchmarks/gpu_check.sh OUT [--cpu] [options of benchmarks/gpu_check.py]" >&2
  exit 2
fi
OUT="$1"; shift
mkdir -p "$OUT"
cd "$ROOT"
if ! "$PY" -c "import remat" 2>/dev/null; then
  # remat is not installed for $PY: the check never changes that environment. remat runs from
  # the tree (PYTHONPATH); where its own dependencies (ortools, highspy, rich) are missing too,
  # they go into a venv under OUT that sees $PY's packages (torch), from a wheel folder carried
  # beside the tree (a GPU machine has no network), made here with
  #   pip download ortools "highspy==1.12.0" rich -d .wheels --python-version 3.X --only-binary :all:
  # and named by REMAT_WHEELS (the device tool's carry list takes .wheels)
  if ! "$PY" -c "import ortools, highspy, rich" 2>/dev/null; then
    if [ -n "${REMAT_WHEELS:-}" ] && [ -d "$REMAT_WHEELS" ]; then
      echo "remat's dependencies are missing for $PY: installing them from $REMAT_WHEELS into $OUT/.venv" >&2
      "$PY" -m venv --system-site-packages "$OUT/.venv"
      PY="$OUT/.venv/bin/python"
      "$PY" -m pip install -q --no-index --find-links "$REMAT_WHEELS" ortools "highspy>=1.12,<1.13" rich
    else
      echo "remat's dependencies (ortools, highspy, rich) do not import for $PY: install remat there" \
           "(pip install -e .), or set REMAT_WHEELS to a folder of their wheels" >&2
      exit 2
    fi
  fi
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi
# compiled-graph caches off (a hit skips the partitioner, so nothing is planned); the
# kernel cache stays, shared by the variants' processes
export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
start=$(date +%s)
"$PY" "$ROOT/benchmarks/gpu_check.py" "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
echo "gpu_check: $(( $(date +%s) - start )) s, exit $status; rows in $OUT/rows.jsonl" | tee -a "$OUT/gpu_check.log"
exit "$status"
