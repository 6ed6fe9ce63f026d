"""Forecasting mode: data, model, baselines, training. A synthetic ETT-like series (real ETTh1 for
its own split figures), tiny models, seconds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.forecast.baselines import DLinear, RepeatLast, SeasonalNaive
from aiayn.forecast.data import Scaler, n_windows, prepare, read_series, split_borders, split_range
from aiayn.forecast.model import ForecastConfig, Forecaster, InstanceNorm
from aiayn.forecast.train import FitState, ForecastTask, ForecastTrainConfig, batch_error, evaluate
from aiayn.train import engine
from aiayn.train.engine import WeightAverage
from conftest import write_ett_like_csv


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> Path:
    """6,000 hourly rows shaped like ETT-small, made here (split 70/10/20 %); ``etth1`` is the real file."""
    return write_ett_like_csv(tmp_path_factory.mktemp("series") / "series.csv", rows=6000)


def tiny(**overrides) -> ForecastConfig:
    values = dict(
        n_features=3,
        outputs=[0, 1, 2],
        seq_len=32,
        label_len=8,
        horizon=16,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=32,
        dropout=0.0,
    )
    return ForecastConfig(**{**values, **overrides})


# --- data ---------------------------------------------------------------------------------------


def test_etth1_split_borders_and_train_only_scaler(etth1: Path) -> None:
    data = prepare(etth1, "M", "OT", 96, 24)
    assert data.borders == (8640, 11520, 14400)
    assert data.columns == ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]
    raw = read_series(etth1).values
    np.testing.assert_allclose(data.scaler.mean, raw[:8640].mean(axis=0))
    np.testing.assert_allclose(data.scaler.std, raw[:8640].std(axis=0))
    assert abs(data.scaled[:8640].mean()) < 1e-9 and not np.allclose(
        data.scaled[8640:14400].mean(axis=0), 0, atol=0.05
    )
    assert data.scaled.shape == (14400, 7)


def test_window_counts_and_context(etth1: Path) -> None:
    data = prepare(etth1, "M", "OT", 96, 24)
    train, val, test = (data.windows(s, 96, 24) for s in ("train", "val", "test"))
    assert len(train) == 8640 - 96 - 24 + 1
    assert len(val) == len(test) == 2880 - 24 + 1  # val/test start 96 rows earlier for context
    first = test.targets(torch.tensor([0]))[0]  # the first target row is the test split's first row
    np.testing.assert_allclose(first[0].numpy(), data.scaled[11520], rtol=1e-6)
    assert split_range(data.borders, "val", 96) == (8544, 11520)
    assert n_windows(10, 4, 3) == 4


def test_feature_modes(series: Path) -> None:
    assert prepare(series, "S", "OT", 48, 24).columns == ["OT"]
    ms = prepare(series, "MS", "OT", 48, 24)
    assert len(ms.columns) == 7 and ms.outputs == [6]


def test_ratio_split_for_other_files(tmp_path: Path) -> None:
    small = write_ett_like_csv(tmp_path / "small.csv", rows=1000)
    assert split_borders(small, 1000) == (700, 800, 1000)


# --- model --------------------------------------------------------------------------------------


def test_instance_norm_round_trip() -> None:
    x = torch.randn(4, 32, 3) * 5 + 7
    norm = InstanceNorm()
    mean, std = norm.stats(x)
    z = norm.normalise(x, mean, std)
    assert torch.allclose(z.mean(dim=1), torch.zeros(4, 3), atol=1e-5)
    assert torch.allclose(z.std(dim=1, unbiased=False), torch.ones(4, 3), atol=1e-3)
    assert torch.allclose(norm.restore(z, mean, std), x, atol=1e-5)


def test_overlapping_patches() -> None:
    x = torch.arange(2 * 32 * 3, dtype=torch.float32).reshape(2, 32, 3)
    plain, overlapping = Forecaster(tiny(patch_len=8)), Forecaster(tiny(patch_len=8, patch_stride=4))
    assert torch.equal(plain.patches(x), plain.to_tokens(x))  # stride 0 = patch_len: no overlap
    tokens = overlapping.patches(x)  # (2, 7, 24): starts 0, 4, ..., 24; the last ends at step 31
    assert tokens.shape == (2, 7, 24)
    for j in range(7):
        torch.testing.assert_close(tokens[:, j], x[:, 4 * j : 4 * j + 8].reshape(2, 24))
    assert overlapping(x).shape == (2, 16, 3)
    with pytest.raises(ValueError, match="patch_stride"):
        tiny(patch_len=8, patch_stride=5)  # (32 - 8) is not a multiple of 5


@pytest.mark.parametrize(
    "options", [{}, {"patch_len": 4}, {"channel_independent": True}, {"patch_len": 4, "patch_stride": 2}]
)
def test_one_pass_decoding_is_causal(options: dict) -> None:
    model = Forecaster(tiny(**options)).eval()
    x = torch.randn(2, 32, 3)
    memory = model.encode(model._split_channels(x))
    dec_in = model.decoder_input(model._split_channels(x))  # (B, 24, c): 8 known + 16 placeholders
    changed = dec_in.clone()
    changed[:, 16:] = torch.randn_like(changed[:, 16:])  # later placeholders
    out, out2 = model.decode(dec_in, memory), model.decode(changed, memory)
    assert torch.allclose(out[:, :16], out2[:, :16], atol=1e-6)
    assert not torch.allclose(out[:, 16:], out2[:, 16:])


def test_last_patch_placeholders_repeat_the_last_known_patch() -> None:
    x = torch.randn(2, 32, 3)
    zeros = Forecaster(tiny(patch_len=4)).decoder_input(x)  # (B, 8 known + 16 placeholders, c)
    repeated = Forecaster(tiny(patch_len=4, placeholders="last_patch")).decoder_input(x)
    torch.testing.assert_close(repeated[:, :8], zeros[:, :8])  # the known steps are untouched
    assert not zeros[:, 8:].any()
    for start in range(8, 24, 4):  # each 4-step placeholder token is x's last 4 steps
        torch.testing.assert_close(repeated[:, start : start + 4], x[:, 28:])
    with pytest.raises(ValueError, match="placeholders"):
        tiny(placeholders="mean")
    with pytest.raises(ValueError, match="placeholders: 'last_patch' applies to one-pass decoding only"):
        tiny(placeholders="last_patch", decoding="autoregressive")


def test_last_period_placeholders_repeat_the_last_known_period() -> None:
    """A period that divides neither the patch nor the horizon: the horizon's step t is the input's
    step L - period + (t mod period); a period of 0 or beyond the input is refused, and so is a
    period given to other placeholders (it would do nothing)."""
    x = torch.randn(2, 32, 3)
    dec_in = Forecaster(tiny(patch_len=4, placeholders="last_period", period=6)).decoder_input(x)
    torch.testing.assert_close(dec_in[:, :8], x[:, 24:])  # the known steps
    torch.testing.assert_close(dec_in[:, 8:], x[:, [26 + t % 6 for t in range(16)]])
    for period in (0, 33):
        with pytest.raises(ValueError, match=r"period: must be in \[1, seq_len=32\]"):
            tiny(placeholders="last_period", period=period)
    with pytest.raises(ValueError, match="other placeholders take none"):
        tiny(placeholders="last_patch", period=24)


def test_forward_shapes_and_outputs() -> None:
    model = Forecaster(tiny(outputs=[2], instance_norm=False)).eval()
    assert model(torch.randn(5, 32, 3)).shape == (5, 16, 1)


def test_autoregressive_option_runs_and_matches_teacher_forcing() -> None:
    model = Forecaster(tiny(decoding="autoregressive", patch_len=4)).eval()
    x = torch.randn(2, 32, 3)
    generated = model(x)  # fed back token by token
    assert generated.shape == (2, 16, 3) and torch.isfinite(generated).all()
    model.train()  # dropout is 0: teacher forcing on its own output must give the same values
    forced = model(x, target=generated)
    assert torch.allclose(forced, generated, atol=1e-4)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="horizon"):
        tiny(horizon=18, patch_len=4)
    with pytest.raises(ValueError, match="channel_independent"):
        tiny(outputs=[0], channel_independent=True)
    with pytest.raises(ValueError, match="d_model"):
        tiny(d_model=15)


def task_loss(model, windows, idx, outputs: list[int], loss: str = "mse") -> torch.Tensor:
    """The training loss as the engine computes it (:meth:`ForecastTask.loss`) on windows ``idx``."""
    task = ForecastTask(model, windows, windows, outputs, ForecastTrainConfig(loss=loss))
    return task.loss(model, idx).value


def test_few_training_steps_lower_the_loss(series: Path) -> None:
    data = prepare(series, "M", "OT", 32, 16)
    train = data.windows("train", 32, 16)
    model = Forecaster(tiny(n_features=7, outputs=list(range(7)), channel_independent=True, patch_len=4))
    idx = torch.arange(0, 4096, 256)
    before = task_loss(model, train, idx, data.outputs).item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        loss = task_loss(model, train, idx, data.outputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert task_loss(model, train, idx, data.outputs).item() < 0.85 * before


# --- baselines ----------------------------------------------------------------------------------


def _periodic(length: int, period: int = 24) -> torch.Tensor:
    t = torch.arange(length, dtype=torch.float32)
    return torch.stack([torch.sin(2 * math.pi * t / period), torch.cos(2 * math.pi * t / period) * 3], dim=1)


def test_seasonal_naive_exact_on_periodic_series() -> None:
    series = _periodic(96 + 40)
    x, y = series[None, :96], series[None, 96:]
    assert torch.allclose(SeasonalNaive(40, [0, 1], 24)(x), y, atol=1e-5)
    assert not torch.allclose(RepeatLast(40, [0, 1])(x), y, atol=1e-2)


def test_repeat_last_exact_on_constant_series() -> None:
    x = torch.full((2, 10, 3), 4.5)
    assert torch.equal(RepeatLast(5, [1])(x), torch.full((2, 5, 1), 4.5))


def test_dlinear_learns_a_linear_trend() -> None:
    torch.manual_seed(0)
    model = DLinear(24, 8, [0])
    t = torch.arange(32, dtype=torch.float32)
    slopes = torch.linspace(-1, 1, 64)[:, None, None]
    series = slopes * t[None, :, None] / 10  # (64, 32, 1) straight lines
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(150):
        loss = torch.mean((model(series[:, :24]) - series[:, 24:]) ** 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 1e-3


def test_evaluate_limit_scores_the_first_windows_only(series: Path) -> None:
    # The published ETT figures drop the last partial test batch: evaluate(limit=) scores that prefix.
    data = prepare(series, "M", "OT", 48, 24)
    test = data.windows("test", 48, 24)
    model = SeasonalNaive(24, data.outputs, 24)
    kept = len(test) - len(test) % 128
    idx = torch.arange(kept)
    expected = torch.mean((model(test.inputs(idx)) - test.targets(idx)[..., data.outputs]) ** 2).item()
    assert evaluate(model, test, data.outputs, batch_size=100, limit=kept)["mse"] == pytest.approx(expected)
    assert evaluate(model, test, data.outputs, limit=10**9) == evaluate(model, test, data.outputs)
    assert evaluate(model, test, data.outputs, limit=kept)["mse"] != pytest.approx(
        evaluate(model, test, data.outputs)["mse"]
    )
    with pytest.raises(ValueError, match="limit must be >= 1"):
        evaluate(model, test, data.outputs, limit=0)


def test_training_loss_is_squared_or_absolute_error(series: Path) -> None:
    data = prepare(series, "M", "OT", 48, 24)
    train = data.windows("train", 48, 24)
    model, idx = SeasonalNaive(24, data.outputs, 24), torch.arange(100, 164)
    error = model(train.inputs(idx)) - train.targets(idx)[..., data.outputs]
    mse = task_loss(model, train, idx, data.outputs)  # the default
    mae = task_loss(model, train, idx, data.outputs, "mae")
    torch.testing.assert_close(mse, error.square().mean())
    torch.testing.assert_close(mae, error.abs().mean())
    assert mae.item() != pytest.approx(mse.item(), rel=1e-2)
    assert ForecastTrainConfig(loss="mae").loss == "mae"
    with pytest.raises(ValueError, match="^loss: must be one of mse, mae; got 'huber'"):
        ForecastTrainConfig(loss="huber")


def fit(model, train, val, outputs: list[int], config: ForecastTrainConfig) -> FitState:
    """Train ``model`` as a :class:`ForecastTask` with no run directory; what the task reports."""
    task = ForecastTask(model, train, val, outputs, config)
    engine.train(task, None, progress=False)
    return task.result()


def test_evaluate_and_fit_with_early_stopping(series: Path) -> None:
    data = prepare(series, "S", "OT", 48, 24)
    train, val = data.windows("train", 48, 24), data.windows("val", 48, 24)
    model = DLinear(48, 24, data.outputs)
    state = fit(
        model,
        train,
        val,
        data.outputs,
        ForecastTrainConfig(batch_size=256, lr=1e-2, max_epochs=2, precision="fp32"),
    )
    assert state.epoch == 2 and state.best_val == min(h["val_mse"] for h in state.history)
    assert evaluate(model, val, data.outputs)["mse"] == pytest.approx(state.best_val)
    assert evaluate(RepeatLast(24, [0]), val, [0])["mse"] > state.best_val


def test_weight_average_is_an_exponential_moving_average() -> None:
    model = torch.nn.Linear(2, 1)
    start = model.weight.detach().clone()
    average = WeightAverage(model, decay=0.75, updates=100)  # warmed up: (1 + 100) / (10 + 100) > 0.75
    with torch.no_grad():
        model.weight.add_(4.0)
    average.update()  # 0.75 * start + 0.25 * (start + 4)
    torch.testing.assert_close(average.average["weight"], start + 1.0)
    assert average.updates == 101
    with average.swapped_in():
        torch.testing.assert_close(model.weight, start + 1.0)
    torch.testing.assert_close(model.weight, start + 4.0)  # the trained weights come back
    fresh = WeightAverage(model, decay=0.99)
    with torch.no_grad():
        model.weight.add_(10.0)
    fresh.update()  # first update: decay (1 + 0) / (10 + 0) = 0.1, not 0.99
    torch.testing.assert_close(fresh.average["weight"], start + 4.0 + 9.0)


def test_fit_with_ema_keeps_the_validated_average(series: Path) -> None:
    data = prepare(series, "S", "OT", 48, 24)
    train, val = data.windows("train", 48, 24), data.windows("val", 48, 24)
    model = DLinear(48, 24, data.outputs)
    cfg = ForecastTrainConfig(
        batch_size=256, lr=1e-2, max_epochs=2, max_steps_per_epoch=5, ema=0.9, precision="fp32"
    )
    state = fit(model, train, val, data.outputs, cfg)
    assert evaluate(model, val, data.outputs)["mse"] == pytest.approx(state.best_val)
    for bad in (dict(ema=1.0), dict(patience=-1), dict(lr_decay=0.0), dict(clip_norm=-1.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ForecastTrainConfig(**bad)


def test_scaler_round_trip() -> None:
    values = np.random.default_rng(0).normal(3, 2, size=(50, 2))
    scaler = Scaler.from_dict(Scaler.fit(values).to_dict())
    np.testing.assert_allclose(scaler.inverse(scaler.transform(values)), values)
    np.testing.assert_allclose(scaler.inverse(scaler.transform(values)[:, [1]], [1]), values[:, [1]])


def test_channel_independent_forecast_of_any_subset_of_variables() -> None:
    """Channel independent: a variable's forecast does not depend on the others, so the model reads
    any subset of them (what ``channels_per_step`` trains on)."""
    torch.manual_seed(0)
    model = Forecaster(tiny(channel_independent=True, patch_len=4)).eval()
    x = torch.randn(5, 32, 3)
    with torch.no_grad():
        every, some = model(x), model(x[..., [2, 0]])
    assert some.shape == (5, 16, 2)
    torch.testing.assert_close(some, every[..., [2, 0]])


def _seven_variable_model() -> Forecaster:
    """A small channel-independent model of ETTh1's 7 variables (48 steps in, 24 out)."""
    shape = dict(n_features=7, outputs=list(range(7)), seq_len=48, label_len=24, horizon=24, patch_len=24)
    stacks = dict(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    return Forecaster(ForecastConfig(**shape, **stacks, channel_independent=True))


def test_channels_per_step_trains_on_a_seeded_subset(series: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = prepare(series, "M", "OT", 48, 24)
    train, val = data.windows("train", 48, 24), data.windows("val", 48, 24)
    seen: list[int] = []
    error = batch_error

    def recording(pred, truth, loss="mse"):
        seen.append(pred.size(-1))
        assert truth.shape == pred.shape
        return error(pred, truth, loss)

    monkeypatch.setattr("aiayn.forecast.train.batch_error", recording)
    cfg = ForecastTrainConfig(
        batch_size=64, lr=1e-3, max_epochs=2, max_steps_per_epoch=3, channels_per_step=2
    )
    weights = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _seven_variable_model()
        state = fit(model, train, val, data.outputs, cfg)
        weights.append(model.head.weight.detach().clone())
        assert math.isfinite(state.best_val)
    assert seen == [2] * 12  # 2 runs x 2 epochs x 3 steps, 2 variables each
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)  # seeded draws


def test_channels_per_step_of_the_files_width_or_more_changes_nothing(series: Path) -> None:
    """The recipe's ``channels_per_step: 7`` leaves a 7-variable file's training as it was, bit for bit."""
    data = prepare(series, "M", "OT", 48, 24)
    train, val = data.windows("train", 48, 24), data.windows("val", 48, 24)
    weights = []
    for k in (0, 7, 9):
        cfg = ForecastTrainConfig(
            batch_size=64, lr=1e-3, max_epochs=1, max_steps_per_epoch=3, channels_per_step=k
        )
        torch.manual_seed(0)
        model = _seven_variable_model()
        fit(model, train, val, data.outputs, cfg)
        weights.append(model.head.weight.detach().clone())
    torch.testing.assert_close(weights[1], weights[0], rtol=0, atol=0)
    torch.testing.assert_close(weights[2], weights[0], rtol=0, atol=0)


def test_a_wide_file_is_scored_in_batches_of_bounded_series(monkeypatch: pytest.MonkeyPatch) -> None:
    """A channel-independent model reads B windows of n variables as B*n series: evaluate cuts a wide
    file's windows into batches of at most SERIES_PER_BATCH series, with the same scores."""
    from aiayn.forecast import metrics
    from aiayn.forecast.data import Windows

    n = 40
    torch.manual_seed(0)
    model = Forecaster(tiny(n_features=n, outputs=list(range(n)), channel_independent=True, patch_len=8))
    windows = Windows(np.random.default_rng(0).normal(size=(120, n)).astype(np.float32), 0, 120, 32, 16)
    monkeypatch.setattr(metrics, "SERIES_PER_BATCH", 10**6)
    whole = evaluate(model, windows, list(range(n)), batch_size=len(windows))  # 73 windows, 2,920 series
    seen: list[int] = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda x: seen.append(x.shape[0] * x.shape[2]) or forward(x))
    monkeypatch.setattr(metrics, "SERIES_PER_BATCH", 100)
    cut = evaluate(model, windows, list(range(n)), batch_size=len(windows))
    assert max(seen) <= 100 and len(seen) == math.ceil(len(windows) / 2)  # 2 windows of 40 series
    assert cut == pytest.approx(whole, rel=1e-6)
