"""The generated GGUF model: deterministic, and carrying what llama.cpp needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf

from testing.tiny_gguf import IM_END, IM_START, ModelShape, bytes_to_unicode, write_model

ROOT = Path(__file__).resolve().parents[2]
SMALL = ModelShape(layers=2, dim=64, heads=2, ff=128, ctx=512, seed=3)


def field_text(reader: gguf.GGUFReader, key: str) -> str:
    field = reader.fields[key]
    return bytes(field.parts[field.data[0]]).decode()


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = write_model(tmp_path / "a.gguf", SMALL).read_bytes()
    b = write_model(tmp_path / "b.gguf", SMALL).read_bytes()
    c = write_model(tmp_path / "c.gguf", ModelShape(layers=2, dim=64, heads=2, ff=128, ctx=512, seed=4)).read_bytes()
    assert a == b
    assert a != c


def test_vocabulary_and_metadata(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_model(tmp_path / "m.gguf", SMALL))
    assert field_text(reader, "general.architecture") == "llama"
    assert field_text(reader, "tokenizer.ggml.model") == "gpt2"
    assert field_text(reader, "tokenizer.ggml.pre") == "default"
    template = field_text(reader, "tokenizer.chat_template")
    assert "tools" in template and "tool_response" in template and IM_START in template
    tokens_field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(tokens_field.parts[i]).decode() for i in tokens_field.data]
    byte_chars = bytes_to_unicode()
    assert tokens[:256] == [byte_chars[b] for b in range(256)]
    assert len(set(byte_chars.values())) == 256
    assert IM_START in tokens and IM_END in tokens
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    assert tokens[eos] == IM_END
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert len([name for name in tensors if name.startswith("blk.")]) == 9 * SMALL.layers


def test_make_model_command(tmp_path: Path) -> None:
    out = tmp_path / "models" / "tiny.gguf"
    args = ["--layers", "2", "--dim", "64", "--heads", "2", "--ff", "128", "--ctx", "512", "--seed", "3"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "make_model.py"), str(out), *args],
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(out) in result.stdout
    assert out.read_bytes() == write_model(tmp_path / "same.gguf", SMALL).read_bytes()
