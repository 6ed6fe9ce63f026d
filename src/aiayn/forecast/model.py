"""The paper's encoder-decoder Transformer on continuous inputs.

Data flow for one window (B windows, input length L, horizon H, n variables)::

    x (B, L, n) --instance norm--> --tokens--> Linear(n·p -> d_model) + positions --> Encoder
    decoder input: last label_len known steps, then H placeholders (zeros: the Informer protocol)
    --> Linear + positions --> Decoder (causal mask, attends to the encoder memory)
    --> Linear head (d_model -> n·p) --> the last H steps --> undo instance norm --> (B, H, n_out)

The stacks are :class:`aiayn.model.Encoder` / :class:`aiayn.model.Decoder` (no second attention
implementation). Their :class:`TransformerConfig` has vocabulary sizes of 4 (the special ids need
them); the vocabulary fields are unused here, the embeddings are linear.

Options, each off/paper-like by default where it is a deviation:

* ``instance_norm``: per-window, per-variable mean/std subtracted before the model and restored after
  the head (RevIN without the affine part).
* ``channel_independent``: each variable is its own univariate series through one shared model
  (``n`` becomes 1 inside; the batch becomes B·n). Still the paper's encoder-decoder.
* ``patch_len`` p: a token is p consecutive steps (``Linear(n·p -> d_model)``); p=1 is one token
  per step, the plain linear embedding. L, label_len and H must be multiples of p.
* ``patch_stride`` s: the encoder's patches start every s steps (s < p overlaps them, as PatchTST's
  stride); 0 means s = p. The last patch ends at the last input step. The decoder's tokens never
  overlap.
* ``decoding``: "one_pass" (placeholders, one causal pass) or "autoregressive" (decoder input is
  the series shifted by one token, teacher-forced in training; at inference each predicted token
  is fed back, one at a time).
* ``placeholders`` (one pass): "zeros" (Informer), "last_patch", the last p known steps repeated
  over the horizon (a seasonal-naive guess with period p that the decoder corrects), or
  "last_period", the last ``period`` known steps repeated (the command sets ``period`` to a day of
  the file's steps: 24 for hourly data, 96 at 15 minutes, whatever p is).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import Checked, TransformerConfig, from_mapping, require, setting
from aiayn.model import Decoder, Encoder, PositionalEncoding, causal_mask

DECODING = ("one_pass", "autoregressive")
PLACEHOLDERS = ("zeros", "last_patch", "last_period")


@dataclass
class ForecastConfig(Checked):
    """Shape and options of a :class:`Forecaster`; validated on construction (ValueError names the field).

    The stacks' fields (``d_model`` to ``activation``) follow :class:`TransformerConfig`'s rules.
    """

    n_features: int = setting(7, ge=1)
    outputs: list[int] = setting(factory=lambda: list(range(7)))
    seq_len: int = setting(96, ge=1)
    label_len: int = setting(48, ge=0)
    horizon: int = setting(96, ge=1)
    d_model: int = 64
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 1
    d_ff: int = 128
    dropout: float = 0.1
    attention_dropout: float = 0.0
    positional: str = "sinusoidal"
    norm_first: bool = False
    activation: str = "relu"
    instance_norm: bool = True
    channel_independent: bool = False
    patch_len: int = setting(1, ge=1)
    #: encoder patches start every patch_stride steps (0 = patch_len: no overlap)
    patch_stride: int = setting(0, ge=0)
    decoding: str = setting("one_pass", choices=DECODING)
    #: One-pass placeholders for the horizon: "zeros" (Informer), "last_patch" (the last p known
    #: steps repeated: a seasonal-naive guess with period p for the decoder to correct) or
    #: "last_period" (the last ``period`` known steps repeated).
    placeholders: str = setting("zeros", choices=PLACEHOLDERS)
    #: steps repeated by "last_period" placeholders; 0 in a config file: a day of the file's steps
    period: int = setting(0, ge=0)

    def check(self) -> None:
        require("label_len", self.label_len <= self.seq_len, f"must be in [0, seq_len={self.seq_len}]")
        for name in ("seq_len", "label_len", "horizon"):
            require(
                name,
                getattr(self, name) % self.patch_len == 0,
                f"must be a multiple of patch_len={self.patch_len}",
            )
        require(
            "patch_stride",
            self.patch_stride <= self.patch_len and (self.seq_len - self.patch_len) % self.stride == 0,
            f"must be in [0, patch_len={self.patch_len}] with (seq_len - patch_len) a multiple of it",
        )
        require(
            "label_len",
            self.decoding == "one_pass" or self.label_len + self.patch_len <= self.seq_len,
            "autoregressive decoding needs label_len + patch_len <= seq_len (a start token)",
        )
        require(
            "outputs",
            bool(self.outputs) and all(0 <= o < self.n_features for o in self.outputs),
            f"must be indices in [0, {self.n_features})",
        )
        require(
            "placeholders",
            self.decoding == "one_pass" or self.placeholders == "zeros",
            f"{self.placeholders!r} applies to one-pass decoding only (autoregressive decoding has none)",
        )
        require(
            "period",
            1 <= self.period <= self.seq_len if self.placeholders == "last_period" else self.period == 0,
            f"must be in [1, seq_len={self.seq_len}] for last_period placeholders, got {self.period} "
            "(0 in a config file: a day of the file's steps); other placeholders take none",
        )
        require(
            "channel_independent",
            not self.channel_independent or len(self.outputs) == self.n_features,
            "needs every variable as an output (features M or S)",
        )
        self.stack_config()  # validates d_model, heads, dropout, positional, activation

    @property
    def stride(self) -> int:
        """Steps between the starts of consecutive encoder patches."""
        return self.patch_stride or self.patch_len

    @property
    def source_tokens(self) -> int:
        return (self.seq_len - self.patch_len) // self.stride + 1

    @property
    def channels(self) -> int:
        """Variables per token inside the model (1 when channel independent)."""
        return 1 if self.channel_independent else self.n_features

    def stack_config(self) -> TransformerConfig:
        """The core config for the stacks; vocabulary sizes are placeholders (unused)."""
        tokens = max((self.seq_len + self.label_len + self.horizon) // self.patch_len + 1, self.source_tokens)
        return TransformerConfig(
            src_vocab_size=4,
            tgt_vocab_size=4,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_encoder_layers=self.n_encoder_layers,
            n_decoder_layers=self.n_decoder_layers,
            d_ff=self.d_ff,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            max_len=tokens,
            norm_first=self.norm_first,
            positional=self.positional,
            activation=self.activation,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ForecastConfig":
        """Build from a mapping; an unknown key is a ``ValueError`` listing the valid names."""
        return from_mapping(cls, values)


class InstanceNorm(nn.Module):
    """Per-window, per-variable standardisation over time (RevIN, non-affine)."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps

    def stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x`` ``(B, L, n)`` -> mean, std, each ``(B, 1, n)``."""
        mean = x.mean(dim=1, keepdim=True)
        std = torch.sqrt(x.var(dim=1, keepdim=True, unbiased=False) + self.eps)
        return mean, std

    @staticmethod
    def normalise(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        return (x - mean) / std

    @staticmethod
    def restore(y: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        return y * std + mean


class Forecaster(nn.Module):
    """Encoder-decoder forecaster: ``forward(x (B, L, n)) -> (B, H, len(outputs))``."""

    def __init__(self, config: ForecastConfig) -> None:
        super().__init__()
        self.config = config
        stacks = config.stack_config()
        width, d, p = config.channels * config.patch_len, config.d_model, config.patch_len
        self.src_embed = nn.Linear(width, d)  # (B, S, n·p) -> (B, S, D)
        self.tgt_embed = nn.Linear(width, d)
        self.src_pos = PositionalEncoding(d, stacks.max_len, config.positional, config.dropout)
        self.tgt_pos = PositionalEncoding(d, stacks.max_len, config.positional, config.dropout)
        self.encoder = Encoder(stacks)
        self.decoder = Decoder(stacks)
        self.head = nn.Linear(d, width)  # (B, T, D) -> (B, T, n·p)
        self.norm = InstanceNorm()
        self.p = p

    # --- shapes ----------------------------------------------------------------------------------
    def to_tokens(self, x: Tensor) -> Tensor:
        """``(B, T, c)`` -> ``(B, T/p, p·c)`` (p consecutive steps per token)."""
        return x.reshape(x.size(0), x.size(1) // self.p, self.p * x.size(2))

    def patches(self, x: Tensor) -> Tensor:
        """``(B, L, c)`` -> ``(B, (L-p)/s + 1, p·c)``: patches every s steps, laid out as
        :meth:`to_tokens`."""
        stride = self.config.stride
        if stride == self.p:
            return self.to_tokens(x)
        patches = x.unfold(1, self.p, stride)  # (B, S, c, p)
        return patches.transpose(2, 3).reshape(x.size(0), patches.size(1), self.p * x.size(2))

    def from_tokens(self, tokens: Tensor) -> Tensor:
        """``(B, T/p, p·c)`` -> ``(B, T, c)``."""
        return tokens.reshape(tokens.size(0), tokens.size(1) * self.p, -1)

    def _split_channels(self, x: Tensor) -> Tensor:
        """``(B, L, n)`` -> ``(B·n, L, 1)`` when channel independent."""
        if not self.config.channel_independent:
            return x
        return x.transpose(1, 2).reshape(-1, x.size(1), 1)

    def _merge_channels(self, y: Tensor, batch: int) -> Tensor:
        """``(B·n, H, 1)`` -> ``(B, H, n)`` when channel independent."""
        if not self.config.channel_independent:
            return y
        return y.reshape(batch, -1, y.size(1)).transpose(1, 2)

    # --- the stacks ------------------------------------------------------------------------------
    def encode(self, x: Tensor) -> Tensor:
        """Normalised input ``(B, L, c)`` -> memory ``(B, S, D)`` (S = L/p without overlap)."""
        return self.encoder(self.src_pos(self.src_embed(self.patches(x))))

    def decode(self, dec_in: Tensor, memory: Tensor) -> Tensor:
        """Decoder input ``(B, T, c)`` (T a multiple of p) -> head output ``(B, T, c)``, causal."""
        tokens = self.tgt_pos(self.tgt_embed(self.to_tokens(dec_in)))  # (B, T/p, D)
        mask = causal_mask(tokens.size(1), tokens.device)  # (1, 1, T/p, T/p)
        return self.from_tokens(self.head(self.decoder(tokens, memory, tgt_mask=mask)).float())

    def decoder_input(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        """The decoder input ``(B, label_len + H, c)`` for one-pass decoding or teacher forcing.

        One pass: the last ``label_len`` known steps, then placeholders for the horizon (zeros, or the
        last patch or period repeated). Autoregressive: the known steps followed by ``target``
        (teacher forcing), shifted right by one token.
        """
        cfg = self.config
        known = x[:, x.size(1) - cfg.label_len :]  # (B, label_len, c)
        if cfg.decoding == "one_pass":
            if cfg.placeholders == "zeros":
                future = x.new_zeros(x.size(0), cfg.horizon, x.size(2))
            else:  # the last p (last_patch) or period steps, (B, period, c), tiled over the horizon
                period = self.p if cfg.placeholders == "last_patch" else cfg.period
                tiles = -(-cfg.horizon // period)
                future = x[:, x.size(1) - period :].repeat(1, tiles, 1)[:, : cfg.horizon]
            return torch.cat([known, future], dim=1)
        start = x[:, x.size(1) - cfg.label_len - self.p : x.size(1) - cfg.label_len]  # one token before
        future = target if target is not None else x.new_zeros(x.size(0), cfg.horizon, x.size(2))
        return torch.cat([start, known, future], dim=1)[:, : cfg.label_len + cfg.horizon]

    # --- forward ---------------------------------------------------------------------------------
    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        """``x`` ``(B, L, n)`` -> forecast ``(B, H, len(outputs))`` in the input's units.

        ``target`` ``(B, H, n)`` (same units as ``x``) is used only for teacher forcing when training
        with ``decoding="autoregressive"``; inference with that option feeds predictions back.
        """
        batch, cfg = x.size(0), self.config
        mean, std = self.norm.stats(x) if cfg.instance_norm else (None, None)
        if mean is not None:
            x = self.norm.normalise(x, mean, std)
            target = self.norm.normalise(target, mean, std) if target is not None else None
        x = self._split_channels(x)  # (B', L, c)
        target = self._split_channels(target) if target is not None else None
        memory = self.encode(x)  # (B', L/p, D)
        if cfg.decoding == "autoregressive" and not self.training:
            y = self._generate(x, memory)
        else:
            y = self.decode(self.decoder_input(x, target), memory)[:, cfg.label_len :]  # (B', H, c)
        y = self._merge_channels(y, batch)  # (B, H, n)
        if mean is not None:
            y = self.norm.restore(y, mean, std)
        # channel independent: every variable is an output (check()), so any number of them may be read
        return y if cfg.channel_independent else y[..., cfg.outputs]

    def _generate(self, x: Tensor, memory: Tensor) -> Tensor:
        """Autoregressive inference: one token (p steps) at a time, each prediction fed back."""
        cfg = self.config
        dec_in = self.decoder_input(x)[:, : cfg.label_len + self.p]  # start token + known steps
        for _ in range(cfg.horizon // self.p):
            out = self.decode(dec_in, memory)  # (B, T, c)
            dec_in = torch.cat([dec_in, out[:, -self.p :].to(dec_in.dtype)], dim=1)
        return dec_in[:, cfg.label_len + self.p :]  # (B, H, c)
