"""The one exception type refimpl raises for bad input (files, keys, flags).

Its message is a single line that names the offending file, key, tensor or flag; the CLI prints it
as ``refimpl: error: <message>`` and exits with :data:`EXIT_BAD_INPUT`.
"""

EXIT_BAD_INPUT = 2


class RefimplError(Exception):
    """Bad input: a one-line, user-facing message (no traceback is shown by the CLI)."""
