"""User-facing errors.

Anything a user can get wrong (a name, an option, a shape, a file) raises
`GradleakError`; the CLI prints its message as one line and exits with code 2.
"""


class GradleakError(Exception):
    """A problem with the user's input, reported as one line, exit code 2."""


def fail(message: str) -> "None":
    raise GradleakError(message)
