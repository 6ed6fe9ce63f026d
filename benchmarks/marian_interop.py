"""MarianMT in and out, at real sizes: import an opus-mt-shaped model, decode test2016 against
transformers and CTranslate2; export a Multi30k-trained aiayn model and decode it with transformers.

    .venv/bin/python benchmarks/marian_interop.py                      # both parts
    .venv/bin/python benchmarks/marian_interop.py --parts shape --limit 200 --rounds 2

**shape**: a MarianMT directory of opus-mt-de-en's shape (d_model 512, 6+6 layers, 8 heads, FFN 2048,
swish, shared and tied embeddings, a vocabulary of 58,101 pieces: two unigram SentencePiece models
trained on Multi30k's train.de / train.en and filler pieces up to that size), random weights
(transformers' own initialisation, seeded). ``aiayn import marian`` runs in a child process: its wall
time and peak RSS. Then test2016's first ``--limit`` German sentences are decoded greedily by aiayn
(torch), ``MarianMTModel.generate`` and CTranslate2 (aiayn's export), every output exactly
``--out-tokens`` tokens long (random weights rarely choose EOS; the length limit makes the work equal),
in interleaved rounds: sentences/s (median) and how many outputs equal aiayn's.

**export**: ``aiayn train`` on Multi30k de->en with ``configs/multi30k_de_en.yaml`` for ``--steps``
steps, ``aiayn export --format huggingface``, then val decoded greedily by ``aiayn translate``'s
Translator and by ``MarianMTModel.generate`` on the export: how many outputs are equal (MarianTokenizer
strips the ends of the text, so both are compared stripped).

Writes ``benchmarks/results/marian_interop.json`` (command, versions, machine).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sentencepiece as spm
import torch

from common import command, machine, versions

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=("shape", "export"), default=["shape", "export"])
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--limit", type=int, default=300, help="test2016 sentences decoded (shape part)")
    parser.add_argument("--out-tokens", type=int, default=30, help="output tokens per sentence (shape part)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="training steps (export part)")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "marian_interop.json"))
    return parser.parse_args()


def lines(path: Path, n: int = 0) -> list[str]:
    text = path.read_text(encoding="utf-8").splitlines()
    return text[:n] if n else text


def spm_model(sentences: list[str], vocab_size: int) -> bytes:
    import io

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        num_threads=2,
        minloglevel=2,
        hard_vocab_limit=False,
    )
    return model.getvalue()


def opus_mt_shaped(out: Path, data: Path, vocab_size: int = 58101) -> Path:
    from transformers import MarianConfig, MarianMTModel

    out.mkdir(parents=True)
    protos = {
        "source.spm": spm_model(lines(data / "train.de"), 8000),
        "target.spm": spm_model(lines(data / "train.en"), 8000),
    }
    pieces = ["</s>", "<unk>"]
    seen = set(pieces)
    for name, proto in protos.items():
        (out / name).write_bytes(proto)
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in seen:
                pieces.append(piece)
                seen.add(piece)
    pieces += [f"▁filler{i}" for i in range(vocab_size - 1 - len(pieces))] + ["<pad>"]
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False))
    v = len(pieces)
    config = MarianConfig(
        vocab_size=v, decoder_vocab_size=v, d_model=512, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
        activation_function="swish", max_position_embeddings=512, scale_embedding=True,
        pad_token_id=v - 1, eos_token_id=0, decoder_start_token_id=v - 1, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[v - 1]]
    model.save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}))
    return out


def timed_import(source: Path, run: Path) -> dict:
    """``aiayn import marian`` in a child process: wall seconds and its peak RSS."""
    start = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-m", "aiayn", "import", "marian", str(source), "--out", str(run)],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if child.returncode:
        raise SystemExit(f"import failed: {child.stderr.strip()}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    files = sum(f.stat().st_size for f in source.iterdir()) / 2**20
    return {"seconds": seconds, "peak_rss_mib": peak, "source_mib": files, "said": child.stdout.strip()}


def shape_part(args, work: Path) -> dict:
    from transformers import MarianMTModel, MarianTokenizer

    from aiayn.decode.backends import load_backend
    from aiayn.decode.search import DecodeOptions

    data = Path(args.data_dir)
    source = opus_mt_shaped(work / "opus-mt-shaped", data)
    run = work / "imported"
    imported = timed_import(source, run)
    print(f"import: {imported['seconds']:.1f} s, peak RSS {imported['peak_rss_mib']:.0f} MiB", flush=True)
    texts = lines(data / "test2016.de", args.limit)
    n = args.out_tokens
    options = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=n, scores=False)
    aiayn, ct2 = load_backend(run, "torch"), load_backend(run, "ctranslate2", ct2_dir=work / "ct2")
    hf, hf_tok = MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source)

    def transformers_generate(batch: list[str]) -> list[str]:
        out = []
        for start in range(0, len(batch), 32):
            inputs = hf_tok(batch[start : start + 32], padding=True, return_tensors="pt")
            with torch.inference_mode():
                ids = hf.generate(
                    **inputs, num_beams=1, do_sample=False, max_new_tokens=n + 1, min_new_tokens=n + 1
                )
            out += hf_tok.batch_decode(ids, skip_special_tokens=True)
        return out

    systems = {
        "aiayn": lambda: [t.text for t in aiayn.translate(texts, options)],
        "transformers": lambda: transformers_generate(texts),
        "ctranslate2": lambda: [t.text for t in ct2.translate(texts, options)],
    }
    outputs = {name: run_() for name, run_ in systems.items()}  # warm-up, and the outputs compared
    rates: dict[str, list[float]] = {name: [] for name in systems}
    names = list(systems)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            systems[name]()
            rates[name].append(len(texts) / (time.perf_counter() - start))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} sent/s" for k, v in rates.items()), flush=True)
    ours = [o.strip() for o in outputs["aiayn"]]
    return {
        "model": "opus-mt-de-en's shape, random weights (seed 0)",
        "vocabulary": hf.config.vocab_size,
        "parameters": sum(p.numel() for p in hf.parameters()),
        "import": imported,
        "sentences": len(texts),
        "output_tokens": n,
        "sentences_per_s": {k: {"median": statistics.median(v), "samples": v} for k, v in rates.items()},
        "ratio_aiayn_over": {
            k: statistics.median(rates["aiayn"]) / statistics.median(v)
            for k, v in rates.items()
            if k != "aiayn"
        },
        "equal_to_aiayn": {
            k: sum(a == b.strip() for a, b in zip(ours, v)) for k, v in outputs.items() if k != "aiayn"
        },
    }


def export_part(args, work: Path) -> dict:
    from transformers import MarianMTModel, MarianTokenizer

    from aiayn import load
    from aiayn.decode import Translator
    from aiayn.decode.search import DecodeOptions

    run, out = work / "m30k", work / "m30k-hf"
    train = [
        sys.executable, "-m", "aiayn", "train", "--config", str(ROOT / "configs" / "multi30k_de_en.yaml"),
        "--data-dir", args.data_dir, "--out", str(run), "--max-steps", str(args.steps),
        "--set", f"train.save_every={args.steps}", "--set", "train.valid_every=0", "--no-progress",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(train, check=True, capture_output=True)
    trained = time.perf_counter() - start
    subprocess.run(
        [
            sys.executable,
            "-m",
            "aiayn",
            "export",
            "--checkpoint",
            str(run),
            "--format",
            "huggingface",
            "--out",
            str(out),
        ],
        check=True,
    )
    model, tokenizer, _ = load(run)
    texts = lines(Path(args.data_dir) / "val.de")
    options = DecodeOptions(beam=1, max_len_a=0.0, max_len_b=60)
    ours = [t.text.strip() for t in Translator(model, tokenizer, options=options).translate(texts)]
    hf, hf_tok = MarianMTModel.from_pretrained(out).eval(), MarianTokenizer.from_pretrained(out)
    theirs = []
    for i in range(0, len(texts), 64):
        inputs = hf_tok(texts[i : i + 64], padding=True, return_tensors="pt")
        with torch.inference_mode():
            ids = hf.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=61)
        theirs += hf_tok.batch_decode(ids, skip_special_tokens=True)
    differ = [(t, a, b) for t, a, b in zip(texts, ours, theirs) if a != b]
    return {
        "training": {"config": "configs/multi30k_de_en.yaml", "steps": args.steps, "seconds": trained},
        "val_sentences": len(texts),
        "equal": len(texts) - len(differ),
        "first_differences": differ[:5],
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    results = {
        "benchmark": "marian_interop",
        "command": command(),
        "versions": versions(transformers=transformers.__version__, ctranslate2=_ct2_version()),
        "machine": machine(),
        "threads": args.threads,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.parts:
            results[part] = {"shape": shape_part, "export": export_part}[part](args, Path(tmp))
            print(json.dumps(results[part], indent=1)[:1500], flush=True)
            Path(args.results).write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.results}")


def _ct2_version() -> str:
    import ctranslate2

    return ctranslate2.__version__


if __name__ == "__main__":
    sys.exit(main())
