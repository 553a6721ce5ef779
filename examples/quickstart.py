"""A short scripted conversation with a tool call, through a window memory of k=2 turns.

Each turn prints what the model would be sent (pinned system prompt + the last 2 turns) and,
at the end, the memory's stats. Run it with `make demo` or `python examples/quickstart.py`.
"""

from __future__ import annotations

import json

from zerda import ApproxCounter, Message, ToolCall, to_openai
from zerda.memory import ConversationBufferWindowMemory

ORDERS = {"A-1001": "shipped", "A-1002": "being packed"}


def order_status(order_id: str) -> str:
    """The tool the assistant may call."""
    return json.dumps({"order_id": order_id, "status": ORDERS.get(order_id, "unknown")})


def show(memory: ConversationBufferWindowMemory, counter: ApproxCounter) -> None:
    context = memory.get_context()
    print(f"  the model sees {len(context)} messages, ~{counter.count_messages(context)} tokens:")
    for m in to_openai(context):
        if m.get("tool_calls"):
            calls = ", ".join(
                f"{c['function']['name']}({c['function']['arguments']})" for c in m["tool_calls"]
            )
            print(f"    {m['role']:>9}: -> {calls}")
        else:
            print(f"    {m['role']:>9}: {m['content']}")


def main() -> None:
    memory = ConversationBufferWindowMemory(k=2)
    counter = ApproxCounter()  # exact counts: zerda.TiktokenCounter("o200k_base")
    memory.add_message(Message("system", "You are a helpful shop assistant."))

    print("Turn 1: a plain exchange")
    memory.save_context({"input": "Hi, I'm Ada."}, {"output": "Hello Ada! How can I help?"})
    show(memory, counter)

    print("Turn 2: the assistant calls a tool before it answers")
    call = ToolCall(id="call_1", name="order_status", arguments='{"order_id": "A-1001"}')
    memory.add_messages(
        [
            {"role": "user", "content": "Where is my order A-1001?"},
            Message("assistant", None, tool_calls=(call,)),
            Message("tool", order_status("A-1001"), tool_call_id=call.id),
            {"role": "assistant", "content": "Order A-1001 has shipped."},
        ]
    )
    show(memory, counter)

    print("Turn 3: the window (k=2) drops turn 1, and keeps the tool call with its result")
    memory.save_context({"input": "Thanks! And A-1002?"}, {"output": "A-1002 is being packed."})
    show(memory, counter)

    print("Turn 4: turn 2 leaves whole, never a tool result without its call")
    memory.save_context({"input": "Great, bye."}, {"output": "Goodbye, Ada!"})
    show(memory, counter)

    print("Stats:")
    for key, value in memory.get_memory_stats().items():
        print(f"  {key}: {value}")
    print(f"Window: {memory.get_window_info()}")


if __name__ == "__main__":
    main()
