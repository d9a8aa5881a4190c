"""Real model output, one row per example, with where it was taken from.

Sources (public repositories; the text is model output quoted in their tests or issues):
  vllm-hermes   vllm-project/vllm tests/tool_parsers/test_hermes_tool_parser.py
  vllm-llama3   vllm-project/vllm tests/tool_parsers/test_llama3_json_tool_parser.py
  vllm-mistral  vllm-project/vllm tests/tool_parsers/test_mistral_tool_parser.py
  vllm-pythonic vllm-project/vllm tests/tool_parsers/test_pythonic_tool_parser.py
  vllm-llama4   vllm-project/vllm tests/tool_parsers/test_llama4_pythonic_tool_parser.py
  vllm-qwen3c   vllm-project/vllm tests/tool_parsers/test_qwen3coder_tool_parser.py
  vllm-fgemma   vllm-project/vllm tests/tool_parsers/test_functiongemma_tool_parser.py
  llamacpp      ggml-org/llama.cpp tests/test-chat.cpp (Hermes 2 Pro, Llama 3.x, Mistral, Command-R sections)
  ollama        ollama/ollama tools/tools_test.go (TestParseToolCalls, TestParseJSONToolCalls)
  lmstudio      lmstudio-ai/docs 1_developer/3_openai-compat/tools.md (default tool format)
  issue:X       the GitHub issue named, quoting real output
  realstack     captured here: Qwen2.5-Coder-0.5B-Instruct GGUF on the shared/realstack llama-server,
                tools=[get_weather, write_file], temperature 0, HTTP 200, finish_reason "stop",
                tool_calls null: the call is only in `content` (the stack's parser did not see it)

Each row: (id, text, expected calls as (name, arguments, format) with arguments None when they
must not parse, attempted, expected content or None to skip the content check).
"""

WEATHER_SF = {"format": "fahrenheit", "location": "San Francisco, CA"}
WEATHER_TO = {"format": "celsius", "location": "Toronto, Canada"}
OLLAMA_T1 = '{"name": "get_current_weather", "arguments": {"format":"fahrenheit","location":"San Francisco, CA"}}'
OLLAMA_T2 = '{"name": "get_current_weather", "arguments": {"format":"celsius","location":"Toronto, Canada"}}'
QWEN3C_WEATHER = (
    "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
    "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>"
)
DALLAS = {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}
SF = {"city": "San Francisco", "state": "CA", "unit": "celsius"}

