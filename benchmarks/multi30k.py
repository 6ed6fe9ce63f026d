"""Multi30k quality: train with a shipped config, average the last checkpoints, decode test2016.

    python benchmarks/multi30k.py --direction en-de          # configs/multi30k_en_de.yaml
    python benchmarks/multi30k.py --direction de-en          # resumes a run that was interrupted

Steps, each logged with its wall time:

1. ``aiayn train --config configs/multi30k_{src}_{tgt}.yaml`` in a child process (peak RSS from
   ``getrusage(RUSAGE_CHILDREN)``). A run directory that already holds checkpoints resumes; the
   training time reported is the trainer's own clock summed over resumes (``hours`` in the state).
2. Average the last ``--average`` checkpoints (the paper averaged the last 5).
3. Beam search (``--beam``, length penalty ``--alpha``) on ``val`` for the averaged model, the last
   checkpoint and ``best/``; the one with the highest val BLEU (sacreBLEU; a tie keeps the average)
   is decoded on ``test2016``, the reported figure. ``--select averaged`` always reports the average
   (the protocol of runs before this option). test2016 is never used to choose anything.
4. sacreBLEU BLEU + chrF with signatures, and the literature's tokenized lowercased BLEU
   (Moses tokenizer, ``multi-bleu.perl`` style; not comparable to sacreBLEU).

Writes ``benchmarks/results/multi30k_{src}_{tgt}.json`` (command, versions, machine, figures).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
import torch
import yaml

from common import command, machine, peak_rss_mib, versions

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    args = parse_args()
    src, tgt = args.direction.split("-")
    config = ROOT / "configs" / f"multi30k_{src}_{tgt}.yaml"
    out = Path(args.out or ROOT / "runs" / f"multi30k_{src}_{tgt}")
    results_path = Path(args.results or ROOT / "benchmarks" / "results" / f"multi30k_{src}_{tgt}.json")
    log(f"training {config.name} into {out}")
    training = train(config, out, args)
    from aiayn.train.average import average_checkpoints, last_checkpoints
    from aiayn.train.checkpoint import load_checkpoint
    from aiayn.train.trainer import METRICS_FILE, RUN_CONFIG_FILE

    averaged = out / "averaged"
    inputs = last_checkpoints(out, args.average)
    average_checkpoints(inputs, averaged)
    log(f"averaged {[p.name for p in inputs]}")
    data = Path(args.data_dir)
    candidates = {"averaged": averaged, "last": inputs[-1], "best": out / "best"}
    val = {name: decode_and_score(path, data, "val", src, tgt, args) for name, path in candidates.items()
           if path.exists()}
    selected = select(val, args.select)
    log(f"test2016 with the {selected} model ({args.select})")
    test = decode_and_score(candidates[selected], data, "test2016", src, tgt, args)
    state = load_checkpoint(inputs[-1]).train_state["trainer"]
    results = {
        "benchmark": "multi30k", "direction": f"{src}-{tgt}",
        "command": command(), "config": str(config.relative_to(ROOT)),
        "versions": versions(sacrebleu=sacrebleu.__version__), "machine": machine(),
        "run_config": yaml.safe_load((out / RUN_CONFIG_FILE).read_text()),  # the config as trained, overrides applied
        "training": {**training, "steps": state["step"], "hours": state["hours"]},
        "validation_curve": validation_curve(out / METRICS_FILE),
        "averaged_checkpoints": [p.name for p in inputs],
        "decoding": {"beam": args.beam, "alpha": args.alpha},
        "selection": args.select, "test2016_model": selected,
        "val": val, "test2016": test,
    }
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    log(f"test2016 {src}->{tgt}: sacreBLEU {test['bleu']:.2f}, tokenized lowercased BLEU "
        f"{test['tokenized_lowercased_bleu']:.2f}, chrF {test['chrf']:.2f}; wrote {results_path}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", choices=["en-de", "de-en"], default="en-de")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--out", help="run directory (default runs/multi30k_{src}_{tgt})")
    parser.add_argument("--results", help="results JSON (default benchmarks/results/multi30k_{src}_{tgt}.json)")
    parser.add_argument("--max-hours", type=float, default=0.0, help="training time budget (0 = the config's)")
    parser.add_argument("--average", type=int, default=5, help="average the last N checkpoints")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty (GNMT, as the paper)")
    parser.add_argument("--set", action="append", default=[], help="config override passed to aiayn train")
    parser.add_argument("--select", choices=["val", "averaged"], default="val",
                        help="model decoded on test2016: the best of averaged/last/best on val BLEU, or always the average")
    return parser.parse_args()


def select(val: dict, rule: str) -> str:
    """The candidate decoded on test2016: chosen on val only (ties keep the averaged model)."""
    if rule == "averaged":
        return "averaged"
    return max(val, key=lambda name: (val[name]["bleu"], name == "averaged"))


def train(config: Path, out: Path, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "aiayn", "train", "--config", str(config), "--data-dir", args.data_dir,
               "--out", str(out), "--no-progress"]
    if args.max_hours:
        argv += ["--max-hours", str(args.max_hours)]
    for override in args.set:
        argv += ["--set", override]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return {"command": " ".join(argv[1:]), "wall_s_this_invocation": time.perf_counter() - started,
            "peak_rss_mib": peak_rss_mib(children=True)}


def decode_and_score(checkpoint: Path, data: Path, split: str, src: str, tgt: str, args) -> dict:
    from aiayn.data.corpus import read_parallel
    from aiayn.decode.translator import Translator
    from aiayn.evaluate import sacrebleu_scores, tokenized_bleu
    from aiayn.train.checkpoint import load_translation_model

    model, tokenizer = load_translation_model(checkpoint)[:2]
    pairs, _ = read_parallel(data, split, src, tgt)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    translator = Translator(model, tokenizer, beam=args.beam, alpha=args.alpha)
    started = time.perf_counter()
    with torch.inference_mode():
        hypotheses = translator.translate(sources)
    seconds = time.perf_counter() - started
    scores = sacrebleu_scores(hypotheses, references)
    scores["tokenized_lowercased_bleu"] = tokenized_bleu(hypotheses, references, tgt)
    scores["decode_s"] = seconds
    scores["sentences_per_s"] = len(sources) / seconds
    log(f"{checkpoint.name} {split}: BLEU {scores['bleu']:.2f} (tokenized lowercased "
        f"{scores['tokenized_lowercased_bleu']:.2f}) chrF {scores['chrf']:.2f} in {seconds:.0f} s")
    return scores


def validation_curve(metrics: Path) -> list[dict]:
    """The run's validations (step, loss, greedy BLEU, chrF) from its metrics.jsonl."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in ("step", "loss", "bleu", "chrf") if k in r} for r in records if r["split"] == "valid"]


def log(message: str) -> None:
    print(f"[multi30k {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    main()
