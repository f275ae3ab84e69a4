"""Dynamo 1.6.1's rewrite of a chat template's source before it compiles. Pure.

``{% generation %}``/``{% endgeneration %}`` become ``{% with %}``/``{% endwith %}``
(MiniJinja has no generation block); ``.items()`` inside ``{{ }}`` and ``{% %}``
becomes the ``items`` filter. Comments, raw blocks and quoted strings stay as
they are. Used once per template at worker start-up (``minijinja_env``).
"""

from __future__ import annotations


def rewrite_source(source: str) -> str:
    """Dynamo's pre-compile rewrite: ``{% generation %}``/``{% endgeneration %}``
    become ``{% with %}``/``{% endwith %}``; ``.items()`` inside ``{{ }}`` and
    ``{% %}`` becomes ``|items``; comments, raw blocks and quoted strings stay."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        if source.startswith("{#", i):
            end = source.find("#}", i + 2)
            end = n if end < 0 else end + 2
            out.append(source[i:end])
            i = end
        elif source.startswith("{{", i) or source.startswith("{%", i):
            close = "}}" if source[i + 1] == "{" else "%}"
            tag_end = _tag_end(source, i + 2, close)
            if tag_end is None:
                out.append(source[i:])
                break
            end = tag_end
            inner = source[i + 2 : end - 2]
            if close == "%}" and _block_name(inner) == "raw":
                raw_end = _raw_end(source, end)
                if raw_end is None:
                    out.append(source[i:])
                    break
                out.append(source[i:raw_end])
                i = raw_end
                continue
            if close == "%}" and _block_name(inner) in ("generation", "endgeneration"):
                name = _block_name(inner)
                inner = inner.replace(name, "with" if name == "generation" else "endwith", 1)
            else:
                inner = _rewrite_items(inner)
            out.append(source[i : i + 2] + inner + close)
            i = end
        else:
            out.append(source[i])
            i += 1
    return "".join(out)


def _block_name(inner: str) -> str:
    code = inner[1:] if inner[:1] in ("-", "+") else inner
    code = code[:-1] if code[-1:] in ("-", "+") else code
    return code.strip()


def _tag_end(source: str, start: int, close: str) -> int | None:
    """Index just past ``close``, skipping quoted strings and nested braces."""
    quote: str | None = None
    escaped = False
    braces = 0
    i = start
    while i < len(source):
        ch = source[i]
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif braces == 0 and source.startswith(close, i):
            return i + len(close)
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "{":
            braces += 1
        elif ch == "}":
            braces = max(0, braces - 1)
        i += 1
    return None


def _raw_end(source: str, start: int) -> int | None:
    i = start
    while (open_at := source.find("{%", i)) >= 0:
        rest = source[open_at + 2 :]
        rest = rest[1:] if rest[:1] in ("-", "+") else rest
        rest = rest.lstrip()
        if rest.startswith("endraw"):
            rest = rest[len("endraw") :].lstrip()
            rest = rest[1:] if rest[:1] in ("-", "+") else rest
            if rest.startswith("%}"):
                return len(source) - len(rest) + 2
        i = open_at + 2
    return None


def _rewrite_items(code: str) -> str:
    out: list[str] = []
    quote: str | None = None
    escaped = False
    i = 0
    while i < len(code):
        ch = code[i]
        if quote is not None:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            i += 1
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
            i += 1
        elif code.startswith(".items()", i):
            out.append("|items")
            i += len(".items()")
        else:
            out.append(ch)
            i += 1
    return "".join(out)
