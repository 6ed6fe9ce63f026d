"""Time-series forecasting with the paper's encoder-decoder (continuous inputs, linear embedding).

``data`` reads and validates CSV series, splits and scales them and cuts windows; ``model`` holds
:class:`Forecaster`; ``baselines`` the repeat-last, seasonal-naive and DLinear references;
``metrics`` the scores (:func:`evaluate`); ``train`` the task the training engine
(:mod:`aiayn.train.engine`) runs; ``cli`` the ``aiayn forecast`` commands. ``TrainConfig`` and
``fit`` are imported on first use, so that inference never imports the training package.
"""

from typing import Any

from aiayn.forecast.baselines import DLinear, RepeatLast, SeasonalNaive
from aiayn.forecast.data import ForecastData, Scaler, Series, Windows, prepare, read_series
from aiayn.forecast.metrics import evaluate, mae, mse
from aiayn.forecast.model import ForecastConfig, Forecaster, InstanceNorm

__all__ = [
    "DLinear",
    "RepeatLast",
    "SeasonalNaive",
    "ForecastData",
    "Scaler",
    "Series",
    "Windows",
    "prepare",
    "read_series",
    "mae",
    "mse",
    "ForecastConfig",
    "Forecaster",
    "InstanceNorm",
    "TrainConfig",
    "evaluate",
    "fit",
]


def __getattr__(name: str) -> Any:
    """``TrainConfig`` and ``fit`` from :mod:`aiayn.forecast.train` (which imports the training engine)."""
    if name in ("TrainConfig", "fit"):
        from aiayn.forecast import train

        return getattr(train, name)
    raise AttributeError(f"module 'aiayn.forecast' has no attribute {name!r}")
