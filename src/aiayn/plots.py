"""Pictures: attention heatmaps, the positional-encoding table, training curves (matplotlib, Agg),
and the ``aiayn plot attention | positional-encoding | curves`` commands that draw them.

Each function writes one PNG and returns its path. Bad input (no metrics log, an empty one, a
broken JSON line, maps whose shapes do not match the tokens) raises :class:`UserError`.
matplotlib is imported on the first drawing, so that registering the commands costs nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from torch import Tensor

from aiayn.decode.attention import sentence_attention
from aiayn.decode.search import DecodeOptions
from aiayn.device import resolve_device
from aiayn.errors import UserError
from aiayn.loading import load_translation_model
from aiayn.model.embedding import positional_encoding

#: How target rows are labelled: by the piece each position predicts, or the piece it reads.
TARGET_ROWS = ("predicts", "reads")
#: The attention kinds of ``Transformer.forward(..., return_attention=True)``: (title, query axis, key axis).
ATTENTION_KINDS = {
    "encoder_self": ("encoder self-attention", "source", "source"),
    "decoder_self": ("decoder self-attention", "target", "target"),
    "cross": ("cross-attention (decoder -> encoder)", "target", "source"),
}


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib  # here, not at the top: it is slow to import and only drawing needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- attention --------------------------------------------------------------------------------------


def plot_attention(
    maps: dict[str, list[Tensor]],
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | Path,
    *,
    predicted: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    layer: int | None = None,
) -> Path:
    """Heatmaps of every layer and head: one row per (kind, layer), one column per head.

    ``maps``: as returned by ``Transformer.forward(..., return_attention=True)``, one tensor per
    layer, ``(H, T_q, T_k)`` or ``(1, H, T_q, T_k)``. ``src_tokens`` label the source positions
    (encoder input, EOS included), ``tgt_tokens`` the target positions (decoder input, BOS first).
    Rows are queries, columns are keys. With ``predicted`` (the piece each target position
    predicts, EOS last) the target rows are labelled by it, as an alignment is read; the target
    columns of decoder self-attention keep the pieces the positions read. ``kinds`` (default: all)
    and ``layer`` (1-based; default: every layer) draw a part.
    """
    for kind in kinds or ():
        if kind not in ATTENTION_KINDS:
            raise UserError(f"unknown attention kind {kind!r}; valid: {', '.join(ATTENTION_KINDS)}")
    drawn = [kind for kind in ATTENTION_KINDS if kinds is None or kind in kinds]
    if layer is not None and not all(1 <= layer <= len(maps.get(kind, [])) for kind in drawn):
        counts = ", ".join(f"{kind} {len(maps.get(kind, []))}" for kind in drawn)
        raise UserError(f"layer {layer}: the layers are numbered from 1 ({counts})")
    rows = [
        (kind, i, _heads(m))
        for kind in drawn
        for i, m in enumerate(maps.get(kind, []))
        if layer is None or i == layer - 1
    ]
    if not rows:
        raise UserError("no attention maps to plot")
    if predicted is not None and len(predicted) != len(tgt_tokens):
        raise UserError(f"{len(predicted)} predicted pieces for {len(tgt_tokens)} target positions")
    n_heads = rows[0][2].shape[0]
    for kind, layer, weights in rows:
        _check_shape(kind, layer, weights, src_tokens, tgt_tokens)
    plt = _pyplot()
    cell = min(max(1.8, 0.22 * max(len(src_tokens), len(tgt_tokens)) + 1.0), 6.0)
    fig, axes = plt.subplots(
        len(rows),
        n_heads,
        figsize=(cell * n_heads + 1, cell * len(rows)),
        squeeze=False,
        layout="constrained",
    )
    for r, (kind, layer, weights) in enumerate(rows):
        queries, keys = _labels(kind, src_tokens, tgt_tokens)
        if predicted is not None and ATTENTION_KINDS[kind][1] == "target":
            queries = predicted
        for h in range(n_heads):
            title = f"{ATTENTION_KINDS[kind][0]}\nlayer {layer + 1}, head {h + 1}"
            image = _attention_panel(axes[r][h], weights[h], title=title, queries=queries, keys=keys)
    fig.colorbar(image, ax=axes, shrink=min(1.0, 4.0 / len(rows)), label="attention weight")
    reading = "the piece each predicts" if predicted is not None else "the piece each reads"
    fig.suptitle(f"Attention weights (rows: queries, columns: keys; target rows: {reading})", fontsize=14)
    return _save(fig, path)


def _heads(weights: Tensor):
    """``(1, H, Tq, Tk)`` or ``(H, Tq, Tk)`` -> numpy ``(H, Tq, Tk)``."""
    w = weights.detach().float().cpu()
    return (w[0] if w.dim() == 4 else w).numpy()


def _labels(
    kind: str, src_tokens: Sequence[str], tgt_tokens: Sequence[str]
) -> tuple[Sequence[str], Sequence[str]]:
    _, query, key = ATTENTION_KINDS[kind]
    pick = {"source": src_tokens, "target": tgt_tokens}
    return pick[query], pick[key]


def _check_shape(kind, layer, weights, src_tokens, tgt_tokens) -> None:
    queries, keys = _labels(kind, src_tokens, tgt_tokens)
    if weights.shape[1:] != (len(queries), len(keys)):
        raise UserError(
            f"{kind} layer {layer + 1}: attention is {tuple(weights.shape[1:])} but there are "
            f"{len(queries)} x {len(keys)} tokens"
        )


def _attention_panel(ax, weights, *, title: str, queries: Sequence[str], keys: Sequence[str]):
    """One head's ``(T_q, T_k)`` weights, queries down, keys across."""
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
    ax.set_yticks(range(len(queries)), queries, fontsize=7)
    ax.set_title(title, fontsize=8)
    return image


