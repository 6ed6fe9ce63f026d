"""Multi30k quality: train with a shipped config, average the last checkpoints, decode test2016.

    python benchmarks/multi30k.py --direction en-de          # configs/multi30k_en_de.yaml
    python benchmarks/multi30k.py --direction de-en          # resumes a run that was interrupted
    python benchmarks/multi30k.py --direction en-de --decode-only   # steps 2-4 on a finished run

Steps, each logged with its wall time:

1. ``aiayn train --config configs/multi30k_{src}_{tgt}.yaml`` in a child process (peak RSS from
   ``getrusage(RUSAGE_CHILDREN)``). A run directory that already holds checkpoints resumes; the
   training time reported is the trainer's own clock summed over resumes (``hours`` in the state).
   ``--decode-only`` skips this step and keeps the training figures of the results file it replaces
   (when that file describes the same run: same direction and last step).
2. Average the last ``--average`` checkpoints (the paper averaged the last 5).
3. Beam search (``--beam``) on ``val`` for the averaged model, the last checkpoint and ``best/``,
   each with every length penalty of ``--alpha`` (GNMT's; default 0.6, the paper's, and 1.0, 1.5,
   2.0); the model and penalty with the highest val BLEU (sacreBLEU; a tie keeps the average and the
   smaller penalty) are decoded on ``test2016``, the reported figure. ``--select averaged`` always
   reports the average (with ``--alpha 0.6``: the protocol of the earlier runs). test2016 is never
   used to choose anything.
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
    if args.decode_only:
        training = earlier_training(results_path, out, f"{src}-{tgt}")
    else:
        log(f"training {config.name} into {out}")
        training = train(config, out, args)
    from aiayn.checkpoint import load_checkpoint
    from aiayn.train.average import average_checkpoints, last_checkpoints
    from aiayn.train.engine import METRICS_FILE, RUN_CONFIG_FILE

    averaged = out / "averaged"
    inputs = last_checkpoints(out, args.average)
    average_checkpoints(inputs, averaged)
    log(f"averaged {[p.name for p in inputs]}")
    data = Path(args.data_dir)
    candidates = {"averaged": averaged, "last": inputs[-1], "best": out / "best"}
    grid = {
        name: {alpha: decode_and_score(path, data, "val", src, tgt, args.beam, alpha) for alpha in args.alpha}
        for name, path in candidates.items()
        if path.exists()
    }
    val = {name: best_alpha(scores) for name, scores in grid.items()}
    selected = select(val, args.select)
    alpha = val[selected]["alpha"]
    log(f"test2016 with the {selected} model ({args.select}), alpha {alpha}")
    test = decode_and_score(candidates[selected], data, "test2016", src, tgt, args.beam, alpha)
    state = load_checkpoint(inputs[-1]).train_state["trainer"]
    results = {
        "benchmark": "multi30k",
        "direction": f"{src}-{tgt}",
        "command": command(),
        "config": str(config.relative_to(ROOT)),
        "versions": versions(sacrebleu=sacrebleu.__version__),
        "machine": machine(),
        "run_config": yaml.safe_load(
            (out / RUN_CONFIG_FILE).read_text()
        ),  # the config as trained, overrides applied
        "training": {**training, "steps": state["step"], "hours": state["hours"]},
        "validation_curve": validation_curve(out / METRICS_FILE),
        "averaged_checkpoints": [p.name for p in inputs],
        "decoding": {"beam": args.beam, "alphas_tried_on_val": args.alpha, "alpha": alpha},
        "selection": args.select,
        "test2016_model": selected,
        "val": val,
        "val_by_alpha": {name: {str(a): s for a, s in scores.items()} for name, scores in grid.items()},
        "test2016": test,
    }
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2) + "\n")
    log(
        f"test2016 {src}->{tgt}: sacreBLEU {test['bleu']:.2f}, tokenized lowercased BLEU "
        f"{test['tokenized_lowercased_bleu']:.2f}, chrF {test['chrf']:.2f}; wrote {results_path}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", choices=["en-de", "de-en"], default="en-de")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--out", help="run directory (default runs/multi30k_{src}_{tgt})")
    parser.add_argument(
        "--results", help="results JSON (default benchmarks/results/multi30k_{src}_{tgt}.json)"
    )
    parser.add_argument(
        "--max-hours", type=float, default=0.0, help="training time budget (0 = the config's)"
    )
    parser.add_argument("--average", type=int, default=5, help="average the last N checkpoints")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument(
        "--alpha",
        type=float,
        nargs="+",
        default=[0.6, 1.0, 1.5, 2.0],
        help="length penalties (GNMT's; the paper's is 0.6) tried on val; the best is used on test2016",
    )
    parser.add_argument(
        "--decode-only",
        action="store_true",
        help="skip training: average, choose on val and decode test2016 for a finished run",
    )
    parser.add_argument("--set", action="append", default=[], help="config override passed to aiayn train")
    parser.add_argument(
        "--select",
        choices=["val", "averaged"],
        default="val",
        help="model decoded on test2016: the best of averaged/last/best on val BLEU, or always the average",
    )
    return parser.parse_args()


def select(val: dict, rule: str) -> str:
    """The candidate decoded on test2016: chosen on val only (ties keep the averaged model)."""
    if rule == "averaged":
        return "averaged"
    return max(val, key=lambda name: (val[name]["bleu"], name == "averaged"))


def best_alpha(scores: dict[float, dict]) -> dict:
    """The val scores of the length penalty with the highest BLEU (a tie keeps the smaller), with its
    ``alpha``."""
    alpha = max(scores, key=lambda a: (scores[a]["bleu"], -a))
    return {**scores[alpha], "alpha": alpha}


def earlier_training(results_path: Path, out: Path, direction: str) -> dict:
    """``--decode-only``: the training figures of the results file being replaced, if it is this run's."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.errors import UserError
    from aiayn.train.average import last_checkpoints

    try:
        state = load_checkpoint(last_checkpoints(out, 1)[-1]).train_state["trainer"]
    except UserError as err:
        raise SystemExit(f"--decode-only: {err}; train the run with this script first") from None
    if results_path.exists():
        earlier = json.loads(results_path.read_text())
        if (
            earlier.get("direction") == direction
            and earlier.get("training", {}).get("steps") == state["step"]
        ):
            kept = {key: value for key, value in earlier["training"].items() if key not in ("steps", "hours")}
            return {**kept, "figures_from": f"{results_path.name} of the training invocation (--decode-only)"}
    raise SystemExit(
        f"--decode-only: {results_path} does not describe the run in {out} (step {state['step']}); "
        "train it with this script first"
    )


