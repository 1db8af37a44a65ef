"""A tiny random-weight llama model in GGUF, made locally for tests and benchmarks.

The vocabulary is byte-level BPE: the 256 GPT-2 byte tokens (one per byte, id = byte value),
one merged token so the merge list is not empty, and the ChatML specials. Its answers are
noise, but llama.cpp loads it, applies its chat template (tools included) and caches prompts
like any real model, which is what the tests measure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}
{{- messages[0].content + '\\n\\n' }}
{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions. '
    + 'Their signatures are within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}
{{- '\\n' + (tool | tojson) }}
{%- endfor %}
{{- '\\n</tools>\\n\\nFor each call, answer a JSON object with the function name and arguments within \
<tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n\
</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'user' or message.role == 'system' %}
{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}
{{- '\\n' + message.content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}
{%- set tool_call = tool_call.function %}
{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}
{{- tool_call.arguments }}
{%- else %}
{{- tool_call.arguments | tojson }}
{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response><|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


@dataclass(frozen=True)
class ModelShape:
    """The size of the generated model."""

    layers: int = 4
    dim: int = 256
    heads: int = 4
    ff: int = 512
    ctx: int = 4096
    seed: int = 0


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes, strict=True)}


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of the byte-level vocabulary."""
    byte_chars = bytes_to_unicode()
    space = byte_chars[ord(" ")]
    tokens = [byte_chars[b] for b in range(256)] + [space + space]
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    merges = [f"{space} {space}"]
    for special in (ENDOFTEXT, IM_START, IM_END):
        tokens.append(special)
        types.append(int(gguf.TokenType.CONTROL))
    return tokens, types, merges


def write_model(path: Path, shape: ModelShape = ModelShape()) -> Path:
    """Write the model to `path` and return it; the same shape and seed give the same bytes."""
    if shape.dim % shape.heads:
        raise ValueError(f"dim {shape.dim} is not a multiple of heads {shape.heads}")
    tokens, types, merges = vocabulary()
    n_vocab = len(tokens)
    head_dim = shape.dim // shape.heads
    rng = np.random.default_rng(shape.seed)

    def matrix(rows: int, cols: int) -> npt.NDArray[np.float16]:
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float16)

    def norm() -> npt.NDArray[np.float32]:
        return (1.0 + 0.01 * rng.standard_normal(shape.dim)).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name(f"cachet-tiny-{shape.layers}x{shape.dim}-seed{shape.seed}")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.dim)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(ENDOFTEXT))
    writer.add_eos_token_id(tokens.index(IM_END))
    writer.add_pad_token_id(tokens.index(ENDOFTEXT))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", matrix(n_vocab, shape.dim))
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.attn_q.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(f"blk.{i}.attn_k.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(f"blk.{i}.attn_v.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(f"blk.{i}.attn_output.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(shape.ff, shape.dim))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", matrix(shape.ff, shape.dim))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", matrix(shape.dim, shape.ff))
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", matrix(n_vocab, shape.dim))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
