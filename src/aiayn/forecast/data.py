"""Time-series data: CSV reading with validation, splits, the scaler, and sliding windows.

A series file is a CSV with a header, a timestamp column (``date``, else the first column) and
numeric columns. Bad input raises :class:`UserError` naming the column and the 1-based line number
in the file (the header is line 1, the first data row line 2). Files as they are published are read
as the published benchmarks read them, by row: a file that is not UTF-8 is read as Latin-1 (units
such as "W/m²"), and repeated timestamps and gaps in time are one warning each, naming the first and
counting them; a timestamp going backwards is an error.

Splits follow the Informer protocol: for files named ``ETTh*`` rows [0, 8640) train,
[8640, 11520) validation, [11520, 14400) test; ``ETTm*`` the same ×4; any other file 70/10/20 %.
Validation and test windows start ``seq_len`` rows earlier so their first target is the split's
first row. Features are standardised with the training rows' mean and std.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aiayn.config import Checked, setting
from aiayn.errors import UserError, warning

FEATURE_MODES = ("M", "S", "MS")  # multivariate in/out, univariate target, multivariate in -> target
SPLITS = ("train", "val", "test")
ETT_HOURLY_BORDERS = (8640, 11520, 14400)


@dataclass
class SeriesConfig(Checked):
    """The ``data`` section of a forecasting config: the file, its columns and the windows' shape."""

    path: str | None = None  #: CSV file (in a config file: relative to it); None: given by --data
    target: str = "OT"  #: the column to forecast (features S and MS)
    features: str = setting("M", choices=FEATURE_MODES)
    input_len: int = setting(96, ge=1)  #: steps the model reads
    label_len: int = setting(48, ge=0)  #: known steps the decoder starts from
    horizon: int = setting(96, ge=1)  #: steps forecast


@dataclass
class Series:
    """A validated series: ``timestamps`` (N,) datetime64[s], ``values`` (N, C) float64, ``columns``."""

    path: Path
    timestamps: np.ndarray
    values: np.ndarray
    columns: list[str]

    @property
    def freq(self) -> np.timedelta64:
        """The spacing of the timestamps: the most common step between consecutive rows."""
        steps, counts = np.unique(np.diff(self.timestamps), return_counts=True)
        positive = steps > np.timedelta64(0, "s")
        return steps[positive][np.argmax(counts[positive])]

    @property
    def steps_per_day(self) -> int:
        """Rows in a day at :attr:`freq`, rounded; 1 for daily or coarser data."""
        return max(1, round(np.timedelta64(1, "D") / self.freq))

    def select(self, columns: list[str]) -> "Series":
        """The same series with only ``columns``, in that order (a missing one raises :class:`UserError`)."""
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise UserError(
                f"{self.path}: column(s) {', '.join(repr(c) for c in missing)} not found "
                f"(the checkpoint was trained on them); columns: {', '.join(self.columns)}"
            )
        index = [self.columns.index(c) for c in columns]
        return Series(self.path, self.timestamps, self.values[:, index], list(columns))


def _line(row: int) -> int:
    """0-based data row -> 1-based line number in the file (header is line 1)."""
    return row + 2


def read_series(path: str | Path) -> Series:
    """Read and validate a CSV series (see the module docstring)."""
    path = Path(path)
    header, rows = _read_rows(path)
    time_col = header.index("date") if "date" in header else 0
    stamps = _parse_timestamps(path, header[time_col], [r[time_col] for r in rows])
    value_cols = [i for i in range(len(header)) if i != time_col]
    values = _parse_values(path, header, rows, value_cols)
    return Series(path, stamps, values, [header[i] for i in value_cols])


def _read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    if not path.is_file():
        raise UserError(f"data file not found: {path}")
    rows = list(csv.reader(io.StringIO(_decode(path), newline="")))
    while rows and len(rows[-1]) <= 1 and not "".join(rows[-1]).strip():  # trailing blank lines
        rows.pop()
    if len(rows) < 3:
        raise UserError(
            f"{path}: needs a header and at least 2 data rows, found {max(len(rows) - 1, 0)} rows"
        )
    header = [h.strip() for h in rows[0]]
    for i, row in enumerate(rows[1:]):
        if len(row) != len(header):
            raise UserError(f"{path}:{_line(i)}: {len(row)} fields, the header has {len(header)}")
    return header, rows[1:]


def _decode(path: Path) -> str:
    """The file's text: UTF-8 (a byte-order mark dropped), else Latin-1 with a warning naming the line."""
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        warning(f"{path}:{line}: not UTF-8 (byte {data[err.start]:#04x}); the file is read as Latin-1")
        return data.decode("latin-1")


