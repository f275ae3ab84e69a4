"""A Responses API request -> the chat request Dynamo 1.6.1 preprocesses in its place.

Pure. Runs in the tap worker when a ``POST /v1/responses`` body is preprocessed
(``preprocess.py`` calls ``chat_request`` after the model is known, then takes
the chat path: template, tokens, options). ``chat_request`` either returns a
chat-completions body holding exactly what 1.6.1 carries over, or raises
``Reject`` with a reason of the fixed vocabulary; it never reads client text
into a reason.

The rules were found on the running 1.6.1 frontend by comparing the engine's
token ids of Responses requests with those of chat requests (the public
``responses/mod.rs`` is older and differs: it neither merges system messages
nor groups assistant turns):

- ``instructions`` opens a system message; the *leading* ``system``/``developer``
  items are merged into it, contents joined with a blank line (``"\\n\\n"``); a
  system item after another item stays a message of its own; a system item's
  text parts are concatenated;
- ``user`` items: string content as is, ``input_text`` parts joined with
  ``"\\n"``; ``input_image`` parts become chat image parts; file and audio
  parts are refused by the frontend (400);
- assistant-side items in a row (assistant messages, ``function_call`` and
  ``reasoning`` items) form ONE assistant message, closed by any other item:
  texts (``output_text`` and ``refusal`` parts) concatenated, each call a
  ``tool_calls`` entry (``id`` = ``call_id``), reasoning (``content`` texts,
  else ``summary`` texts, concatenated) as its ``reasoning_content``;
- ``function_call_output`` -> a ``tool`` message (list outputs concatenated);
  ``item_reference`` items are dropped;
- function ``tools`` -> chat tools; any other tool type is refused (400);
  ``tool_choice: "none"`` drops them from the prompt (the chat rule);
  ``"required"`` forces the array-of-calls JSON schema, a named function its
  parameters' schema; ``allowed_tools`` keeps only the named tools in the
  prompt (and with ``mode: required`` forces the array schema over them); a
  forced choice's schema wins over ``text.format`` (``json_schema``,
  ``json_object``), which is guided JSON otherwise;
- ``max_output_tokens`` -> ``max_tokens`` (0 is refused), ``temperature`` and
  ``top_p`` as they are, ``reasoning.effort`` -> ``reasoning_effort`` (the
  template's thinking switches), ``nvext`` as for chat. Every other field
  (``stop``, ``top_k``, ``store``, unknown keys...) is ignored by 1.6.1 and
  left out here.

Requests whose prompt depends on state the frontend keeps cannot be rebuilt
from the body: ``previous_response_id`` (``previous_response``) and a stored
``prompt`` template (``stored_prompt``); 1.6.1 answers both with 501.
``background: true`` and ``max_tool_calls`` are also 501 in 1.6.1, but their
prompt is in the body: they are mirrored, and the joined record shows the 501.
"""

from __future__ import annotations

from typing import Any

from shadow_proxy.worker.request.fields import Reject

#: Body fields whose prompt lives in the frontend's state, and the reason counted.
STATEFUL_FIELDS = (("previous_response_id", "previous_response"), ("prompt", "stored_prompt"))

_SYSTEM_ROLES = ("system", "developer")


