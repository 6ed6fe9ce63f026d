"""The decoder's one-token step written for inference: the searches' step function on the CPU.

:class:`FastStep` is another implementation of the step protocol of :mod:`aiayn.decode.step` (the
same ``__call__(prefix)``, ``reorder(new_order)``, ``vocab_size``, ``device``), with the same
results as :class:`~aiayn.decode.step.ModelStep` (the reference, ``SearchPaths(fast_step=False)``)
up to float rounding. It computes the same layers (§3.1-3.4) on one new position per row, and
differs from the model's own forward only where decoding allows it:

* **The generator's weight packed once** (CPU, fp32): reordered into oneDNN's blocked layout and
  run by oneDNN's inner-product kernel (``torch.ops.mkldnn._linear_pointwise``, what
  ``torch.compile`` uses for frozen CPU graphs). On a 2-core AMD EPYC the ``(N, 256) x (256, 8000)``
  vocabulary projection runs about 1.5x faster than through PyTorch's default (MKL), while the
  decoder's smaller matmuls do not gain (``benchmarks/README.md``, *Decoding speed*). The packed
  weight is kept per model and made again when a parameter changes (training-time validation
  decodes a model in training). In bf16 (:func:`bfloat16`, on a CPU with native bf16) every linear
  layer is packed: there the decoder's layers gain too (``benchmarks/README.md``, *Issue 54*).
  Elsewhere (GPU, emulated bf16) the plain ``F.linear``.
* **One query's attention written out** (two batched matmuls and a softmax over the contiguous
  cache): for one query per row over a short cache this is faster on the CPU than PyTorch's fused
  kernel, which pays a fixed cost per (row, head). In bf16 the products stay bf16 (fp32 sums) and
  the softmax is fp32.
* The attention and feed-forward layers run from weights gathered once per batch, not through
  their modules (no masks, module calls or per-call checks at each step; embeddings and LayerNorms
  remain the model's).
* The cross-attention keys/values computed once per source and shared by the rows of that source
  (beam search's beams, sampling's samples), as :mod:`aiayn.decode.cache` does.

The encoder is the model's own (:func:`~aiayn.decode.step.encode_sources`).
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.decode.cache import fold, is_identity, memory_groups
from aiayn.decode.step import encode_sources
from aiayn.precision import native_bf16


def supported(model) -> bool:
    """Whether :class:`FastStep` can decode ``model``: a model in eval mode (dropout off)."""
    return not model.training


def by_default(model) -> bool:
    """Whether the searches take :class:`FastStep` for ``model`` by default: on the CPU, where it was
    measured faster than the model's own step (``benchmarks/decode_paths.py``); not on a GPU, where
    it has no figure yet (``benchmarks/decode_paths.py --device cuda`` measures it)."""
    return next(model.parameters()).device.type == "cpu"


# --- linear layers, packed for oneDNN on the CPU ---------------------------------------------------


def _can_pack(weight: Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and (weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and native_bf16(weight.device)))
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class Linear:
    """``y = x W^T + b`` (``relu``: then ReLU), from ``weight`` ``(out, in)``; ``pack``: packed for
    oneDNN where it can be (CPU, fp32), else ``F.linear``. Inputs ``(N, in)`` contiguous."""

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False, pack: bool = False) -> None:
        self.relu, self.bias = relu, None if bias is None else bias.detach()
        self.packed = pack and _can_pack(weight)
        weight = weight.detach()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, None) if self.packed else weight

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(
                x, self.weight, self.bias, "relu" if self.relu else "none", [], ""
            )
        y = F.linear(x, self.weight, self.bias)
        return F.relu(y) if self.relu else y


class Int8Linear:
    """``y = x W^T + b`` with ``weight`` quantized to int8 per output row (symmetric) and ``x`` per
    call (PyTorch's dynamic quantization: ``torch.ops.quantized.linear_dynamic``, fbgemm/x86 on the
    CPU); ``relu``: then ReLU. Inputs ``(N, in)``.

    ``x`` is quantized with one scale for the whole call, so a row's result depends slightly on the
    other rows of its batch: in int8, unlike fp32, a sentence can translate differently in another
    batch (CTranslate2's int8 scales each row)."""

    packed = False

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False, pack: bool = False) -> None:
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1).clamp(min=1e-8) / 127).double()  # (out,)
        zeros = torch.zeros(w.size(0), dtype=torch.long)
        with warnings.catch_warnings():  # PyTorch's notice that quantized tensors will be deprecated
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
        self.relu, self.weight = (
            relu,
            torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float()),
        )

    def __call__(self, x: Tensor) -> Tensor:
        y = torch.ops.quantized.linear_dynamic(x, self.weight, True)  # reduce_range: as nn.quantized.dynamic
        return F.relu(y) if self.relu else y


