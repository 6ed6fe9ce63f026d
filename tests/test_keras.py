"""The Keras 3 port (``aiayn.keras``) against its peer, ``aiayn.model``, with the same weights.

On the PyTorch backend in this process (``KERAS_BACKEND=torch`` before keras is imported; every test
here runs on one xdist worker, so keras is imported once); the JAX and TensorFlow backends in
subprocesses, when they are installed. Skipped with a reason when keras is not installed (the
``test`` extra installs it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ["KERAS_BACKEND"] = "torch"  # before keras is imported: the suite runs the port on PyTorch
keras = pytest.importorskip("keras", reason="keras is not installed: pip install -e '.[keras]'")
if keras.backend.backend() != "torch":  # keras was imported before this module, on another backend
    pytest.skip(
        f"keras runs on {keras.backend.backend()} in this process, not torch", allow_module_level=True
    )

from keras import ops  # noqa: E402

import aiayn  # noqa: E402
import aiayn.keras as ak  # noqa: E402
from aiayn.checkpoint import MODEL_FILE, save_checkpoint  # noqa: E402
from aiayn.cli import main  # noqa: E402
from aiayn.data.batching import collate, make_batches  # noqa: E402
from aiayn.data.synthetic import make_task  # noqa: E402
from aiayn.data.tokenizer import Tokenizer  # noqa: E402
from aiayn.errors import UserError  # noqa: E402
from aiayn.keras import parity  # noqa: E402
from aiayn.train.loss import Seq2SeqObjective, label_smoothed_nll  # noqa: E402
from aiayn.train.schedule import inverse_sqrt_lr, noam_lr  # noqa: E402
from test_docs import demo_run, python_blocks, run_blocks  # noqa: E402, F401  (demo_run: a fixture)

pytestmark = [
    pytest.mark.xdist_group("keras"),  # one worker imports keras, once
    # keras's torch backend turns tensors into arrays with np.array(tensor), which NumPy 2 warns about
    pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy:DeprecationWarning"),
]

ROOT = Path(__file__).resolve().parents[1]
KERAS_DOC = ROOT / "docs" / "keras.md"


def numpy(x) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(x))


# --- parity with aiayn.model ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    parity.pairwise_combinations(),
    ids=lambda o: "-".join(f"{v}" for v in o.values()),
)
def test_logits_attention_and_greedy_tokens_equal_aiayn_model(options: dict) -> None:
    result = parity.check(options)
    assert result["logits"] < 1e-5, result  # against PyTorch's fused attention
    assert result["logits_with_attention"] < 1e-5, result  # against the written-out formula
    assert result["attention"] < 1e-6, result  # every layer's and head's weights, all three kinds
    assert result["maps"] == {"encoder_self": 1, "decoder_self": 2, "cross": 2}
    assert result["greedy_equal"], result


def test_the_pairwise_combinations_cover_every_pair_of_option_values() -> None:
    chosen = parity.pairwise_combinations()
    names = list(parity.OPTIONS)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for x in parity.OPTIONS[a]:
                for y in parity.OPTIONS[b]:
                    assert any(c[a] == x and c[b] == y for c in chosen), (a, x, b, y)
    assert len(chosen) < len(parity.combinations()) / 4  # far fewer than all of them


def test_every_value_of_the_config_options_is_ported() -> None:
    from aiayn.config import ACTIVATIONS, POSITIONAL_KINDS, TIE_KINDS

    assert set(parity.OPTIONS["activation"]) == set(ACTIVATIONS)
    assert set(parity.OPTIONS["positional"]) == set(POSITIONAL_KINDS)
    assert set(parity.OPTIONS["tie_embeddings"]) == set(TIE_KINDS)


def test_a_setting_the_port_lacks_is_one_line_naming_it() -> None:
    config = parity.tiny_config()
    config.activation = "mish"  # past the config's own check, as a newer aiayn might store
    with pytest.raises(UserError, match=r"^aiayn.keras: activation 'mish' is not ported; valid: relu"):
        ak.build_model(config)

    @dataclasses.dataclass
    class Newer(aiayn.TransformerConfig):
        rotary: bool = False

    ak.check_supported(Newer(**parity.tiny_config().to_dict()))  # at its default: built as before
    with pytest.raises(UserError, match=r"^aiayn.keras: the model setting rotary=True is not ported$"):
        ak.check_supported(Newer(**parity.tiny_config().to_dict(), rotary=True))


def test_the_model_takes_both_sides() -> None:
    model = ak.build_model(parity.tiny_config())
    with pytest.raises(ValueError, match=r"takes source and target ids: model\(src, tgt\)"):
        model(np.full((2, 3), 5, dtype="int32"))


def test_masks_and_positional_table_are_aiayns() -> None:
    tokens = np.array([[5, 6, 7, 0], [8, 0, 0, 0]])
    for ours, theirs in [
        (ak.padding_mask(tokens, 0), aiayn.padding_mask(torch.from_numpy(tokens), 0)),
        (ak.causal_mask(4), aiayn.causal_mask(4)),
        (ak.target_mask(tokens, 0), aiayn.target_mask(torch.from_numpy(tokens), 0)),
    ]:
        assert numpy(ours).dtype == bool and np.array_equal(numpy(ours), theirs.numpy())
    assert np.array_equal(numpy(ak.positional_encoding(64, 30)), aiayn.positional_encoding(64, 30).numpy())


def test_dropout_only_in_training() -> None:
    config = dataclasses.replace(parity.tiny_config(), dropout=0.5, attention_dropout=0.5)
    model = ak.build_model(config)
    src, tgt = (t.numpy() for t in parity.batch(config, 0))
    inference = numpy(model(src, tgt))
    assert np.array_equal(inference, numpy(model(src, tgt, training=False)))
    assert not np.allclose(numpy(model(src, tgt, training=True)), inference, atol=1e-3)


def test_decoding_on_the_cache_equals_the_whole_prefix() -> None:
    config = dataclasses.replace(parity.tiny_config(), norm_first=True, positional="learned")
    model = ak.build_model(config)
    src, tgt = (t.numpy() for t in parity.batch(config, 1))
    tgt = tgt[:, :4].copy()
    tgt[1, 3] = 7  # no padding: each step feeds one real token
    memory = model.encode(src)
    whole = numpy(model.decode(tgt, memory, ak.padding_mask(src, 0)))  # (B, T, D)
    cache = model.init_cache(memory, ak.padding_mask(src, 0))
    steps = [numpy(model.decode(tgt[:, t : t + 1], None, cache=cache)) for t in range(tgt.shape[1])]
    assert np.allclose(np.concatenate(steps, axis=1), whole, atol=1e-5)
    assert cache.length == 4 and tuple(cache.layers[0][0].k.shape) == (3, 2, 4, 8)


def test_a_fully_masked_query_gets_zeros_not_nan() -> None:
    q = k = v = np.ones((1, 1, 2, 4), dtype="float32")
    mask = np.array([[[[True, False], [False, False]]]])
    out, weights = ak.scaled_dot_product_attention(q, k, v, mask)
    assert numpy(weights).tolist() == [[[[1.0, 0.0], [0.0, 0.0]]]]
    assert (numpy(out)[0, 0, 1] == 0).all()


# --- checkpoints ----------------------------------------------------------------------------------


def _torch_checkpoint(path: Path) -> Path:
    """A small random translation checkpoint written by aiayn (no training)."""
    tokenizer = Tokenizer.train([str(n) for n in range(0, 5000, 7)] + ["one two three"] * 9, vocab_size=300)
    config = dataclasses.replace(
        parity.tiny_config(), src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size
    )
    model = aiayn.build_model(config)
    save_checkpoint(
        path, model, {"kind": "translation", "model": config.to_dict(), "step": 1}, tokenizer.to_bytes()
    )
    return path


def test_load_gives_aiayns_model_and_checks_every_file(tmp_path: Path) -> None:
    ckpt = _torch_checkpoint(tmp_path / "ckpt")
    model, tokenizer, config = ak.load(ckpt)
    torch_model, _, _ = aiayn.load(ckpt)
    src, tgt = (t % config.src_vocab_size for t in parity.batch(config, 2))
    with torch.no_grad():
        expected = torch_model(src, tgt)
    assert np.allclose(numpy(model(src.numpy(), tgt.numpy())), expected.numpy(), atol=1e-5)
    assert tokenizer.vocab_size == config.tgt_vocab_size

    weights = bytearray((ckpt / MODEL_FILE).read_bytes())
    weights[-1] ^= 1  # one flipped bit
    (ckpt / MODEL_FILE).write_bytes(bytes(weights))
    with pytest.raises(UserError, match=r"^corrupt checkpoint file .*model.safetensors: its SHA-256"):
        ak.load(ckpt)
    with pytest.raises(UserError, match=r"^checkpoint not found: "):
        ak.load(tmp_path / "nowhere")


def test_save_refuses_another_tokenizer(tmp_path: Path) -> None:
    model = ak.build_model(parity.tiny_config())  # a vocabulary of 40
    tokenizer = Tokenizer.train([str(n) for n in range(0, 5000, 7)], vocab_size=300)
    with pytest.raises(
        UserError, match=r"^the tokenizer has \d+ pieces but the model's src_vocab_size is 40"
    ):
        ak.save(model, tmp_path / "out", tokenizer)
    assert not (tmp_path / "out").exists()


# --- training -------------------------------------------------------------------------------------


def test_the_schedule_is_eq_3_from_step_1() -> None:
    schedule = ak.NoamSchedule(d_model=256, warmup=100, factor=2.0)
    rates = numpy(schedule(np.arange(400)))
    assert np.allclose(rates, [noam_lr(s, 256, 100, 2.0) for s in range(1, 401)], rtol=1e-5)
    peak = ak.NoamSchedule(d_model=256, warmup=100, peak_lr=1e-3)
    assert np.allclose(
        numpy(peak(np.arange(400))), [inverse_sqrt_lr(s, 1e-3, 100) for s in range(1, 401)], rtol=1e-5
    )
    assert ak.NoamSchedule.from_config(peak.get_config()).factor == peak.factor


def test_the_loss_is_aiayns_per_real_token() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 11)).astype("float32")
    target = np.array([[5, 6, 3, 0], [7, 3, 0, 0], [8, 9, 10, 3]])
    real = target != 0
    for epsilon in (0.0, 0.1):
        summed, _ = label_smoothed_nll(
            torch.from_numpy(logits[real]), torch.from_numpy(target[real]), epsilon
        )
        ours = float(numpy(ak.LabelSmoothedCrossEntropy(epsilon, pad_id=0)(target, logits)))
        assert ours == pytest.approx(float(summed) / real.sum(), rel=1e-5)


@pytest.mark.parametrize("tie", ["all", "none"])
def test_the_gradients_are_aiayns(tie: str) -> None:
    """The loss's gradient with respect to every weight is that of aiayn's training objective
    (per real token), the padding rows of the embeddings included (no gradient from their lookups)."""
    config = parity.tiny_config(tie_embeddings=tie)
    reference = aiayn.build_model(config).train()
    model = ak.from_torch(reference)
    src, tgt = parity.batch(config, 3)
    tgt_out = torch.cat([tgt[:, 1:], torch.full((3, 1), config.eos_id)], dim=1).masked_fill(tgt == 0, 0)
    loss, _ = Seq2SeqObjective(reference, 0.1, config.pad_id)(src, tgt, tgt_out)
    (loss / (tgt_out != 0).sum()).backward()
    ours = ak.LabelSmoothedCrossEntropy(0.1, config.pad_id)(
        tgt_out.numpy(), model((src.numpy(), tgt.numpy()))
    )
    ours.backward()  # the PyTorch backend: the weights are torch parameters
    expected = dict(reference.named_parameters())
    for name, (variable, transposed) in ak.weights.weight_map(model).items():
        if name in expected:  # a tied name is one parameter in both
            grad = variable.value.grad.T if transposed else variable.value.grad
            assert torch.allclose(grad, expected[name].grad, atol=1e-6), name


def test_fit_takes_the_steps_of_a_hand_written_loop() -> None:
    """fit clears every weight's gradient before each step (it would add them up if a weight were
    not one of the model's torch parameters) and applies the optimizer as a plain loop does."""
    config = parity.tiny_config(tie_embeddings="all")
    examples = [(list(range(4, 4 + n % 6 + 1)), list(range(10, 10 + n % 5 + 1))) for n in range(40)]
    batches = ak.TranslationBatches(examples, batch_tokens=64, seed=0)
    fitted, looped = ak.build_model(config), ak.build_model(config)
    looped.set_weights(fitted.get_weights())
    assert len(list(fitted.parameters())) == len(fitted.trainable_weights)
    fitted.compile(optimizer=ak.paper_adam(1e-3), loss=ak.LabelSmoothedCrossEntropy(0.1))
    fitted.fit(batches, epochs=1, steps_per_epoch=3, shuffle=False, verbose=0)
    optimizer, loss = ak.paper_adam(1e-3), ak.LabelSmoothedCrossEntropy(0.1)
    optimizer.build(looped.trainable_weights)
    for step in range(3):
        x, y = batches[step]
        loss(y, looped(x, training=True)).backward()
        with torch.no_grad():
            optimizer.apply([w.value.grad for w in looped.trainable_weights], looped.trainable_weights)
        for weight in looped.trainable_weights:
            weight.value.grad = None
    for a, b in zip(fitted.get_weights(), looped.get_weights()):
        assert np.allclose(a, b, atol=1e-6)


