"""Helpers the tests share, imported as `tests.support.NAME`."""
