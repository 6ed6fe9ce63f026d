"""``aiayn serve``: the JSON API and the web page over a trained model (``pip install 'aiayn[serve]'``).

Safe by default: it binds 127.0.0.1 (another address prints a warning), ``--api-key`` (or
``AIAYN_API_KEY``) requires ``Authorization: Bearer KEY`` on ``/v1/*`` (``--api-keys``: the keys of
``aiayn keys``, with their quotas, :mod:`aiayn.serve.quotas`), request bodies are limited,
clients never name files, and CORS is off unless ``--cors ORIGIN``. SIGINT and SIGTERM stop it
cleanly: requests in flight are answered first.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import os
import re
import socket
import sys

import torch

from aiayn.decode.backends import FLAGS, check_backend, check_torch_compute, load_backend, torch_model
from aiayn.decode.translator import Translator
from aiayn.device import resolve_device
from aiayn.errors import UserError, naming_flags
from aiayn.loading import load
from aiayn.model import count_parameters
from aiayn.serve import keys
from aiayn.service.catalog import catalog
from aiayn.service.registry import Budget

API_KEY_VARIABLE = "AIAYN_API_KEY"
METRICS_TOKEN_VARIABLE = "AIAYN_METRICS_AUTH_TOKEN"


def register(subparsers) -> None:
    _register_serve(subparsers)
    keys.register(subparsers)  # `aiayn keys`: the keys of --api-keys


def _access_flags(p: argparse.ArgumentParser) -> None:
    """Keys and quotas (LibreTranslate's flags): :mod:`aiayn.serve.quotas`."""
    p.add_argument(
        "--api-keys",
        action="store_true",
        help="require a key of `aiayn keys add` on the translation routes (the api_key field or "
        "Authorization: Bearer KEY); its own limits replace the defaults below",
    )
    p.add_argument(
        "--keys-db", metavar="PATH", help="the keys' SQLite file (default: ~/.local/share/aiayn/keys.db)"
    )
    p.add_argument("--req-limit", type=int, help="requests per minute per client (default: no limit)")
    p.add_argument("--hourly-req-limit", type=int, help="requests per hour per client (default: no limit)")
    p.add_argument("--daily-req-limit", type=int, help="requests per day per client (default: no limit)")
    p.add_argument(
        "--char-limit", type=int, help="characters per request, its texts together (default: none)"
    )
    p.add_argument("--batch-limit", type=int, help="texts per request (default: none beyond --max-sentences)")
    p.add_argument(
        "--req-flood-threshold",
        type=int,
        help="a client refused this many times within 30 minutes is banned for 30 minutes (default: never)",
    )
    p.add_argument(
        "--shared-storage",
        metavar="URL",
        help="Redis shared by replicas, redis://HOST:PORT/DB: their keys, counters and bans "
        "(or $AIAYN_SHARED_STORAGE; default: each process its own)",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        metavar="IPS",
        help="proxies whose X-Forwarded-For names the client (comma-separated, * for any; default: "
        "$FORWARDED_ALLOW_IPS or 127.0.0.1,::1, as uvicorn's)",
    )


def _register_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="a JSON API and a web page over a trained model (needs the serve extra)",
        description="Serve a translation or forecasting run: POST /v1/translate, /v1/attention or "
        "/v1/forecast, GET /v1/model and /health, the web page at /, the API's documentation at /docs; "
        "for a translation run also LibreTranslate's API (POST /translate and /detect, GET /languages).",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        help="checkpoint or run directory; SRC-TGT=PATH names its languages (de-en=runs/x; several "
        "targets with +); repeat it to serve several models",
    )
    p.add_argument("--models", metavar="DIR", help="serve every checkpoint or run directory in DIR")
    p.add_argument(
        "--max-loaded-models",
        type=int,
        help="models in memory at once; the least recently used is unloaded beyond (default: no limit)",
    )
    p.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="the loaded models' weights at most (e.g. 2G, 500M; counted at their model.safetensors' "
        "size); the least recently used is unloaded beyond (default: no limit)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)"
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--engine", default="torch", help="torch or ctranslate2 (translation; default: torch)")
    p.add_argument("--ct2-dir", help="with --engine ctranslate2: the export to use or make")
    p.add_argument(
        "--compute-type",
        default="default",
        help="the arithmetic the engine runs: torch: int8 (on the CPU), bfloat16 (where bf16 is native: "
        "AVX512-BF16 or AMX CPUs, Ampere or newer GPUs); ctranslate2: int8, float32 "
        "(float16 on a GPU); default: the checkpoint's (torch), the type the export stores (ctranslate2)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's, one per core)")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1/* (or ${API_KEY_VARIABLE})")
    p.add_argument(
        "--cors", metavar="ORIGIN", help="allow this origin's pages to call the API (default: none)"
    )
    p.add_argument(
        "--metrics", action="store_true", help="serve Prometheus metrics at GET /metrics (default: off)"
    )
    p.add_argument(
        "--metrics-auth-token",
        metavar="TOKEN",
        help=f"with --metrics: /metrics needs 'Authorization: Bearer TOKEN' (or ${METRICS_TOKEN_VARIABLE})",
    )
    p.add_argument(
        "--max-batch-tokens", type=int, default=4096, help="source tokens per batch across requests"
    )
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="how long a batch waits for more requests")
    p.add_argument("--no-batching", action="store_true", help="decode each request alone")
    p.add_argument(
        "--max-sentences", type=int, default=256, help="entries of text per request (each a document)"
    )
    p.add_argument("--max-chars", type=int, default=100_000, help="characters per document")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="request body size")
    p.add_argument(
        "--max-file-bytes", type=int, default=20_000_000, help="a file sent to /translate_file (its size)"
    )
    p.add_argument(
        "--max-file-chars", type=int, default=1_000_000, help="the text to translate of such a file"
    )
    p.add_argument(
        "--disable-files-translation",
        action="store_true",
        help="refuse POST /translate_file (LibreTranslate's flag)",
    )
    p.add_argument(
        "--download-minutes",
        type=int,
        default=30,
        help="how long a translated file can be downloaded (default: 30)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="translation requests in the server at once (waiting or decoded); one more gets a 429",
    )
    _access_flags(p)
    p.add_argument(
        "--source-lang",
        help="the model's source language (ISO 639-1, e.g. de; default: the checkpoint's, when it has one)",
    )
    p.add_argument("--target-lang", help="the model's target language (default: the checkpoint's)")
    p.set_defaults(func=run_serve)


@naming_flags(FLAGS)  # --engine, --compute-type, --ct2-dir, --device: the same flags as translate's
def run_serve(args: argparse.Namespace) -> int:
    uvicorn = _serve_extra()
    from aiayn.serve.app import Limits, create_app  # the serve extra (FastAPI): only when serving

    _check_numbers(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    metrics = make_metrics(args)
    _check_port(args.host, args.port)
    shared = keys.open_shared(args.shared_storage)
    access = make_access(args, api_key, shared)
    models = load_models(args)
    limits = Limits(
        max_sentences=args.max_sentences,
        max_chars=args.max_chars,
        max_body_bytes=args.max_body_bytes,
        api_key=api_key,
        max_queue=args.max_queue,
        max_file_bytes=args.max_file_bytes,
        max_file_chars=args.max_file_chars,
        download_s=args.download_minutes * 60,
        files=not args.disable_files_translation,
    )
    batching = {
        "max_tokens": 0 if args.no_batching else args.max_batch_tokens,
        "max_wait_s": args.max_wait_ms / 1000,
    }
    downloads = make_downloads(limits, shared)
    app = create_app(models, limits, batching, args.cors, metrics=metrics, access=access, downloads=downloads)
    if not _is_loopback(args.host):
        print(
            f"aiayn: warning: serving on {args.host}, reachable from other machines"
            + ("" if api_key else "; consider --api-key"),
            file=sys.stderr,
        )
        if "*" in (args.forwarded_allow_ips or ""):
            print(
                "aiayn: warning: --forwarded-allow-ips '*' on a reachable address: every client can "
                "name its own address (X-Forwarded-For) and so dodge per-address limits and bans",
                file=sys.stderr,
            )
    print(
        f"aiayn serve: {_what(models)} on http://{args.host}:{args.port}/ (API documentation: /docs)",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=30,
        forwarded_allow_ips=args.forwarded_allow_ips,
    )
    _server_class(uvicorn)(config).run()
    return 0


def make_metrics(args: argparse.Namespace):
    """``--metrics``: the app's :class:`aiayn.serve.metrics.Metrics` (with its token); else None."""
    token = args.metrics_auth_token or os.environ.get(METRICS_TOKEN_VARIABLE) or None
    if not args.metrics:
        if args.metrics_auth_token:
            raise UserError("--metrics-auth-token: needs --metrics")
        return None
    try:
        from aiayn.serve.metrics import Metrics  # prometheus_client: only with --metrics
    except ImportError:
        raise UserError("--metrics needs prometheus_client: pip install 'aiayn[serve]'") from None
    return Metrics(token)


def make_downloads(limits, shared):
    """Where translated files wait: the Redis that replicas share (``--shared-storage``), else a
    temporary folder of the process."""
    from aiayn.serve.downloads import LocalDownloads, SharedDownloads  # the serve extra: when serving

    local = LocalDownloads(limits.download_s)
    return SharedDownloads(shared, local) if shared is not None else local


def make_access(args: argparse.Namespace, api_key: str | None, shared=None):
    """The server's :class:`aiayn.serve.quotas.Access` from its flags: an unreachable Redis, a
    URL that is not Redis's, a keys file that cannot be read stop it here, in one line."""
    from aiayn.serve.quotas import Access, MemoryCounters, Quotas, RedisCounters  # starlette: when serving

    quotas = Quotas(
        req_limit=args.req_limit,
        hourly_req_limit=args.hourly_req_limit,
        daily_req_limit=args.daily_req_limit,
        char_limit=args.char_limit,
        batch_limit=args.batch_limit,
        req_flood_threshold=args.req_flood_threshold,
    )
    if api_key and args.api_keys:
        raise UserError("--api-key and --api-keys: one key for all, or keys of aiayn keys; not both")
    if args.keys_db and not args.api_keys:
        raise UserError("--keys-db: needs --api-keys")
    store = keys.open_keys(args.keys_db, shared) if args.api_keys else None
    counters = RedisCounters(shared) if shared else MemoryCounters()
    return Access(quotas, store, counters)


def _server_class(uvicorn):
    """uvicorn's server, ending with exit status 0 after a signal it handled (it would raise the
    signal again once shut down, so that the process died of it)."""

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                self._captured_signals.clear()  # shut down cleanly: nothing to raise again

    return Server


def _serve_extra():
    try:
        import fastapi  # noqa: F401  (the optional serve extra: imported only to serve)
        import uvicorn
    except ImportError:
        raise UserError("aiayn serve needs FastAPI and uvicorn: pip install 'aiayn[serve]'") from None
    return uvicorn


def _check_numbers(args: argparse.Namespace) -> None:
    numbers = ("max_sentences", "max_chars", "max_body_bytes", "max_queue", "max_batch_tokens", "threads")
    files = ("max_file_bytes", "max_file_chars", "download_minutes")
    quotas = ("req_limit", "hourly_req_limit", "daily_req_limit", "char_limit", "batch_limit")
    for name in (*numbers, *files, "max_loaded_models", *quotas, "req_flood_threshold"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be >= 1")
    if args.max_wait_ms < 0:
        raise UserError("--max-wait-ms: must be >= 0")
    if not 0 < args.port < 65536:
        raise UserError(f"--port: {args.port} is not a port number")


def _check_port(host: str, port: int) -> None:
    """One clear line when the address cannot be bound (in use, not this machine's)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise UserError(f"--host {host}: {err.strerror}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            raise UserError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def load_models(args: argparse.Namespace):
    """The server's models (:class:`aiayn.serve.models.Models`): a server of one model loads it now
    (a bad checkpoint is said at start); several load on first use."""
    from aiayn.serve.models import Models  # the serve extra (FastAPI): only when serving

    if not (args.checkpoint or args.models):
        raise UserError("give --checkpoint PATH (repeatable) or --models DIR")
    several = len(args.checkpoint) > 1 or bool(args.models)  # a folder may hold several
    if several and (args.source_lang or args.target_lang or args.ct2_dir):
        flag = "--source-lang" if args.source_lang else "--target-lang" if args.target_lang else "--ct2-dir"
        raise UserError(f"{flag}: for one --checkpoint; name several models' languages as SRC-TGT=PATH")
    specs = catalog(args.checkpoint, args.models, (args.source_lang, args.target_lang))
    budget = Budget(args.max_loaded_models, parse_size(args.max_memory, "--max-memory"))
    device = resolve_device(args.device, "--device")
    if specs[0].kind == "translation":
        check_backend(args.engine, args.compute_type)
        if args.engine == "torch":
            check_torch_compute(args.compute_type, device)
    load_one = functools.partial(load_model, args=args, device=device)
    models = Models(specs, load_one, budget=budget, engine=args.engine)
    if len(specs) == 1:
        models.registry.preload(specs[0].name)
    return models


def _what(models) -> str:
    if len(models.specs) == 1:
        return f"{models.kind} model"
    pairs = len(models.router.routes)
    return f"{len(models.specs)} models ({pairs} language pairs, loaded on first use)"


def parse_size(text: str | None, flag: str) -> int | None:
    """Bytes of ``2G``, ``500M``, ``64k``, ``1.5GB`` or ``1000000`` (powers of 1024)."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise UserError(f"{flag} {text}: not a size (e.g. 2G, 500M, 1000000)")
    size = int(float(match.group(1)) * 1024 ** "_kmgt".index(match.group(2) or "_"))
    if size < 1:
        raise UserError(f"{flag} {text}: must be more than 0 bytes")
    return size


def load_model(spec, args: argparse.Namespace, device):
    """One model of the server (:class:`aiayn.serve.models.Served`), loaded from its spec."""
    loaded = load(spec.path, device)
    if loaded.kind == "forecast":
        return _forecast_served(loaded)
    return _translation_served(loaded, args, device, spec)


def load_served(args: argparse.Namespace):
    """The one model of ``--checkpoint`` (translation: the backend and the torch model; forecast:
    the model)."""
    models = load_models(args)
    return models.registry.slots[models.only].value


def _translation_served(loaded, args: argparse.Namespace, device, spec):
    from aiayn.serve.documents import backend_warning  # the serve extra (FastAPI): only when serving
    from aiayn.serve.models import Served  # with the serve extra, as documents

    if args.engine == "torch":
        model = torch_model(loaded.model, args.compute_type)  # the page's attention: loaded.model
        backend = Translator(model, loaded.tokenizer, device, warn=backend_warning)
    else:
        backend = load_backend(
            spec.path,
            args.engine,
            device=device,
            ct2_dir=args.ct2_dir,
            compute_type=args.compute_type,
            warn=backend_warning,
        )
    source = spec.sources[0] if len(spec.sources) == 1 else list(spec.sources) or None
    target = spec.targets[0] if len(spec.targets) == 1 else list(spec.targets) or None
    info = {
        "kind": "translation",
        "engine": backend.name,
        "step": loaded.checkpoint.config.get("step"),
        "config": loaded.config.to_dict(),
        "parameters": count_parameters(loaded.model),
        "languages": {"source": source, "target": target},  # the checkpoint's, or as named
        "vocab_size": loaded.tokenizer.vocab_size,
    }
    return Served("translation", info, backend=backend, model=loaded.model, device=device)


def _forecast_served(loaded):
    from aiayn.serve.models import Served  # the serve extra (FastAPI): only when serving

    stored = loaded.checkpoint.config
    data = stored["data"]
    inputs, outputs = forecast_columns(data["columns"], data["features"], data["target"])
    info = {
        "kind": "forecast",
        "engine": "torch",
        "config": loaded.config.to_dict(),
        "parameters": count_parameters(loaded.model),
        "input_len": data["input_len"],
        "horizon": data["horizon"],
        "input_columns": inputs,
        "output_columns": [inputs[o] for o in outputs],
        "outputs": outputs,
    }
    return Served("forecast", info, model=loaded.model, stored=stored)


def forecast_columns(columns: list[str], features: str, target: str) -> tuple[list[str], list[int]]:
    """The model's input columns and the indices (into them) of its outputs, as
    :func:`aiayn.forecast.data.select_features` chooses them."""
    if features == "S":
        return [target], [0]
    outputs = list(range(len(columns))) if features == "M" else [columns.index(target)]
    return list(columns), outputs
