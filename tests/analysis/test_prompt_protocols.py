"""Prompt protocols (analysis.classify.protocols): what a request offers in its prompt, what a reply calls,
and that a step's reply and the same step written back into the next prompt read alike. Tables
of cases, the prompts as the real harnesses write them (tests/data/episodes has their traffic)
and the look-alikes that must stay plain chat."""

from __future__ import annotations

import pytest

from toolproxy.analysis.classify.keys import conversation_keys
from toolproxy.analysis.classify.protocols import CODE, DSPY, REACT, read_prompt, read_reply, reply_message

DSPY_SYSTEM = (
    "Your input fields are:\n1. `question` (str): \n2. `trajectory` (str):\nYour output fields are:\n"
    "1. `next_thought` (str): \n2. `next_tool_name` (Literal['get_weather', 'finish']): \n3. `next_tool_args` "
    "(dict[str, Any]):\n"
    "All interactions will be structured in the following way, with the appropriate values filled in.\n\n"
    "[[ ## question ## ]]\n{question}\n\n[[ ## trajectory ## ]]\n{trajectory}\n\n[[ ## next_thought ## "
    "]]\n{next_thought}\n\n"
    "[[ ## next_tool_name ## ]]\n{next_tool_name}\n\n[[ ## next_tool_args ## ]]\n{next_tool_args}\n\n[[ ## completed "
    "## ]]\n"
    "In adhering to this structure, your objective is: \n        When selecting the next_tool_name and its "
    "next_tool_args, "
    "the tool must be one of:\n        \n"
    "        (1) get_weather, whose description is <desc>Current weather for a city.</desc>. It takes arguments "
    "{'city': {'type': 'string'}}.\n"
    "        (2) finish, whose description is <desc>Marks the task as complete.</desc>. It takes arguments {}.\n"
    "        When providing `next_tool_args`, the value inside the field must be in JSON format"
)
EXTRACT_SYSTEM = (
    "Your input fields are:\n1. `question` (str): \n2. `trajectory` (str):\nYour output fields are:\n1. `reasoning` "
    "(str): \n"
    "2. `answer` (str):\nAll interactions will be structured in the following way.\n\n[[ ## completed ## ]]\n"
    "In adhering to this structure, your objective is: \n        Given the fields `question`, produce the fields "
    "`answer`."
)
RESPOND = "\n\nRespond with the corresponding output fields, starting with the field `[[ ## next_thought ## ]]`."
STEP0 = (
    "[[ ## thought_0 ## ]]\nLook it up.\n\n[[ ## tool_name_0 ## ]]\nget_weather\n\n[[ ## tool_args_0 ## ]]\n"
    '{"city": "Paris"}\n\n[[ ## observation_0 ## ]]\nsunny, 21 C'
)
DSPY_REPLY = (
    "[[ ## next_thought ## ]]\nLook it up.\n\n[[ ## next_tool_name ## ]]\nget_weather\n\n[[ ## "
    'next_tool_args ## ]]\n{"city": "Paris"}\n\n[[ ## completed ## ]]'
)


