"""LangChain's classic ReAct agent (langchain-classic create_react_agent + AgentExecutor): the
tools are described in the prompt, the model writes "Action: / Action Input:", the executor
parses that text, runs the tool and writes "Observation:" into the next prompt."""

from __future__ import annotations

import langchain_classic
from common import Log, arguments, weather
from langchain_classic.agents import AgentExecutor, create_react_agent
from langchain_core.prompts import PromptTemplate
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

# The prompt create_react_agent's documentation gives (the hub's hwchase17/react).
TEMPLATE = """Answer the following questions as best you can. You have access to the following tools:

{tools}

Use the following format:

Question: the input question you must answer
Thought: you should always think about what to do
Action: the action to take, should be one of [{tool_names}]
Action Input: the input to the action
Observation: the result of the action
... (this Thought/Action/Action Input/Observation can repeat N times)
Thought: I now know the final answer
Final Answer: the final answer to the original input question

Begin!

Question: {input}
Thought:{agent_scratchpad}"""
TASK = "What is the weather in Paris?"


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    log = Log(args.record, f"langchain-classic {langchain_classic.__version__}")

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        result = weather(city.strip())
        log.executed("task-0", "get_weather", {"city": city}, result)
        return result

    extra = {"max_tokens": args.max_tokens} if args.max_tokens else {}
    llm = ChatOpenAI(model=args.model, base_url=args.base_url, api_key="sk-capture", max_retries=0, **extra)
    agent = create_react_agent(llm, [get_weather], PromptTemplate.from_template(TEMPLATE))
    executor = AgentExecutor(
        agent=agent, tools=[get_weather], max_iterations=4, handle_parsing_errors=True, return_intermediate_steps=True
    )
    out = executor.invoke({"input": TASK})
    log.episode(
        "task-0",
        TASK,
        out["output"],
        steps=[
            {"tool": a.tool, "tool_input": a.tool_input, "log": a.log, "observation": o}
            for a, o in out["intermediate_steps"]
        ],
    )
    log.write()


if __name__ == "__main__":
    main()
