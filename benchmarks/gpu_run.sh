#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, prepared to run in few calls on a machine with a
# GPU, JAX, PyTorch and timm but no TensorFlow and no network. Carry Keras's wheels in .whl/ (see
# docs/benchmarks.md, "Training (GPU)"); from the repository root:
#
#     bash benchmarks/gpu_run.sh kernel roofline     # a few minutes on an H100
#     bash benchmarks/gpu_run.sh training            # about 7 min
#
# Stages: kernel (the fused attention against keras.ops, one layer, at S24's and XXS24's shapes),
# roofline (the S24 step's instructions timed beside their bounds, with and without the fused
# attention), training (the interleaved training run: keras_cait with and without the fused
# attention, timm eager, timm + torch.compile; S24 and XXS24 at batch 128). Each command writes
# its JSON and its log to $OUT (default: gpu_results). A command that fails does not stop the
# next; the script then exits 1 and names those that failed. SMOKE=1 runs every command on a tiny
# CaiT (on any machine; without torch.compile), as tests/benchmarks/test_gpu_run.py does.
set -uo pipefail

OUT=${OUT:-gpu_results}
SMOKE=${SMOKE:-}
if [ "$#" -eq 0 ]; then
    echo "gpu_run.sh: name the stages to run, of: kernel roofline training" >&2
    exit 2
fi
for stage in "$@"; do
    case $stage in
        kernel | roofline | training) ;;
        *) echo "gpu_run.sh: unknown stage '$stage'; choose from: kernel roofline training" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export KERAS_BACKEND=jax
if [ -n "$SMOKE" ]; then
    smoke=(--smoke) steps=2 rounds=2 seconds=1 attentions=keras-ops  # off a GPU the layer runs keras.ops
    workers=(--workers keras,keras-unfused,timm-eager)
else
    smoke=() steps=5 rounds=3 seconds=5 attentions="fused keras-ops" workers=()
fi
failed=()

run() {  # run NAME COMMAND...: the command, its output on the console and in $OUT/NAME.log
    local name=$1
    shift
    echo "== $name: $*"
    if ! "$@" 2>&1 | tee "$OUT/$name.log"; then
        failed+=("$name")
    fi
}

for stage in "$@"; do
    case $stage in
        kernel)
            run kernel_s24 python3 -m benchmarks.talking_heads_kernel "${smoke[@]}" --output "$OUT/kernel_s24.json"
            run kernel_xxs24 python3 -m benchmarks.talking_heads_kernel "${smoke[@]}" --channels 192 --heads 4 \
                --output "$OUT/kernel_xxs24.json"
            ;;
        roofline)
            for attention in $attentions; do
                run "roofline_s24_$attention" python3 -m benchmarks.roofline "${smoke[@]}" --attention "$attention" \
                    --profile "$steps" --output "$OUT/roofline_s24_$attention.json"
            done
            ;;
        training)
            run training python3 -m benchmarks.training "${smoke[@]}" "${workers[@]}" --rounds "$rounds" \
                --seconds "$seconds" --output "$OUT/training.json"
            ;;
    esac
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu_run.sh: failed: ${failed[*]} (their logs are in $OUT)" >&2
    exit 1
fi
