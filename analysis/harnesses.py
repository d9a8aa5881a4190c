"""What particular harnesses write, kept as data in one place.

Episode building and roles are generic (analysis.turns), but two facts can only be read in words
a harness chooses: that it rejected the model's last reply (it could not parse a call out of it,
and says so in its next request), and that a call ends the episode as the model's answer (the
harness's own finishing tool). Each entry names the harness it comes from; add new ones here.
(How prompt-protocol harnesses write their tool lists and steps is analysis.protocols' to read.)
"""

from __future__ import annotations

import re

# Text a harness writes into its next request when it could not use the model's reply: that reply
# was not an answer, whatever it looked like, and the harness asked again.
REJECTIONS = (
    "Error while parsing tool call from model output",  # smolagents ToolCallingAgent
    "Your code snippet is invalid, because the regex pattern",  # smolagents CodeAgent, no code block
    "Error in code parsing:",  # smolagents CodeAgent, code that is not Python
    "Invalid Format: Missing 'Action:' after 'Thought:'",  # LangChain ReAct (handle_parsing_errors)
    "Invalid Format: Missing 'Action Input:' after 'Action:'",  # LangChain ReAct
    "Could not parse LLM output:",  # LangChain agents
    "Invalid or incomplete response",  # LangChain agents (handle_parsing_errors, the error not sent)
)
REJECTION = re.compile("|".join(map(re.escape, REJECTIONS)))

# Tools whose call ends an episode with the model's answer, by the prompt protocol they are
# offered under (None: a `tools` field). The harness stops there: a call to one that ends the
# episode's tool use after a tool result is the episode's answer, as prose is in a plain chat loop
# (smolagents takes final_answer("Paris") although its arguments are not an object).
FINISHING_TOOLS = {
    None: frozenset({"final_answer"}),  # smolagents ToolCallingAgent
    "code": frozenset({"final_answer"}),  # smolagents CodeAgent
    "dspy": frozenset({"finish"}),  # dspy ReAct
}


def rejects(texts) -> bool:
    """Whether any of these texts (a request's messages after its last assistant message) is a
    harness saying it could not use the reply before them."""
    return any(REJECTION.search(t) is not None for t in texts if t)


def finishes(protocol: str | None, names) -> bool:
    """Whether a reply calling exactly these tools ends the episode as the answer."""
    tools = FINISHING_TOOLS.get(protocol)
    return bool(tools) and bool(names) and all(n in tools for n in names)