def chat_request(request: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body 1.6.1 builds from a Responses body (module
    docstring). Raises ``Reject`` for what the frontend refuses or what cannot
    be rebuilt."""
    for key, reason in STATEFUL_FIELDS:
        if request.get(key) is not None:
            raise Reject(reason)
    chat: dict[str, Any] = {
        "model": request.get("model"),
        "messages": _messages(request.get("instructions"), request.get("input")),
    }
    tools = _tools(request.get("tools"))
    if tools:
        chat["tools"] = tools
    # A forced tool choice's schema wins over ``text.format``'s.
    schema = _tool_choice(request.get("tool_choice"), chat)
    if schema is None:
        schema = _format_schema(request.get("text"))
    if schema is not None:
        chat["guided_json"] = schema
    reasoning = request.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise Reject("invalid_field")
        if reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]
    max_tokens = request.get("max_output_tokens")
    if max_tokens is not None:
        if max_tokens == 0:
            raise Reject("invalid_field")  # "Max tokens must be greater than 0"
        chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "nvext"):
        if request.get(key) is not None:
            chat[key] = request[key]
    return chat


# --------------------------------------------------------------------------- input


def _messages(instructions: Any, value: Any) -> list[dict[str, Any]]:
    if instructions is not None and not isinstance(instructions, str):
        raise Reject("invalid_field")
    if isinstance(value, str):
        items: list[Any] = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value:
        items = value
    elif value is None or value == []:
        raise Reject("missing_messages")  # "Messages array cannot be empty"
    else:
        raise Reject("invalid_field")
    builder = _Builder([] if instructions is None else [instructions])
    for item in items:
        builder.add(item)
    return builder.finish()


class _Builder:
    """Chat messages from input items, in order (the 1.6.1 grouping rules)."""

    def __init__(self, system: list[str]) -> None:
        #: Texts of the opening system message (instructions, leading system items).
        self.system = system
        self.leading = True
        self.messages: list[dict[str, Any]] = []
        #: The assistant turn being gathered: texts, reasoning texts, tool calls.
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.open = False

    def add(self, item: Any) -> None:
        if not isinstance(item, dict):
            raise Reject("invalid_field")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "item_reference":
            return
        if kind == "message":
            self._message(item)
            return
        self.leading = False
        if kind == "function_call":
            self._call(item)
        elif kind == "reasoning":
            self.open = True
            self.reasoning.append(_reasoning_text(item))
        elif kind == "function_call_output":
            self._close()
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise Reject("invalid_field")
            content = _joined_text(item.get("output"), "", ("input_text", "output_text"))
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            raise Reject("invalid_field")

    def _message(self, item: dict[str, Any]) -> None:
        role = item.get("role")
        content = item.get("content")
        if role in _SYSTEM_ROLES:
            text = _joined_text(content, "", ("input_text",))
            if self.leading:
                self.system.append(text)
            else:
                self._close()
                self.messages.append({"role": "system", "content": text})
            return
        self.leading = False
        if role == "user":
            self._close()
            self.messages.append({"role": "user", "content": _user_content(content)})
        elif role == "assistant":
            self.open = True
            self.texts.append(_joined_text(content, "", ("output_text", "input_text", "refusal")))
        else:
            raise Reject("invalid_field")

    def _call(self, item: dict[str, Any]) -> None:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not all(isinstance(v, str) for v in (call_id, name, arguments)):
            raise Reject("invalid_field")
        self.open = True
        self.calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )

    def _close(self) -> None:
        """The assistant turn gathered so far becomes one message."""
        if not self.open:
            return
        message: dict[str, Any] = {"role": "assistant"}
        message["content"] = "".join(self.texts) if self.texts or not self.calls else None
        reasoning = "".join(self.reasoning)
        if reasoning:
            message["reasoning_content"] = reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        self.messages.append(message)
        self.texts, self.reasoning, self.calls = [], [], []
        self.open = False

    def finish(self) -> list[dict[str, Any]]:
        self._close()
        if self.system:
            return [{"role": "system", "content": "\n\n".join(self.system)}, *self.messages]
        return self.messages


def _joined_text(content: Any, separator: str, kinds: tuple[str, ...]) -> str:
    """String content as is; text parts of the given types joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Reject("invalid_field")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in kinds:
            raise Reject("invalid_field")
        text = part.get("refusal" if part["type"] == "refusal" else "text")
        if not isinstance(text, str):
            raise Reject("invalid_field")
        texts.append(text)
    return separator.join(texts)


def _user_content(content: Any) -> Any:
    """A user item's content: text parts joined with newlines, or with images
    the chat parts (text and ``image_url``) in order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Reject("invalid_field")
    if all(isinstance(part, dict) and part.get("type") == "input_text" for part in content):
        return _joined_text(content, "\n", ("input_text",))
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:  # file and audio inputs, image file ids: the frontend answers 400
            raise Reject("invalid_field")
    return parts


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``content`` texts, else its ``summary``
    texts, concatenated (encrypted content alone gives nothing)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise Reject("invalid_field")
        texts = []
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise Reject("invalid_field")
            texts.append(text)
        if texts:
            return "".join(texts)
    return ""


# --------------------------------------------------------------------------- tools


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Reject("invalid_field")
    tools = []
    for tool in value:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise Reject("invalid_field")  # hosted tools: 400 in 1.6.1
        if not isinstance(tool.get("name"), str):
            raise Reject("invalid_field")
        function = {
            key: tool[key]
            for key in ("name", "description", "parameters", "strict")
            if tool.get(key) is not None
        }
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(choice: Any, chat: dict[str, Any]) -> dict[str, Any] | None:
    """Guided JSON for a forced tool choice; ``none`` is passed on to the chat
    rule; ``allowed_tools`` keeps only the tools it names in the prompt."""
    if choice is None or choice == "auto":
        return None
    if choice == "none":
        chat["tool_choice"] = "none"
        return None
    tools = chat.get("tools", [])
    functions = {tool["function"]["name"]: tool["function"] for tool in tools}
    if choice == "required":
        return _calls_schema(list(functions.values()))
    if not isinstance(choice, dict):
        raise Reject("invalid_field")
    kind = choice.get("type")
    if kind == "function":
        function = functions.get(choice.get("name"))
        if function is None:
            raise Reject("invalid_field")
        return _parameters(function)
    if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
        allowed = choice.get("tools")
        if not isinstance(allowed, list):
            raise Reject("invalid_field")
        names = set()
        for entry in allowed:
            if not isinstance(entry, dict) or entry.get("type") != "function":
                raise Reject("invalid_field")
            if entry.get("name") not in functions:
                raise Reject("invalid_field")  # "references unknown function"
            names.add(entry["name"])
        chat["tools"] = [tool for tool in tools if tool["function"]["name"] in names]
        if choice["mode"] == "required":
            return _calls_schema([tool["function"] for tool in chat["tools"]])
        return None
    raise Reject("invalid_field")


def _calls_schema(functions: list[dict[str, Any]]) -> dict[str, Any]:
    """The array-of-calls schema a ``required`` tool choice forces."""
    if not functions:
        raise Reject("invalid_field")
    return {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [function["name"]]},
                        "parameters": _parameters(function),
                    },
                    "required": ["name", "parameters"],
                }
                for function in functions
            ],
        },
    }


def _parameters(function: dict[str, Any]) -> Any:
    return function.get("parameters", {"type": "object", "properties": {}})


def _format_schema(text: Any) -> Any:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise Reject("invalid_field")
    spec = text.get("format")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise Reject("invalid_field")
    kind = spec.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        return spec.get("schema")
    raise Reject("invalid_field")
