"""Which models are loaded: each on first use, once however many requests ask for it at once (they
wait for the one load), and unloaded least recently used beyond a budget: a number of models
(``max_loaded``) and bytes of weights on disk (``max_bytes``: each model counted at its
``model.safetensors``' size).

A model is unloaded only while no request uses it: when every loaded model is in use the budget is
exceeded until one is released (a pivot holds all its models while it translates). Models are
unloaded before a new one loads, so that the process's peak stays within the budget. A model that
fails to load (a missing or corrupt file) is said once through ``log`` and refused from then on
(:class:`Unavailable`) while every other model keeps serving.

Used in one asyncio event loop; ``load`` runs in the ``loader`` executor (the loop never waits on
it), ``opened`` and ``closed`` in the loop (to start and stop what the loaded model runs there;
``closed`` may return an awaitable that ends when the model is no longer held), then
:func:`aiayn.malloc.give_back_freed_memory` gives the unloaded model's memory back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

import torch

from aiayn.errors import UserError
from aiayn.malloc import give_back_freed_memory
from aiayn.service.catalog import ModelSpec

T = TypeVar("T")


class Unavailable(Exception):
    """A model that failed to load: its message says why."""


@dataclass
class _Slot(Generic[T]):
    spec: ModelSpec
    value: T | None = None
    loading: asyncio.Future | None = None
    users: int = 0
    used: int = 0  # when last used (the registry's clock)
    error: str | None = None
    loads: int = 0
    opened: bool = False  # its ``opened`` has run (and ``closed`` has not)


@dataclass(frozen=True)
class Budget:
    max_loaded: int | None = None  # models loaded at once; None: no limit
    max_bytes: int | None = None  # their weights' bytes on disk; None: no limit

    def check(self, specs: list[ModelSpec]) -> None:
        """A budget no model fits in is refused at start."""
        if self.max_loaded is not None and self.max_loaded < 1:
            raise UserError("--max-loaded-models: must be >= 1")
        too_large = [s for s in specs if self.max_bytes is not None and s.size > self.max_bytes]
        if too_large:
            raise UserError(
                f"--max-memory {self.max_bytes}: smaller than the model {too_large[0].path} "
                f"({too_large[0].size} bytes of weights)"
            )


class Registry(Generic[T]):
    def __init__(
        self,
        specs: list[ModelSpec],
        load: Callable[[ModelSpec], T],
        loader: Executor,
        *,
        budget: Budget = Budget(),
        opened: Callable[[T], None] = lambda value: None,
        closed: Callable[[T], Any] = lambda value: None,
        log: Callable[[str], None] = print,
    ) -> None:
        budget.check(specs)
        self.slots: dict[str, _Slot[T]] = {spec.name: _Slot(spec) for spec in specs}
        self.load, self.loader, self.budget = load, loader, budget
        self.opened, self.closed, self.log = opened, closed, log
        self._clock = itertools.count(1)
        self._loads: asyncio.Lock | None = None
        self._released: set[asyncio.Task] = set()  # memory being given back

    # --- using a model ------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def use(self, name: str):
        """The loaded model ``name`` while the block runs (loaded first if need be; never unloaded
        meanwhile)."""
        slot = self.slots[name]
        slot.users += 1
        try:
            slot.used = next(self._clock)
            yield await self._loaded(slot)
        finally:
            slot.users -= 1
            slot.used = next(self._clock)
            self._within_budget()

    @contextlib.asynccontextmanager
    async def use_all(self, names: list[str]):
        """Every model of ``names`` at once (a pivot's), loaded one after the other."""
        async with contextlib.AsyncExitStack() as stack:
            yield [await stack.enter_async_context(self.use(name)) for name in names]

    def preload(self, name: str) -> T:
        """Load ``name`` now, outside the event loop (a server of one model loads it at start: a bad
        checkpoint is then said at once). Its ``opened`` runs at its first use."""
        slot = self.slots[name]
        slot.value, slot.loads = self.load(slot.spec), slot.loads + 1
        slot.used = next(self._clock)
        return slot.value

    async def _loaded(self, slot: _Slot[T]) -> T:
        if slot.error is not None:
            raise Unavailable(slot.error)
        if slot.value is not None:
            self._open(slot)
            return slot.value
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot))
        return await asyncio.shield(slot.loading)

    async def _load(self, slot: _Slot[T]) -> T:
        """Load one model at a time: the budget is checked when its load starts (the models loaded
        by then counted), so that the loads of two cold models asked at once stay within it."""
        async with self._one_load():
            try:
                self._within_budget(room_for=slot.spec)
                await asyncio.gather(*self._released, return_exceptions=True)  # their memory back first
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(self.loader, self.load, slot.spec)
            except Exception as err:  # a model that cannot load: said once, refused from then on
                slot.error = f"model {slot.spec.name} cannot be loaded: {_one_line(err)}"
                self.log(slot.error)
                raise Unavailable(slot.error) from None
            finally:
                slot.loading = None
            slot.value, slot.loads = value, slot.loads + 1
            self._open(slot)
        self._within_budget()
        return value

    def _one_load(self) -> asyncio.Lock:
        if self._loads is None:  # made in the event loop that uses it
            self._loads = asyncio.Lock()
        return self._loads

    def _open(self, slot: _Slot[T]) -> None:
        if not slot.opened:
            self.opened(slot.value)
            slot.opened = True

    # --- the budget ---------------------------------------------------------------------------------
    def _within_budget(self, room_for: ModelSpec | None = None) -> None:
        """Unload idle models, least recently used first, until the loaded ones (and ``room_for``,
        about to load) fit the budget, or no idle one is left."""
        while not self._fits(room_for):
            idle = [s for s in self.slots.values() if s.value is not None and s.users == 0]
            if not idle:
                return
            self._unload(min(idle, key=lambda s: s.used))

    def _fits(self, extra: ModelSpec | None) -> bool:
        loaded = [s.spec for s in self.slots.values() if s.value is not None and s.spec is not extra]
        loaded += [extra] if extra else []
        count, size = self.budget.max_loaded, self.budget.max_bytes
        return (count is None or len(loaded) <= count) and (
            size is None or sum(s.size for s in loaded) <= size
        )

    def _unload(self, slot: _Slot[T]) -> None:
        value, slot.value = slot.value, None
        stopping = None
        if slot.opened:
            stopping = self.closed(value)
            slot.opened = False
        del value
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a registry used outside one)
            release_memory()
            return
        task = loop.create_task(self._release(stopping))
        self._released.add(task)
        task.add_done_callback(self._released.discard)

    async def _release(self, stopping) -> None:
        """Give the memory back once what still held the model has stopped (``closed``'s awaitable:
        a batcher's task, cancelled), in the loader's thread (a collection and a trim take tens of
        milliseconds)."""
        if stopping is not None:
            with contextlib.suppress(BaseException):
                await stopping
        await asyncio.get_running_loop().run_in_executor(self.loader, release_memory)

    async def unload_all(self) -> None:
        """Unload every model, and wait until their memory is given back."""
        for slot in self.slots.values():
            if slot.value is not None:
                self._unload(slot)
        await asyncio.gather(*self._released, return_exceptions=True)

    # --- what is there ------------------------------------------------------------------------------
    def status(self, name: str) -> dict[str, Any]:
        slot = self.slots[name]
        state = (
            "failed"
            if slot.error
            else "loaded"
            if slot.value is not None
            else "loading"
            if slot.loading
            else "unloaded"
        )
        return {
            "loaded": slot.value is not None,
            "state": state,
            "loads": slot.loads,
            "in_use": slot.users,
            "error": slot.error,
        }

    def loaded(self) -> list[str]:
        return [name for name, slot in self.slots.items() if slot.value is not None]


def release_memory() -> None:
    """Give an unloaded model's memory back: its tensors freed (reference cycles too), the heap's
    free pages returned to the system, CUDA's cached blocks released."""
    gc.collect()
    give_back_freed_memory()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _one_line(err: Exception) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0]
