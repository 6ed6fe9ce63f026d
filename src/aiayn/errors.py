"""Errors a user can act on.

The CLI catches :class:`UserError` and prints its message on one line (several problems found at
once: one line each, :func:`joined`), then exits non-zero. Anything else is a bug and keeps its
traceback. A :class:`SettingError` names the library's settings; a command that runs under
:func:`naming_flags` names its own flags in their place.
"""

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence

#: Where warnings go: a function given one line (without ``aiayn: warning:``).
Warn = Callable[[str], None]


def warning(message: str) -> None:
    """The library's default :data:`Warn`: ``aiayn: warning: message`` on stderr."""
    print(f"aiayn: warning: {message}", file=sys.stderr)


class UserError(Exception):
    """Bad input (file, config, checkpoint): the message names the file, line or field."""


class Setting:
    """A setting named inside a :class:`SettingError`: ``compute_type``, or with a value
    ``engine='torch'``; on a command line its flag: ``--compute-type``, ``--engine torch``, and for a
    boolean value the flag alone (``use_cache=False`` -> ``--no-cache``)."""

    def __init__(self, name: str, value: object = None) -> None:
        self.name, self.value = name, value

    def named(self, flags: dict[str, str]) -> str:
        flag = flags.get(self.name)
        if flag is None:
            return self.name if self.value is None else f"{self.name}={self.value!r}"
        return flag if self.value is None or isinstance(self.value, bool) else f"{flag} {self.value}"


class SettingError(UserError):
    """A bad setting, its message made of text and :class:`Setting` parts: the library names the
    settings (``str()``); a command line names its flags instead (:meth:`naming`)."""

    def __init__(self, *parts: str | Setting) -> None:
        self.parts = parts
        super().__init__(self.naming({}))

    def naming(self, flags: dict[str, str]) -> str:
        """The message with each setting in ``flags`` (setting -> flag) named by its flag."""
        return "".join(p.named(flags) if isinstance(p, Setting) else p for p in self.parts)


def joined(errors: Sequence[SettingError]) -> SettingError:
    """One error of several problems found at once, each on its own line."""
    parts: list[str | Setting] = []
    for error in errors:
        parts += ["\n", *error.parts] if parts else error.parts
    return SettingError(*parts)


@contextlib.contextmanager
def naming_flags(flags: dict[str, str]) -> Iterator[None]:
    """A :class:`SettingError` raised inside names the command's ``flags`` (setting -> flag), not the
    library's settings (also a decorator of a command's function)."""
    try:
        yield
    except SettingError as err:
        raise UserError(err.naming(flags)) from None
