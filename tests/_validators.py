"""Does a provider accept this request? Validators written from the providers' documentation.

Each ``validate_*`` raises :class:`AssertionError` saying which message (item, block, part)
breaks which rule when the provider would refuse the request, and returns None otherwise. They
check the conversation only (not ``model``, ``tools`` or sampling parameters), and they do not
require a non-empty conversation (every provider refuses an empty one; there is nothing to send
then). They are written from the providers' API references, their SDKs' typed request
parameters and the error messages their APIs return, never from :mod:`zerda.formats`, so that
they can judge it. Where a documented rule is loose, they are strict (they refuse what the
provider might accept): a context that passes them is accepted.

Sources, cited again beside each rule:

- OpenAI Chat Completions: https://platform.openai.com/docs/api-reference/chat/create; the
  function-calling guide https://platform.openai.com/docs/guides/function-calling; the vision
  guide https://platform.openai.com/docs/guides/images-vision; openai-python
  ``types/chat/chat_completion_*_message_param.py``.
- OpenAI Responses: https://platform.openai.com/docs/api-reference/responses/create;
  openai-python ``types/responses/response_input_item_param.py`` and its parts; the reasoning
  items cookbook https://cookbook.openai.com/examples/responses_api/reasoning_items.
- Anthropic Messages: https://platform.claude.com/docs/en/api/messages; tool use
  https://platform.claude.com/docs/en/agents-and-tools/tool-use/implement-tool-use; extended
  thinking https://platform.claude.com/docs/en/build-with-claude/extended-thinking;
  anthropic-sdk-python ``types/message_param.py`` and ``types/*_block_param.py``.
- Gemini: https://ai.google.dev/api/generate-content, https://ai.google.dev/api/caching#Content
  (Content, Part, Blob, FileData, FunctionCall, FunctionResponse); function calling
  https://ai.google.dev/gemini-api/docs/function-calling; thought signatures
  https://ai.google.dev/gemini-api/docs/thought-signatures; google-genai ``types.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "validate_anthropic",
    "validate_gemini",
    "validate_openai_chat",
    "validate_responses",
]

# Image types both OpenAI ("PNG, JPEG, WEBP, non-animated GIF": the vision guide) and Anthropic
# (Base64ImageSourceParam.media_type) take.
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_DATA_IMAGE = re.compile(r"data:(image/[a-z0-9.+-]+);base64,[A-Za-z0-9+/=\s]*", re.DOTALL)


def _check(condition: object, where: str, rule: str) -> None:
    if not condition:
        raise AssertionError(f"{where}: {rule}")


def _string(value: object, where: str, what: str, *, empty: bool = False) -> str:
    _check(
        isinstance(value, str) and (empty or value),
        where,
        f"{what} must be a non-empty string" if not empty else f"{what} must be a string",
    )
    return value  # type: ignore[return-value]


def _object(value: object, where: str) -> Mapping[str, Any]:
    _check(isinstance(value, Mapping), where, f"must be an object, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def _array(value: object, where: str) -> Sequence[Any]:
    _check(isinstance(value, (list, tuple)), where, f"must be an array, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def _keys(data: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    # OpenAI: "Additional properties are not allowed"; Anthropic: "Extra inputs are not
    # permitted"; Gemini: "Unknown name ... Cannot find field".
    _check(not unknown, where, f"has fields the API does not know: {unknown}")


def _image_url(url: object, where: str) -> None:
    """An image the provider can read: an http(s) URL, or a base64 data URL of PNG, JPEG, GIF
    or WEBP (OpenAI vision guide: "Supported file types")."""
    text = _string(url, where, "the image URL")
    if text.startswith(("https://", "http://")):
        return
    found = _DATA_IMAGE.fullmatch(text)
    _check(
        found and found.group(1) in _IMAGE_TYPES,
        where,
        f"an image is an http(s) URL or a data:image/(png|jpeg|gif|webp);base64 URL, got "
        f"{text[:40]!r}",
    )


# -- OpenAI Chat Completions ----------------------------------------------------------------

_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_CHAT_KEYS = {
    # ChatCompletion*MessageParam in openai-python: the fields each role takes.
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset(
        {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"}
    ),
    "tool": frozenset({"role", "content", "tool_call_id"}),
}
# Content parts each role takes (ChatCompletionContentPart*Param): system, developer and tool
# messages take text parts; assistant messages text and refusal; user messages text, images,
# audio and files.
_CHAT_PARTS = {
    "system": ("text",),
    "developer": ("text",),
    "tool": ("text",),
    "assistant": ("text", "refusal"),
    "user": ("text", "image_url", "input_audio", "file"),
}
# "Invalid 'messages[2].tool_calls[0].id': string too long. Expected a string with maximum
# length 40" (the API's error).
_CHAT_CALL_ID_LENGTH = 40
# "Invalid 'messages[1].name': string does not match pattern. Expected a string that matches
# the pattern '^[a-zA-Z0-9_-]+$'" (the API's error; the reference: "An optional name for the
# participant", 64 characters at most in the API's schema).
_CHAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def validate_openai_chat(messages: Sequence[Mapping[str, Any]]) -> None:
    """Raise AssertionError unless OpenAI Chat Completions accepts ``messages``."""
    _array(messages, "messages")
    pending: list[str] = []  # the calls of the last assistant message still unanswered
    answering = False  # inside the run of tool messages after an assistant's tool_calls
    seen_ids: set[str] = set()
    opened = False
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        m = _object(raw, where)
        role = m.get("role")
        _check(role in _CHAT_ROLES, where, f"role must be one of {_CHAT_ROLES}, got {role!r}")
        _keys(m, _CHAT_KEYS[role], where)
        if "name" in m:
            _check(
                isinstance(m["name"], str) and _CHAT_NAME.fullmatch(m["name"]),
                where,
                "name must match ^[a-zA-Z0-9_-]{1,64}$",
            )
        if role == "tool":
            call_id = _string(m.get("tool_call_id"), where, "tool_call_id")
            # "messages with role 'tool' must be a response to a preceeding message with
            # 'tool_calls'" (the API's error); each call is answered once.
            _check(
                answering and call_id in pending,
                where,
                f"a tool message must answer a call of the assistant message right before it "
                f"(and answer it once); {call_id!r} is not one of {pending}",
            )
            pending.remove(call_id)
            _chat_content(m, role, where)
            continue
        # "An assistant message with 'tool_calls' must be followed by tool messages responding
        # to each 'tool_call_id'. The following tool_call_ids did not have response messages"
        _check(
            not pending,
            where,
            f"the calls {pending} of an earlier assistant message have no tool message before "
            "this one (results must directly follow their call, nothing in between)",
        )
        answering = False
        if role in ("system", "developer"):
            _chat_content(m, role, where)
            continue
        if not opened:
            # Zerda's contract (issue 13): the first message after the system and developer
            # messages is the user's, so that no reply is sent without its question.
            _check(
                role == "user",
                where,
                f"the first non-system message must be a user message, got {role!r}",
            )
            opened = True
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                # "Invalid 'messages[1].tool_calls': empty array. Expected an array with
                # minimum length 1" (the API's error).
                _check(_array(calls, f"{where}.tool_calls"), where, "tool_calls must not be empty")
                for j, raw_call in enumerate(calls):
                    call_where = f"{where}.tool_calls[{j}]"
                    call_id = _chat_call(raw_call, call_where)
                    _check(
                        call_id not in seen_ids,
                        call_where,
                        f"the call id {call_id!r} is "
                        "used twice; a result could not say which call it answers",
                    )
                    seen_ids.add(call_id)
                    pending.append(call_id)
                answering = True
            # content: "Required unless tool_calls or function_call is specified"
            if m.get("content") is None:
                _check(calls, where, "an assistant message without tool_calls needs content")
            else:
                _chat_content(m, role, where)
            continue
        _chat_content(m, role, where)
    _check(not pending, "messages", f"the calls {pending} have no tool message answering them")


def _chat_call(raw: object, where: str) -> str:
    call = _object(raw, where)
    _keys(call, frozenset({"id", "type", "function"}), where)
    call_id = _string(call.get("id"), where, "the call id")
    _check(len(call_id) <= _CHAT_CALL_ID_LENGTH, where, "a call id has at most 40 characters")
    _check(call.get("type") == "function", where, "a function call's type is 'function'")
    function = _object(call.get("function"), f"{where}.function")
    _keys(function, frozenset({"name", "arguments"}), f"{where}.function")
    _string(function.get("name"), f"{where}.function", "name")
    _string(function.get("arguments"), f"{where}.function", "arguments", empty=True)
    return call_id


def _chat_content(m: Mapping[str, Any], role: str, where: str) -> None:
    content = m.get("content")
    if isinstance(content, str):
        return
    parts = _array(content, f"{where}.content")
    # "Invalid 'messages[0].content': empty array. Expected an array with minimum length 1"
    _check(parts, f"{where}.content", "an array of parts must not be empty")
    for j, raw in enumerate(parts):
        part_where = f"{where}.content[{j}]"
        part = _object(raw, part_where)
        kind = part.get("type")
        _check(
            kind in _CHAT_PARTS[role],
            part_where,
            f"a {role} message takes parts of type {_CHAT_PARTS[role]}, got {kind!r}",
        )
        if kind == "text":
            _keys(part, frozenset({"type", "text"}), part_where)
            _string(part.get("text"), part_where, "text", empty=True)
        elif kind == "refusal":
            _keys(part, frozenset({"type", "refusal"}), part_where)
            _string(part.get("refusal"), part_where, "refusal", empty=True)
        elif kind == "image_url":
            _keys(part, frozenset({"type", "image_url"}), part_where)
            image = _object(part.get("image_url"), f"{part_where}.image_url")
            _keys(image, frozenset({"url", "detail"}), f"{part_where}.image_url")
            _image_url(image.get("url"), f"{part_where}.image_url.url")
            _check(
                image.get("detail", "auto") in ("auto", "low", "high"),
                part_where,
                "detail is one of auto, low, high",
            )
        elif kind == "input_audio":
            _keys(part, frozenset({"type", "input_audio"}), part_where)
            audio = _object(part.get("input_audio"), f"{part_where}.input_audio")
            _keys(audio, frozenset({"data", "format"}), f"{part_where}.input_audio")
            _string(audio.get("data"), part_where, "audio data")
            # "format: The format of the encoded audio data. Currently supports 'wav' and 'mp3'"
            _check(audio.get("format") in ("wav", "mp3"), part_where, "audio format is wav or mp3")
        else:  # file
            _keys(part, frozenset({"type", "file"}), part_where)
            file = _object(part.get("file"), f"{part_where}.file")
            _keys(file, frozenset({"file_data", "file_id", "filename"}), f"{part_where}.file")
            _check(
                isinstance(file.get("file_data"), str) or isinstance(file.get("file_id"), str),
                part_where,
                "a file part needs file_data or file_id",
            )


# -- OpenAI Responses -----------------------------------------------------------------------

_RESPONSES_ROLES = ("user", "assistant", "system", "developer")
_RESPONSES_INPUT_PARTS = ("input_text", "input_image", "input_file")
_RESPONSES_ASSISTANT_PARTS = ("output_text", "refusal")
_RESPONSES_KEYS = {
    # EasyInputMessageParam / Message / ResponseOutputMessageParam
    "message": frozenset({"type", "role", "content", "id", "status", "phase"}),
    # ResponseFunctionToolCallParam
    "function_call": frozenset(
        {"type", "call_id", "name", "arguments", "id", "status", "namespace", "caller"}
    ),
    # FunctionCallOutput
    "function_call_output": frozenset(
        {"type", "call_id", "output", "id", "status", "caller", "name", "namespace"}
    ),
    # ResponseReasoningItemParam
    "reasoning": frozenset({"type", "id", "summary", "encrypted_content", "content", "status"}),
}
_STATUSES = ("in_progress", "completed", "incomplete")


def validate_responses(items: Sequence[Mapping[str, Any]]) -> None:
    """Raise AssertionError unless the OpenAI Responses API accepts ``items`` as ``input``."""
    _array(items, "input")
    calls: dict[str, int] = {}  # call_id -> index of its function_call
    answered: set[str] = set()
    kinds = []
    for i, raw in enumerate(items):
        where = f"input[{i}]"
        item = _object(raw, where)
        kind = item.get("type", "message" if "role" in item else None)
        _check(
            kind in _RESPONSES_KEYS,
            where,
            f"item type must be one of {sorted(_RESPONSES_KEYS)}, got {kind!r}",
        )
        _keys(item, _RESPONSES_KEYS[kind], where)
        if "status" in item:
            _check(item["status"] in _STATUSES, where, f"status is one of {_STATUSES}")
        role = item.get("role")
        kinds.append((kind, role))
        if kind == "message":
            _responses_message(item, where)
        elif kind == "function_call":
            call_id = _string(item.get("call_id"), where, "call_id")
            _string(item.get("name"), where, "name")
            _string(item.get("arguments"), where, "arguments", empty=True)
            _check(call_id not in calls, where, f"the call_id {call_id!r} is used twice")
            calls[call_id] = i
        elif kind == "function_call_output":
            call_id = _string(item.get("call_id"), where, "call_id")
            # "No tool call found for function call output with call_id …" (the API's error)
            _check(call_id in calls, where, f"no function_call before it has call_id {call_id!r}")
            _check(call_id not in answered, where, f"a second output for call {call_id!r}")
            answered.add(call_id)
            output = item.get("output")
            if not isinstance(output, str):
                parts = _array(output, f"{where}.output")
                _check(parts, f"{where}.output", "an array of parts must not be empty")
                for j, part in enumerate(parts):
                    _responses_part(part, _RESPONSES_INPUT_PARTS, f"{where}.output[{j}]")
        else:  # reasoning
            _string(item.get("id"), where, "a reasoning item's id")
            # "Input[N] missing required field `summary`" (ResponseReasoningItemParam: summary
            # is required, [] when empty)
            summary = _array(item.get("summary"), f"{where}.summary")
            for j, raw_summary in enumerate(summary):
                entry = _object(raw_summary, f"{where}.summary[{j}]")
                _check(
                    entry.get("type") == "summary_text",
                    f"{where}.summary[{j}]",
                    "a summary entry's type is 'summary_text'",
                )
                _string(entry.get("text"), f"{where}.summary[{j}]", "text", empty=True)
            encrypted = item.get("encrypted_content")
            _check(
                encrypted is None or isinstance(encrypted, str),
                where,
                "encrypted_content is a string",
            )
    # "No tool output found for function call …" (the API's error)
    unanswered = sorted(set(calls) - answered, key=calls.__getitem__)
    _check(not unanswered, "input", f"the function calls {unanswered} have no function_call_output")
    # "Item 'rs_…' of type 'reasoning' was provided without its required following item"
    for i, (kind, _) in enumerate(kinds):
        if kind == "reasoning":
            after = kinds[i + 1] if i + 1 < len(kinds) else None
            _check(
                after is not None
                and (
                    after[0] in ("function_call", "reasoning") or after == ("message", "assistant")
                ),
                f"input[{i}]",
                "a reasoning item must be followed by the item it led to (an assistant message "
                "or a function call)",
            )


def _responses_message(item: Mapping[str, Any], where: str) -> None:
    role = item.get("role")
    _check(role in _RESPONSES_ROLES, where, f"role is one of {_RESPONSES_ROLES}, got {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        return
    parts = _array(content, f"{where}.content")
    _check(parts, f"{where}.content", "an array of parts must not be empty")
    # Assistant content is output text and refusals ("Invalid value: 'input_text'. Supported
    # values are: 'output_text' and 'refusal'." is the API's error); other roles take inputs.
    allowed = _RESPONSES_ASSISTANT_PARTS if role == "assistant" else _RESPONSES_INPUT_PARTS
    for j, part in enumerate(parts):
        _responses_part(part, allowed, f"{where}.content[{j}]")


def _responses_part(raw: object, allowed: tuple[str, ...], where: str) -> None:
    part = _object(raw, where)
    kind = part.get("type")
    _check(kind in allowed, where, f"part type must be one of {allowed}, got {kind!r}")
    if kind in ("input_text", "output_text"):
        keys = {"type", "text", "prompt_cache_breakpoint"}
        if kind == "output_text":
            keys |= {"annotations", "logprobs"}
        _keys(part, frozenset(keys), where)
        _string(part.get("text"), where, "text", empty=True)
    elif kind == "refusal":
        _keys(part, frozenset({"type", "refusal"}), where)
        _string(part.get("refusal"), where, "refusal", empty=True)
    elif kind == "input_image":
        _keys(
            part,
            frozenset({"type", "image_url", "file_id", "detail", "prompt_cache_breakpoint"}),
            where,
        )
        _check(
            part.get("image_url") is not None or part.get("file_id") is not None,
            where,
            "an input_image needs image_url or file_id",
        )
        if part.get("image_url") is not None:
            _image_url(part["image_url"], f"{where}.image_url")
        if "detail" in part:
            _check(
                part["detail"] in ("low", "high", "auto", "original"),
                where,
                "detail is one of low, high, auto, original",
            )
    else:  # input_file
        _keys(
            part,
            frozenset(
                {
                    "type",
                    "file_id",
                    "file_data",
                    "file_url",
                    "filename",
                    "detail",
                    "prompt_cache_breakpoint",
                }
            ),
            where,
        )
        _check(
            any(
                isinstance(part.get(k), str) and part[k]
                for k in ("file_id", "file_data", "file_url")
            ),
            where,
            "an input_file needs file_id, file_data or file_url",
        )


# -- Anthropic Messages ---------------------------------------------------------------------

# ToolUseBlockParam.id: the API checks "String should match pattern '^[a-zA-Z0-9_-]+$'".
_ANTHROPIC_TOOL_ID = re.compile(r"[A-Za-z0-9_-]+")
_ANTHROPIC_USER_BLOCKS = ("text", "image", "document", "tool_result")
_ANTHROPIC_ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")
_ANTHROPIC_KEYS = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "image": frozenset({"type", "source", "cache_control"}),
    "document": frozenset({"type", "source", "cache_control", "citations", "context", "title"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control", "caller"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
}


def validate_anthropic(payload: Mapping[str, Any]) -> None:
    """Raise AssertionError unless the Anthropic Messages API accepts ``payload``'s ``system``
    and ``messages``."""
    data = _object(payload, "the payload")
    if "system" in data:
        system = data["system"]
        if isinstance(system, str):
            # A string is shorthand for one text block, which must hold non-whitespace text.
            _check(system.strip(), "system", "the system prompt must hold non-whitespace text")
        else:
            blocks = _array(system, "system")
            _check(blocks, "system", "an array of system blocks must not be empty")
            for j, block in enumerate(blocks):
                _anthropic_block(block, ("text",), f"system[{j}]")
    messages = _array(data.get("messages"), "messages")
    previous_uses: list[str] = []
    seen_ids: set[str] = set()
    last = len(messages) - 1
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        m = _object(raw, where)
        _keys(m, frozenset({"role", "content"}), where)
        role = m.get("role")
        # "there is no "system" role for input messages in the Messages API" (the reference)
        _check(role in ("user", "assistant"), where, f"role is 'user' or 'assistant', got {role!r}")
        if i == 0:
            # "messages: first message must use the "user" role" (the API's error)
            _check(role == "user", where, "the first message must use the user role")
        content = m.get("content")
        final_assistant = i == last and role == "assistant"
        if isinstance(content, str):
            blocks: list[Mapping[str, Any]] = [{"type": "text", "text": content}]
            if not content and final_assistant:
                blocks = []
        else:
            blocks = list(_array(content, f"{where}.content"))
        # "all messages must have non-empty content except for the optional final assistant
        # message" (the API's error)
        _check(blocks or final_assistant, where, "content must not be empty")
        allowed = _ANTHROPIC_USER_BLOCKS if role == "user" else _ANTHROPIC_ASSISTANT_BLOCKS
        uses: list[str] = []
        results: list[str] = []
        results_done = False
        for j, raw_block in enumerate(blocks):
            block_where = f"{where}.content[{j}]" if not isinstance(content, str) else where
            block = _anthropic_block(raw_block, allowed, block_where)
            kind = block["type"]
            if kind == "tool_use":
                use_id = block["id"]
                _check(use_id not in seen_ids, block_where, f"tool_use id {use_id!r} used twice")
                seen_ids.add(use_id)
                uses.append(use_id)
            elif kind == "tool_result":
                # "In the user message containing tool results, the tool_result blocks must
                # come FIRST in the content array" (implement-tool-use)
                _check(
                    not results_done,
                    block_where,
                    "tool_result blocks must come first in the message, before any other block",
                )
                # "unexpected tool_use_id found in tool_result blocks … Each tool_result block
                # must have a corresponding tool_use block in the previous message"
                result_id = block["tool_use_id"]
                _check(
                    result_id in previous_uses and result_id not in results,
                    block_where,
                    f"tool_result {result_id!r} answers no tool_use of the previous message "
                    "(or answers one twice)",
                )
                results.append(result_id)
            else:
                results_done = True
        # "tool_use ids were found without tool_result blocks immediately after … Each tool_use
        # block must have a corresponding tool_result block in the next message"
        missing = [u for u in previous_uses if u not in results]
        _check(
            not missing,
            where,
            f"the tool_use blocks {missing} of the previous message have "
            "no tool_result in this one",
        )
        if final_assistant and blocks:
            # "final assistant content cannot end with trailing whitespace" (the API's error)
            end = blocks[-1]
            if end.get("type") == "text":
                _check(
                    end["text"] == end["text"].rstrip(),
                    where,
                    "a final assistant message must not end with whitespace",
                )
        previous_uses = uses
    _check(
        not previous_uses,
        "messages",
        f"the tool_use blocks {previous_uses} of the last message have no tool_result after them",
    )


def _anthropic_block(raw: object, allowed: tuple[str, ...], where: str) -> Mapping[str, Any]:
    block = _object(raw, where)
    kind = block.get("type")
    _check(kind in allowed, where, f"block type must be one of {allowed}, got {kind!r}")
    _keys(block, _ANTHROPIC_KEYS[kind], where)
    if kind == "text":
        # "text content blocks must be non-empty" / "… must contain non-whitespace text"
        text = _string(block.get("text"), where, "text", empty=True)
        _check(text.strip(), where, "a text block must hold non-whitespace text")
    elif kind == "image":
        source = _object(block.get("source"), f"{where}.source")
        if source.get("type") == "base64":
            _keys(source, frozenset({"type", "media_type", "data"}), f"{where}.source")
            # Base64ImageSourceParam.media_type: "image/jpeg", "image/png", "image/gif",
            # "image/webp"
            _check(
                source.get("media_type") in _IMAGE_TYPES,
                where,
                f"an image's media_type is one of {_IMAGE_TYPES}",
            )
            _string(source.get("data"), where, "data")
        else:
            _check(source.get("type") == "url", where, "an image source is base64 or url")
            _keys(source, frozenset({"type", "url"}), f"{where}.source")
            _check(
                str(source.get("url", "")).startswith(("https://", "http://")),
                where,
                "an image url is an http(s) URL",
            )
    elif kind == "document":
        source = _object(block.get("source"), f"{where}.source")
        kind_of_source = source.get("type")
        # DocumentBlockParam.source: Base64PDFSourceParam, PlainTextSourceParam,
        # ContentBlockSourceParam, URLPDFSourceParam
        if kind_of_source == "base64":
            _keys(source, frozenset({"type", "media_type", "data"}), f"{where}.source")
            _check(
                source.get("media_type") == "application/pdf",
                where,
                "a base64 document is a PDF (application/pdf)",
            )
            _string(source.get("data"), where, "data")
        elif kind_of_source == "text":
            _keys(source, frozenset({"type", "media_type", "data"}), f"{where}.source")
            _check(
                source.get("media_type") == "text/plain",
                where,
                "a text document's media_type is text/plain",
            )
            _string(source.get("data"), where, "data", empty=True)
        else:
            _check(kind_of_source == "url", where, "a document source is base64, text or url")
            _keys(source, frozenset({"type", "url"}), f"{where}.source")
            _check(
                str(source.get("url", "")).startswith(("https://", "http://")),
                where,
                "a document url is an http(s) URL",
            )
    elif kind == "tool_use":
        tool_id = _string(block.get("id"), where, "id")
        _check(
            _ANTHROPIC_TOOL_ID.fullmatch(tool_id), where, "a tool_use id matches ^[a-zA-Z0-9_-]+$"
        )
        _string(block.get("name"), where, "name")
        _check(isinstance(block.get("input"), Mapping), where, "input is an object")
    elif kind == "tool_result":
        _string(block.get("tool_use_id"), where, "tool_use_id")
        if "is_error" in block:
            _check(isinstance(block["is_error"], bool), where, "is_error is a boolean")
        if "content" in block:
            content = block["content"]
            if isinstance(content, str):
                _check(
                    content.strip(),
                    where,
                    "a tool_result's text must hold non-whitespace "
                    "text (leave content out when there is none)",
                )
            else:
                inner = _array(content, f"{where}.content")
                for j, item in enumerate(inner):
                    # ToolResultBlockParam.content: text, image, document (and search) blocks
                    _anthropic_block(item, ("text", "image", "document"), f"{where}.content[{j}]")
    elif kind == "thinking":
        _string(block.get("thinking"), where, "thinking", empty=True)
        # ThinkingBlockParam.signature is required: "Thinking blocks must be passed back
        # unmodified"
        _string(block.get("signature"), where, "signature")
    else:  # redacted_thinking
        _string(block.get("data"), where, "data")
    return block


# -- Gemini ---------------------------------------------------------------------------------

# Part's data fields ("Exactly one field within a Part should be set": google-genai Part; the
# REST reference: "data: Union type … can be only one of the following"), in both spellings.
_GEMINI_DATA = {
    "text": "text",
    "inline_data": "inline_data",
    "inlineData": "inline_data",
    "file_data": "file_data",
    "fileData": "file_data",
    "functionCall": "function_call",
    "function_call": "function_call",
    "functionResponse": "function_response",
    "function_response": "function_response",
    "executableCode": "executable_code",
    "executable_code": "executable_code",
    "codeExecutionResult": "code_execution_result",
    "code_execution_result": "code_execution_result",
}
_GEMINI_META = {
    "thought": "thought",
    "thoughtSignature": "thought_signature",
    "thought_signature": "thought_signature",
    "videoMetadata": "video_metadata",
    "video_metadata": "video_metadata",
    "mediaResolution": "media_resolution",
    "media_resolution": "media_resolution",
    "partMetadata": "part_metadata",
    "part_metadata": "part_metadata",
}


def _gemini_field(data: Mapping[str, Any], snake: str, camel: str, where: str) -> Any:
    # The REST API reads either spelling of a field (proto3 JSON); both at once is an error.
    _check(not (snake in data and camel in data), where, f"has both {snake!r} and {camel!r}")
    return data.get(snake, data.get(camel))


def validate_gemini(payload: Mapping[str, Any]) -> None:
    """Raise AssertionError unless the Gemini API's ``generateContent`` accepts ``payload``'s
    ``system_instruction`` and ``contents``."""
    data = _object(payload, "the payload")
    system = _gemini_field(data, "system_instruction", "systemInstruction", "the payload")
    if system is not None:
        content = _object(system, "system_instruction")
        _keys(content, frozenset({"role", "parts"}), "system_instruction")
        parts = _array(content.get("parts"), "system_instruction.parts")
        _check(parts, "system_instruction.parts", "must not be empty")
        for j, raw in enumerate(parts):
            part_where = f"system_instruction.parts[{j}]"
            kind, _ = _gemini_part(raw, part_where)
            _check(kind == "text", part_where, "the system instruction holds text parts")
    contents = _array(data.get("contents"), "contents")
    previous: tuple[str, list[Mapping[str, Any]], int] | None = None  # role, calls, responses
    standard_user = -1  # index of the last user content that is not a function response turn
    shapes: list[tuple[str, list[Mapping[str, Any]], list[Mapping[str, Any]]]] = []
    for i, raw in enumerate(contents):
        where = f"contents[{i}]"
        content = _object(raw, where)
        _keys(content, frozenset({"role", "parts"}), where)
        # Content.role: "Must be either 'user' or 'model'. If not set, the service will default
        # to 'user'."
        role = content.get("role", "user")
        _check(role in ("user", "model"), where, f"role is 'user' or 'model', got {role!r}")
        parts = _array(content.get("parts"), f"{where}.parts")
        _check(parts, f"{where}.parts", "a content holds at least one part")
        calls: list[Mapping[str, Any]] = []
        responses: list[Mapping[str, Any]] = []
        others = 0
        signed: list[bool] = []
        for j, raw_part in enumerate(parts):
            part_where = f"{where}.parts[{j}]"
            kind, part = _gemini_part(raw_part, part_where)
            if kind == "function_call":
                _check(role == "model", part_where, "a functionCall belongs to a model content")
                calls.append(
                    _object(
                        _gemini_field(part, "functionCall", "function_call", part_where), part_where
                    )
                )
                signed.append(
                    _gemini_field(part, "thoughtSignature", "thought_signature", part_where)
                    is not None
                )
            elif kind == "function_response":
                _check(role == "user", part_where, "a functionResponse belongs to a user content")
                responses.append(
                    _object(
                        _gemini_field(part, "functionResponse", "function_response", part_where),
                        part_where,
                    )
                )
            else:
                others += 1
                if part.get("thought"):
                    _check(role == "model", part_where, "thoughts are the model's")
        if calls:
            # "Please ensure that function call turn comes immediately after a user turn or
            # after a function response turn." (the API's error)
            _check(
                previous is not None and previous[0] == "user",
                where,
                "a function call turn must come right after a user turn or a function "
                "response turn",
            )
        if responses:
            # "Please ensure that function response turn comes immediately after a function
            # call turn." and "… the number of function response parts is equal to the number
            # of function call parts of the function call turn." (the API's errors); a
            # function response turn holds function responses only.
            _check(
                previous is not None and previous[1],
                where,
                "a function response turn must come right after a function call turn",
            )
            assert previous is not None
            _check(not others, where, "a function response turn holds function responses only")
            _gemini_pairs(previous[1], responses, where)
        elif previous is not None and previous[1]:
            raise AssertionError(
                f"contents[{i - 1}]: the function calls have no function response turn after them"
            )
        if role == "user" and not responses:
            standard_user = i
        shapes.append((role, calls, [{"signed": s} for s in signed]))
        previous = (role, calls, len(responses))
    if previous is not None and previous[1]:
        raise AssertionError(
            f"contents[{len(contents) - 1}]: the function calls have no "
            "function response turn after them"
        )
    # Gemini 3: "missing signatures in the current turn result in a 400 error": in the current
    # turn (after the last standard user turn), the first function call of each step carries a
    # thought signature (thought-signatures guide; parallel calls carry it on the first call).
    for i in range(standard_user + 1, len(shapes)):
        role, calls, signed = shapes[i]
        if calls:
            _check(
                signed[0]["signed"],
                f"contents[{i}]",
                "the first function call of the "
                "current turn's step carries a thoughtSignature (Gemini 3)",
            )


def _gemini_pairs(
    calls: list[Mapping[str, Any]], responses: list[Mapping[str, Any]], where: str
) -> None:
    _check(
        len(calls) == len(responses),
        where,
        f"{len(responses)} function responses answer {len(calls)} function calls",
    )
    call_names = sorted(str(c.get("name")) for c in calls)
    response_names = sorted(str(r.get("name")) for r in responses)
    _check(
        call_names == response_names,
        where,
        f"the responses {response_names} do not name the calls {call_names}",
    )
    # FunctionResponse.id: "The id of the function call this response is for."
    call_ids = sorted(str(c["id"]) for c in calls if "id" in c)
    response_ids = sorted(str(r["id"]) for r in responses if "id" in r)
    if call_ids:
        _check(
            call_ids == response_ids,
            where,
            f"the responses' ids {response_ids} are not the calls' ids {call_ids}",
        )


def _gemini_part(raw: object, where: str) -> tuple[str, Mapping[str, Any]]:
    part = _object(raw, where)
    data_fields = [k for k in part if k in _GEMINI_DATA]
    unknown = [k for k in part if k not in _GEMINI_DATA and k not in _GEMINI_META]
    _check(not unknown, where, f"has fields Gemini does not know: {unknown}")
    # "Exactly one field within a Part should be set"
    _check(
        len(data_fields) == 1, where, f"a part holds exactly one kind of data, got {data_fields}"
    )
    kind = _GEMINI_DATA[data_fields[0]]
    signature = _gemini_field(part, "thoughtSignature", "thought_signature", where)
    if signature is not None:
        _string(signature, where, "thoughtSignature")
    if "thought" in part:
        _check(isinstance(part["thought"], bool), where, "thought is a boolean")
    value = part[data_fields[0]]
    if kind == "text":
        text = _string(value, where, "text", empty=True)
        # Empty text is refused ("Unable to submit request because it has an empty text
        # parameter"), though the model sends some back carrying only a signature.
        _check(text or signature is not None, where, "a text part must not be empty")
    elif kind == "inline_data":
        blob = _object(value, where)
        _keys(
            blob, frozenset({"mime_type", "mimeType", "data", "display_name", "displayName"}), where
        )
        _string(_gemini_field(blob, "mime_type", "mimeType", where), where, "mime_type")
        _string(blob.get("data"), where, "data")
    elif kind == "file_data":
        file = _object(value, where)
        _keys(
            file,
            frozenset(
                {"mime_type", "mimeType", "file_uri", "fileUri", "display_name", "displayName"}
            ),
            where,
        )
        # FileData: "mime_type: Required", "file_uri: Required"
        _string(_gemini_field(file, "mime_type", "mimeType", where), where, "mime_type")
        _string(_gemini_field(file, "file_uri", "fileUri", where), where, "file_uri")
    elif kind == "function_call":
        call = _object(value, where)
        _keys(
            call,
            frozenset(
                {
                    "id",
                    "name",
                    "args",
                    "partial_args",
                    "partialArgs",
                    "will_continue",
                    "willContinue",
                }
            ),
            where,
        )
        _string(call.get("name"), where, "the function's name")
        if call.get("args") is not None:
            _check(isinstance(call["args"], Mapping), where, "args is an object")
        if "id" in call:
            _string(call["id"], where, "id")
    elif kind == "function_response":
        response = _object(value, where)
        _keys(
            response,
            frozenset(
                {"id", "name", "response", "will_continue", "willContinue", "scheduling", "parts"}
            ),
            where,
        )
        _string(response.get("name"), where, "the function's name")
        # FunctionResponse.response: "Required. The function response in JSON object format."
        _check(isinstance(response.get("response"), Mapping), where, "response is an object")
        if "id" in response:
            _string(response["id"], where, "id")
    return kind, part