ROWS = [
    # ---------------------------------------------------------------- Hermes / Qwen <tool_call>
    (
        "vllm-hermes-between-tags",
        '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>',
        [("final_answer", {"trigger": True}, "hermes")],
        True,
        "",
    ),
    (
        "vllm-hermes-until-eos",
        '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}',
        [("final_answer", {"trigger": True}, "hermes")],
        True,
        "",
    ),
    (
        "vllm-hermes-invalid-json",
        '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}',
        [("final_answer", None, "hermes")],
        True,
        "",
    ),
    (
        "vllm-hermes-serialized-arguments",
        '<tool_call>\n{"name": "get_db_config", "arguments": "{\\"param\\": \\"max_connections\\"}"}\n</tool_call>',
        [("get_db_config", {"param": "max_connections"}, "hermes")],
        True,
        "",
    ),
    (
        "vllm-hermes-bare-string-arguments",
        '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>',
        [("do_thing", None, "hermes")],
        True,
        "",
    ),
    (
        "vllm-hermes-content-then-call",
        'Sure, let me check the weather.<tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>',
        [("get_weather", {"city": "NYC"}, "hermes")],
        True,
        "Sure, let me check the weather.",
    ),
    (
        "vllm-hermes-parallel",
        '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call><tool_call>{"name": "search", '
        '"arguments": {"q": "dogs"}}</tool_call>',
        [("search", {"q": "cats"}, "hermes"), ("search", {"q": "dogs"}, "hermes")],
        True,
        "",
    ),
    ("vllm-hermes-no-call", "This is not a tool call.", [], False, "This is not a tool call."),
    (
        "llamacpp-hermes-content-before",
        'Hello, world!\nWhat\'s up?<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "Hello, world!\nWhat's up?",
    ),
    (
        "llamacpp-hermes-think-then-call",
        'I\'m\nthinking</think>\n<tool_call>{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "I'm\nthinking</think>",
    ),
    (
        "llamacpp-hermes-tool-tag",
        '<tool>\n  {"name": "special_function", "arguments": {"arg1": 1}}\n</tool>',
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-tools-tag",
        '<tools>\n  {"name": "special_function", "arguments": {"arg1": 1}}\n</tools>',
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-json-tag",
        '<json>\n  {"name": "special_function", "arguments": {"arg1": 1}}\n</json>',
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-xml-tag",
        '<xml>\n  {\n    "name": "special_function", "arguments": {"arg1": 1}\n  }\n</xml>',
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-function-call-in-fence",
        '```json\n\n                    <function_call> {"name": "special_function", "arguments": {"arg1": 1}} \n     '
        "               </function_call> \n``` ",
        [("special_function", {"arg1": 1}, "hermes")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-python-lines",
        '<tool_call>\n{"name": "python", "arguments": {"code": "# This is a program:\\nprint(\'hey\')"}}\n</tool_call>',
        [("python", {"code": "# This is a program:\nprint('hey')"}, "hermes")],
        True,
        "",
    ),
    (
        "ollama-qwen25-with-prefix",
        f"<tool_call>{OLLAMA_T1}</tool_call>",
        [("get_current_weather", WEATHER_SF, "hermes")],
        True,
        "",
    ),
    (
        "ollama-qwen25-list-in-tag-trailing-text",
        f"<tool_call> [{OLLAMA_T1}, {OLLAMA_T2}] </tool_call> some tokens after call",
        [("get_current_weather", WEATHER_SF, "hermes"), ("get_current_weather", WEATHER_TO, "hermes")],
        True,
        "some tokens after call",
    ),
    (
        "ollama-qwen25-without-and-with-prefix",
        f"{OLLAMA_T1} <tool_call>{OLLAMA_T1}</tool_call> <tool_call>{OLLAMA_T2}</tool_call>",
        [
            ("get_current_weather", WEATHER_SF, "bare_json"),
            ("get_current_weather", WEATHER_SF, "hermes"),
            ("get_current_weather", WEATHER_TO, "hermes"),
        ],
        True,
        "",
    ),
    (
        "ollama-llama3-groq-xml-tags",
        f"<tool_call>\n\t\t{OLLAMA_T1}\n\t\t</tool_call>",
        [("get_current_weather", WEATHER_SF, "hermes")],
        True,
        "",
    ),
    ("hermes-broken-no-name", "<tool_call>{broken", [(None, None, "hermes")], True, ""),
    (
        "hermes-empty-tag-at-eos",
        "Let me look that up.\n<tool_call>",
        [(None, None, "hermes")],
        True,
        "Let me look that up.",
    ),
    # ---------------------------------------------------------------- Qwen3-Coder XML
    ("vllm-qwen3c-single", QWEN3C_WEATHER, [("get_current_weather", DALLAS, "qwen_xml")], True, ""),
    (
        "vllm-qwen3c-with-content",
        "Sure! Let me check the weather for you." + QWEN3C_WEATHER,
        [("get_current_weather", DALLAS, "qwen_xml")],
        True,
        "Sure! Let me check the weather for you.",
    ),
    (
        "vllm-qwen3c-multiline-json-param",
        "<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n"
        '<parameter=dimensions>\n{"width": '
        '10, \n "height": 20}\n</parameter>\n<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>',
        [
            (
                "calculate_area",
                {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2},
                "qwen_xml",
            )
        ],
        True,
        "",
    ),
    (
        "vllm-qwen3c-parallel",
        QWEN3C_WEATHER + "\n" + QWEN3C_WEATHER.replace("Dallas", "Orlando").replace("TX", "FL"),
        [
            ("get_current_weather", DALLAS, "qwen_xml"),
            ("get_current_weather", {"city": "Orlando", "state": "FL", "unit": "fahrenheit"}, "qwen_xml"),
        ],
        True,
        "",
    ),
    (
        "vllm-qwen3c-fallback-no-tags",
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>",
        [("get_current_weather", {"city": "Dallas", "state": "TX"}, "qwen_xml")],
        True,
        "",
    ),
    (
        "issue:llama.cpp#15012-content-then-xml",
        "I need to check the weather for Tokyo and Paris as well. Let me get that information for "
        "you.\n\n<tool_call>\n<function=get_current_weather>\n<parameter=location>\nTokyo, "
        "Japan\n</parameter>\n</function>\n</tool_call> ",
        [("get_current_weather", {"location": "Tokyo, Japan"}, "qwen_xml")],
        True,
        "I need to check the weather for Tokyo and Paris as well. Let me get that information for you.",
    ),
    (
        "llamacpp-functionary-function-eq-json",
        '<function=special_function>{"arg1": 1}</function>',
        [("special_function", {"arg1": 1}, "qwen_xml")],
        True,
        "",
    ),
    (
        "llamacpp-function-name-attr-json",
        '<function name="special_function">\n{"arg1": 1}\n</function>',
        [("special_function", {"arg1": 1}, "qwen_xml")],
        True,
        "",
    ),
    (
        "qwen3c-truncated-mid-parameter",
        "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n<parameter=content>\nprint(",
        [("write_file", {"path": "/tmp/a.py", "content": "print("}, "qwen_xml")],
        True,
        "",
    ),
    # ---------------------------------------------------------------- Llama 3.x JSON, <|python_tag|>
    (
        "llamacpp-llama3-parameters",
        '{"name": "special_function", "parameters": {"arg1": 1}}',
        [("special_function", {"arg1": 1}, "llama_json")],
        True,
        "",
    ),
    (
        "vllm-llama3-simple-in-prose",
        'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like to know more?',
        [("getOpenIncidentsTool", {}, "llama_json")],
        True,
        "Here is the result:  Would you like to know more?",
    ),
    (
        "vllm-llama3-arguments-key",
        '{"name": "searchTool", "arguments": {"query": "test"}}',
        [("searchTool", {"query": "test"}, "bare_json")],
        True,
        "",
    ),
    (
        "vllm-llama3-semicolons",
        '{"name": "searchTool", "parameters": {"query": "test1"}}; {"name": "getOpenIncidentsTool", "parameters": '
        '{}}; {"name": "searchTool", "parameters": {"query": "test2"}}',
        [
            ("searchTool", {"query": "test1"}, "llama_json"),
            ("getOpenIncidentsTool", {}, "llama_json"),
            ("searchTool", {"query": "test2"}, "llama_json"),
        ],
        True,
        "",
    ),
    (
        "vllm-llama3-semicolons-surrounding-text",
        'Here are the results: {"name": "searchTool", "parameters": {"query": "test1"}}; {"name": '
        '"getOpenIncidentsTool", "parameters": {}}; {"name": "searchTool", "parameters": {"query": "test2"}} '
        "Would you like to know more?",
        [
            ("searchTool", {"query": "test1"}, "llama_json"),
            ("getOpenIncidentsTool", {}, "llama_json"),
            ("searchTool", {"query": "test2"}, "llama_json"),
        ],
        True,
        "Here are the results:  Would you like to know more?",
    ),
    (
        "vllm-llama3-brackets-in-strings",
        '{"name": "searchTool", "parameters": {"query": "test {value} [complex]","nested": {"inner": "more '
        '{brackets}"}}}',
        [("searchTool", {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}}, "llama_json")],
        True,
        "",
    ),
    (
        "vllm-llama3-escaped-quotes",
        '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
        [("parserTool", {"text": 'He said "Hello {world}"'}, "llama_json")],
        True,
        "",
    ),
    (
        "vllm-llama3-invalid-json",
        '{"name": "invalidTool", "parameters": {invalid json}',
        [("invalidTool", None, "bare_json")],
        True,
        None,
    ),
    ("vllm-llama3-missing-name", '{"parameters": {}}', [], False, '{"parameters": {}}'),
    ("vllm-llama3-missing-arguments", '{"name": "toolWithoutParams"}', [], False, '{"name": "toolWithoutParams"}'),
    (
        "vllm-llama3-brace-in-trailing-text",
        '{"name": "searchTool", "parameters": {"query": "test"}} I used {searchTool} for this.',
        [("searchTool", {"query": "test"}, "llama_json")],
        True,
        "I used {searchTool} for this.",
    ),
    (
        "vllm-llama3-json-fragment-in-trailing-text",
        '{"name": "searchTool", "parameters": {"query": "test"}} The arguments I passed were {"query": "test"}',
        [("searchTool", {"query": "test"}, "llama_json")],
        True,
        'The arguments I passed were {"query": "test"}',
    ),
    (
        "llamacpp-llama31-python-tag-builtin",
        "<|python_tag|>code_interpreter.call(code=\"print('hey')\")",
        [("code_interpreter", {"code": "print('hey')"}, "python_tag")],
        True,
        "",
    ),
    (
        "llama31-python-tag-json-eom",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
        [("get_weather", {"city": "Paris"}, "python_tag")],
        True,
        "",
    ),
    # ---------------------------------------------------------------- Mistral [TOOL_CALLS]
    (
        "vllm-mistral-pre-v11-add",
        '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]',
        [("add", {"a": 3.5, "b": 4}, "mistral")],
        True,
        "",
    ),
    (
        "vllm-mistral-argument-before-name",
        '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]',
        [("get_age", {"name": "John Doe"}, "mistral")],
        True,
        "",
    ),
    (
        "vllm-mistral-multiple",
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": "get_current_weather", '
        '"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]',
        [("add", {"a": 3.5, "b": 4}, "mistral"), ("get_current_weather", SF, "mistral")],
        True,
        "",
    ),
    (
        "vllm-mistral-content-before",
        'Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]',
        [("add", {"a": 1, "b": 2}, "mistral")],
        True,
        "Hello",
    ),
    (
        "vllm-mistral-trailing-data",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "Dallas", "state": "TX", "unit": '
        '"fahrenheit"}}]\nextra trailing data',
        [("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}, "mistral")],
        True,
        "extra trailing data",
    ),
    (
        "vllm-mistral-v11-name-then-json",
        '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", {"a": 3.5, "b": 4}, "mistral")],
        True,
        "",
    ),
    (
        "vllm-mistral-v11-two-markers",
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
        [("add", {"a": 3.5, "b": 4}, "mistral"), ("multiply", {"a": 3, "b": 6}, "mistral")],
        True,
        "",
    ),
    (
        "vllm-mistral-v11-content-before",
        'bla[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}',
        [("add_this_and_that", {"a": 3.5, "b": 4}, "mistral")],
        True,
        "bla",
    ),
    (
        "vllm-mistral-v11-complex-wrong-json",
        'hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}',
        [("bash", {"command": "print(\"hello world!\")\nre.compile(r'{}')"}, "mistral")],
        True,
        "hi{hi",
    ),
    (
        "vllm-mistral-v11-truncated",
        'hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')',
        [("bash", None, "mistral")],
        True,
        "hi{hi",
    ),
    (
        "vllm-mistral-v11-name-without-args",
        "[TOOL_CALLS]toolname_no_args",
        [("toolname_no_args", None, "mistral")],
        True,
        "",
    ),
    (
        "llamacpp-ministral-args-token",
        '[TOOL_CALLS]special_function[ARGS]{"arg1":1}',
        [("special_function", {"arg1": 1}, "mistral")],
        True,
        "",
    ),
    (
        "llamacpp-ministral-think-then-call",
        '[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}',
        [("special_function", {"arg1": 1}, "mistral")],
        True,
        "[THINK]I'm\nthinking[/THINK]",
    ),
    (
        "llamacpp-mistral-nemo-with-id",
        '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
        [("special_function", {"arg1": 1}, "mistral")],
        True,
        "",
    ),
    (
        "ollama-mistral-malformed-second-call",
        f'[TOOL_CALLS]  [{OLLAMA_T1},{{"name": "get_curren}}]',
        [("get_current_weather", WEATHER_SF, "mistral"), (None, None, "mistral")],
        True,
        "",
    ),
    (
        "ollama-mistral-incomplete",
        '[TOOL_CALLS]  [{"name": "get_current_weather", '
        '"arguments": {"format":"fahrenheit","location":"San Francisco, ',
        [("get_current_weather", None, "mistral")],
        True,
        "",
    ),
    ("vllm-mistral-not-json", "[TOOL_CALLS] not json at all", [(None, None, "mistral")], True, "json at all"),
    # ---------------------------------------------------------------- pythonic
    (
        "vllm-pythonic-simple",
        "[get_weather(city='San Francisco', metric='celsius')]",
        [("get_weather", {"city": "San Francisco", "metric": "celsius"}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-pythonic-more-types",
        "[register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, "
        "passed_test=True, aliases=['John', 'Johnny'])]",
        [
            (
                "register_user",
                {
                    "name": "John Doe",
                    "age": 37,
                    "address": {"city": "San Francisco", "state": "CA"},
                    "role": None,
                    "passed_test": True,
                    "aliases": ["John", "Johnny"],
                },
                "pythonic",
            )
        ],
        True,
        "",
    ),
    ("vllm-pythonic-parameterless", "[get_weather()]", [("get_weather", {}, "pythonic")], True, ""),
    (
        "vllm-pythonic-empty-dict",
        "[do_something_cool(additional_data={})]",
        [("do_something_cool", {"additional_data": {}}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-pythonic-empty-list",
        "[do_something_cool(steps=[])]",
        [("do_something_cool", {"steps": []}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-pythonic-escaped-string",
        r"""[get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')]""",
        [("get_weather", {"city": "Martha's Vineyard", "metric": '"cool units"'}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-pythonic-parallel",
        "[get_weather(city='San Francisco', metric='celsius'), get_weather()]",
        [("get_weather", {"city": "San Francisco", "metric": "celsius"}, "pythonic"), ("get_weather", {}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-pythonic-bytes-sibling",
        "[bad(x=b'z'), get_weather(city='San Francisco', metric='celsius')]",
        [("bad", None, "pythonic"), ("get_weather", {"city": "San Francisco", "metric": "celsius"}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-pythonic-non-finite",
        "[calc(x=1e999), get_weather(city='San Francisco', metric='celsius')]",
        [("calc", None, "pythonic"), ("get_weather", {"city": "San Francisco", "metric": "celsius"}, "pythonic")],
        True,
        "",
    ),
    ("vllm-pythonic-mismatched-brackets", "[foo(x=1])]", [], False, "[foo(x=1])]"),
    (
        "vllm-llama4-python-start",
        "<|python_start|>[get_weather(city='LA', metric='C')]<|python_end|>",
        [("get_weather", {"city": "LA", "metric": "C"}, "pythonic")],
        True,
        "",
    ),
    (
        "vllm-llama4-parallel-unclosed",
        "<|python_start|>[get_weather(city='LA', metric='C'), register_user(name='Doe', age=9)]",
        [
            ("get_weather", {"city": "LA", "metric": "C"}, "pythonic"),
            ("register_user", {"name": "Doe", "age": 9}, "pythonic"),
        ],
        True,
        "",
    ),
    (
        "pythonic-function-calls-wrapper",
        "I'll look it up.\n<function_calls>\n[get_weather(city='Paris')]\n</function_calls>",
        [("get_weather", {"city": "Paris"}, "pythonic")],
        True,
        "I'll look it up.",
    ),
    ("prose-python-in-brackets", "Use [len(x)] to count items.", [], False, "Use [len(x)] to count items."),
    # ---------------------------------------------------------------- FunctionGemma
    (
        "vllm-fgemma-single",
        "<start_function_call>call:get_weather{location:<escape>London<escape>}<end_function_call>",
        [("get_weather", {"location": "London"}, "functiongemma")],
        True,
        "",
    ),
    (
        "vllm-fgemma-two-args",
        "<start_function_call>call:get_weather{location:<escape>San "
        "Francisco<escape>,unit:<escape>celsius<escape>}<end_function_call>",
        [("get_weather", {"location": "San Francisco", "unit": "celsius"}, "functiongemma")],
        True,
        "",
    ),
    (
        "vllm-fgemma-text-before",
        "Let me check the weather for you. "
        "<start_function_call>call:get_weather{location:<escape>Paris<escape>}<end_function_call>",
        [("get_weather", {"location": "Paris"}, "functiongemma")],
        True,
        "Let me check the weather for you.",
    ),
    (
        "vllm-fgemma-two-calls",
        "<start_function_call>call:get_weather{location:<escape>London<escape>}<end_function_call><start_function_call>call:get_time{timezone:<escape>UTC<escape>}<end_function_call>",
        [("get_weather", {"location": "London"}, "functiongemma"), ("get_time", {"timezone": "UTC"}, "functiongemma")],
        True,
        "",
    ),
    (
        "fgemma-bare-number",
        "<start_function_call>call:set_volume{level:3,mute:false}<end_function_call>",
        [("set_volume", {"level": 3, "mute": False}, "functiongemma")],
        True,
        "",
    ),
    (
        "issue:unsloth#4999-gemma4-tool-call",
        '<think>...</think><|tool_call>call:bash { "command": "ls" }<tool_call|>',
        [("bash", {"command": "ls"}, "functiongemma")],
        True,
        "<think>...</think>",
    ),
    (
        "fgemma-truncated",
        "<start_function_call>call:get_weather{location:<escape>Lon",
        [("get_weather", None, "functiongemma")],
        True,
        "",
    ),
    # ---------------------------------------------------------------- LM Studio
    (
        "lmstudio-docs-default-format",
        '[TOOL_REQUEST]{"name": "get_weather", "arguments": {"location": "Paris"}}[END_TOOL_REQUEST]',
        [("get_weather", {"location": "Paris"}, "lmstudio")],
        True,
        "",
    ),
    (
        "lmstudio-multiline",
        'Okay, I will list the files.\n[TOOL_REQUEST]\n{"name": "list_dir", "arguments": {"path": '
        '"/workspace"}}\n[END_TOOL_REQUEST]',
        [("list_dir", {"path": "/workspace"}, "lmstudio")],
        True,
        "Okay, I will list the files.",
    ),
    (
        "lmstudio-unclosed",
        '[TOOL_REQUEST]{"name": "exec", "arguments": {"command": "ls"}}',
        [("exec", {"command": "ls"}, "lmstudio")],
        True,
        "",
    ),
    # ---------------------------------------------------------------- fenced JSON
    (
        "llamacpp-hermes-fenced-json",
        '```json\n  {"name": "special_function", "arguments": {"arg1": 1}}\n```',
        [("special_function", {"arg1": 1}, "fenced_json")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-fenced-unlabeled",
        '```\n{"name": "special_function", "arguments": {"arg1": 1}}\n```',
        [("special_function", {"arg1": 1}, "fenced_json")],
        True,
        "",
    ),
    (
        "ollama-command-r-plus-fenced-list",
        'Action: ```json\n[\n    {\n        "tool_name": "get_current_weather",\n        "parameters": {\n            '
        '"format": "fahrenheit",\n            "location": "San Francisco, CA"\n        }\n    },\n    {\n     '
        '   "tool_name": "get_current_weather",\n        "parameters": {\n            "format": "celsius",\n  '
        '          "location": "Toronto, Canada"\n        }\n    }\n]\n```',
        [("get_current_weather", WEATHER_SF, "fenced_json"), ("get_current_weather", WEATHER_TO, "fenced_json")],
        True,
        "Action:",
    ),
    (
        "llamacpp-command-r7b-action-fence",
        'Action:\n```json\n[{"tool_name": "special_function", "parameters": {"arg1": 1}}]\n```',
        [("special_function", {"arg1": 1}, "fenced_json")],
        True,
        "Action:",
    ),
    (
        "realstack-qwen25coder-weather-fenced",
        '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n    "unit": "celsius"\n  '
        "}\n}\n```",
        [("get_weather", {"city": "Paris", "unit": "celsius"}, "fenced_json")],
        True,
        "",
    ),
    (
        "realstack-qwen25coder-write-file-fenced",
        '```json\n{\n  "name": "write_file",\n  "arguments": {\n    "path": "/path/to/hello.txt",\n    "content": '
        '"Hello, world!"\n  }\n}\n```',
        [("write_file", {"path": "/path/to/hello.txt", "content": "Hello, world!"}, "fenced_json")],
        True,
        "",
    ),
    (
        "realstack-qwen25coder-write-file-bare",
        '{"name": "write_file", "arguments": {"path": "todo.txt", "content": "buy milk"}}',
        [("write_file", {"path": "todo.txt", "content": "buy milk"}, "bare_json")],
        True,
        "",
    ),
    # "What is 2+2?": no tool fits, the model calls one anyway (a call, not prose).
    (
        "realstack-qwen25coder-unneeded-call",
        '{"name": "get_weather", "arguments": {"city": "London", "unit": "celsius"}}',
        [("get_weather", {"city": "London", "unit": "celsius"}, "bare_json")],
        True,
        "",
    ),
    (
        "realstack-qwen25coder-file-path-name",
        'To create the file, use:\n\n```json\n{\n  "name": "src/hello.py",\n  "arguments": {\n    "content": '
        "\"print('hello')\"\n  }\n}\n```",
        [("src/hello.py", {"content": "print('hello')"}, "fenced_json")],
        True,
        "To create the file, use:",
    ),
    (
        "qwen25coder-fenced-flat-arguments",
        '```json\n{"name": "get_weather", "city": "Paris"}\n```',
        [("get_weather", {"city": "Paris"}, "fenced_json")],
        True,
        "",
    ),
    (
        "fenced-json-answer-not-a-call",
        '```json\n{"temperature": 20, "unit": "C"}\n```',
        [],
        False,
        '```json\n{"temperature": 20, "unit": "C"}\n```',
    ),
    ("fenced-python-not-json", '```python\nprint({"name": 1})\n```', [], False, None),
    # ---------------------------------------------------------------- bare JSON in prose
    (
        "issue:ollama#12174-qwen25coder-bare",
        '{"name": "calculator", "arguments": {"expr": "17 * 23"}}',
        [("calculator", {"expr": "17 * 23"}, "bare_json")],
        True,
        "",
    ),
    (
        "issue:mcphost#12-qwen25coder-vllm",
        '\n\n  {"name": "filesystem__list_directory", "arguments": {"path": "."}}   ',
        [("filesystem__list_directory", {"path": "."}, "bare_json")],
        True,
        "",
    ),
    (
        "llamacpp-hermes-bare-multiline",
        '{\n  "name": "special_function", "arguments": {"arg1": 1}}',
        [("special_function", {"arg1": 1}, "bare_json")],
        True,
        "",
    ),
    (
        "ollama-mistral-list-without-prefix",
        f"[{OLLAMA_T1},{OLLAMA_T2}]",
        [("get_current_weather", WEATHER_SF, "bare_json"), ("get_current_weather", WEATHER_TO, "bare_json")],
        True,
        "",
    ),
    (
        "ollama-qwen25-list-trailing-text",
        f"[{OLLAMA_T1}, {OLLAMA_T2}] some tokens after call",
        [("get_current_weather", WEATHER_SF, "bare_json"), ("get_current_weather", WEATHER_TO, "bare_json")],
        True,
        "some tokens after call",
    ),
    (
        "ollama-firefunction-functools",
        f" functools[{OLLAMA_T1},{OLLAMA_T2}]",
        [("get_current_weather", WEATHER_SF, "bare_json"), ("get_current_weather", WEATHER_TO, "bare_json")],
        True,
        "functools",
    ),
    (
        "ollama-xlam-wrapper",
        f'{{"tool_calls": [{OLLAMA_T1},{OLLAMA_T2}]}}',
        [("get_current_weather", WEATHER_SF, "bare_json"), ("get_current_weather", WEATHER_TO, "bare_json")],
        True,
        "",
    ),
    (
        "ollama-nested-arrays",
        '{"name": "tool1", "arguments": {"arg1": [1, 2, ["nested", "array"]]}}',
        [("tool1", {"arg1": [1, 2, ["nested", "array"]]}, "bare_json")],
        True,
        "",
    ),
    (
        "ollama-incomplete-json",
        '{"name": "test_tool", "arguments": {"arg1": ',
        [("test_tool", None, "bare_json")],
        True,
        "",
    ),
    ("ollama-missing-fields", '{"other": "field"}', [], False, '{"other": "field"}'),
    (
        "openai-shape-leaked",
        'Calling now: {"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": '
        '\\"Oslo\\"}"}}',
        [("get_weather", {"city": "Oslo"}, "bare_json")],
        True,
        "Calling now:",
    ),
    # Qwen2.5's template lists the offered tools in <tools> like this; echoed back it is not a call.
    (
        "qwen-template-tool-definition-echo",
        '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Get weather", '
        '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>',
        [],
        False,
        None,
    ),
    ("json-answer-not-a-call", '{"temperature": 20}', [], False, '{"temperature": 20}'),
    (
        "json-person-not-a-call",
        'The record is {"name": "Alice", "age": 30}.',
        [],
        False,
        'The record is {"name": "Alice", "age": 30}.',
    ),
    (
        "prose",
        "The weather in San Francisco, CA is 70°F and in Toronto, Canada is 20°C.",
        [],
        False,
        "The weather in San Francisco, CA is 70°F and in Toronto, Canada is 20°C.",
    ),
    (
        "markdown-link",
        "See [the docs](https://example.com/a_(b)) for more.",
        [],
        False,
        "See [the docs](https://example.com/a_(b)) for more.",
    ),
]