def _parse_timestamps(path: Path, name: str, cells: list[str]) -> np.ndarray:
    stamps = np.empty(len(cells), dtype="datetime64[s]")
    for i, cell in enumerate(cells):
        if not cell.strip():
            raise UserError(f"{path}:{_line(i)}: missing timestamp in column '{name}'")
        try:
            stamps[i] = np.datetime64(cell.strip(), "s")
        except ValueError:
            raise UserError(f"{path}:{_line(i)}: column '{name}': cannot read timestamp {cell!r}") from None
    _check_spacing(path, name, stamps)
    return stamps


def _check_spacing(path: Path, name: str, stamps: np.ndarray) -> None:
    """Timestamps must not go backwards; repeated ones and gaps are a warning each (rows are used as
    they are, in file order, as the published benchmarks do)."""
    diffs = np.diff(stamps)
    back = np.flatnonzero(diffs < np.timedelta64(0, "s"))
    if back.size:
        i = int(back[0]) + 1
        raise UserError(
            f"{path}:{_line(i)}: column '{name}': timestamps not sorted ({stamps[i]} after {stamps[i - 1]})"
        )
    repeated = np.flatnonzero(diffs == np.timedelta64(0, "s"))
    if repeated.size:
        i = int(repeated[0]) + 1
        warning(
            f"{path}:{_line(i)}: column '{name}': timestamp {_when(stamps[i])} repeated "
            f"({repeated.size} repeated in all); rows are used in file order"
        )
    steps = diffs[diffs > np.timedelta64(0, "s")]
    if not steps.size:
        raise UserError(f"{path}: column '{name}': every timestamp is the same ({stamps[0]})")
    values, counts = np.unique(steps, return_counts=True)
    step = values[np.argmax(counts)]
    gaps = np.flatnonzero(diffs > step)
    if gaps.size:
        i = int(gaps[0]) + 1
        warning(
            f"{path}:{_line(i)}: column '{name}': gap in time before {_when(stamps[i])} (expected "
            f"{_when(stamps[i - 1] + step)}, step {step.item()}; {gaps.size} gap(s) in all); rows are "
            "used as they are"
        )


def _when(stamp: np.datetime64) -> str:
    return str(stamp).replace("T", " ")


def _parse_values(path: Path, header: list[str], rows: list[list[str]], cols: list[int]) -> np.ndarray:
    try:
        values = np.array([[row[c] for c in cols] for row in rows], dtype=np.float64)  # (N, C)
    except ValueError:
        values = None
    if values is None or not np.isfinite(values).all():
        _raise_bad_cell(path, header, rows, cols)
    return values


def _raise_bad_cell(path: Path, header: list[str], rows: list[list[str]], cols: list[int]) -> None:
    for i, row in enumerate(rows):
        for c in cols:
            try:
                ok = np.isfinite(float(row[c]))
            except ValueError:
                ok = False
            if not ok:
                raise UserError(f"{path}:{_line(i)}: column '{header[c]}': not a number: {row[c]!r}")


# --- features, splits, scaling -------------------------------------------------------------------


def select_features(series: Series, features: str, target: str) -> tuple[np.ndarray, list[str], list[int]]:
    """Input values ``(N, n)``, their column names, and the indices (into those) of the outputs."""
    if features not in FEATURE_MODES:
        raise UserError(f"features: unknown value {features!r}; valid: {', '.join(FEATURE_MODES)}")
    if target not in series.columns:
        raise UserError(
            f"{series.path}: target column '{target}' not found; columns: {', '.join(series.columns)}"
        )
    t = series.columns.index(target)
    if features == "S":
        return series.values[:, [t]], [target], [0]
    outputs = list(range(len(series.columns))) if features == "M" else [t]
    return series.values, list(series.columns), outputs


def split_borders(path: Path, n_rows: int) -> tuple[int, int, int]:
    """End rows (exclusive) of train, val and test for this file (see the module docstring)."""
    name = Path(path).name
    if name.startswith("ETTh") and n_rows >= ETT_HOURLY_BORDERS[2]:
        return ETT_HOURLY_BORDERS
    if name.startswith("ETTm") and n_rows >= 4 * ETT_HOURLY_BORDERS[2]:
        return tuple(4 * b for b in ETT_HOURLY_BORDERS)  # type: ignore[return-value]
    train, test = int(n_rows * 0.7), int(n_rows * 0.2)
    return train, n_rows - test, n_rows


