"""Documents against lines, on Multi30k test2016 (de->en): BLEU, structure, tags, speed and memory.

    python benchmarks/documents.py --checkpoint RUN [--data-dir $AIAYN_DATA/multi30k] \
        [--engine torch|ctranslate2] [--threads 2] [--rounds 3] [--results benchmarks/results/documents.json]

* **Paragraphs**: test2016 cut into paragraphs of 3-8 consecutive sentences (seeded; a sentence
  without terminal punctuation gets a "." on both sides, counted in the output). The same sentences
  are translated one per line (``backend.translate``, no segmentation) and as paragraphs
  (``DocumentTranslator``, ``--format text``'s path); both are scored per paragraph (a paragraph's
  sentence translations joined by a space against its references joined likewise). Paragraph
  structure: the paragraphs come back as many, separated as in the source.
* **One long line**: the first 60 sentences on one line, translated whole (nothing cut, no
  warning), scored as one segment against the same 60 translated one per line.
* **HTML**: each paragraph a ``<p>``, and in each sentence the first word of a small de-en word list
  (nouns and colours whose translation is unambiguous in Multi30k) in ``<b>``. Kept: every tag, the
  output parsed again (stdlib ``html.parser``) with the same start and end tags. Placement: a tag
  counts when the target words it wraps contain a translation of its word; the ceiling is the share
  of sentences whose reference has that translation at all (the issue's), beside the share whose
  own translation has it. Empty: the ``<b>`` elements that come back with no word in them, and of
  those, the ones whose paragraph's translation has a translation of their word. With ``--layers``
  (the torch engine), placement for every decoder layer's cross-attention.
* **Speed**: sentences/s of line mode, text documents and HTML on the same sentences, interleaved
  rounds, medians and ratios.
* **Memory**: peak RSS of ``aiayn translate --format text`` on files of 10,000 and 100,000 sentences
  (paragraphs of 5), with a tiny random model of the same tokenizer (so that the run takes seconds,
  not hours): the stream's memory does not grow with the file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import sacrebleu
import torch

import aiayn
from aiayn import TransformerConfig, build_model
from aiayn.checkpoint import save_checkpoint
from aiayn.decode.backends import load_backend
from aiayn.decode.search import DecodeOptions
from aiayn.device import resolve_device
from aiayn.documents.translate import DocumentTranslator
from aiayn.loading import model_languages
from common import command, gpu, machine, versions

TERMINAL = (".", "!", "?", '"', "…")
#: de -> en: the source word (as written) and the target words that translate it
WORDS = {
    "Mann": ["man"], "Frau": ["woman", "lady"], "Hund": ["dog"], "Kind": ["child", "kid"],
    "Mädchen": ["girl"], "Junge": ["boy"], "Männer": ["men"], "Frauen": ["women"],
    "Kinder": ["children", "kids"], "Hunde": ["dogs"], "Straße": ["street", "road"],
    "Wasser": ["water"], "Ball": ["ball"], "Hemd": ["shirt"], "Hut": ["hat"],
    "Fahrrad": ["bike", "bicycle"], "Gebäude": ["building"], "Strand": ["beach"], "Auto": ["car"],
    "Gras": ["grass"], "Schnee": ["snow"], "Tisch": ["table"], "Gitarre": ["guitar"],
    "Bühne": ["stage"], "Baby": ["baby"], "Menschen": ["people"], "Leute": ["people"],
    "Gruppe": ["group"], "Jacke": ["jacket"], "Pferd": ["horse"], "Boot": ["boat"], "Stadt": ["city"],
    "Park": ["park"], "Sand": ["sand"], "Baum": ["tree"], "Zug": ["train"], "Küche": ["kitchen"],
    "Feld": ["field"], "Berg": ["mountain"], "Kamera": ["camera"], "Sonnenbrille": ["sunglasses"],
    "Mauer": ["wall"], "Wand": ["wall"], "Fenster": ["window"], "Brücke": ["bridge"],
    "Kleid": ["dress"], "Schild": ["sign"], "Stuhl": ["chair"], "Bank": ["bench"],
    "Motorrad": ["motorcycle", "motorbike"], "Bus": ["bus"], "Ozean": ["ocean"], "Fluss": ["river"],
    "Helm": ["helmet"], "Markt": ["market"], "Restaurant": ["restaurant"], "Musik": ["music"],
    "Skateboard": ["skateboard"], "Welle": ["wave"], "Mütze": ["hat", "cap"], "Tür": ["door"],
    **{f"{stem}{end}": [colour] for stem, colour in (
        ("rot", "red"), ("blau", "blue"), ("grün", "green"), ("schwarz", "black"), ("weiß", "white"),
        ("gelb", "yellow"), ("braun", "brown"), ("grau", "gray"),
    ) for end in ("", "e", "en", "er", "es", "em")},
}  # fmt: skip


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    src = read(args.data_dir / f"{args.split}.de")
    ref = read(args.data_dir / f"{args.split}.en")
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    (src, ref), added = with_full_stops(src, ref)
    sizes = paragraph_sizes(len(src), args.seed)
    device = resolve_device(args.device, "--device")
    ct2_dir = tempfile.TemporaryDirectory()  # the export, for --engine ctranslate2
    backend = load_backend(
        args.checkpoint, args.engine, device=device, ct2_dir=ct2_dir.name, batch_tokens=args.batch_tokens
    )
    tokenizer = backend.tokenizer
    documents = DocumentTranslator(backend, language=model_languages(args.checkpoint)[0] or "de")
    options = DecodeOptions(beam=args.beam, alpha=args.alpha)
    paragraphs = group(src, sizes)
    html = [html_paragraph(sentences) for sentences in paragraphs]
    results = {
        "command": command(),
        "versions": versions(sacrebleu=sacrebleu.__version__),
        "aiayn_src": str(Path(aiayn.__file__).parent),  # the code measured (PYTHONPATH may name another tree)
        "machine": machine(),
        "gpu": gpu(device) if device.type == "cuda" else None,
        "threads": args.threads,
        "engine": args.engine,
        "checkpoint": str(args.checkpoint),
        "options": {"beam": args.beam, "alpha": args.alpha},
        "data": {
            "split": args.split,
            "sentences": len(src),
            "paragraphs": len(sizes),
            "full_stops_added": added,
        },
    }
    results["speed"], outputs = speed(backend, documents, src, paragraphs, html, options, args.rounds)
    results["paragraphs"] = paragraph_scores(outputs, group(ref, sizes), sizes)
    results["long_line"] = long_line(documents, backend, src[:60], ref[:60], options)
    results["html"] = html_scores(html, outputs["html"], paragraphs, group(ref, sizes))
    if args.layers and args.engine == "torch":
        results["html_by_layer"] = by_layer(backend, documents, html, paragraphs, group(ref, sizes), options)
    results["memory"] = stream_memory(tokenizer, src, args.sizes) if args.sizes else {}
    report(results)
    if args.results:
        Path(args.results).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("AIAYN_DATA", "../shared/data")) / "multi30k"
    )
    p.add_argument("--split", default="test2016")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    p.add_argument("--engine", default="torch", choices=["torch", "ctranslate2"])
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of each mode")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=int, help="the first N sentences only (a quick check)")
    p.add_argument("--layers", action="store_true", help="tag placement for every decoder layer")
    p.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000], help="sentences (memory)")
    p.add_argument("--results")
    return p.parse_args()


# --- the documents ----------------------------------------------------------------------------------


def read(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def with_full_stops(src: list[str], ref: list[str]) -> tuple[tuple[list[str], list[str]], int]:
    """Each pair with terminal punctuation on both sides ("." added where a side has none)."""
    added = sum((not s.endswith(TERMINAL)) + (not r.endswith(TERMINAL)) for s, r in zip(src, ref))
    fix = (
        [s if s.endswith(TERMINAL) else s + "." for s in src],
        [r if r.endswith(TERMINAL) else r + "." for r in ref],
    )
    return fix, added


def paragraph_sizes(n: int, seed: int) -> list[int]:
    rng, sizes = random.Random(seed), []
    while sum(sizes) < n:
        sizes.append(min(rng.randint(3, 8), n - sum(sizes)))
    return sizes


def group(lines: list[str], sizes: list[int]) -> list[list[str]]:
    out, start = [], 0
    for size in sizes:
        out.append(lines[start : start + size])
        start += size
    return out


def tagged_word(sentence: str) -> str | None:
    """The first word of :data:`WORDS` in ``sentence`` (punctuation aside)."""
    for word in sentence.split():
        if word.strip(".,;:!?\"'") in WORDS:
            return word.strip(".,;:!?\"'")
    return None


def html_paragraph(sentences: list[str]) -> str:
    """``<p>`` with the first listed word of each sentence in ``<b>`` (entities escaped)."""
    out = []
    for sentence in sentences:
        word = tagged_word(sentence)
        text = escape(sentence)
        if word is not None:
            text = re.sub(rf"(?<!\w){re.escape(escape(word))}(?!\w)", f"<b>{escape(word)}</b>", text, count=1)
        out.append(text)
    return "<p>" + " ".join(out) + "</p>"


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- measurements -----------------------------------------------------------------------------------


def speed(backend, documents, src, paragraphs, html, options, rounds: int):
    """Interleaved rounds of the three modes on the same sentences: seconds, medians, ratios."""
    modes = {
        "lines": lambda: [t.text for t in backend.translate(src, options)],
        "text": lambda: documents.translate(["\n\n".join(" ".join(p) for p in paragraphs)], options)[0],
        "html": lambda: documents.translate(html, options, fmt="html"),
    }
    seconds = {mode: [] for mode in modes}
    outputs = {}
    for _ in range(rounds):
        for mode, run in modes.items():
            start = time.perf_counter()
            outputs[mode] = run()
            seconds[mode].append(time.perf_counter() - start)
    medians = {mode: statistics.median(s) for mode, s in seconds.items()}
    result = {
        "seconds": seconds,
        "sentences_per_s": {mode: len(src) / m for mode, m in medians.items()},
        "text_over_lines": medians["lines"] / medians["text"],
        "html_over_lines": medians["lines"] / medians["html"],
    }
    return result, outputs


def paragraph_scores(outputs, refs: list[list[str]], sizes: list[int]) -> dict:
    """BLEU per paragraph of both modes, and whether the text document kept its paragraphs."""
    references = [" ".join(r) for r in refs]
    lines = group(outputs["lines"], sizes)
    line_hyps = [" ".join(t for t in p if t) for p in lines]
    document = outputs["text"].text
    doc_hyps = document.split("\n\n")
    bleu_lines = sacrebleu.corpus_bleu(line_hyps, [references]).score
    bleu_text = sacrebleu.corpus_bleu(doc_hyps, [references]).score if len(doc_hyps) == len(refs) else None
    return {
        "bleu_lines_per_paragraph": bleu_lines,
        "bleu_text_per_paragraph": bleu_text,
        "ratio": bleu_text / bleu_lines if bleu_text is not None else None,
        "paragraphs_in": len(refs),
        "paragraphs_out": len(doc_hyps),
        "bleu_lines_per_sentence": sacrebleu.corpus_bleu(
            outputs["lines"], [[s for r in refs for s in r]]
        ).score,
        "sentences_in_text_mode": len(outputs["text"].sentences),
    }


def long_line(documents, backend, src, ref, options) -> dict:
    warnings: list[str] = []
    whole = DocumentTranslator(backend, language=documents.language, warn=warnings.append)
    line = " ".join(src)
    out = whole.translate([line], options)[0]
    lines = " ".join(t.text for t in backend.translate(src, options))
    reference = " ".join(ref)
    return {
        "source_tokens": len(backend.tokenizer.encode(line)) + 1,
        "max_len": backend.config.max_len,
        "sentences_found": len(out.sentences),
        "words_out": len(out.text.split()),
        "words_reference": len(reference.split()),
        "bleu_whole_line": sacrebleu.corpus_bleu([out.text], [[reference]]).score,
        "bleu_one_per_line": sacrebleu.corpus_bleu([lines], [[reference]]).score,
        "warnings": warnings,
    }


class Tags(HTMLParser):
    """Start and end tags of a document, and the text inside each ``<b>``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts, self.ends, self.bold, self.depth = [], [], [], 0

    def handle_starttag(self, tag, attrs):
        self.starts.append((tag, tuple(attrs)))
        if tag == "b":
            self.depth += 1
            self.bold.append("")

    def handle_endtag(self, tag):
        self.ends.append(tag)
        if tag == "b":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth > 0:
            self.bold[-1] += data


