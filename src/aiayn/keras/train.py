"""Training in Keras: the paper's learning-rate schedule (Eq. 3) as a ``LearningRateSchedule``, the
label-smoothed loss with padding masked (§5.4), Adam with the paper's settings (§5.3), and
token-bounded batches of a parallel corpus for ``model.fit``.

    >>> model = aiayn.keras.build_model(config)                                          # doctest: +SKIP
    >>> model.compile(optimizer=paper_adam(NoamSchedule(config.d_model, warmup=4000)),
    ...               loss=LabelSmoothedCrossEntropy(0.1, config.pad_id))                 # doctest: +SKIP
    >>> model.fit(TranslationBatches(examples, batch_tokens=1024), steps_per_epoch=500)  # doctest: +SKIP

The PyTorch originals: :func:`aiayn.train.schedule.noam_lr`, :func:`aiayn.train.loss.label_smoothed_nll`
and :class:`aiayn.data.batching.TokenBatchSampler`, whose batching (by length, shuffled, seeded by
(seed, epoch)) :class:`TranslationBatches` reuses.
"""

from __future__ import annotations

import math
from typing import Sequence

import keras
import numpy as np
from keras import ops

from aiayn.config import PAD_ID
from aiayn.data.batching import Example, collate, make_batches


@keras.saving.register_keras_serializable(package="aiayn")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)  (Eq. 3).

    Keras counts an optimizer's steps from 0 and Eq. 3 from 1, so the rate of Keras step ``s`` is
    Eq. 3 at ``s + 1``: the rates of a run are those of :func:`aiayn.train.schedule.noam_lr` for
    steps 1, 2, ... ``peak_lr`` (instead of ``factor``) sets the factor that peaks at that rate at
    the end of the warm-up, which is fairseq's ``inverse_sqrt`` schedule (``optim.peak_lr`` in a run
    config): the same curve.
    """

    def __init__(self, d_model: int, warmup: int = 4000, factor: float = 1.0, peak_lr: float | None = None):
        if d_model <= 0 or warmup <= 0:
            raise ValueError(f"d_model and warmup must be > 0; got {d_model}, {warmup}")
        self.d_model, self.warmup = d_model, warmup
        self.factor = factor if peak_lr is None else peak_lr * math.sqrt(d_model * warmup)

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        rate = ops.minimum(ops.rsqrt(step), step * self.warmup**-1.5)
        return self.factor * self.d_model**-0.5 * rate

    def get_config(self) -> dict:
        return {"d_model": self.d_model, "warmup": self.warmup, "factor": self.factor}


def paper_adam(learning_rate, clipnorm: float | None = None) -> keras.optimizers.Adam:
    """Adam with the paper's β1 = 0.9, β2 = 0.98, ε = 1e-9 (§5.3); ``clipnorm``: clip the global
    gradient norm (``train.clip_norm``). Keras adds ε to the bias-corrected sqrt(v) a little
    differently from PyTorch (ε scaled by sqrt(1 - β2^t)): at ε = 1e-9 the two agree to rounding."""
    return keras.optimizers.Adam(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9, global_clipnorm=clipnorm
    )


@keras.saving.register_keras_serializable(package="aiayn")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """The label-smoothed cross-entropy per real target token (§5.4), in float32.

    ``y_true`` ``(B, T)`` token ids, ``y_pred`` ``(B, T, V)`` logits. Each position's loss is
    (1 - ε) · (-log p_y) + ε · mean_v(-log p_v) (ε spread over all V classes, as
    ``F.cross_entropy(label_smoothing=ε)`` and :func:`aiayn.train.loss.label_smoothed_nll`); positions
    whose target is ``pad_id`` count for nothing, and the batch's loss is the sum over the real tokens
    divided by their number, as aiayn's training logs it.
    """

    def __init__(self, epsilon: float = 0.1, pad_id: int = PAD_ID, name: str = "label_smoothed_ce", **kwargs):
        super().__init__(name=name, **kwargs)
        self.epsilon, self.pad_id = epsilon, pad_id

    def call(self, y_true, y_pred):
        target = ops.cast(y_true, "int32")  # Keras hands targets over as floats
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)  # (B, T, V)
        nll = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(target, -1), axis=-1), -1)
        loss = (1.0 - self.epsilon) * nll - self.epsilon * ops.mean(log_probs, axis=-1)  # (B, T)
        real = ops.cast(ops.not_equal(target, self.pad_id), "float32")
        return ops.sum(loss * real) / ops.maximum(ops.sum(real), 1.0)

    def get_config(self) -> dict:
        return {**super().get_config(), "epsilon": self.epsilon, "pad_id": self.pad_id}


class TranslationBatches(keras.utils.PyDataset):
    """An endless stream of token-bounded batches of ``examples`` (``(source ids, target ids)``
    pairs without BOS/EOS) for ``model.fit(batches, epochs=..., steps_per_epoch=...)``.

    Batch ``i`` is ``((src, tgt_in), tgt_out)``: ``src`` = source + EOS, ``tgt_in`` = BOS + target,
    ``tgt_out`` = target + EOS, padded with PAD to the batch's longest; at most ``batch_tokens``
    padded tokens per batch. The batches of each pass over the data are those of aiayn's training
    (:func:`aiayn.data.batching.make_batches`, sorted by length, then shuffled, seeded by
    ``(seed, pass)``), so a run repeats; the stream is indexed by the step, as Keras asks for it.
    """

    def __init__(self, examples: Sequence[Example], batch_tokens: int, seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        if not examples:
            raise ValueError("no examples to batch")
        longest = max(max(len(s), len(t)) for s, t in examples) + 1
        if longest > batch_tokens:
            raise ValueError(
                f"batch_tokens={batch_tokens} is smaller than the longest example ({longest} tokens)"
            )
        self.examples, self.batch_tokens, self.seed = examples, batch_tokens, seed
        self._order: list[np.ndarray] = []  # the batches of the passes made so far, in order
        self._passes = 0

    @property
    def num_batches(self) -> None:
        return None  # endless: fit's steps_per_epoch sets an epoch's length

    def batches_per_pass(self) -> int:
        """How many batches the first pass over the data makes (others differ by a few: the cut
        depends on the pass's order)."""
        return len(make_batches(self.examples, self.batch_tokens, np.random.default_rng((self.seed, 0))))

    def _extend(self, needed: int) -> None:
        while len(self._order) < needed:
            rng = np.random.default_rng((self.seed, self._passes))
            batches = make_batches(self.examples, self.batch_tokens, rng)
            self._order += [batches[i] for i in rng.permutation(len(batches))]
            self._passes += 1

    def __getitem__(self, index: int):
        self._extend(index + 1)
        batch = collate([self.examples[i] for i in self._order[index]])
        as_int32 = lambda t: t.numpy().astype(np.int32)  # noqa: E731
        return (as_int32(batch.src), as_int32(batch.tgt_in)), as_int32(batch.tgt_out)