class _Layer:
    """One decoder layer's weights as the step uses them."""

    def __init__(self, layer, d_model: int, linear=Linear) -> None:
        d = d_model
        self_attn, cross = layer.self_attn, layer.cross_attn
        self.qkv = linear(self_attn.in_proj.weight, self_attn.in_proj.bias)  # (3D, D)
        self.self_out = linear(self_attn.out_proj.weight, self_attn.out_proj.bias)
        self.cross_q = linear(cross.in_proj.weight[:d], cross.in_proj.bias[:d])
        self.cross_kv = (cross.in_proj.weight[d:].detach(), cross.in_proj.bias[d:].detach())  # memory, once
        self.cross_out = linear(cross.out_proj.weight, cross.out_proj.bias)
        ff = layer.feed_forward
        relu = ff.activation is F.relu
        self.ff_in, self.activation = (
            linear(ff.w_1.weight, ff.w_1.bias, relu),
            None if relu else ff.activation,
        )
        self.ff_out = linear(ff.w_2.weight, ff.w_2.bias)
        self.norms = [block.norm for block in (layer.self_block, layer.cross_block, layer.ff_block)]
        self.norm_first = layer.self_block.norm_first


class _Weights:
    """Every decoder weight of a model as :class:`FastStep` uses them: views of the parameters
    (live), except packed and int8 weights (copies, made once per model): the generator's, and in
    bf16 (:func:`bfloat16`'s copies) every layer's, which gain from packing there too."""

    def __init__(self, model) -> None:
        config, linear = model.config, Int8Linear if is_int8(model) else Linear
        generator = model.generator.proj
        layer_linear = (
            functools.partial(Linear, pack=True) if generator.weight.dtype == torch.bfloat16 else linear
        )
        self.layers = [_Layer(layer, config.d_model, layer_linear) for layer in model.decoder.layers]
        self.generator = linear(generator.weight, generator.bias, pack=True)
        self.version = _version(model)
        # what the packed generator was made from: a weight changed where no version counter sees
        # it (through ``.data``, or under inference_mode) is caught by comparing with it
        self.source = generator.weight.detach().clone() if self.generator.packed else None

    def current(self, model) -> bool:
        """Whether these weights are still ``model``'s: the version counters, and when the generator
        is packed one comparison of its weight (per batch: 1.8 ms for 8,000 x 256, 19 ms for 37,000 x 512
        on 2 EPYC cores, against a batch's decoding of 0.1-10 s)."""
        if self.version != _version(model):
            return False
        return self.source is None or torch.equal(self.source, model.generator.proj.weight.detach())