def parse_tags(html: str) -> Tags:
    parser = Tags()
    parser.feed(html)
    parser.close()
    return parser


def html_scores(html_in: list[str], html_out: list, paragraphs, refs) -> dict:
    """Every tag kept, and where each ``<b>`` landed, against the ceiling."""
    kept = placed = tight = in_ref = in_hyp = tags = empty = empty_in_hyp = 0
    for source, result, sentences, references in zip(html_in, html_out, paragraphs, refs):
        before, after = parse_tags(source), parse_tags(result.text)
        kept += before.starts == after.starts and sorted(before.ends) == sorted(after.ends)
        wanted = [WORDS[w] for w in (tagged_word(s) for s in sentences) if w is not None]
        hypothesis = words_of(" ".join(t for _, t in result.sentences))
        for k, targets in enumerate(wanted):
            tags += 1
            inside = words_of(after.bold[k]) if k < len(after.bold) else []
            placed += any(t in inside for t in targets)
            tight += any(t in inside for t in targets) and len(inside) <= 2
            in_ref += any(t in words_of(" ".join(references)) for t in targets)
            in_hyp += any(t in hypothesis for t in targets)
            empty += k < len(after.bold) and not after.bold[k].strip()
            empty_in_hyp += (
                k < len(after.bold) and not after.bold[k].strip() and any(t in hypothesis for t in targets)
            )
    return {
        "documents": len(html_in),
        "documents_with_every_tag": kept,
        "tags": tags,
        "placed_on_a_translation": placed / tags,
        "placed_tightly": tight / tags,
        "ceiling_reference_has_word": in_ref / tags,
        "translation_has_word": in_hyp / tags,
        "placed_over_ceiling": (placed / tags) / (in_ref / tags),
        "empty": empty,
        "empty_translation_has_word": empty_in_hyp,
    }


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def by_layer(backend, documents, html, paragraphs, refs, options) -> dict:
    out = {}
    for layer in range(backend.config.n_decoder_layers):
        backend.align_layer = layer
        results = documents.translate(html, options, fmt="html")
        out[str(layer)] = html_scores(html, results, paragraphs, refs)
    backend.align_layer = None
    return out