def dspy(trajectory: str = "", system: str = DSPY_SYSTEM) -> list[dict]:
    return [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": f"[[ ## question ## ]]\nWeather in Paris?\n\n[[ ## trajectory ## ]]\n{trajectory}{RESPOND}",
        },
    ]


REACT_PROMPT = (
    "Answer the following questions as best you can. You have access to the following tools:\n\n"
    "get_weather(city: 'str') -> 'str' - Current weather for a city.\nsearch - Search the web.\n\n"
    "Use the following format:\n\nQuestion: the input question you must answer\nThought: you should always think "
    "about what to do\n"
    "Action: the action to take, should be one of [get_weather, search]\nAction Input: the input to the action\n"
    "Observation: the result of the action\n... (this Thought/Action/Action Input/Observation can repeat N times)\n"
    "Thought: I now know the final answer\nFinal Answer: the final answer to the original input question\n\nBegin!\n\n"
    "Question: What is the weather in Paris?\nThought:"
)
REACT_REPLY = " I should look it up.\nAction: get_weather\nAction Input: Paris"

CODE_SYSTEM = (
    "You are an expert assistant who can solve any task using code blobs.\nThe code sequence must be opened with "
    "'<code>', "
    "and closed with '</code>'.\nHere are a few examples using notional tools:\n<code>\nanswer = "
    "document_qa(document=d)\n</code>\n"
    "You only have access to these tools, behaving like regular python functions:\n<code>\n"
    'def get_weather(city: string) -> string:\n    """Current weather for a city.\n\n    Args:\n        city: City '
    'name\n    """\n\n'
    'def final_answer(answer: any) -> any:\n    """Provides a final answer to the given problem."""\n\n</code>\nNow '
    "Begin!"
)
CODE_REPLY = 'Thought: look it up.\n<code>\nweather = get_weather(city="Oslo")\nprint(weather)\n</code>'
CODE_ECHO = (
    CODE_REPLY + "\nCalling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'python_interpreter', "
    "'arguments': 'weather = get_weather(city=\"Oslo\")\\nprint(weather)'}}]"
)


def names(reading):
    return [t["function"]["name"] for t in reading.tools or []]


# (messages, protocol, offered tools) -- what read_prompt recognises
RECOGNISED = [
    (dspy(), DSPY, ["get_weather", "finish"]),
    (dspy(STEP0), DSPY, ["get_weather", "finish"]),
    (dspy(STEP0, EXTRACT_SYSTEM), DSPY, []),  # the extract step: the trajectory, no tools
    ([{"role": "user", "content": REACT_PROMPT}], REACT, ["get_weather", "search"]),
    (
        [{"role": "system", "content": REACT_PROMPT}, {"role": "user", "content": "Paris?"}],
        REACT,
        ["get_weather", "search"],
    ),
    (
        [{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": "New task:\nWeather in Oslo?"}],
        CODE,
        ["get_weather", "final_answer"],
    ),
    # smolagents' summary at max_steps: another system prompt, the code steps written back
    (
        [
            {"role": "system", "content": "An agent tried to answer a user query but it got stuck."},
            {"role": "user", "content": "New task:\nWeather in Oslo?"},
            {"role": "assistant", "content": CODE_ECHO},
            {"role": "user", "content": "Observation:\nrain"},
        ],
        CODE,
        [],
    ),
]


@pytest.mark.parametrize("messages,protocol,offered", RECOGNISED)
def test_read_prompt_recognises_the_protocols_harnesses_write(messages, protocol, offered):
    reading = read_prompt(messages)
    assert reading is not None and reading.protocol == protocol and names(reading) == offered


# Plain chat that only looks like a protocol: none of these is one.
NOT_PROTOCOLS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "In LangChain, what do 'Action:' and 'Action Input:' mean? And Observation:?"}],
    [
        {
            "role": "user",
            "content": "Explain this format:\nAction: the action to take, should be one of [a tool, another]\n"
            "Action Input: the input\nObservation: the result",
        }
    ],  # names that are not tool names
    [
        {
            "role": "system",
            "content": "You write Python.\n```python\ndef add(a: int, b: int) -> int:\n    return a + b\n```",
        },
        {"role": "user", "content": "Fix it"},
    ],  # a function with a body, not a tool stub with a docstring
    [
        {"role": "user", "content": 'def f(x: int) -> int:\n    """doc"""\n<code>print(f(1))</code>'}
    ],  # stubs in a user message
    [
        {
            "role": "system",
            "content": "Your input fields are:\n1. `q` (str):\nYour output fields are:\n1. `a` (str):\n"
            "[[ ## completed ## ]]",
        },
        {"role": "user", "content": "[[ ## q ## ]]\nhi\n\nRespond with the corresponding output fields"},
    ],  # dspy without tools
    [{"role": "user", "content": [{"type": "text", "text": "no protocol here"}]}],
    [],
    ["not a message", None, 7],
]