def int8(model):
    """A copy of ``model`` that decodes with int8 weights on the CPU: the encoder's linear layers
    replaced by int8 ones, and :class:`FastStep` running the decoder's and the generator's in int8
    (:class:`Int8Linear`; the reference step keeps the decoder in fp32). ``benchmarks/decode_int8.py``
    measures its speed and BLEU against fp32 and CTranslate2's int8."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("int8 decoding runs on the CPU: move the model there first")
    quantized = copy.deepcopy(model).float().eval()
    _encoder_linears(quantized, Int8Linear)
    quantized.int8 = True
    return quantized


def is_int8(model) -> bool:
    """Whether ``model`` is an :func:`int8` copy."""
    return getattr(model, "int8", False) is True


def bfloat16(model):
    """A copy of ``model`` that decodes in bf16, for a device with bf16 matrix hardware
    (:func:`aiayn.precision.native_bf16`: CPUs with AVX512-BF16 or AMX, CUDA GPUs from Ampere on;
    elsewhere bf16 is emulated, many times slower, and this refuses). Every weight in bf16; the
    attention's softmax, the log-softmax and the searches' scores stay fp32. On the CPU the encoder's
    linear layers, like :class:`FastStep`'s, run oneDNN's packed bf16 kernel (:class:`Linear`).
    ``benchmarks/decode_int8.py`` measures its speed and BLEU against fp32, int8 and CTranslate2."""
    device = next(model.parameters()).device
    if not native_bf16(device):
        raise ValueError(
            f"bf16 decoding needs native bf16 (AVX512-BF16 or AMX, or an Ampere GPU); {device} has none"
        )
    converted = copy.deepcopy(model).to(torch.bfloat16).eval()
    if device.type == "cpu":
        _encoder_linears(converted, functools.partial(Linear, pack=True))
    return converted


def _encoder_linears(model, linear) -> None:
    """In place: every ``nn.Linear`` of ``model``'s encoder run by ``linear(weight, bias)``."""
    for module in model.encoder.modules():
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, _EncoderLinear(child, linear))


class _EncoderLinear(nn.Module):
    """An ``nn.Linear`` of the encoder run by ``linear`` (:class:`Int8Linear`, or :class:`Linear`
    packed), over any leading dimensions."""

    def __init__(self, module: nn.Linear, linear) -> None:
        super().__init__()
        self.in_features, self.out_features = module.in_features, module.out_features
        self.linear = linear(module.weight, module.bias)

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear(x.reshape(-1, self.in_features).contiguous())
        return y.reshape(*x.shape[:-1], self.out_features)


def _version(model) -> tuple:
    """What identifies a model's weights: each parameter's storage and in-place version counter
    (none for a parameter made under ``torch.inference_mode``: its storage alone)."""
    return tuple((p.data_ptr(), None if p.is_inference() else p._version) for p in model.parameters())


_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its _Weights


def weights(model) -> _Weights:
    """``model``'s decoder weights for :class:`FastStep`, packed on first use and again whenever a
    parameter has changed since (an optimizer step, a loaded state dict, an edit through ``.data``)."""
    cached = _PACKED.get(model)
    if cached is None or not cached.current(model):
        cached = _PACKED[model] = _Weights(model)
    return cached


# --- the step -------------------------------------------------------------------------------------


