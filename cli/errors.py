"""Typed errors of the command line: each says what is wrong; all exit with status 2."""

from __future__ import annotations


class CliError(ValueError):
    """A bad argument or input file. ``pagedkv`` prints the message and exits with 2."""

    exit_code = 2


class BadSize(CliError):
    """A byte size that does not parse (e.g. ``250KB`` parses, ``250 parsecs`` does not)."""


class BadLengths(CliError):
    """A sequence-length file that is missing, empty, or holds something but integers >= 0."""


class BadKernelBench(CliError):
    """A kernel benchmark file in neither supported format."""


class MissingInput(CliError):
    """A figure was asked for without the inputs it needs."""


class ToolMissing(CliError):
    """An external program (Graphviz ``dot``) that the request needs is not installed."""
