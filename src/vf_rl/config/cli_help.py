"""Help, ``--version`` and usage errors for vf-rl's commands (``vf-rl`` and its subcommands,
``vf-train``, ``vf-vllm``, ``vf-sft``).

Each command builds a :class:`CommandParser`: an ``argparse.ArgumentParser`` whose description
and epilog keep their paragraphs as written, with ``-h/--help`` and ``--version``, and whose
usage errors are one line with exit status 2. Standard library only (the config's own modules
load lazily), so ``--help`` imports neither torch nor vLLM.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_USAGE = 2
HELP_FLAGS = ("-h", "--help", "--version")


def version() -> str:
    """vf-rl's version from the installed package's metadata; ``unknown`` where vf-rl runs from a
    checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("vf-rl")
    except PackageNotFoundError:
        return "unknown"


HELP_COLUMN = 32
"""The rightmost column where an option's help starts (argparse starts it nearer for short options)."""
HELP_WIDTH = 100


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Paragraphs of the description and epilog as written; option help wrapped beside a wider
    column of option names, each option's value named once (``-s, --session SESSION``)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=HELP_COLUMN, width=HELP_WIDTH)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)  # "learning-rate" stays whole


def command_list(title: str, commands: dict[str, str]) -> str:
    """``title`` and one entry a command: its name, then its description wrapped beside the names."""
    import textwrap

    column = max(len(name) for name in commands) + 4
    lines = [title]
    for name, what in commands.items():
        wrapped = textwrap.wrap(what, HELP_WIDTH - column - 2, break_on_hyphens=False)
        lines.append(f"  {name:<{column - 2}}{wrapped[0]}")
        lines += [" " * column + rest for rest in wrapped[1:]]
    return "\n".join(lines)


class CommandParser(argparse.ArgumentParser):
    """An argument parser for one of vf-rl's commands.

    Args:
        prog: the command as the user types it (``"vf-rl plot"``); it starts each error line.
        usage: the usage lines after ``usage: `` (several forms, one a line).
        description: what the command does, in sentences; paragraphs are kept.
        epilog: text after the options (exit statuses, examples).

    ``-h/--help`` prints the help and exits 0, ``--version`` prints ``vf-rl <version>`` and exits 0.
    A usage error (an unknown option, a missing or malformed value) prints one line,
    ``<prog>: error: <what> (<prog> --help lists the options)``, to stderr and exits 2.
    """

    def __init__(self, prog: str, *, usage: str, description: str, epilog: str | None = None) -> None:
        super().__init__(prog=prog, usage=usage, description=description, epilog=epilog,
                         formatter_class=HelpFormatter, add_help=False, allow_abbrev=False)
        self.add_argument("-h", "--help", action="help", help="Print this help and exit.")
        self.add_argument("--version", action="version", version=f"vf-rl {version()}",
                          help="Print vf-rl's version and exit.")

    def error(self, message: str) -> None:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def looks_like_at(argv: list[str]) -> bool:
    """Whether ``argv`` starts with ``@ config.toml`` or ``@config.toml``."""
    return bool(argv) and argv[0].startswith("@")


def parse_at_command(parser: CommandParser, argv: list[str]) -> tuple[Path, argparse.Namespace]:
    """Parse ``@ config.toml [options]`` for a command whose first argument is ``@``.

    Without a config, ``-h``, ``--help`` and ``--version`` are the parser's (they print and exit
    0), and no arguments at all print the help to stderr and exit 2 (a usage error). After the
    config, ``parser`` reads the options (``--help`` included).

    Returns:
        The config file's path and the parsed options.
    Raises:
        ConfigError: the first argument is not ``@`` (one line).
        SystemExit: help or version printed (0), a usage error (2).
    """
    from vf_rl.config.schema import parse_at_args

    if not argv:
        parser.print_help(sys.stderr)
        parser.exit(EXIT_USAGE)
    if not looks_like_at(argv) and any(a in HELP_FLAGS for a in argv):
        parser.parse_args(argv)  # prints the help or the version and exits
    path, rest = parse_at_args(argv, parser.prog)
    return path, parser.parse_args(rest)
