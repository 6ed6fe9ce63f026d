"""Errors a user can act on.

The CLI catches :class:`UserError` and prints its message on one line, then exits non-zero.
Anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input (file, config, checkpoint): the message names the file, line or field."""