class FastStep:
    """The decoder as a step function (see the module docstring), for a model in eval mode.

    ``src`` ``(B, S)`` padded source ids; ``log_probs=False``: calls return logits (greedy search).
    ``group_rows``, ``by_length``: as :class:`~aiayn.decode.step.ModelStep`'s ``paths``.
    ``attention_layer``: after each call, ``attention`` ``(N, S)`` holds that decoder layer's
    cross-attention of the new position, its heads averaged (None: not kept).
    """

    def __init__(
        self,
        model,
        src: Tensor,
        *,
        log_probs: bool = True,
        group_rows: bool = True,
        by_length: bool = True,
        attention_layer: int | None = None,
    ) -> None:
        config = model.config
        self.model, self.log_probs, self.group_rows = model, log_probs, group_rows
        self.attention_layer, self.attention = attention_layer, None
        self.heads, self.d_model = config.n_heads, config.d_model
        self.d_k = config.d_model // config.n_heads
        self.weights = weights(model)
        with torch.inference_mode():
            memory, src_mask = encode_sources(model, src, by_length)  # (B, S, D), (B, 1, 1, S)
            self.cross = [self._memory_keys(layer, memory) for layer in self.weights.layers]
        keep = src_mask[:, 0, 0, :]  # (B, S)
        # masked keys: the most negative float (softmax gives them 0); a source with no key at all
        # gets zeros, as the model's attention does
        self.bias = torch.zeros(keep.shape, dtype=torch.float32, device=memory.device)  # added to fp32 scores
        self.bias = self.bias.masked_fill(~keep, torch.finfo(torch.float32).min)[:, None, None, :]
        self.has_keys = None if bool(keep.any(dim=-1).all()) else keep.any(dim=-1)[:, None, None, None]
        self.group = 1  # rows per memory row (consecutive rows share it)
        self.sources = torch.arange(src.size(0), device=src.device)  # memory row of each row
        empty = memory.new_empty(src.size(0), self.heads, 0, self.d_k)
        self.keys = [empty] * len(self.weights.layers)  # self-attention, per layer (N, H, t, d_k)
        self.values = [empty] * len(self.weights.layers)
        self.t = 0  # positions decoded
        self.order: Tensor | None = None  # a reorder of the self-attention cache not yet applied

    @property
    def device(self) -> torch.device:
        return self.bias.device

    @property
    def vocab_size(self) -> int:
        return self.model.config.tgt_vocab_size

    def _memory_keys(self, layer: _Layer, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The cross-attention keys and values of ``memory``, each ``(B, H, S, d_k)`` contiguous."""
        k, v = F.linear(memory, *layer.cross_kv).chunk(2, dim=-1)  # (B, S, D) each
        return tuple(x.unflatten(-1, (self.heads, self.d_k)).transpose(1, 2).contiguous() for x in (k, v))

    def __call__(self, prefix: Tensor) -> Tensor:
        """``prefix`` ``(N, t)`` -> next-token log-probs (or logits) ``(N, V)``, fp32."""
        t = prefix.size(1) - 1  # the new token's position
        if t != self.t:
            raise ValueError(f"FastStep holds {self.t} positions; a prefix of {t + 1} tokens came")
        model = self.model
        x = model.tgt_pos(model.tgt_embed(prefix[:, -1:]), t)[:, 0]  # (N, D)
        for i, layer in enumerate(self.weights.layers):
            x = self._layer(i, layer, x, t)
        x = model.decoder.norm(x)
        out = self.weights.generator(x)  # (N, V)
        self.t, self.order = self.t + 1, None
        return F.log_softmax(out, dim=-1, dtype=torch.float32) if self.log_probs else out.float()

    def _layer(self, i: int, layer: _Layer, x: Tensor, t: int) -> Tensor:
        """One decoder layer on the new position of every row: ``x`` ``(N, D)``."""
        self_norm, cross_norm, ff_norm = layer.norms
        x = self._residual(x, self_norm, layer.norm_first, lambda y: self._self_attention(i, layer, y, t))
        x = self._residual(x, cross_norm, layer.norm_first, lambda y: self._cross_attention(i, layer, y))
        return self._residual(x, ff_norm, layer.norm_first, lambda y: self._feed_forward(layer, y))

    @staticmethod
    def _residual(x: Tensor, norm, norm_first: bool, sublayer) -> Tensor:
        if norm_first:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))

    def _self_attention(self, i: int, layer: _Layer, x: Tensor, t: int) -> Tensor:
        n, h, d_k = x.size(0), self.heads, self.d_k
        q, k, v = layer.qkv(x).view(n, 3, h, 1, d_k).unbind(1)  # (N, H, 1, d_k) each
        if t:  # contiguous, so that the batched matmuls read it without a copy
            k, v = self._append(self.keys[i], k), self._append(self.values[i], v)
        self.keys[i], self.values[i] = k, v  # (N, H, t + 1, d_k)
        out = _attend(q, k, v, None)  # (N, H, 1, d_k)
        return layer.self_out(out.reshape(n, self.d_model))

    def _append(self, cache: Tensor, new: Tensor) -> Tensor:
        """``cache`` ``(N', H, t, d_k)`` with the rows of the pending reorder, then ``new``
        ``(N, H, 1, d_k)``: one copy of the cache (a reorder and a concatenation would be two)."""
        if self.order is None:
            return torch.cat([cache, new], dim=2)
        out = new.new_empty(new.size(0), new.size(1), cache.size(2) + 1, new.size(3))
        torch.index_select(cache, 0, self.order, out=out[:, :, :-1])
        out[:, :, -1:] = new
        return out

    def _cross_attention(self, i: int, layer: _Layer, x: Tensor) -> Tensor:
        n, h, d_k = x.size(0), self.heads, self.d_k
        q = layer.cross_q(x).view(n, h, 1, d_k)  # (N, H, 1, d_k): as (N, 1, H, d_k) transposed
        keys, values = self.cross[i]
        if i == self.attention_layer:
            out, weights = _attend(fold(q, self.group), keys, values, self.bias, weights=True)
            self.attention = fold(weights, self.group, inverse=True).float().mean(dim=1)[:, 0]  # (N, S)
        else:
            out = _attend(fold(q, self.group), keys, values, self.bias)  # (B, H, g, d_k): a group's rows
        if self.has_keys is not None:  # sources with no key: a zero output, as the model's
            out = torch.where(self.has_keys, out, 0.0)
        return layer.cross_out(fold(out, self.group, inverse=True).reshape(n, self.d_model))

    @staticmethod
    def _feed_forward(layer: _Layer, x: Tensor) -> Tensor:
        hidden = layer.ff_in(x)
        return layer.ff_out(hidden if layer.activation is None else layer.activation(hidden))

    def reorder(self, new_order: Tensor) -> None:
        """Row i becomes old row ``new_order[i]`` (rows may repeat or go; see
        :meth:`~aiayn.decode.cache.GroupedDecoderCache.reorder`)."""
        if is_identity(new_order, self.sources.numel()):
            return
        # the self-attention cache is reordered as the next step appends to it (one copy)
        self.order = new_order if self.order is None else self.order.index_select(0, new_order)
        sources = self.sources.index_select(0, new_order)
        if not torch.equal(sources, self.sources):
            self._regroup(sources)

    def _regroup(self, sources: Tensor) -> None:
        """Rows now read memory rows ``sources`` ``(N',)``, grouped as the model step's cache groups
        them (:func:`~aiayn.decode.cache.memory_groups`)."""
        runs, group = memory_groups(sources, self.group_rows)
        self.group = group
        self.sources = torch.arange(runs.numel(), device=runs.device).repeat_interleave(group)
        if is_identity(runs, self.bias.size(0)):
            return
        self.cross = [(k.index_select(0, runs), v.index_select(0, runs)) for k, v in self.cross]
        self.bias = self.bias.index_select(0, runs)
        if self.has_keys is not None:
            self.has_keys = self.has_keys.index_select(0, runs)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, weights: bool = False):
    """softmax(q k^T / sqrt(d_k) + bias) v for few queries: ``q`` ``(B, H, T_q, d_k)``, ``k``/``v``
    ``(B, H, T_k, d_k)``, ``bias`` fp32, broadcastable to ``(B, H, T_q, T_k)``. ``weights``: the output
    and the softmax ``(B, H, T_q, T_k)``, fp32.

    The scale goes on ``q`` (a few elements) rather than on the scores; in fp16/bf16 the products are
    taken in that type (fp32 sums), the bias added and the softmax taken in fp32, each in one pass
    (the scores widened by the addition or by the softmax itself)."""
    scores = (q * (1.0 / math.sqrt(q.size(-1)))) @ k.transpose(-2, -1)  # (B, H, T_q, T_k)
    if bias is not None:
        scores = scores + bias
    probs = scores.softmax(dim=-1, dtype=torch.float32)
    out = (probs if v.dtype == torch.float32 else probs.to(v.dtype)) @ v
    return (out, probs) if weights else out