@pytest.mark.parametrize("messages", NOT_PROTOCOLS)
def test_plain_chat_stays_plain(messages):
    assert read_prompt(messages) is None


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "final_answer",
            "parameters": {
                "type": "object",
                "properties": {"answer": {}},
                "required": ["answer"],
                "additionalProperties": False,
            },
        },
    },
]

# (protocol, reply text, tools, calls as (name, arguments, error?), attempted)
REPLIES = [
    (DSPY, DSPY_REPLY, None, [("get_weather", {"city": "Paris"}, False)], True),
    (
        DSPY,
        "[[ ## next_thought ## ]] x\n[[ ## next_tool_name ## ]] get_weather\n[[ ## next_tool_args ## ]] "
        '{"city": {"type": "string"}}\n[[ ## completed ## ]]',
        None,
        [("get_weather", {"city": {"type": "string"}}, False)],
        True,
    ),
    (
        DSPY,
        "[[ ## next_tool_name ## ]]\nfinish\n\n[[ ## next_tool_args ## ]]\n{'a': 1}",
        None,
        [("finish", {"a": 1}, False)],
        True,
    ),
    (
        DSPY,
        "[[ ## next_tool_name ## ]]\nget_weather\n\n[[ ## next_tool_args ## ]]\n{city: Paris",
        None,
        [("get_weather", None, True)],
        True,
    ),
    (
        DSPY,
        '{"next_thought": "t", "next_tool_name": "get_weather", "next_tool_args": {"city": "Oslo"}}',
        None,
        [("get_weather", {"city": "Oslo"}, False)],
        True,
    ),  # the JSONAdapter fallback
    (DSPY, "[[ ## reasoning ## ]]\nsunny\n\n[[ ## answer ## ]]\nSunny.", None, [], False),
    (REACT, REACT_REPLY, [TOOLS[0]], [("get_weather", {"city": "Paris"}, False)], True),
    (
        REACT,
        'Thought: x\nAction: get_weather\nAction Input: {"city": "Oslo"}',
        [TOOLS[0]],
        [("get_weather", {"city": "Oslo"}, False)],
        True,
    ),
    (
        REACT,
        "Action: get_weather(city='Paris')\nAction Input: None",
        [TOOLS[0]],
        [("get_weather(city='Paris')", None, True)],
        True,
    ),  # not a tool
    (REACT, "Action: two\nAction Input: a and b", TOOLS, [("two", None, True)], True),
    (REACT, " I now know the final answer\nFinal Answer: Sunny.", [TOOLS[0]], [], False),
    (REACT, "Thought: hmm\nAction:", [TOOLS[0]], [], True),  # LangChain: Missing 'Action Input:'
    (CODE, CODE_REPLY, TOOLS, [("get_weather", {"city": "Oslo"}, False)], True),
    (
        CODE,
        '<code>\nfinal_answer("It rains.")\n</code>',
        TOOLS,
        [("final_answer", {"answer": "It rains."}, False)],
        True,
    ),
    (
        CODE,
        "<code>\nw = get_weather(city=town)\nfinal_answer(w)\n",
        TOOLS,  # a block a stop sequence left open
        [("get_weather", {"city": "town"}, False), ("final_answer", {"answer": "w"}, False)],
        True,
    ),
    (
        CODE,
        '<code>\nx = wikipedia_search(query="Oslo")\nprint(len(x))\n</code>',
        TOOLS,
        [("wikipedia_search", {"query": "Oslo"}, False)],
        True,
    ),
    (
        CODE,
        "<code>\ndef helper(a):\n    return a\nprint(helper(2) + 1)\n</code>",
        TOOLS,
        [],
        False,
    ),  # defined here, and builtins
    (CODE, "<code>\nthis is not python(\n</code>", TOOLS, [], True),
    (CODE, "Thought: I will answer directly: it rains.", TOOLS, [], False),
    (CODE, '```py\nprint(get_weather("Oslo"))\n```', TOOLS, [("get_weather", {"city": "Oslo"}, False)], True),
]