def split_range(borders: tuple[int, int, int], split: str, seq_len: int) -> tuple[int, int]:
    """Rows ``[start, end)`` a split's windows are cut from (val/test start ``seq_len`` earlier)."""
    if split not in SPLITS:
        raise UserError(f"split: unknown value {split!r}; valid: {', '.join(SPLITS)}")
    index = SPLITS.index(split)
    start = 0 if index == 0 else max(borders[index - 1] - seq_len, 0)
    return start, borders[index]


@dataclass
class Scaler:
    """Per-column standardisation with the training rows' statistics."""

    mean: np.ndarray  # (n,)
    std: np.ndarray  # (n,)

    @classmethod
    def fit(cls, values: np.ndarray) -> "Scaler":
        std = values.std(axis=0)
        return cls(values.mean(axis=0), np.where(std > 0, std, 1.0))

    def transform(self, values: np.ndarray) -> np.ndarray:
        return (values - self.mean) / self.std

    def inverse(self, values: np.ndarray, columns: list[int] | None = None) -> np.ndarray:
        """Undo :meth:`transform` on ``values`` (..., len(columns)) holding those columns."""
        cols = slice(None) if columns is None else columns
        return values * self.std[cols] + self.mean[cols]

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, list[float]]) -> "Scaler":
        return cls(np.asarray(d["mean"], dtype=np.float64), np.asarray(d["std"], dtype=np.float64))


# --- windows -------------------------------------------------------------------------------------


def n_windows(n_rows: int, seq_len: int, horizon: int) -> int:
    """How many (input, target) windows ``n_rows`` consecutive rows give."""
    return max(n_rows - seq_len - horizon + 1, 0)


class Windows:
    """All sliding windows of one split: ``inputs(idx)`` ``(B, L, n)``, ``targets(idx)`` ``(B, H, n)``.

    Window ``i`` reads rows ``start+i .. start+i+L-1`` as input and the next ``H`` rows as target.
    """

    def __init__(self, scaled: np.ndarray, start: int, end: int, seq_len: int, horizon: int) -> None:
        self.data = torch.from_numpy(scaled[start:end]).float()  # (rows, n)
        self.start, self.seq_len, self.horizon = start, seq_len, horizon
        self.count = n_windows(end - start, seq_len, horizon)

    def __len__(self) -> int:
        return self.count

    def to(self, device: torch.device | str) -> "Windows":
        """The same windows with their rows on ``device`` (batches are then cut there)."""
        moved = object.__new__(Windows)
        moved.__dict__.update(self.__dict__, data=self.data.to(device))
        return moved

    def _gather(self, idx: Tensor, offset: int, length: int) -> Tensor:
        idx = idx.to(self.data.device)
        rows = idx[:, None] + offset + torch.arange(length, device=idx.device)  # (B, length)
        return self.data[rows]  # (B, length, n)

    def inputs(self, idx: Tensor) -> Tensor:
        return self._gather(idx, 0, self.seq_len)

    def targets(self, idx: Tensor) -> Tensor:
        return self._gather(idx, self.seq_len, self.horizon)


@dataclass
class ForecastData:
    """A series prepared for one task: scaled values, output columns, scaler and split borders."""

    series: Series
    columns: list[str]  # input columns, in model order
    outputs: list[int]  # indices into ``columns`` that are forecast
    scaler: Scaler
    scaled: np.ndarray  # (N_used, n)
    borders: tuple[int, int, int]

    def windows(self, split: str, seq_len: int, horizon: int) -> Windows:
        start, end = split_range(self.borders, split, seq_len)
        return Windows(self.scaled, start, end, seq_len, horizon)


def prepare(
    path: str | Path,
    features: str,
    target: str,
    seq_len: int,
    horizon: int,
    scaler: Scaler | None = None,
    value_columns: list[str] | None = None,
) -> ForecastData:
    """Read, select features, split, and scale (fitting the scaler on train unless given).

    ``value_columns`` (a checkpoint's value columns) are picked by name: their order in the file does not
    matter, other columns are ignored, a missing one raises :class:`UserError`.
    """
    series = read_series(path)
    if value_columns is not None:
        series = series.select(value_columns)
    values, columns, outputs = select_features(series, features, target)
    borders = split_borders(series.path, len(values))
    for split in SPLITS:
        start, end = split_range(borders, split, seq_len)
        if n_windows(end - start, seq_len, horizon) < 1:
            raise UserError(
                f"{series.path}: the {split} split has {end - start} rows, fewer than "
                f"input length + horizon = {seq_len} + {horizon}"
            )
    scaler = scaler or Scaler.fit(values[: borders[0]])
    scaled = scaler.transform(values[: borders[2]])
    return ForecastData(series, columns, outputs, scaler=scaler, scaled=scaled, borders=borders)
