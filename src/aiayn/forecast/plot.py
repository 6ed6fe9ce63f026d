"""One PNG: the input history, the true future and the forecast of the last test window."""

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
    model: torch.nn.Module, data: ForecastData, config: dict[str, Any], column: str, out: str | Path
) -> None:
    """Draw ``column`` (original units) for the last window of the test split."""
    d = config["data"]
    windows = data.windows("test", d["input_len"], d["horizon"])
    idx = torch.tensor([len(windows) - 1])
    c = data.columns.index(column)
    k = data.outputs.index(c)
    history = windows.inputs(idx)[0, :, c].double().numpy()  # (L,)
    truth = windows.targets(idx)[0, :, c].double().numpy()  # (H,)
    pred = model(windows.inputs(idx))[0, :, k].double().numpy()  # (H,)
    mean, std = data.scaler.mean[c], data.scaler.std[c]
    row0 = windows.start + int(idx[0])
    stamps = data.series.timestamps[row0 : row0 + d["input_len"] + d["horizon"]]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(stamps[: d["input_len"]], history * std + mean, color="0.4", label="history")
    ax.plot(stamps[d["input_len"] :], truth * std + mean, color="tab:blue", label="truth")
    ax.plot(stamps[d["input_len"] :], pred * std + mean, color="tab:red", label="forecast")
    ax.set_title(f"{Path(data.series.path).name}: {column}, horizon {d['horizon']} (last test window)")
    ax.legend()
    fig.autofmt_xdate()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
