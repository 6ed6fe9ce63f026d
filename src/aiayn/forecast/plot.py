"""One PNG: the input history, the true future and the forecast of one test window, a panel per column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from aiayn.forecast.data import ForecastData  # noqa: E402


@torch.no_grad()
def plot_window(
    model: torch.nn.Module,
    data: ForecastData,
    config: dict[str, Any],
    columns: list[str],
    *,
    out: str | Path,
    window: int = -1,
) -> None:
    """Draw ``columns`` (original units) for test window ``window`` (negative: from the last)."""
    d = config["data"]
    windows = data.windows("test", d["input_len"], d["horizon"])
    index = window % len(windows)
    idx = torch.tensor([index])
    x = windows.inputs(idx)
    pred = model(x)[0].double().numpy()  # (H, n_out)
    row0 = windows.start + index
    stamps = data.series.timestamps[row0 : row0 + d["input_len"] + d["horizon"]]
    past, future = stamps[: d["input_len"]], stamps[d["input_len"] :]
    fig, axes = plt.subplots(len(columns), 1, figsize=(10, 2.6 * len(columns) + 0.8), squeeze=False)
    for ax, column in zip(axes[:, 0], columns):
        c = data.columns.index(column)
        mean, std = data.scaler.mean[c], data.scaler.std[c]
        ax.plot(past, x[0, :, c].double().numpy() * std + mean, color="0.4", label="input")
        ax.plot(
            future,
            windows.targets(idx)[0, :, c].double().numpy() * std + mean,
            color="tab:blue",
            label="truth",
        )
        ax.plot(future, pred[:, data.outputs.index(c)] * std + mean, color="tab:red", label="forecast")
        ax.set_ylabel(column)
    axes[0, 0].set_title(
        f"{Path(data.series.path).name}: horizon {d['horizon']}, test window {index} of {len(windows)} "
        f"(forecast from {str(future[0]).replace('T', ' ')})"
    )
    axes[0, 0].legend(loc="upper left")
    fig.autofmt_xdate()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
