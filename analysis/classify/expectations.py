"""What an item expects (`call` or `none`), from its `expect` tag or from an analyst's rules.

Recordings are usually made before anyone decides what each item expects, so besides the
`expect=call|none` tag an analyst can state expectations afterwards, as rules on tags:

    category=irrelevance:none      every item whose category tag is `irrelevance` expects no call
    item=irrelevance_*:none        shell-style patterns on the value (fnmatch, case-sensitive)
    run=bfcl-*:call                any tag works, and run, episode, item, category, condition

The part after the last `:` is the expectation. Rules are tried in order and the last match wins;
a matching rule overrides the recorded `expect` tag (the analyst decides now). Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from toolproxy.analysis.classify.outcomes import EXPECTATIONS

EXPECT_TAG = "expect"


class RuleError(ValueError):
    """A rule the user typed that cannot be read; the message says how to write it."""


@dataclass(frozen=True)
class ExpectationRule:
    key: str
    pattern: str
    expect: str

    def __str__(self) -> str:
        return f"{self.key}={self.pattern}:{self.expect}"

    def matches(self, tags: Mapping[str, str | None]) -> bool:
        value = tags.get(self.key)
        return value is not None and fnmatchcase(str(value), self.pattern)


def parse_rule(text: str) -> ExpectationRule:
    """`KEY=PATTERN:EXPECT`, e.g. `category=irrelevance:none`."""
    selector, sep, expect = text.strip().rpartition(":")
    key, eq, pattern = selector.partition("=")
    key = key.strip().lower()
    if not sep or not eq or not key or not pattern:
        raise RuleError(
            f"cannot read expectation rule {text!r}: write TAG=VALUE:EXPECT, e.g. 'category=irrelevance:none'"
        )
    expect = expect.strip().lower()
    if expect not in EXPECTATIONS:
        raise RuleError(f"expectation rule {text!r} ends in {expect!r}; it must end in :call or :none")
    return ExpectationRule(key, pattern.strip(), expect)


def parse_rules(texts: Sequence[str]) -> list[ExpectationRule]:
    return [parse_rule(t) for t in texts]


def tag_expectation(value: str | None) -> str | None:
    """The recorded `expect` tag, if it is one of the two meaningful values (anything else is ignored)."""
    if value is None:
        return None
    value = value.strip().lower()
    return value if value in EXPECTATIONS else None


def expectation(tags: Mapping[str, str | None], rules: Sequence[ExpectationRule]) -> str | None:
    """The item's expectation: the last matching rule, else its `expect` tag, else None (unknown)."""
    for rule in reversed(rules):
        if rule.matches(tags):
            return rule.expect
    return tag_expectation(tags.get(EXPECT_TAG))
