"""Memories shared between threads and between asyncio tasks lose nothing and never interleave
inside a write."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from zerda.memory import BaseMemory, ConversationBufferMemory, ConversationBufferWindowMemory
from zerda.messages import Message, Role, ToolCall

WORKERS = 8
PER_WORKER = 1_000


def run_threads(n: int, work: Callable[[int], None]) -> None:
    """Run ``work(i)`` in n threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def check_whole_turns_in_worker_order(turns: list[dict[str, Any]]) -> None:
    assert len(turns) == WORKERS * PER_WORKER
    seen: dict[int, list[int]] = {w: [] for w in range(WORKERS)}
    for turn in turns:
        worker, i = map(int, turn["input"].split(":"))
        # The turn is whole: its output was written with its input.
        assert turn["output"] == f"reply {worker}:{i}"
        seen[worker].append(i)
    for worker, order in seen.items():
        assert order == list(range(PER_WORKER)), f"worker {worker} out of order"


def check_window_after(memory: ConversationBufferWindowMemory) -> None:
    k = memory.k
    turns = memory.get_messages()
    assert len(turns) == k
    for turn in turns:
        worker, i = turn["input"].split(":")
        assert turn["output"] == f"reply {worker}:{i}"
    context = memory.get_context()
    assert [m.role for m in context] == [Role.USER, Role.ASSISTANT] * k
    assert memory.get_window_info()["is_full"] is True
    stats = memory.get_memory_stats()
    assert stats["message_count"] == k
    assert stats["stored_turns"] == WORKERS * PER_WORKER


def save(memory: BaseMemory, worker: int, i: int) -> None:
    memory.save_context({"input": f"{worker}:{i}"}, {"output": f"reply {worker}:{i}"})


def test_threads_save_context_lose_nothing() -> None:
    buffer = ConversationBufferMemory()
    window = ConversationBufferWindowMemory(k=7)

    def work(worker: int) -> None:
        for i in range(PER_WORKER):
            save(buffer, worker, i)
            save(window, worker, i)

    run_threads(WORKERS, work)

    check_whole_turns_in_worker_order(buffer.get_messages())
    assert len(buffer.get_history()) == 2 * WORKERS * PER_WORKER
    check_window_after(window)
    # The window shows the newest turns of the same conversation its store holds.
    history = window.get_history()
    assert window.get_context() == history[-2 * window.k :]


def test_threads_read_while_others_write() -> None:
    window = ConversationBufferWindowMemory(k=3)
    readers, writers = 4, 4
    bad: list[object] = []

    def work(n: int) -> None:
        if n < writers:
            for i in range(PER_WORKER // 4):
                save(window, n, i)
            return
        for _ in range(PER_WORKER // 4):
            turns = window.get_messages()
            if len(turns) > 3 or any(t["output"] != f"reply {t['input']}" for t in turns):
                bad.append(turns)
            context = window.get_context()
            if context and context[0].role is not Role.USER:
                bad.append(context)

    run_threads(readers + writers, work)
    assert bad == []
    assert len(window.get_messages()) == 3


def test_asyncio_tasks_asave_context_lose_nothing() -> None:
    buffer = ConversationBufferMemory()
    window = ConversationBufferWindowMemory(k=5)

    async def worker(n: int) -> None:
        for i in range(PER_WORKER):
            await buffer.asave_context({"input": f"{n}:{i}"}, {"output": f"reply {n}:{i}"})
            await window.asave_context({"input": f"{n}:{i}"}, {"output": f"reply {n}:{i}"})
            # A yield point (not a wait), so that the tasks interleave.
            await asyncio.sleep(0)

    async def main() -> list[dict[str, Any]]:
        await asyncio.gather(*(worker(n) for n in range(WORKERS)))
        return await buffer.aget_messages()

    turns = asyncio.run(main())
    check_whole_turns_in_worker_order(turns)
    # The tasks did interleave (else this would only test a serial run).
    assert len({t["input"].split(":")[0] for t in turns[:PER_WORKER]}) > 1
    check_window_after(window)


def _batch(worker: int, j: int) -> list[Message]:
    tag = f"{worker}/{j}"
    call_id = f"call-{tag}"
    return [
        Message(Role.USER, f"q {tag}"),
        Message(Role.ASSISTANT, None, tool_calls=(ToolCall(call_id, "lookup"),)),
        Message(Role.TOOL, f"r {tag}", tool_call_id=call_id),
        Message(Role.ASSISTANT, f"a {tag}"),
    ]


def _tag(message: Message) -> str:
    if message.tool_calls:
        return message.tool_calls[0].id.removeprefix("call-")
    return message.text.split(" ", 1)[1]


def test_add_messages_batches_from_threads_never_interleave() -> None:
    batches = 200
    memory = ConversationBufferMemory()
    window = ConversationBufferWindowMemory(k=4)

    def work(worker: int) -> None:
        for j in range(batches):
            memory.add_messages(_batch(worker, j))
            window.add_messages(_batch(worker, j))

    run_threads(WORKERS, work)

    for mem in (memory, window):
        history = mem.get_history()
        assert len(history) == 4 * WORKERS * batches
        per_worker: dict[str, list[int]] = {}
        for start in range(0, len(history), 4):
            chunk = history[start : start + 4]
            tags = {_tag(m) for m in chunk}
            assert len(tags) == 1, f"batch interleaved at {start}: {sorted(tags)}"
            worker, j = tags.pop().split("/")
            per_worker.setdefault(worker, []).append(int(j))
            assert [m.role for m in chunk] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
        assert all(order == list(range(batches)) for order in per_worker.values())
        assert len(per_worker) == WORKERS

    context = window.get_context()
    assert len(context) == 4 * window.k
    assert context == window.get_history()[-4 * window.k :]
    assert len({_tag(m) for m in context}) == window.k


def test_asyncio_add_messages_batches_never_interleave() -> None:
    memory = ConversationBufferMemory()
    batches = 200

    async def worker(n: int) -> None:
        for j in range(batches):
            await memory.aadd_messages(_batch(n, j))
            await asyncio.sleep(0)  # a yield point, so that the tasks interleave

    async def main() -> None:
        await asyncio.gather(*(worker(n) for n in range(WORKERS)))

    asyncio.run(main())
    history = memory.get_history()
    assert len(history) == 4 * WORKERS * batches
    for start in range(0, len(history), 4):
        assert len({_tag(m) for m in history[start : start + 4]}) == 1