# --- positional encoding --------------------------------------------------------------------------


def plot_positional_encoding(
    d_model: int, max_len: int, path: str | Path, dims: Sequence[int] | None = None
) -> Path:
    """The sinusoidal table as a heatmap (position x dimension) and a few of its sinusoids.

    ``dims`` default: four sine dimensions at 1/64, 1/16, 1/8 and 1/4 of ``d_model`` (wavelengths
    from a few positions to tens of them).
    """
    if d_model < 2 or max_len < 1:
        raise UserError(f"need d_model >= 2 and max_len >= 1, got d_model={d_model}, max_len={max_len}")
    table = positional_encoding(max_len, d_model).numpy()  # (max_len, d_model)
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 9), height_ratios=(3, 2), layout="constrained")
    image = top.pcolormesh(table, cmap="RdBu", vmin=-1, vmax=1)
    top.set(
        xlabel="dimension i", ylabel="position", title=f"Sinusoidal positional encoding (d_model={d_model})"
    )
    top.invert_yaxis()
    fig.colorbar(image, ax=top)
    if dims is None:
        dims = sorted({2 * int(d_model * f / 2) for f in (1 / 64, 1 / 16, 1 / 8, 1 / 4)})
    for d in [d for d in dims if d < d_model]:
        bottom.plot(table[:, d], label=f"dim {d} ({'sin' if d % 2 == 0 else 'cos'})")
    bottom.set(xlabel="position", ylabel="value", title="a few dimensions along the positions")
    bottom.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


