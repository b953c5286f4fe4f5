"""The one exception type the library raises for bad input.

Every message names the field, the value and the fix, on one line; the CLI turns
it into exit code 2 without a traceback.
"""


class NdplanError(ValueError):
    """Bad input: message says field, value and fix."""

    def __init__(self, field: str, value, fix: str):
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"{field}={value!r}: {fix}")
