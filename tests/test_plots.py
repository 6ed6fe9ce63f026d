"""Pictures: valid PNGs of non-trivial size; bad input is a UserError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn import TransformerConfig, build_model
from aiayn.errors import UserError
from aiayn.plots import plot_attention, plot_curves, plot_positional_encoding, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, min_bytes: int = 10_000) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > min_bytes


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_attention_plot_of_a_real_forward_pass(tmp_path: Path) -> None:
    config = TransformerConfig.from_dict(
        dict(
            src_vocab_size=20,
            tgt_vocab_size=20,
            d_model=16,
            n_heads=2,
            n_encoder_layers=2,
            n_decoder_layers=1,
            d_ff=32,
            dropout=0.0,
        )
    )
    model = build_model(config).eval()
    src, tgt = torch.tensor([[5, 6, 7, 8, 3]]), torch.tensor([[2, 9, 10, 11]])
    with torch.no_grad():
        _, maps = model(src, tgt, return_attention=True)
    out = plot_attention(
        maps, ["▁Ein", "▁Hund", "▁läuft", ".", "</s>"], ["<s>", "▁A", "▁dog", "▁runs"], tmp_path / "att.png"
    )
    assert_png(out)
    width, height = png_size(out)
    assert height > width  # 2 + 1 + 1 = 4 rows of panels, 2 head columns


def test_attention_plot_rejects_mismatched_tokens(tmp_path: Path) -> None:
    maps = {"encoder_self": [torch.rand(1, 2, 3, 3)], "decoder_self": [], "cross": []}
    with pytest.raises(UserError, match="encoder_self layer 1"):
        plot_attention(maps, ["a", "b"], ["c"], tmp_path / "x.png")
    with pytest.raises(UserError, match="no attention maps"):
        plot_attention({}, ["a"], ["b"], tmp_path / "x.png")


def test_positional_encoding_plot(tmp_path: Path) -> None:
    assert_png(plot_positional_encoding(64, 50, tmp_path / "pe.png"))
    with pytest.raises(UserError, match="d_model"):
        plot_positional_encoding(0, 10, tmp_path / "bad.png")


def write_log(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_curves_plot(tmp_path: Path) -> None:
    records = [
        {"step": s, "split": "train", "loss": 5.0 / s, "lr": 1e-4 * s, "tokens_per_s": 1000.0}
        for s in range(1, 30)
    ]
    records += [
        {"step": s, "split": "valid", "loss": 6.0 / s, "ppl": 2.0, "bleu": 3.0 * s**0.5} for s in (10, 20, 29)
    ]
    assert_png(plot_curves(write_log(tmp_path / "run", records), tmp_path / "curves.png"))
    # loss only (no lr, no bleu) still plots
    assert_png(plot_curves(write_log(tmp_path / "run2", records[:3]), tmp_path / "c2.png"), 5_000)


def test_curves_bad_input_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no metrics log"):
        plot_curves(tmp_path / "missing", tmp_path / "c.png")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("\n")
    with pytest.raises(UserError, match="empty"):
        plot_curves(tmp_path / "empty", tmp_path / "c.png")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.jsonl").write_text(
        '{"step": 1, "split": "train", "loss": 2}\n{"step": 2,\n'
    )
    with pytest.raises(UserError, match="line 2: not JSON"):
        read_metrics(tmp_path / "broken")
    write_log(tmp_path / "nosplit", [{"step": 1, "loss": 1.0}])
    with pytest.raises(UserError, match="line 1"):
        read_metrics(tmp_path / "nosplit")
    write_log(tmp_path / "nothing", [{"step": 1, "split": "train", "tokens_per_s": 5.0}])
    with pytest.raises(UserError, match="no loss, lr or bleu"):
        plot_curves(tmp_path / "nothing", tmp_path / "c.png")


@pytest.mark.xdist_group("served")  # tiny_translation_run: tests/conftest.py, shared_server
def test_aiayn_plot_attention_labels_target_rows_by_the_piece_they_predict(
    tiny_translation_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a target row is labelled by the piece its position predicts (the translation's
    pieces, </s> last), as an alignment is read; ``--target-rows reads`` labels it by the piece the
    decoder reads there (<s> first). Decoder self-attention's columns are the pieces read."""
    from aiayn import plots
    from aiayn.cli import main
    from aiayn.decode.attention import sentence_attention
    from aiayn.decode.search import DecodeOptions
    from aiayn.loading import load

    drawn: dict[str, tuple[list[str], list[str]]] = {}
    titles: list[str] = []
    panel = plots._attention_panel

    def recording(ax, weights, *, title, queries, keys):
        drawn[title.split("\n")[0]] = (list(queries), list(keys))
        titles.append(title.replace("\n", ", "))
        return panel(ax, weights, title=title, queries=queries, keys=keys)

    monkeypatch.setattr(plots, "_attention_panel", recording)
    model, tokenizer, _ = load(tiny_translation_run)
    found = sentence_attention(model, tokenizer, "907042", DecodeOptions(beam=1, alpha=0.0))
    assert found.predicted_pieces == [*found.target_pieces[1:], "</s>"]
    command = ["plot", "attention", "--checkpoint", str(tiny_translation_run), "--src", "907042"]
    cross, self_ = "cross-attention (decoder -> encoder)", "decoder self-attention"
    assert main([*command, "--out", str(tmp_path / "a.png")]) == 0
    assert drawn[cross] == (found.predicted_pieces, found.source_pieces)
    assert drawn[self_] == (found.predicted_pieces, found.target_pieces)
    assert main([*command, "--target-rows", "reads", "--out", str(tmp_path / "b.png")]) == 0
    assert drawn[cross] == (found.target_pieces, found.source_pieces)
    assert drawn[self_] == (found.target_pieces, found.target_pieces)
    assert_png(tmp_path / "a.png")
    titles.clear()  # a part: --kind and --layer (the picture of docs/paper.md)
    assert main([*command, "--kind", "cross", "--layer", "2", "--out", str(tmp_path / "c.png")]) == 0
    assert titles == [f"{cross}, layer 2, head {h}" for h in (1, 2)]
    assert main([*command, "--kind", "cross", "--layer", "3", "--out", str(tmp_path / "d.png")]) == 2
    assert not (tmp_path / "d.png").exists()
