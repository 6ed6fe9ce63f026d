#!/usr/bin/env bash
# One run on a rented GPU machine (one H100/H200, no internet), about 9 minutes in all:
#   A0 a profile of the base model's training step, eager and compiled (benchmarks/train_profile.py):
#      top kernels, kinds of kernel, the device's busy share;
#   A  training throughput of the paper's base and big models against nn.Transformer and Marian
#      (benchmarks/train_throughput.py --device cuda, batches of ~25,000 target tokens);
#   B  a Multi30k de->en training with the shipped recipe (configs/multi30k_de_en.yaml) on the GPU for
#      a few minutes, the last checkpoints averaged, test2016 scored with `aiayn evaluate`;
#   C  decoding speed on test2016 with B's model (benchmarks/decode_speed.py --device cuda): aiayn,
#      HF Marian and, where it can run on the GPU, CTranslate2; in fp32, then all three in bf16.
#      Then the inference step against the model's own (benchmarks/decode_paths.py --device cuda):
#      the figure aiayn.decode.fast_step.by_default follows on a GPU (the model's own step until then).
#
#   OUT=/folder bash benchmarks/gpu_run.sh            # from the repository root
#   TINY=1 DATA_DIR=../shared/data/multi30k OUT=/tmp/gpu_rehearsal PYTHON=.venv/bin/python \
#       bash benchmarks/gpu_run.sh                    # the same flow on the CPU at tiny sizes
#
# Every stage runs under `timeout`, sized from what is left of TOTAL_S (540 s); a stage that fails
# leaves its error in the log and the next stage still runs. Wheels in .whl/ (ctranslate2, sacremoses:
# what the machine lacks) are installed into $SITE, never torch. DATA_DIR holds Multi30k's
# {train,val,test2016}.{de,en} (default .gpudata/multi30k). At most 11 files are written to $OUT:
# gpu_run.log, train_profile_gpu.json, train_throughput_gpu.json, multi30k_gpu_train.log, multi30k_gpu_metrics.jsonl,
# multi30k_gpu_eval.json, decode_speed_gpu.json, decode_speed_bf16_gpu.json, decode_paths_gpu.json,
# gpu_summary.json.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_out}
TINY=${TINY:-0}
PY=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-.gpudata/multi30k}
WORK=${WORK:-/tmp/aiayn_gpu_run}
SITE=${SITE:-/tmp/site}
TOTAL_S=${TOTAL_S:-540}
START=$SECONDS
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/gpu_run.log") 2>&1
TEE_PID=$!

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$ROOT/src:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH}
if [ "$TINY" = 1 ]; then
    DEVICE=cpu
    export OMP_NUM_THREADS=1 # the rehearsal shares its CPU
else
    DEVICE=cuda
fi
declare -A STATUS

left() { echo $((TOTAL_S - (SECONDS - START))); }

# stage NAME CAP RESERVE COMMAND...: run COMMAND under a timeout of at most CAP seconds that leaves
# RESERVE seconds of TOTAL_S to the stages after it; its exit status and time go to STATUS. With
# LOGFILE set, its output is also written there; with STDOUT set, its standard output goes there.
stage() {
    local name=$1 cap=$2 reserve=$3
    shift 3
    local limit=$(($(left) - reserve))
    ((limit > cap)) && limit=$cap
    ((limit < 20)) && limit=20
    echo "=== [$(date +%T)] $name: timeout ${limit}s ($(left)s of ${TOTAL_S}s left)"
    echo "+ $*"
    local t0=$SECONDS rc
    if [ -n "${LOGFILE:-}" ]; then # also into a log file of its own
        timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGFILE"
        rc=${PIPESTATUS[0]}
    elif [ -n "${STDOUT:-}" ]; then # standard output into a file, errors to the log
        timeout --kill-after=10 "$limit" "$@" >"$STDOUT"
        rc=$?
    else
        timeout --kill-after=10 "$limit" "$@"
        rc=$?
    fi
    STATUS[$name]="exit $rc, $((SECONDS - t0)) s"
    echo "=== [$(date +%T)] $name: exit $rc after $((SECONDS - t0)) s$( ((rc == 124)) && echo ' (timed out)')"
    return 0
}

