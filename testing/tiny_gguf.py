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

from testing.chat_templates import CHATML

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHAT_TEMPLATE = CHATML


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


def vocabulary(specials: tuple[str, ...] = (), script: str | None = None) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of the byte-level vocabulary: ChatML's specials, then ``specials``, then
    ``script`` as one ordinary token where given."""
    byte_chars = bytes_to_unicode()
    space = byte_chars[ord(" ")]
    tokens = [byte_chars[b] for b in range(256)] + [space + space]
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    merges = [f"{space} {space}"]
    for special in dict.fromkeys((ENDOFTEXT, IM_START, IM_END, *specials)):
        tokens.append(special)
        types.append(int(gguf.TokenType.CONTROL))
    if script is not None:
        tokens.append("".join(byte_chars[b] for b in script.encode()))
        types.append(int(gguf.TokenType.NORMAL))
    return tokens, types, merges


SCRIPT_LOGIT = 40.0


def _scripted(
    n_vocab: int, dim: int, *, newline: int, answer: int, end: int
) -> tuple[npt.NDArray[np.float16], npt.NDArray[np.float16]]:
    """Embeddings and output of a model whose layers add nothing: the next token depends on the last one only.
    After a newline comes ``answer``, after ``answer`` comes ``end``; after anything else, any token alike."""
    embeddings = np.zeros((n_vocab, dim), dtype=np.float16)
    embeddings[:, 2] = 1.0
    embeddings[newline] = 0.0
    embeddings[newline, 0] = 1.0
    embeddings[answer] = 0.0
    embeddings[answer, 1] = 1.0
    output = np.zeros((n_vocab, dim), dtype=np.float16)
    weight = SCRIPT_LOGIT / math.sqrt(dim)
    output[answer, 0] = weight
    output[end, 1] = weight
    return embeddings, output


def write_model(
    path: Path,
    shape: ModelShape = ModelShape(),
    *,
    chat_template: str = CHAT_TEMPLATE,
    specials: tuple[str, ...] = (),
    bos: str = ENDOFTEXT,
    eos: str = IM_END,
    script: str | None = None,
) -> Path:
    """Write the model to `path` and return it; the same arguments give the same bytes.

    ``chat_template`` (jinja) is the template it carries, ``specials`` more control tokens it needs, ``bos`` and
    ``eos`` its begin and end tokens. With ``script``, the model is no noise: whatever it is asked, once the
    prompt ends in a newline (every generation prompt does) it answers ``script`` and ends its turn, so
    reasoning and tool calls in the template's own format come back from the server as a real model's would.
    """
    if shape.dim % shape.heads:
        raise ValueError(f"dim {shape.dim} is not a multiple of heads {shape.heads}")
    tokens, types, merges = vocabulary((bos, eos, *specials), script)
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
    writer.add_bos_token_id(tokens.index(bos))
    writer.add_eos_token_id(tokens.index(eos))
    writer.add_pad_token_id(tokens.index(ENDOFTEXT))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    writer.add_chat_template(chat_template)

    embeddings = matrix(n_vocab, shape.dim)
    output = matrix(n_vocab, shape.dim)
    if script is not None:
        embeddings, output = _scripted(n_vocab, shape.dim, newline=ord("\n"), answer=n_vocab - 1, end=tokens.index(eos))
    writer.add_tensor("token_embd.weight", embeddings)
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.attn_q.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(f"blk.{i}.attn_k.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(f"blk.{i}.attn_v.weight", matrix(shape.dim, shape.dim))
        attn_output = matrix(shape.dim, shape.dim)
        writer.add_tensor(f"blk.{i}.attn_output.weight", attn_output * 0 if script is not None else attn_output)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(shape.ff, shape.dim))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", matrix(shape.ff, shape.dim))
        ffn_down = matrix(shape.dim, shape.ff)
        writer.add_tensor(f"blk.{i}.ffn_down.weight", ffn_down * 0 if script is not None else ffn_down)
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass(frozen=True)
class ProjectorShape:
    """The size of the generated vision projector. ``text_dim`` is the ``dim`` of the text model it feeds; every
    image is resized to ``image`` pixels square and costs ``image_tokens`` prompt tokens, whatever its size."""

    text_dim: int = 256
    image: int = 64
    patch: int = 16
    layers: int = 2
    dim: int = 64
    heads: int = 2
    ff: int = 128
    seed: int = 0

    @property
    def image_tokens(self) -> int:
        """Prompt tokens one image costs: one per patch."""
        return (self.image // self.patch) ** 2


def write_projector(path: Path, shape: ProjectorShape = ProjectorShape()) -> Path:
    """Write a random-weight LLaVA-style vision projector ("mmproj", projector type ``mlp``) to `path` and return
    it; the same arguments give the same bytes.

    llama-server started with it and a model whose ``dim`` is ``shape.text_dim`` reports vision and takes images
    (PNG, JPEG, GIF, BMP) in chat messages. As in LLaVA, the image features are read before the last layer.
    """
    if shape.image % shape.patch:
        raise ValueError(f"image {shape.image} is not a multiple of patch {shape.patch}")
    if shape.dim % shape.heads:
        raise ValueError(f"dim {shape.dim} is not a multiple of heads {shape.heads}")
    rng = np.random.default_rng(shape.seed)

    def matrix(rows: int, cols: int) -> npt.NDArray[np.float16]:
        return (rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype(np.float16)

    def vector(size: int, mean: float = 0.0) -> npt.NDArray[np.float32]:
        return (mean + 0.01 * rng.standard_normal(size)).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch="clip")
    writer.add_name(f"cachet-tiny-mmproj-{shape.layers}x{shape.dim}-{shape.image}px-seed{shape.seed}")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("mlp")
    writer.add_vision_image_size(shape.image)
    writer.add_vision_patch_size(shape.patch)
    writer.add_vision_embedding_length(shape.dim)
    writer.add_vision_feed_forward_length(shape.ff)
    writer.add_vision_projection_dim(shape.text_dim)
    writer.add_vision_head_count(shape.heads)
    writer.add_vision_block_count(shape.layers)
    writer.add_vision_attention_layernorm_eps(1e-5)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    writer.add_vision_use_gelu(True)

    patch_weights = rng.standard_normal((shape.dim, 3, shape.patch, shape.patch)) / shape.patch
    writer.add_tensor("v.patch_embd.weight", patch_weights.astype(np.float16))
    writer.add_tensor("v.patch_embd.bias", vector(shape.dim))
    writer.add_tensor("v.position_embd.weight", matrix(shape.image_tokens, shape.dim))
    for i in range(shape.layers):
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"v.blk.{i}.{norm}.weight", vector(shape.dim, 1.0))
            writer.add_tensor(f"v.blk.{i}.{norm}.bias", vector(shape.dim))
        for attn in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"v.blk.{i}.{attn}.weight", matrix(shape.dim, shape.dim))
            writer.add_tensor(f"v.blk.{i}.{attn}.bias", vector(shape.dim))
        writer.add_tensor(f"v.blk.{i}.ffn_up.weight", matrix(shape.ff, shape.dim))
        writer.add_tensor(f"v.blk.{i}.ffn_up.bias", vector(shape.ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.weight", matrix(shape.dim, shape.ff))
        writer.add_tensor(f"v.blk.{i}.ffn_down.bias", vector(shape.dim))
    writer.add_tensor("mm.0.weight", matrix(shape.text_dim, shape.dim))
    writer.add_tensor("mm.0.bias", vector(shape.text_dim))
    writer.add_tensor("mm.2.weight", matrix(shape.text_dim, shape.text_dim))
    writer.add_tensor("mm.2.bias", vector(shape.text_dim))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
