"""Time-series forecasting with the paper's encoder-decoder (continuous inputs, linear embedding).

``data`` reads and validates CSV series, splits and scales them and cuts windows; ``model`` holds
:class:`Forecaster`; ``baselines`` the repeat-last, seasonal-naive and DLinear references;
``metrics`` the scores (:func:`evaluate`); ``run`` a config and what a training builds from it;
``train`` the task the training engine (:mod:`aiayn.train.engine`) runs; ``tune`` the settings
search; ``cli`` the ``aiayn forecast`` commands. The package itself holds what inference needs:
``aiayn.forecast.train`` (which imports the training engine) is imported by name.
"""

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
    "evaluate",
]