# ------------------------------------------------------------------------------------------ set-up
echo "=== [$(date +%T)] set-up: TINY=$TINY DEVICE=$DEVICE DATA_DIR=$DATA_DIR OUT=$OUT WORK=$WORK"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    TAG=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
    for wheel in .whl/*.whl; do # one at a time: a wheel that does not fit this Python skips alone
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$wheel" 2>&1 | tail -3
        if [ "${PIPESTATUS[0]}" != 0 ]; then
            case $wheel in # pip failed (or is missing): a wheel for this Python is a zip of its files
            *-py3-none-any.whl | *-$TAG-$TAG-*.whl)
                echo "unzipping $wheel into $SITE"
                "$PY" -m zipfile -e "$wheel" "$SITE"
                ;;
            esac
        fi
    done
    export PYTHONPATH=$PYTHONPATH:$SITE # ahead of site-packages (as all of PYTHONPATH): carry no torch
fi
echo "PYTHONPATH=$PYTHONPATH"
if [ "$DEVICE" = cuda ]; then nvidia-smi || true; fi
"$PY" - <<'EOF' || true
import importlib, platform, sys
import torch
print("python", platform.python_version(), sys.executable)
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB")
for name in ("aiayn", "aiayn.cli", "transformers", "sacrebleu", "sentencepiece", "sacremoses", "ctranslate2"):
    try:
        module = importlib.import_module(name)
        print(f"import {name}: ok", getattr(module, "__version__", ""), getattr(module, "__file__", ""))
    except Exception as error:
        print(f"import {name}: FAILED {error!r}")
try:
    import ctranslate2
    print("ctranslate2 CUDA devices:", ctranslate2.get_cuda_device_count())
except Exception as error:
    print("ctranslate2 CUDA devices: n/a", repr(error))
EOF
echo "=== set-up done at $((SECONDS - START)) s"

# ------------------------------------------------------------------------------------------ data
if [ "$TINY" = 1 ]; then # a 500-line excerpt of the corpus
    mkdir -p "$WORK/data"
    for lang in de en; do
        head -n 500 "$DATA_DIR/train.$lang" >"$WORK/data/train.$lang"
        head -n 100 "$DATA_DIR/val.$lang" >"$WORK/data/val.$lang"
        head -n 20 "$DATA_DIR/test2016.$lang" >"$WORK/data/test2016.$lang"
    done
    DATA=$WORK/data
else
    DATA=$DATA_DIR
fi
wc -l "$DATA"/{train,val,test2016}.{de,en} || true

# ------------------------------------------------------------------------------------------ A0
# where a base training step's time goes, eager and compiled (issue 54: profile first): top kernels,
# kinds of kernel, and the share of the wall time the device was busy
if [ "$TINY" = 1 ]; then
    A0_ARGS=(--device cpu --shape tiny --batch-tokens 200 --max-len 16 --warmup 2 --steps 2 --threads 1)
else
    A0_ARGS=(--device cuda --shape base --batch-tokens 25000 --max-len 64 --warmup 4 --steps 5 --compile)
fi
stage A0_train_profile 75 420 "$PY" benchmarks/train_profile.py "${A0_ARGS[@]}" \
    --results "$OUT/train_profile_gpu.json"

# ------------------------------------------------------------------------------------------ A
if [ "$TINY" = 1 ]; then
    A_ARGS=(--device cpu --shapes tiny a --precisions bf16 fp32 --batch-tokens 200 --max-len 16
        --skip a:fp32 --rounds 1 --steps 1 --warmup 1 --threads 1)
else
    A_ARGS=(--device cuda --shapes base big --precisions bf16 fp32 --batch-tokens 25000 --max-len 64
        --skip big:fp32 --rounds 5 --steps 3 --warmup 3)
fi
stage A_train_throughput 120 270 "$PY" benchmarks/train_throughput.py "${A_ARGS[@]}" \
    --out "$OUT/train_throughput_gpu.json"

# ------------------------------------------------------------------------------------------ B
RUN=$WORK/m30k
rm -rf "$RUN"
if [ "$TINY" = 1 ]; then
    B_ARGS=(--max-steps 30 --set data.vocab_size=1000 --set data.batch_tokens=1024
        --set train.valid_every=15 --set train.save_every=10 --set train.log_every=10)
    B_CAP=240
else
    # the training budget: 0.04 h (144 s), less when stage A ran long (prep, start and the final
    # validation take ~45 s more)
    budget=$(($(left) - 150 - 45))
    ((budget > 144)) && budget=144
    ((budget < 30)) && budget=30
    HOURS=$(awk "BEGIN { printf \"%.4f\", $budget / 3600 }")
    B_ARGS=(--set train.max_hours="$HOURS" --set train.log_every=100)
    B_CAP=$((budget + 75))
fi
LOGFILE=$OUT/multi30k_gpu_train.log stage B_train "$B_CAP" 150 "$PY" -m aiayn train \
    --config configs/multi30k_de_en.yaml --data-dir "$DATA" --out "$RUN" --set train.device="$DEVICE" \
    --no-progress "${B_ARGS[@]}"
cp "$RUN/metrics.jsonl" "$OUT/multi30k_gpu_metrics.jsonl" 2>/dev/null || echo "no $RUN/metrics.jsonl"

# the last 5 checkpoints averaged (as the paper; fewer when fewer were kept), else the run's own pick
N_CKPT=$(ls -d "$RUN"/checkpoints/step-* 2>/dev/null | wc -l)
((N_CKPT > 5)) && N_CKPT=5
CKPT=$RUN
if ((N_CKPT > 0)); then
    stage B_average 40 120 "$PY" -m aiayn average --last "$N_CKPT" "$RUN" --output "$RUN/avg$N_CKPT"
    [ -f "$RUN/avg$N_CKPT/model.safetensors" ] && CKPT=$RUN/avg$N_CKPT
fi
echo "checkpoint for evaluation and decoding: $CKPT"
EVAL_CMD=("$PY" -m aiayn evaluate --checkpoint "$CKPT" --src "$DATA/test2016.de" --ref "$DATA/test2016.en"
    --device "$DEVICE" --beam 4 --json --output "$WORK/test2016.hyp.en")
STDOUT=$OUT/multi30k_gpu_eval.json stage B_evaluate 60 100 "${EVAL_CMD[@]}"
cat "$OUT/multi30k_gpu_eval.json" 2>/dev/null

# ------------------------------------------------------------------------------------------ C
# CTranslate2's wheels load CUDA 12's libcublas.so.12 at run time; a CUDA 13 machine (torch cu130) may
# only have libcublas.so.13. Where no libcublas.so.12 is found, a folder of links named .so.12 to the
# .so.13 files is put on LD_LIBRARY_PATH for stage C (AIAYN_CT2_CUBLAS_SHIM names it):
# decode_speed.py tries CTranslate2 without it and with it in child processes, records both, and uses
# it only when it works; its logits and greedy checks then compare CTranslate2 with aiayn.
C_ENV=()
if [ "$DEVICE" = cuda ]; then
    LIB_DIRS=$("$PY" -c "import site, sys; print(' '.join(site.getsitepackages() + [site.getusersitepackages()]))" 2>/dev/null)
    CUBLAS12=$( (ldconfig -p 2>/dev/null | grep -o '/[^ ]*libcublas\.so\.12$'; find $LIB_DIRS /usr/local/cuda* \
        -name 'libcublas.so.12*' 2>/dev/null) | head -n 1)
    if [ -n "$CUBLAS12" ]; then
        echo "libcublas.so.12 found: $CUBLAS12"
        ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.12 ' ||
            C_ENV=(LD_LIBRARY_PATH="$(dirname "$CUBLAS12")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    else
        CUBLAS13=$(find $LIB_DIRS /usr/local/cuda* -name 'libcublas.so.13' 2>/dev/null | head -n 1)
        if [ -n "$CUBLAS13" ]; then
            SHIM=$WORK/cublas12_shim
            mkdir -p "$SHIM"
            LIBDIR=$(dirname "$CUBLAS13")
            ln -sf "$LIBDIR/libcublas.so.13" "$SHIM/libcublas.so.12"
            [ -e "$LIBDIR/libcublasLt.so.13" ] && ln -sf "$LIBDIR/libcublasLt.so.13" "$SHIM/libcublasLt.so.12"
            C_ENV=(AIAYN_CT2_CUBLAS_SHIM="$SHIM" LD_LIBRARY_PATH="$SHIM:$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
            echo "no libcublas.so.12; shim for CTranslate2: $(ls -l "$SHIM" | tail -n +2)"
        else
            echo "neither libcublas.so.12 nor libcublas.so.13 found"
        fi
    fi
    C_ARGS=(--device cuda --rounds 2 --batch-tokens 16384)
else
    C_ARGS=(--device cpu --threads 1 --rounds 1 --limit 20)
fi
echo "stage C environment: ${C_ENV[*]:-(as is)}"
stage C_decode_speed 150 75 env "${C_ENV[@]}" "$PY" benchmarks/decode_speed.py --checkpoint "$CKPT" --data-dir "$DATA" \
    --split test2016 --beam 4 --on-check-failure warn "${C_ARGS[@]}" --results "$OUT/decode_speed_gpu.json"
# the same in bf16 (all three systems; issue 44's goal is fp16/bf16 as well as fp32)
stage C_decode_speed_bf16 90 70 env "${C_ENV[@]}" "$PY" benchmarks/decode_speed.py --checkpoint "$CKPT" \
    --data-dir "$DATA" --split test2016 --beam 4 --on-check-failure warn --precision bf16 "${C_ARGS[@]}" \
    --results "$OUT/decode_speed_bf16_gpu.json"

# the inference step against the model's own on the GPU: the figure the GPU's default step follows
# (aiayn.decode.fast_step.by_default: the model's own step there until this says otherwise)
if [ "$TINY" = 1 ]; then P_ARGS=(--limit 20 --rounds 1 --threads 1); else P_ARGS=(--limit 300 --rounds 2); fi
stage C_decode_paths 60 10 "$PY" benchmarks/decode_paths.py --checkpoint "$CKPT" --data-dir "$DATA" \
    --device "$DEVICE" "${P_ARGS[@]}" --results "$OUT/decode_paths_gpu.json"

# ------------------------------------------------------------------------------------------ summary
for name in "${!STATUS[@]}"; do echo "$name=${STATUS[$name]}"; done >"$WORK/status.txt"
SUMMARY_ARGS=("$OUT" "$WORK/status.txt" "${EVAL_CMD[*]}" "$WORK/test2016.hyp.en" "$DATA/test2016.en")
"$PY" - "${SUMMARY_ARGS[@]}" <<'EOF' || echo "summary failed"
"""gpu_summary.json and a short table from the stages' files, each part alone (a missing file is noted)."""
import json
import sys
from pathlib import Path

out, status, eval_command = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
hyps, refs = Path(sys.argv[4]), Path(sys.argv[5])
summary = {"stages": dict(line.split("=", 1) for line in status.read_text().splitlines() if "=" in line)}


def part(name, build):
    try:
        summary[name] = build()
    except Exception as error:
        summary[name] = {"missing": repr(error)}
        print(f"{name}: {error!r}")


def fmt(value, spec):
    return format(value, spec) if value is not None else "n/a"


def throughput():
    data = json.loads((out / "train_throughput_gpu.json").read_text())
    rows = {}
    head = f"{'tok/s':>10}{'MFU':>7}{'MFU spec':>9}{'h/100k':>8}{'GiB':>6}"
    print(f"\n{'shape':<6}{'prec':<6}{'system':<16}{head}")
    for shape, entry in data["shapes"].items():
        for precision, row in entry["precisions"].items():
            key = f"{shape}/{precision}"
            if "target_tokens_per_s" not in row:
                rows[key] = row
                print(f"{shape:<6}{precision:<6}{row}")
                continue
            rows[key] = {}
            for system, tps in row["target_tokens_per_s"].items():
                mfu, spec = row["mfu"].get(system), row.get("mfu_spec", {}).get(system)
                hours = row.get("implied_hours_paper_100k_steps", {}).get(system)
                gib = row.get("cuda_memory", {}).get(system, {}).get("peak_allocated_mib", 0) / 1024
                rows[key][system] = {
                    "tokens_per_s": tps["median"],
                    "mfu": mfu,
                    "mfu_spec": spec,
                    "hours_paper_100k_steps": hours,
                    "peak_gib": gib,
                }
                print(
                    f"{shape:<6}{precision:<6}{system:<16}{tps['median']:>10,.0f}{fmt(mfu, '.1%'):>7}"
                    f"{fmt(spec, '.1%'):>9}{fmt(hours, '.1f'):>8}{gib:>6.1f}"
                )
    return {"gpu": data["machine"].get("gpu"), "matmul_peak_flops": data["matmul_peak_flops"], "rows": rows}


def multi30k():
    try:
        scores = json.loads((out / "multi30k_gpu_eval.json").read_text())
    except Exception as error:  # evaluate failed after writing its translations (e.g. no sacremoses)
        import sacrebleu

        print(f"no scores from aiayn evaluate ({error!r}): sacreBLEU of {hyps}")
        bleu = sacrebleu.corpus_bleu(hyps.read_text().splitlines(), [refs.read_text().splitlines()])
        scores = {"bleu": bleu.score, "tokenized_bleu": None, "chrf": None, "from": str(hyps)}
    lines = (out / "multi30k_gpu_metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    valid = [r for r in records if "bleu" in r]
    result = {
        "evaluate_command": eval_command,
        "test2016": scores,
        "last_record": records[-1] if records else None,
        "last_valid": valid[-1] if valid else None,
    }
    print(
        f"\nMulti30k de-en test2016: sacreBLEU {scores['bleu']:.2f}, tokenized lowercased BLEU "
        f"{fmt(scores['tokenized_bleu'], '.2f')}, chrF {fmt(scores['chrf'], '.2f')}"
    )
    print(f"last record: {result['last_record']}")
    return result


def decoding(name="decode_speed_gpu.json"):
    data = json.loads((out / name).read_text())
    figures = {
        search: {
            name: {k: row[k] for k in ("sentences_per_s", "target_tokens_per_s", "bleu")}
            for name, row in rows.items()
            if isinstance(row, dict)
        }
        for search, rows in data["figures"].items()
    }
    for search, rows in figures.items():
        text = "; ".join(
            f"{n} {r['sentences_per_s']:.0f} sent/s, BLEU {r['bleu']:.2f}" for n, r in rows.items()
        )
        print(f"\ndecoding {search}: {text}")
    result = {"figures": figures, "checks_failed": data["checks"].get("failures")}
    if "ctranslate2" in data:
        result["ctranslate2"] = data["ctranslate2"]
        print("ctranslate2:", json.dumps(data["ctranslate2"])[:800])
    return result


def train_profile():
    data = json.loads((out / "train_profile_gpu.json").read_text())
    result = {}
    for variant, row in data["variants"].items():
        kinds = ", ".join(f"{k} {v:.0%}" for k, v in row["kinds"].items())
        print(f"\ntraining step, {variant}: {row['seconds_per_step'] * 1e3:.1f} ms, busy {row['busy']:.0%}; {kinds}")
        result[variant] = {k: row[k] for k in ("seconds_per_step", "busy", "kinds", "warmup_s")}
        result[variant]["top"] = row["top"][:5]
    return result


print("\n=== summary")
print("stages:", summary["stages"])
part("train_profile", train_profile)
part("train_throughput", throughput)
part("multi30k", multi30k)
part("decode_speed", decoding)
part("decode_speed_bf16", lambda: decoding("decode_speed_bf16_gpu.json"))
(out / "gpu_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"wrote {out / 'gpu_summary.json'}")
EOF
echo "=== [$(date +%T)] done in $((SECONDS - START)) s; files in $OUT:"
ls -la "$OUT"
exec >&- 2>&- # let tee write the log's last lines before the script ends
wait "$TEE_PID" 2>/dev/null || true
