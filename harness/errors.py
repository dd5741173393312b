"""User-facing errors: anything the user can fix is raised as `UserError` and printed as one line."""

from adapters.base import AdapterError


class UserError(AdapterError):
    """Bad input to the harness (unknown suite, bad database URL, missing data file...): exit code 2."""