def test_batches_are_aiayns_and_fit_lowers_the_loss_and_the_checkpoint_translates(
    tmp_path: Path, capsys
) -> None:
    task = make_task(seed=0, n_train=400, n_valid=0, n_test=30)
    tokenizer = Tokenizer.train([side for pair in task["train"] for side in pair], vocab_size=400)
    examples = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in task["train"]]
    batches = ak.TranslationBatches(examples, batch_tokens=256, seed=3)
    rng = np.random.default_rng((3, 0))  # the first pass's batches, as aiayn's sampler makes them
    first = make_batches(examples, 256, rng)
    expected = collate([examples[i] for i in first[rng.permutation(len(first))[1]]])
    (src, tgt_in), tgt_out = batches[1]
    for ours, theirs in ((src, expected.src), (tgt_in, expected.tgt_in), (tgt_out, expected.tgt_out)):
        assert ours.dtype == np.int32 and np.array_equal(ours, theirs.numpy())
    assert src.shape[0] * max(src.shape[1], tgt_out.shape[1]) <= 256

    keras.utils.set_random_seed(0)
    config = aiayn.TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=64,
        dropout=0.0,
        max_len=64,
        tie_embeddings="all",
    )
    model = ak.build_model(config)
    model.compile(
        optimizer=ak.paper_adam(ak.NoamSchedule(32, warmup=10, peak_lr=0.01)),
        loss=ak.LabelSmoothedCrossEntropy(0.1, config.pad_id),
    )
    history = model.fit(batches, epochs=4, steps_per_epoch=10, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0], losses

    run = ak.save(model, tmp_path / "keras_run", tokenizer)
    assert ak.load(run).checkpoint.config["step"] == 40
    sources = [s for s, _ in task["test"]] + [""]
    (tmp_path / "test.digits").write_text("".join(f"{line}\n" for line in sources))
    capsys.readouterr()
    assert (
        main(["translate", "--checkpoint", str(run), "--beam", "1", "--input", str(tmp_path / "test.digits")])
        == 0
    )
    translated = capsys.readouterr().out.splitlines()
    ours = ak.translate(model, tokenizer, sources)
    assert translated == ours and ours[-1] == ""


