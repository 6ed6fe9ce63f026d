"""How a language pair is reached: by the model that translates it directly, else through bridge
languages, one model after the other (a pivot).

A pivot goes through English first (source -> en -> target, where both legs are served), else along
the shortest chain the served models allow (breadth first over the languages; among chains of one
length the first found, in the models' order). Every leg is a direct pair
(:func:`aiayn.service.catalog.direct_pairs`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from aiayn.service.catalog import ModelSpec, direct_pairs
from aiayn.service.languages import ENGLISH


@dataclass(frozen=True)
class Leg:
    """One model's step of a route: ``model`` translates ``source`` to ``target`` (a multi-target
    model with its ``token``, the ``>>xx<<`` piece its source starts with)."""

    model: str
    source: str
    target: str
    token: str | None = None

    def describe(self) -> dict:
        return {"model": self.model, "source": self.source, "target": self.target}


@dataclass(frozen=True)
class Route:
    legs: tuple[Leg, ...]

    @property
    def pivoted(self) -> bool:
        return len(self.legs) > 1

    @property
    def languages(self) -> list[str]:
        """The languages it goes through, source first: ``["de", "en", "fr"]``."""
        return [self.legs[0].source, *(leg.target for leg in self.legs)]

    @property
    def models(self) -> list[str]:
        return [leg.model for leg in self.legs]

    def describe(self) -> list[dict]:
        return [leg.describe() for leg in self.legs]


class Router:
    """Routes between the languages of ``specs`` (translation models)."""

    def __init__(self, specs: list[ModelSpec]) -> None:
        self.direct = direct_pairs(specs)
        self.next: dict[str, list[str]] = collections.defaultdict(list)  # language -> direct targets
        for source, target in self.direct:
            self.next[source].append(target)
        self.routes = {pair: route for pair, route in self._all_routes()}

    @property
    def sources(self) -> list[str]:
        return sorted(self.next)

    def route(self, source: str, target: str) -> Route | None:
        return self.routes.get((source, target))

    def targets(self, source: str) -> list[str]:
        """Every language reachable from ``source``, sorted."""
        return sorted(target for (s, target) in self.routes if s == source)

    def _all_routes(self):
        for source in list(self.next):
            for target, chain in self._chains(source).items():
                yield (source, target), Route(tuple(self._leg(a, b) for a, b in zip(chain, chain[1:])))

    def _chains(self, source: str) -> dict[str, list[str]]:
        """The chain of languages to each target reachable from ``source``: direct, through English,
        else the shortest."""
        chains = {target: [source, target] for target in self.next[source]}
        if ENGLISH in chains:
            for target in self.next.get(ENGLISH, ()):  # .get: reading may not add English as a source
                chains.setdefault(target, [source, ENGLISH, target])
        for target, chain in _shortest(source, self.next).items():
            chains.setdefault(target, chain)
        chains.pop(source, None)
        return chains

    def _leg(self, source: str, target: str) -> Leg:
        spec = self.direct[(source, target)]
        return Leg(spec.name, source, target, spec.tokens.get(target))


def _shortest(source: str, graph: dict[str, list[str]]) -> dict[str, list[str]]:
    """Breadth first from ``source``: the first shortest chain of languages to each reachable one."""
    chains, queue = {source: [source]}, collections.deque([source])
    while queue:
        here = queue.popleft()
        for there in graph.get(here, ()):
            if there not in chains:
                chains[there] = [*chains[here], there]
                queue.append(there)
    return chains
