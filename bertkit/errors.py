"""The one error type for user mistakes.

Anything a user can get wrong at the edges (a wrong type, an unknown token id, a
sequence too long, a corrupt or mismatched checkpoint, a bad CLI argument) raises
`BertkitError` with a message that names the problem and, where there is one, the
fix. The CLI prints that message as a single line instead of a traceback. Asserts
are kept for our own invariants only.
"""


class BertkitError(ValueError):
    """A user-facing error: the message says what was wrong and how to fix it."""
