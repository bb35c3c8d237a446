"""Errors a user can cause. The CLI prints them as one line and exits 2."""


class UserError(Exception):
    """Bad input from a user: unknown name, bad override, missing or corrupt file."""
