#!/usr/bin/env bash
# One device run within a deadline: the correctness stages side by side, then the timed
# stages one at a time, everything packed into one archive after each part.
#
#   DEADLINE=270 bash benchmarks/gpu/device_run.sh OUTDIR [PACK.tgz]
#
# 1. CHECKS (default "pytest variants steps steps18"): each stage of acceptance.sh in its
#    own process, with its own compiled-code cache and log (OUTDIR/<stage>/), all at once:
#    they check results, not times, and the 16 cores and the GPU's memory hold them all;
#    each is cut at its own limit (acceptance.sh's *_LIMIT variables).
# 2. TIMED (default "speed pre mixed"), alone on the machine, in order: acceptance.sh's
#    speed stage; "pre": the same speed rows from the tree before the whole-operation
#    kernels (PRE, default ./_pre, PRE_ARGS), for the before/after; "mixed": acceptance.sh's
#    mixed stage with the seconds left before DEADLINE as its budget (MIXED_ARGS without
#    --budget). The calibrated models of benchmarks/models/$MODELS_DIR seed the timed
#    stages' cache (the host name the device reports: vm).
# HETERO_NN_GPU_EMULATE=1 dry-runs it on cuda-emu (CI does, with short limits).
set -u
OUT=${1:?usage: device_run.sh OUTDIR [PACK.tgz]}
PACK=${2:-}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$HERE"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-270}
export PYTHONUNBUFFERED=1
pack() {
    [ -z "$PACK" ] && return 0
    tar -czf "$PACK.part" -C "$OUT" . && mv "$PACK.part" "$PACK"
}

WHEELS=${HETERO_NN_WHEELS:-}
for d in "$HERE/../.whl" "$HERE/.whl"; do
    [ -z "$WHEELS" ] && [ -d "$d" ] && WHEELS=$d
done
if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1 &&
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$WHEELS"/*.whl >"$OUT/wheels.txt" 2>&1; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export HETERO_NN_WHEELS=/nonexistent  # installed once here, not by each stage
{ date -u; command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c 'import sys, numpy; print(sys.version.split()[0], "numpy", numpy.__version__)'
  $PY -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
  $PY -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
} >"$OUT/env.txt" 2>&1

pids=()
for s in ${CHECKS-pytest variants steps steps18}; do
    HETERO_NN_CACHE=/tmp/hn-$s bash benchmarks/gpu/acceptance.sh "$OUT/$s" "$s" \
        >"$OUT/$s.log" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "checks done at ${SECONDS} s" >>"$OUT/env.txt"
pack

export HETERO_NN_CACHE=/tmp/hn-timed
mkdir -p "$HETERO_NN_CACHE/perfmodels/vm"
cp benchmarks/models/${MODELS_DIR:-nvidia-h200}/*.json "$HETERO_NN_CACHE/perfmodels/vm/" 2>/dev/null
for s in ${TIMED-speed pre mixed}; do
    case $s in
    speed) bash benchmarks/gpu/acceptance.sh "$OUT/speed" speed >"$OUT/speed.log" 2>&1 ;;
    pre) (cd "${PRE:-_pre}" && HETERO_NN_CACHE=/tmp/hn-pre timeout "${PRE_LIMIT:-40}" $PY \
            benchmarks/gpu/speed.py ${PRE_ARGS:---models lenet5,cifar-small,dahl-basic,resnet18 --batches 256 --steps 6 --budget 25}
         ) >"$OUT/speed_pre.txt" 2>&1 ;;
    mixed) B=$((DEADLINE - SECONDS - 30))
        if [ "$B" -ge 15 ]; then
            MIXED_LIMIT=$((B + 28)) MIXED_ARGS="--budget $B ${MIXED_ARGS:---energy}" \
                bash benchmarks/gpu/acceptance.sh "$OUT/mixed" mixed models >"$OUT/mixed.log" 2>&1
        else
            echo "mixed: not started, ${B} s left" >>"$OUT/env.txt"
        fi ;;
    esac
    echo "$s done at ${SECONDS} s" >>"$OUT/env.txt"
    pack
done
cat "$OUT"/*/summary.txt >"$OUT/summary.txt" 2>/dev/null
pack
