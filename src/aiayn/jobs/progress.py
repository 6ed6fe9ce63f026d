"""A job's progress on stderr: on a terminal a bar (lines done of the job's, sentences per second,
time left); in a log or a pipe a plain line now and then (:data:`EVERY_S`) and one at the end."""

from __future__ import annotations

import sys
import time
from typing import IO

EVERY_S = 60.0


class Progress:
    """Counts lines (:meth:`lines`, a chunk committed) and sentences (:meth:`sentences`, the
    engine's callback per batch) of ``total`` lines, ``done`` of them done before this run."""

    def __init__(
        self,
        total: int,
        done: int = 0,
        *,
        enabled: bool = True,
        stream: IO[str] | None = None,
        label: str = "aiayn",
        every_s: float = EVERY_S,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.label, self.every_s = total, done, label, every_s
        self.enabled = enabled
        self.start = self.said = time.monotonic()
        self.count_sentences, self.new_lines = 0, 0
        self.bar = None
        if enabled and _is_terminal(self.stream):
            from tqdm import tqdm  # here: only a run on a terminal draws a bar

            self.bar = tqdm(total=total, initial=done, unit="line", file=self.stream, dynamic_ncols=True)

    def sentences(self, n: int) -> None:
        self.count_sentences += n
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self._rate():.1f} sent/s", refresh=True)

    def lines(self, n: int) -> None:
        self.done += n
        self.new_lines += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.monotonic() - self.said >= self.every_s:
            self._say()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.new_lines:
            self._say()

    def _rate(self) -> float:
        return self.count_sentences / max(time.monotonic() - self.start, 1e-9)

    def _say(self) -> None:
        self.said = now = time.monotonic()
        elapsed = max(now - self.start, 1e-9)
        share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        left = self.total - self.done
        eta = f", {_duration(left * elapsed / self.new_lines)} left" if left and self.new_lines else ""
        print(
            f"{self.label}: {self.done:,}/{self.total:,} lines{share}, {self._rate():.1f} sent/s{eta}",
            file=self.stream,
            flush=True,
        )


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
