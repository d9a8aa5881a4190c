"""What `playback` and `run --playback` share: the matching and miss options, and loading the run."""

from __future__ import annotations

from pathlib import Path

import click

from toolproxy.playback.fixture import FixtureError, load_fixture
from toolproxy.playback.match import MatchError, parse_rules
from toolproxy.playback.server import ON_MISS, PACES
from toolproxy.term.printable import printable


def miss_line(message: str) -> None:
    click.echo(printable(message), err=True)


def playback_options(fn):
    """What `playback` and `run --playback` share: how requests are matched and misses handled."""
    for option in reversed(
        (
            click.option(
                "--on-miss",
                type=click.Choice(ON_MISS),
                default="fail",
                show_default=True,
                help="fail: answer 404 naming the closest recorded request and the first difference; forward: send "
                "the request to --upstream; record: send it through a recording proxy so it joins the run.",
            ),
            click.option(
                "--pace",
                type=click.Choice(PACES),
                default="fast",
                show_default=True,
                help="fast: each reply at once; recorded: streams piece by piece with the recorded timing.",
            ),
            click.option(
                "--match",
                "match",
                multiple=True,
                metavar="RULE",
                help="Tune matching (repeatable): ignore=PATH (e.g. temperature, messages.*.name), keep=FIELD (a "
                "default-ignored field), mask=REGEX (blank what it finds in every string), body=off, episodes=off, "
                "reuse=on (the last recorded reply again once they are used up).",
            ),
        )
    ):
        fn = option(fn)
    return fn


def load(data_dir: Path, run: str, match: tuple[str, ...]):
    """(the run's recording, the match rules), or a usage error that says what is wrong."""
    try:
        rules = parse_rules(match)
    except MatchError as exc:
        raise click.BadParameter(str(exc), param_hint="--match") from None
    try:
        return load_fixture(data_dir, run), rules
    except FixtureError as exc:
        raise click.ClickException(printable(str(exc))) from None
