"""User-facing errors.

Anything a user can get wrong (a name, an option, a shape, a file) raises
`GradleakError`; the CLI prints its message as one line and exits with code 2.
The subclasses name the kind of failure, for callers that want to tell them apart.
"""


class GradleakError(Exception):
    """A problem with the user's input, reported as one line, exit code 2."""

    def __str__(self) -> str:
        # One line whatever the message: a multi-line cause (a YAML excerpt, a warning)
        # is folded so the CLI's promise of a single stderr line holds.
        text = super().__str__()
        if "\n" not in text and "\r" not in text:
            return text
        return " ".join(line.strip() for line in text.splitlines() if line.strip())


class OptionRangeError(GradleakError):
    """A numeric option outside its allowed range (or not finite)."""


class ResourceLimitError(GradleakError):
    """A model, input or run size beyond the documented maximums (memory or time)."""


class DeviceError(GradleakError):
    """A device that is not auto, cpu or an available cuda[:N]."""


class InputFileError(GradleakError):
    """A data, weights, sweep or text file that is missing, unreadable, malformed or hostile."""


class StoreError(InputFileError):
    """A results store that is not ours, damaged, or holds malformed rows."""


class OutputPathError(GradleakError):
    """An output path that cannot be written (an existing file, no permission, too long)."""


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like Ctrl-C (stores stay consistent), exit code 143."""


def fail(message: str) -> "None":
    raise GradleakError(message)
