#!/usr/bin/env bash
# The GPU acceptance run: one command, no network, everything written to one folder.
#
#   bash benchmarks/gpu/acceptance.sh OUTDIR [stage ...]
#
# Stages (default: the first five): env pytest variants steps speed; and steps18 (the
# float64 step check of ResNet-18), launch (a replayed graph's cost per task against a
# raw CuPy launch), mixed (the CPU+GPU experiment, benchmarks/gpu/mixed.py, its rows and
# traces under OUTDIR/mixed) and models (the performance models the run calibrated, as
# perfmodels.tgz). Each stage's arguments and time limit can be set from the
# environment: SPEED_ARGS, MIXED_ARGS, STEPS18_ARGS; SPEED_LIMIT, MIXED_LIMIT, STEPS_LIMIT,
# VARIANTS_LIMIT, HETERO_NN_PYTEST_TIMEOUT.
# With HETERO_NN_PACK=FILE.tgz the whole OUTDIR is packed into FILE after each stage, with
# the performance models so far (a device run returns few files: one archive that is
# current whenever the run is cut).
# Wheels for what the machine lacks (dask, distributed and their pure-Python needs,
# snntorch) are installed from $HETERO_NN_WHEELS (default: ../.whl beside the tree, or
# .whl in it) into /tmp/site, with pip --no-index. Without a GPU (or with
# HETERO_NN_GPU_EMULATE=1) every stage runs on the emulated device cuda-emu, quick, and the
# GPU-only checks skip with a reason: that is the dry run CI makes.
# Each stage has its own timeout and its own log; summary.txt collects each stage's
# SUMMARY line and exit status. Exit status: 1 if any stage failed.
set -u
OUT=${1:?usage: acceptance.sh OUTDIR [stage ...]}
shift
STAGES=${*:-env pytest variants steps speed}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$HERE"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
KNOWN="env pytest variants steps steps18 speed launch mixed models"
for s in $STAGES; do  # a misspelt stage fails the run before any device time is spent
    case " $KNOWN " in *" $s "*) ;; *)
        echo "acceptance: unknown stage $s (stages: $KNOWN)" | tee "$OUT/summary.txt"
        exit 1 ;;
    esac
done
export PYTHONUNBUFFERED=1
export HETERO_NN_CACHE=${HETERO_NN_CACHE:-/tmp/hncache-acceptance}

GPU=$($PY - <<'PY' 2>/dev/null
import os
from hetero_nn.codelets.xp import cupy_or_none
print("yes" if cupy_or_none() is not None and not os.environ.get("HETERO_NN_GPU_EMULATE") else "no")
PY
)
if [ "$GPU" = yes ]; then QUICK=""; else QUICK="--quick"; fi
echo "acceptance: GPU=$GPU stages=[$STAGES] out=$OUT" | tee "$OUT/summary.txt"
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee -a "$OUT/summary.txt"

WHEELS=${HETERO_NN_WHEELS:-}
for d in "$HERE/../.whl" "$HERE/.whl"; do
    [ -z "$WHEELS" ] && [ -d "$d" ] && WHEELS=$d
done
if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$WHEELS"/*.whl >/tmp/hetero_nn-wheels.txt 2>&1; then
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
        echo "wheels: installed $(ls "$WHEELS"/*.whl | wc -l) from $WHEELS" | tee -a "$OUT/summary.txt"
    else
        { echo "wheels: install failed:"; cat /tmp/hetero_nn-wheels.txt; } | tee -a "$OUT/summary.txt"
    fi
fi

FAILED=0
stage() {  # stage NAME SECONDS COMMAND...: run with a timeout, log to NAME.txt, note the result
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    local why=""
    [ $rc = 124 ] || [ $rc = 137 ] && why=" (timed out after ${limit}s)"
    [ $rc != 0 ] && FAILED=1
    local line
    line=$(grep -E '^SUMMARY|^[0-9]+ (passed|failed)|passed|failed|skipped' "$OUT/$name.txt" | tail -1)
    echo "stage $name: rc=$rc$why in $((SECONDS - t0)) s -- $line" | tee -a "$OUT/summary.txt"
    pack
}
pack() {
    [ -z "${HETERO_NN_PACK:-}" ] && return 0
    local models=()
    [ -d "$HETERO_NN_CACHE/perfmodels" ] && models=(-C "$HETERO_NN_CACHE" perfmodels)
    tar -czf "$HETERO_NN_PACK.part" -C "$OUT" . "${models[@]}" &&
        mv "$HETERO_NN_PACK.part" "$HETERO_NN_PACK"
    return 0
}

for s in $STAGES; do
    case $s in
    env) stage env 30 bash -c "
        date -u; uname -a; nvidia-smi || echo 'nvidia-smi: none'
        $PY -c 'import sys; print(sys.version)'
        $PY -m pip list 2>/dev/null | grep -iE '^(numpy|numba|numba-cuda|cupy|torch|dask|distributed|snntorch|pytest|hypothesis|scipy) '
        $PY -c 'import hetero_nn, sys; print(\"hetero_nn from\", hetero_nn.__file__); print(\"dask imported by hetero_nn:\", \"dask\" in sys.modules)'
        $PY -c 'import cupy; print(\"cupy\", cupy.__version__); cupy.show_config()' || true
        echo SUMMARY env: done" ;;
    pytest) stage pytest "${HETERO_NN_PYTEST_TIMEOUT:-100}" $PY -m pytest -m cuda -q -rs -p no:cacheprovider \
            -o addopts="" --continue-on-collection-errors tests ;;
    variants) stage variants "${VARIANTS_LIMIT:-90}" $PY benchmarks/gpu/variants.py $QUICK ;;
    steps) stage steps "${STEPS_LIMIT:-110}" $PY benchmarks/gpu/steps.py $QUICK ;;
    steps18) stage steps18 "${STEPS_LIMIT:-110}" $PY benchmarks/gpu/steps.py $QUICK \
            ${STEPS18_ARGS:---models resnet18 --policies eager,dmda} ;;
    speed) stage speed "${SPEED_LIMIT:-90}" $PY benchmarks/gpu/speed.py $QUICK ${SPEED_ARGS:---budget 60} ;;
    launch) stage launch 40 $PY benchmarks/gpu/launch.py $QUICK ;;
    mixed) stage mixed "${MIXED_LIMIT:-170}" $PY benchmarks/gpu/mixed.py $QUICK \
            ${MIXED_ARGS:---budget 130 --energy} --out "$OUT/mixed" ;;
    models) stage models 30 bash -c "tar -C '$HETERO_NN_CACHE' -czf '$OUT/perfmodels.tgz' . &&
            tar -tzf '$OUT/perfmodels.tgz' | head -50; echo SUMMARY models: the performance models" ;;
    esac
done
echo "acceptance: $([ $FAILED = 0 ] && echo PASSED || echo FAILED)" | tee -a "$OUT/summary.txt"
exit $FAILED
