"""Which models a server has and what each translates, read at start from the checkpoints' own
records (``config.json``, the tokenizer), without loading any weights.

A model's languages are its run's ``data.src_lang`` and ``data.tgt_lang`` (an import's: opus-mt's
``tokenizer_config.json``). A multi-target model (an opus-mt model whose vocabulary has ``>>xx<<``
pieces, which the source must start with) serves each language its pieces name. Where a checkpoint
records no languages, or other ones should be served, ``SRC-TGT=PATH`` names them (``de-en=runs/x``;
several with ``+``: ``en-fr+es=models/en-romance``).

Two models for one pair: a model of one target is chosen over a multi-target one; any other tie is
refused at start, naming both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.checkpoint import CONFIG_FILE, MODEL_FILE, TOKENIZER_FILE, resolve_checkpoint
from aiayn.data.tokenizer import VocabTokenizer
from aiayn.errors import UserError
from aiayn.service.languages import is_code, normalize, target_tokens

NAMING = re.compile(r"^([A-Za-z_+-]+?)-([A-Za-z_+]+)=(.+)$")


@dataclass(frozen=True)
class ModelSpec:
    """A model the server may load: ``name`` (how answers and ``GET /v1/models`` name it), the
    checkpoint ``path``, the ``sources`` and ``targets`` it translates, for a multi-target model
    each target's ``>>xx<<`` piece (``tokens``), its ``kind`` and its weights' size on disk."""

    name: str
    path: Path
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    kind: str = "translation"
    size: int = 0  #: bytes of model.safetensors: what the memory budget counts
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return [(s, t) for s in self.sources for t in self.targets if s != t]


def parse_naming(given: str) -> tuple[str, tuple[str, ...] | None, tuple[str, ...] | None]:
    """``SRC-TGT=PATH`` -> (PATH, sources, targets); a plain path -> (path, None, None)."""
    match = NAMING.match(given)
    if not match or Path(given).exists():
        return given, None, None
    sources, targets = (tuple(normalize(c) for c in side.split("+")) for side in match.group(1, 2))
    if not all(is_code(code) for code in (*sources, *targets)):
        return given, None, None
    return match.group(3), sources, targets


def read_spec(
    given: str, name: str, sources: tuple[str, ...] | None = None, targets: tuple[str, ...] | None = None
) -> ModelSpec:
    """The :class:`ModelSpec` of the checkpoint or run directory ``given`` (languages named by the
    caller win over the checkpoint's)."""
    path = resolve_checkpoint(given)
    config = _config(path)
    kind = config.get("kind", "translation")
    size = (path / MODEL_FILE).stat().st_size if (path / MODEL_FILE).is_file() else 0
    if kind != "translation":
        return ModelSpec(name, path, (), (), kind=str(kind), size=size)
    data = config.get("run", {}).get("data", {}) if isinstance(config.get("run"), dict) else {}
    tokens = _target_tokens(path)
    recorded_targets = tuple(tokens) if tokens else _codes(data.get("tgt_lang"))
    sources = sources or _codes(data.get("src_lang"))
    targets = targets or recorded_targets
    _check_targets(path, targets, tokens)
    return ModelSpec(
        name, path, sources, targets, size=size, tokens={t: tokens[t] for t in targets if tokens}
    )


def _config(path: Path) -> dict:
    file = path / CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UserError(f"cannot read checkpoint file {file}: {err}") from None
    if not isinstance(config, dict):
        raise UserError(f"corrupt checkpoint file {file}: expected a JSON object")
    return config


def _codes(value) -> tuple[str, ...]:
    return (normalize(value),) if isinstance(value, str) and is_code(value) else ()


def _target_tokens(path: Path) -> dict[str, str]:
    """A multi-target model's targets and their ``>>xx<<`` pieces (``{}`` for any other model)."""
    file = path / TOKENIZER_FILE
    try:
        with open(file, "rb") as f:
            if not f.read(len(VocabTokenizer.MAGIC)) == VocabTokenizer.MAGIC:
                return {}
            document = json.loads(VocabTokenizer.MAGIC + f.read())
    except (OSError, ValueError):
        return {}  # read again, and said, when the model loads
    return target_tokens(document.get("pieces", ()))


def _check_targets(path: Path, targets: tuple[str, ...], tokens: dict[str, str]) -> None:
    """A multi-target model serves only targets it has a piece for."""
    if tokens and (missing := [t for t in targets if t not in tokens]):
        raise UserError(
            f"{path}: a multi-target model without a >>{missing[0]}<< piece; its targets: {', '.join(tokens)}"
        )


def discover(folder: str | Path) -> list[ModelSpec]:
    """Every checkpoint or run directory directly under ``folder``, named by its directory name."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--models {folder}: not a directory")
    found = [read_spec(str(d), d.name) for d in sorted(root.iterdir()) if _is_model_dir(d)]
    if not found:
        raise UserError(f"--models {folder}: no checkpoint or run directory in it")
    return found


def _is_model_dir(path: Path) -> bool:
    if not path.is_dir():
        return False
    try:
        resolve_checkpoint(path)
    except UserError:
        return False
    return True


def catalog(
    checkpoints: list[str], folder: str | None, languages: tuple[str | None, str | None] = (None, None)
) -> list[ModelSpec]:
    """The models of ``--checkpoint`` (each ``PATH`` or ``SRC-TGT=PATH``) and ``--models DIR``,
    checked: unique names, one kind, languages known for each of several models, no pair served
    twice without a rule that picks (:func:`direct_pairs`). ``languages``: the one checkpoint's
    source and target (``--source-lang``, ``--target-lang``), where given."""
    specs: list[ModelSpec] = []
    for given in checkpoints:
        path, sources, targets = parse_naming(given)
        sources = sources or _codes(languages[0])
        targets = targets or _codes(languages[1])
        specs.append(read_spec(path, _unique_name(path, specs), sources, targets))
    if folder is not None:
        for spec in discover(folder):
            specs.append(ModelSpec(**{**spec.__dict__, "name": _unique_name(spec.name, specs)}))
    _check_kinds(specs)
    if len(specs) > 1:  # a server of one model may serve it without knowing its languages
        for spec in specs:
            _check_languages(spec)
    return specs


def _check_languages(spec: ModelSpec) -> None:
    if not (spec.sources and spec.targets):
        raise UserError(
            f"{spec.path}: the checkpoint records no languages; name them: --checkpoint "
            f"SRC-TGT={spec.path} (e.g. de-en)"
        )


def _unique_name(name: str, specs: list[ModelSpec]) -> str:
    taken = {spec.name for spec in specs}
    k, candidate = 2, name
    while candidate in taken:
        candidate, k = f"{name}#{k}", k + 1
    return candidate


def _check_kinds(specs: list[ModelSpec]) -> None:
    if not specs:
        raise UserError("no model to serve: give --checkpoint PATH or --models DIR")
    other = [spec for spec in specs if spec.kind != "translation"]
    if other and len(specs) > 1:
        raise UserError(f"{other[0].path}: a {other[0].kind} model is served alone, not beside other models")


def direct_pairs(specs: list[ModelSpec]) -> dict[tuple[str, str], ModelSpec]:
    """The model serving each pair directly: a one-target model before a multi-target one; two of a
    kind for one pair is a :class:`UserError` naming both."""
    chosen: dict[tuple[str, str], ModelSpec] = {}
    for spec in specs:
        for pair in spec.pairs:
            other = chosen.get(pair)
            if other is None or (other.tokens and not spec.tokens):
                chosen[pair] = spec
            elif bool(other.tokens) == bool(spec.tokens):
                raise UserError(
                    f"two models translate {pair[0]}->{pair[1]}: {other.path} and {spec.path}; "
                    "serve one of them"
                )
    return chosen
