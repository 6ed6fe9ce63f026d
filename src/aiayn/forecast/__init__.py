"""Time-series forecasting with the paper's encoder-decoder (continuous inputs, linear embedding).

``data`` reads and validates CSV series, splits and scales them and cuts windows; ``model`` holds
:class:`Forecaster`; ``baselines`` the repeat-last, seasonal-naive and DLinear references;
``train`` the training loop with checkpoints; ``cli`` the ``aiayn forecast`` commands.
"""

from aiayn.forecast.baselines import DLinear, RepeatLast, SeasonalNaive
from aiayn.forecast.data import ForecastData, Scaler, Series, Windows, prepare, read_series
from aiayn.forecast.metrics import mae, mse
from aiayn.forecast.model import ForecastConfig, Forecaster, InstanceNorm
from aiayn.forecast.train import TrainConfig, evaluate, fit

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