def stream_memory(tokenizer, src: list[str], sizes: list[int]) -> dict:
    """Peak RSS of ``aiayn translate --format text`` on files of ``sizes`` sentences, a tiny model."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = tiny_run(Path(tmp), tokenizer)
        for n in sizes:
            text = Path(tmp) / f"{n}.txt"
            with text.open("w", encoding="utf-8") as handle:
                for k in range(n):
                    handle.write(src[k % len(src)] + ("\n\n" if k % 5 == 4 else " "))
            start = time.perf_counter()
            translate = ["translate", "--checkpoint", str(run), "--input", str(text), "--format", "text"]
            fast = ["--beam", "1", "--max-len-a", "0", "--max-len-b", "2", "--source-lang", "de"]
            timed = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "aiayn", *translate, *fast]
            done = subprocess.run(
                [*timed, "--output", str(Path(tmp) / "out.txt")], capture_output=True, text=True
            )
            lines_in = text.read_text(encoding="utf-8").count("\n")
            lines_out = (Path(tmp) / "out.txt").read_text(encoding="utf-8").count("\n")
            out[str(n)] = {
                "exit": done.returncode,
                "peak_rss_mib": int(done.stderr.strip().splitlines()[-1]) / 1024,
                "seconds": time.perf_counter() - start,
                "input_bytes": text.stat().st_size,
                "lines_in": lines_in,
                "lines_out": lines_out,
            }
    return out


def tiny_run(folder: Path, tokenizer) -> Path:
    """A random 1+1-layer model (d 32) on ``tokenizer``: translation takes little time."""
    config = TransformerConfig.from_dict(
        dict(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            d_model=32,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            d_ff=64,
            dropout=0.0,
            max_len=256,
        )
    )
    torch.manual_seed(0)
    model = build_model(config).eval()
    meta = {"kind": "translation", "model": config.to_dict()}
    return save_checkpoint(folder / "tiny", model, meta, tokenizer.to_bytes())


def report(results: dict) -> None:
    s, p, lo, h = results["speed"], results["paragraphs"], results["long_line"], results["html"]
    print(f"sentences/s: {json.dumps({k: round(v, 1) for k, v in s['sentences_per_s'].items()})}")
    print(f"text / lines {s['text_over_lines']:.3f}x, html / lines {s['html_over_lines']:.3f}x")
    print(
        f"paragraph BLEU: lines {p['bleu_lines_per_paragraph']:.2f}, text {p['bleu_text_per_paragraph']}, "
        f"ratio {p['ratio']}; paragraphs {p['paragraphs_in']} -> {p['paragraphs_out']}"
    )
    print(
        f"long line ({lo['source_tokens']} tokens, max_len {lo['max_len']}): BLEU whole "
        f"{lo['bleu_whole_line']:.2f} vs one per line {lo['bleu_one_per_line']:.2f}; words "
        f"{lo['words_out']} (reference {lo['words_reference']}); warnings {lo['warnings']}"
    )
    print(
        f"html: every tag kept in {h['documents_with_every_tag']}/{h['documents']}; {h['tags']} tags placed "
        f"{h['placed_on_a_translation']:.3f} (tightly {h['placed_tightly']:.3f}); ceiling "
        f"{h['ceiling_reference_has_word']:.3f}; translation has the word {h['translation_has_word']:.3f}; "
        f"placed / ceiling {h['placed_over_ceiling']:.3f}"
    )
    print(
        f"html: {h['empty']} of {h['tags']} tags come back empty, {h['empty_translation_has_word']} of them "
        "although the translation has their word"
    )
    for layer, scores in results.get("html_by_layer", {}).items():
        placed, tight = scores["placed_on_a_translation"], scores["placed_tightly"]
        print(f"  layer {layer}: placed {placed:.3f}, tightly {tight:.3f}")
    for n, m in results["memory"].items():
        print(
            f"stream {n} sentences: peak RSS {m['peak_rss_mib']:.0f} MiB, {m['seconds']:.1f} s, "
            f"exit {m['exit']}, lines {m['lines_in']} -> {m['lines_out']}"
        )


if __name__ == "__main__":
    main()
