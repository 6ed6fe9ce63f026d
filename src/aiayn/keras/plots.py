"""The positional-encoding plot of the TensorFlow/Keras write-up, from this port's table."""

from __future__ import annotations

from pathlib import Path

from keras import ops

from aiayn.errors import UserError
from aiayn.keras.embedding import positional_encoding


def plot_positional_encoding(d_model: int, max_len: int, path: str | Path) -> Path:
    """The sinusoidal table (:func:`aiayn.keras.positional_encoding`) as a heatmap, position by
    dimension, written as a PNG to ``path`` (what ``aiayn plot positional-encoding`` draws, with its
    curves of a few dimensions)."""
    if d_model < 2 or max_len < 1:
        raise UserError(f"need d_model >= 2 and max_len >= 1, got d_model={d_model}, max_len={max_len}")
    import matplotlib  # here, not at the top: slow to import, and only drawing needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = ops.convert_to_numpy(positional_encoding(max_len, d_model))  # (max_len, d_model)
    fig, ax = plt.subplots(figsize=(10, 6), layout="constrained")
    image = ax.pcolormesh(table, cmap="RdBu", vmin=-1, vmax=1)
    ax.set(
        xlabel="dimension i", ylabel="position", title=f"Sinusoidal positional encoding (d_model={d_model})"
    )
    ax.invert_yaxis()
    fig.colorbar(image, ax=ax)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100, format="png")
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror}") from None
    finally:
        plt.close(fig)
    return path