@pytest.mark.parametrize("protocol,text,tools,calls,attempted", REPLIES)
def test_read_reply(protocol, text, tools, calls, attempted):
    parse = read_reply(protocol, text, tools)
    assert [(c.name, c.arguments, c.error is not None) for c in parse.calls] == calls
    assert parse.attempted == attempted
    assert all(c.format == protocol for c in parse.calls)


@pytest.mark.parametrize("text", ["", None, "x" * (300 * 1024)])
def test_read_reply_of_nothing_or_too_much_is_no_call(text):
    for protocol in (DSPY, REACT, CODE):
        assert read_reply(protocol, text, TOOLS).calls == ()


def chain(messages, protocol_reply):
    """The chain hash a reply gets, and the parents the next request (given) names."""
    reading = read_prompt(messages)
    tools = reading.tools
    parse = read_reply(reading.protocol, protocol_reply, tools)
    reply = reply_message(reading.protocol, protocol_reply, [(c.name, c.arguments) for c in parse.calls])
    return conversation_keys(reading.messages, tool_set="t", tool_names=names(reading), model="m", reply=reply)


def parents(messages):
    reading = read_prompt(messages)
    return conversation_keys(reading.messages, tool_set="t", tool_names=names(reading), model="m", reply=None)


@pytest.mark.parametrize(
    "first,reply,second",
    [
        # dspy rewrites the whole prompt: the next one's trajectory holds the reply's fields
        (dspy(), DSPY_REPLY, dspy(STEP0)),
        # LangChain: the scratchpad at the end of the prompt holds the reply and the observation
        (
            [{"role": "user", "content": REACT_PROMPT}],
            REACT_REPLY,
            [{"role": "user", "content": REACT_PROMPT + REACT_REPLY + "\nObservation: sunny\nThought: "}],
        ),
        # smolagents CodeAgent: the reply written back with its own interpreter record after it
        (
            [{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": "Oslo?"}],
            CODE_REPLY,
            [
                {"role": "system", "content": CODE_SYSTEM},
                {"role": "user", "content": "Oslo?"},
                {"role": "assistant", "content": CODE_ECHO},
                {"role": "user", "content": "Observation:\nExecution logs:\nrain"},
            ],
        ),
    ],
)
def test_a_step_written_back_into_the_next_prompt_chains_to_its_reply(first, reply, second):
    keys = chain(first, reply)
    later = parents(second)
    assert keys.chain_hash in later.parent_hashes
    assert later.tool_results == keys.tool_results + 1  # the observation came back: the harness acted on it
    other = chain(first, reply.replace("Paris", "Rome").replace("Oslo", "Rome"))
    assert other.chain_hash not in later.parent_hashes


def test_a_code_agent_reply_without_code_written_back_with_its_closing_tag_chains():
    """smolagents appends `</code>` to a reply before writing it back, code or not, and says it found none."""
    first = [{"role": "system", "content": CODE_SYSTEM}, {"role": "user", "content": "Oslo?"}]
    reply = "The weather in Oslo is rainy."
    later = parents(
        first
        + [
            {"role": "assistant", "content": reply + "</code>"},
            {
                "role": "user",
                "content": "Error:\nError in code parsing:\nYour code snippet is invalid, because "
                "the regex pattern <code>(.*?)</code> was not found in it.",
            },
        ]
    )
    assert chain(first, reply).chain_hash in later.parent_hashes and later.rejects


@pytest.mark.timeout(5)
def test_a_reply_of_actions_without_input_is_read_in_linear_time():
    """LangChain's one regex took 10 s on this 40 KB reply (it rescans from every 'Action:')."""
    for text in ("Action: " * 5000, "Action Input: x\n" + "Action: " * 5000):
        assert read_reply(REACT, text, TOOLS).calls == ()