def train(config: Path, out: Path, args: argparse.Namespace) -> dict:
    argv = [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        "--config",
        str(config),
        "--data-dir",
        args.data_dir,
        "--out",
        str(out),
        "--no-progress",
    ]
    if args.max_hours:
        argv += ["--max-hours", str(args.max_hours)]
    for override in args.set:
        argv += ["--set", override]
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return {
        "command": " ".join(argv[1:]),
        "wall_s_this_invocation": time.perf_counter() - started,
        "peak_rss_mib": peak_rss_mib(children=True),
    }


def decode_and_score(
    checkpoint: Path, data: Path, split: str, src: str, tgt: str, beam: int, alpha: float
) -> dict:
    from aiayn.data.corpus import read_parallel
    from aiayn.decode.translator import Translator
    from aiayn.evaluate import sacrebleu_scores, tokenized_bleu
    from aiayn.loading import load_translation_model

    model, tokenizer = load_translation_model(checkpoint)[:2]
    pairs, _ = read_parallel(data, split, src, tgt)
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    translator = Translator(model, tokenizer, beam=beam, alpha=alpha)
    started = time.perf_counter()
    with torch.inference_mode():
        hypotheses = [t.text for t in translator.translate(sources)]
    seconds = time.perf_counter() - started
    scores = sacrebleu_scores(
        hypotheses, references, lowercase=tokenizer.lowercases
    )  # case:lc for a lowercasing model
    scores["tokenized_lowercased_bleu"] = tokenized_bleu(hypotheses, references, tgt)
    scores["decode_s"] = seconds
    scores["sentences_per_s"] = len(sources) / seconds
    log(
        f"{checkpoint.name} {split} (beam {beam}, alpha {alpha}): BLEU {scores['bleu']:.2f} (tokenized "
        "lowercased "
        f"{scores['tokenized_lowercased_bleu']:.2f}) chrF {scores['chrf']:.2f} in {seconds:.0f} s"
    )
    return scores


def validation_curve(metrics: Path) -> list[dict]:
    """The run's validations (step, loss, greedy BLEU, chrF) from its metrics.jsonl."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [
        {k: r[k] for k in ("step", "loss", "bleu", "chrf") if k in r}
        for r in records
        if r["split"] == "valid"
    ]


def log(message: str) -> None:
    print(f"[multi30k {time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    main()