# --- training curves ----------------------------------------------------------------------------


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``RUN_DIR/metrics.jsonl`` (one JSON object per line, with "step" and "split")."""
    log = Path(run_dir) / "metrics.jsonl"
    if not log.is_file():
        raise UserError(f"no metrics log at {log}")
    records = []
    for number, line in enumerate(log.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            records.append(_record(line, log, number))
    if not records:
        raise UserError(f"{log} is empty: nothing to plot")
    return records


def _record(line: str, log: Path, number: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{log}: line {number}: not JSON ({err.msg})") from None
    if not isinstance(record, dict) or "step" not in record or "split" not in record:
        raise UserError(f'{log}: line {number}: expected an object with "step" and "split"')
    return record


def _series(records: list[dict], split: str, key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r["split"] == split and r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_curves(run_dir: str | Path, path: str | Path) -> Path:
    """Loss (train and valid), learning rate and, when logged, valid BLEU, each against the step."""
    records = read_metrics(run_dir)
    panels = [("loss", ["train", "valid"]), ("lr", ["train"]), ("bleu", ["valid"])]
    panels = [(key, splits) for key, splits in panels if any(_series(records, s, key)[0] for s in splits)]
    if not panels:
        raise UserError(f"{Path(run_dir) / 'metrics.jsonl'} has no loss, lr or bleu values")
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(8, 3.2 * len(panels)), sharex=True, squeeze=False, layout="constrained"
    )
    for ax, (key, splits) in zip(axes[:, 0], panels):
        for split in splits:
            steps, values = _series(records, split, key)
            if steps:
                ax.plot(steps, values, marker="o" if split == "valid" else None, markersize=3, label=split)
        ax.set_ylabel({"lr": "learning rate", "bleu": "BLEU"}.get(key, key))
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(f"Training curves: {Path(run_dir).name}")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, format="png")
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror}") from None
    finally:
        _pyplot().close(fig)
    return path


# --- the commands -----------------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = subparsers.add_parser("plot", help="draw attention maps, the positional encoding or training curves")
    kinds = p.add_subparsers(dest="plot", required=True, metavar="WHAT")
    att = kinds.add_parser("attention", help="attention heatmaps of one sentence, per layer and head")
    att.add_argument("--checkpoint", required=True)
    att.add_argument("--src", required=True, help="source sentence")
    att.add_argument("--tgt", help="target sentence (default: the model's greedy translation)")
    att.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    att.add_argument(
        "--target-rows",
        choices=TARGET_ROWS,
        default="predicts",
        help="label each target row by the piece it predicts (default; as an alignment reads) or "
        "by the piece the decoder reads there (<s> first, one place before)",
    )
    att.add_argument(
        "--kind", nargs="+", choices=list(ATTENTION_KINDS), help="draw only these kinds (default: all three)"
    )
    att.add_argument("--layer", type=int, help="draw only this layer of each kind, from 1 (default: all)")
    att.add_argument("--out", required=True, help="PNG file to write")
    att.set_defaults(func=run_plot_attention)
    pe = kinds.add_parser("positional-encoding", help="the sinusoidal positional-encoding table")
    pe.add_argument("--d-model", type=int, default=512)
    pe.add_argument("--max-len", type=int, default=100)
    pe.add_argument("--out", required=True)
    pe.set_defaults(func=lambda a: _plot_done(plot_positional_encoding(a.d_model, a.max_len, a.out)))
    cur = kinds.add_parser("curves", help="loss, learning rate and BLEU from RUN_DIR/metrics.jsonl")
    cur.add_argument("run_dir")
    cur.add_argument("--out", required=True)
    cur.set_defaults(func=lambda a: _plot_done(plot_curves(a.run_dir, a.out)))


def _plot_done(path: Path) -> int:
    print(f"wrote {path}", file=sys.stderr)
    return 0


def run_plot_attention(args) -> int:
    device = resolve_device(args.device, "--device")
    model, tokenizer, _ = load_translation_model(args.checkpoint, device=device)
    part = {"target_rows": args.target_rows, "kinds": args.kind, "layer": args.layer}
    return _plot_done(draw_attention(model, tokenizer, args.src, args.tgt, args.out, device=device, **part))


def draw_attention(
    model,
    tokenizer,
    src_text: str,
    tgt_text: str | None,
    out,
    *,
    device="cpu",
    target_rows="predicts",
    kinds: Sequence[str] | None = None,
    layer: int | None = None,
) -> Path:
    """Heatmaps of every layer's and head's attention for one sentence pair (greedy target if None),
    the target rows labelled by the piece each ``predicts`` or ``reads`` (``kinds``, ``layer``: a part,
    as :func:`plot_attention`)."""
    greedy = DecodeOptions(beam=1, alpha=0.0)
    found = sentence_attention(model, tokenizer, src_text, greedy, device=device, target=tgt_text)
    predicted = found.predicted_pieces if target_rows == "predicts" else None
    pieces = found.source_pieces, found.target_pieces
    return plot_attention(found.maps, *pieces, out, predicted=predicted, kinds=kinds, layer=layer)
