"""Tool calls that a model wrote as text (docs/stacks.md#tool-calls-left-in-text), and
argument validation against the request's tool schemas.

One parser, two users: the analyzer classifies recorded turns with it, and the `text` and
`template` conditions parse model replies with it at request time. Everything here is a pure
function of its inputs and never raises on any text.
"""

from .jsontext import parse_arguments
from .model import FORMATS, TextCall, TextParse
from .parse import parse_text, start_markers
from .validate import Validation, offered_tools, validate_call

__all__ = [
    "FORMATS",
    "TextCall",
    "TextParse",
    "Validation",
    "offered_tools",
    "parse_arguments",
    "parse_text",
    "start_markers",
    "validate_call",
]
