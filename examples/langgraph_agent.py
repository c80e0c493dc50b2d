"""A LangGraph agent (model node <-> tool node) whose turns go through luftpause.

    python examples/langgraph_agent.py --service-class batch --caller me \
        [--base-url http://127.0.0.1:8080/v1]

The model is ``langchain_openai.ChatOpenAI(base_url=..., default_headers=...)`` with the three
luftpause headers; the graph is the usual two-node tool loop (``tools_condition`` routes to the
``ToolNode`` while the model asks for tools, else ends).
"""

from __future__ import annotations

import httpx
from _common import RunIdRecorder, api_key, lookup, luftpause_headers, parse_args, report
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def lookup_notes(query: str) -> str:
    """Look a topic up in the notes."""
    return lookup(query)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    recorder = RunIdRecorder()
    with httpx.Client(event_hooks={"response": [recorder]}) as http:
        model = ChatOpenAI(
            model=args.model,
            base_url=args.base_url,
            api_key=api_key(),
            default_headers=luftpause_headers(args),
            http_client=http,
            max_tokens=64,
        ).bind_tools([lookup_notes])

        def call_model(state: MessagesState) -> dict[str, list[object]]:
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", call_model)
        graph.add_node("tools", ToolNode([lookup_notes]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        final = graph.compile().invoke({"messages": [("user", args.task)]}, {"recursion_limit": 20})
    report(args, recorder.run_ids, str(final["messages"][-1].content))


if __name__ == "__main__":
    main()