# --- the walk-through and the other backends --------------------------------------------------------


@pytest.mark.usefixtures("demo_run")  # aiayn_demo/run, which the page loads
def test_the_keras_walkthrough_runs() -> None:
    blocks = python_blocks(KERAS_DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 10, f"only {len(blocks)} python blocks in {KERAS_DOC}"
    unchecked = [line for line, code in blocks if "assert " not in code]
    assert not unchecked, f"blocks without an assert in docs/keras.md, at lines {unchecked}"
    run_blocks(KERAS_DOC, blocks)


@pytest.mark.parametrize("backend,package", [("jax", "jax"), ("tensorflow", "tensorflow")])
def test_the_same_parity_on_another_backend(backend: str, package: str) -> None:
    """``python -m aiayn.keras.parity --pairwise`` in a subprocess on that backend (the backend is
    chosen once per process); ``benchmarks/keras_backends.py`` runs every combination."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(
            f"{package} is not installed (pip install {'jax[cpu]' if package == 'jax' else 'tensorflow-cpu'})"
        )
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    command = [sys.executable, "-m", "aiayn.keras.parity", "--pairwise"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["backend"] == backend and report["combinations"] == len(parity.pairwise_combinations())
    assert report["max_logits_difference"] < 1e-5 and report["max_attention_difference"] < 1e-5, report
    assert report["greedy_equal"], report
