"""docs/source/cli.rst documents every subcommand, each flag of it, under the section of
its family, and no command that does not exist."""

import argparse
import re

import pytest
from paths import ROOT

from effectful_durable.cli import FAMILIES, parser

CLI_RST = ROOT / "docs" / "source" / "cli.rst"


def sections() -> dict[str, dict[str, str]]:
    """cli.rst's sections (``---``), each with its subsections (``~~~``) and their text."""
    found: dict[str, dict[str, str]] = {}
    lines = CLI_RST.read_text("utf-8").splitlines()
    section = subsection = None
    for number, line in enumerate(lines):
        underline = lines[number + 1] if number + 1 < len(lines) else ""
        if line and re.fullmatch(r"-{2,}", underline) and len(underline) == len(line):
            section, subsection = line, None
            found[section] = {}
        elif line and re.fullmatch(r"~{2,}", underline) and len(underline) == len(line):
            assert section is not None, f"subsection {line!r} before any section"
            subsection = line
            found[section][subsection] = ""
        elif section is not None and subsection is not None:
            found[section][subsection] += line + "\n"
    return found


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by name."""
    [action] = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


class TestDocumented:
    def test_every_subcommand_under_its_family(self) -> None:
        """Each family is one section of cli.rst, and each of its commands a subsection
        of that section, titled with the command's name."""
        documented = sections()
        for family in FAMILIES:
            title = family.COMMANDS.title
            assert title in documented, f"cli.rst has no section {title!r}"
            for command in family.COMMANDS.commands:
                assert command.name in documented[title], (
                    f"cli.rst documents no {command.name!r} under {title!r}"
                )

    def test_nothing_but_subcommands(self) -> None:
        """Every subsection of a family's section is a subcommand of the parser."""
        names = set(subcommands())
        titles = {family.COMMANDS.title for family in FAMILIES}
        stale = [
            f"{section}: {subsection}"
            for section, found in sections().items()
            if section in titles
            for subsection in found
            if subsection not in names
        ]
        assert not stale, f"cli.rst documents commands that do not exist: {stale}"

    @pytest.mark.parametrize("name", sorted(subcommands()))
    def test_every_flag(self, name: str) -> None:
        """A subcommand's subsection names each of its flags (but ``--json``: the list at
        the top of cli.rst says which commands take it)."""
        text = next(found[name] for found in sections().values() if name in found)
        flags = [
            option
            for action in subcommands()[name]._actions
            for option in action.option_strings[-1:]
            if option not in ("--help", "--json")
        ]
        missing = [o for o in flags if not re.search(rf"{re.escape(o)}(?![\w-])", text)]
        assert not missing, f"cli.rst's {name!r} does not name {missing}"
