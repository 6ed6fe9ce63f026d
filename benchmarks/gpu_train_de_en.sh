#!/usr/bin/env bash
# Train the shipped Multi30k de->en recipe (configs/multi30k_de_en.yaml) on one GPU for TRAIN_S seconds,
# average its last 5 checkpoints, score test2016 with `aiayn evaluate`, and bring the averaged
# checkpoint back as parts of one tarball (the device tool returns files of at most 16 MiB): the
# model benchmarks/documents.py measures on a 2-core CPU, trained in minutes instead of hours.
#
#   OUT=/folder bash benchmarks/gpu_train_de_en.sh                 # on the GPU machine, repository root
#   TINY=1 OUT=/tmp/rehearsal PYTHON=.venv/bin/python DATA_DIR=../shared/data/multi30k \
#       bash benchmarks/gpu_train_de_en.sh                         # the same flow on the CPU, 30 steps
#
# Wheels in .whl/ (sacremoses: what the GPU machine lacks) go into $SITE, never torch. DATA_DIR holds
# Multi30k's {train,val,test2016}.{de,en} (default .gpudata/multi30k). Unpack the result with
#   cat OUT/de_en_avg.tar.part-* | tar -x -C DEST      # DEST/avg5: an aiayn checkpoint directory
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_out}
TINY=${TINY:-0}
PY=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-.gpudata/multi30k}
WORK=${WORK:-/tmp/aiayn_gpu_de_en}
SITE=${SITE:-/tmp/site}
TRAIN_S=${TRAIN_S:-300}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/gpu_train_de_en.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH=$PYTHONPATH:$SITE
fi
if [ "$TINY" = 1 ]; then
    DEVICE=cpu
    ARGS=(--max-steps 30 --set data.vocab_size=1000 --set train.valid_every=15 --set train.save_every=5)
    export OMP_NUM_THREADS=1
else
    DEVICE=cuda
    nvidia-smi --query-gpu=name,memory.total --format=csv || true
    HOURS=$(awk "BEGIN { printf \"%.4f\", $TRAIN_S / 3600 }")
    ARGS=(--set train.max_hours="$HOURS")
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
RUN=$WORK/run
rm -rf "$RUN"
echo "+ aiayn train --config configs/multi30k_de_en.yaml --data-dir $DATA_DIR --out $RUN --set train.device=$DEVICE ${ARGS[*]}"
timeout $((TRAIN_S + 120)) "$PY" -m aiayn train --config configs/multi30k_de_en.yaml --data-dir "$DATA_DIR" \
    --out "$RUN" --set train.device="$DEVICE" --set train.log_every=200 --no-progress "${ARGS[@]}"
cp "$RUN/metrics.jsonl" "$OUT/de_en_metrics.jsonl"
"$PY" -m aiayn average --last 5 "$RUN" --output "$WORK/avg5"
for alpha in 0.6 1.0; do
    echo "+ aiayn evaluate --checkpoint avg5 --src test2016.de --ref test2016.en --beam 4 --alpha $alpha"
    "$PY" -m aiayn evaluate --checkpoint "$WORK/avg5" --src "$DATA_DIR/test2016.de" --ref "$DATA_DIR/test2016.en" \
        --device "$DEVICE" --beam 4 --alpha $alpha --json >"$OUT/de_en_eval_alpha$alpha.json"
    cat "$OUT/de_en_eval_alpha$alpha.json"
done
tar -C "$WORK" -c avg5 | split -b 15M - "$OUT/de_en_avg.tar.part-"
ls -l "$OUT"
