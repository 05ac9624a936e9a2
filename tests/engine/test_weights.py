"""HF-directory and GGUF loading agree with the weights of a tiny seeded Llama."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tropical.engine.gguf_reader import load_gguf, unpermute
from tropical.engine.weights import load_hf_dir

HEADS, KV_HEADS, VOCAB = 4, 2, 300
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "post_attention_layernorm": "ffn_norm",
    "input_layernorm": "attn_norm",
}


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def hf_state(hf_model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in hf_model.state_dict().items()}


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    _, _, layer, module = hf_name.split(".", 3)
    stem, suffix = module.rsplit(".", 1)
    return f"blk.{layer}.{HF_TO_GGUF[stem]}.{suffix}"


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's rotary permutation of q/k rows."""
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_array(hf_name: str, tensor: torch.Tensor) -> np.ndarray:
    array = tensor.numpy().astype(np.float32)
    if hf_name.endswith("q_proj.weight"):
        return permute(array, HEADS)
    if hf_name.endswith("k_proj.weight"):
        return permute(array, KV_HEADS)
    return array


def add_tensor(writer: gguf.GGUFWriter, hf_name: str, array: np.ndarray) -> None:
    """F32 for norms, Q8_0 for the embedding, F16 for the other matrices."""
    name = gguf_name(hf_name)
    if array.ndim == 1:
        writer.add_tensor(name, array)
    elif name == "token_embd.weight":
        q = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(array, q), raw_dtype=q)
    else:
        writer.add_tensor(name, array.astype(np.float16))


def write_metadata(writer: gguf.GGUFWriter, cfg: LlamaConfig) -> None:
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(["t 1", "t1 0"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)


def finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_gguf(
    path: Path, model: LlamaForCausalLM, state: dict[str, torch.Tensor], tied: bool = False
) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    write_metadata(writer, model.config)
    for hf_name, tensor in state.items():
        if not (tied and hf_name == "lm_head.weight"):
            add_tensor(writer, hf_name, gguf_array(hf_name, tensor))
    finish(writer)
    return path


def test_hf_dir_round_trip(tmp_path: Path, hf_model: LlamaForCausalLM, hf_state: dict) -> None:
    hf_model.save_pretrained(tmp_path)
    config, state = load_hf_dir(tmp_path)
    assert config["num_key_value_heads"] == KV_HEADS
    assert state.keys() == hf_state.keys()
    for name, tensor in hf_state.items():
        assert torch.equal(state[name], tensor), name


def test_hf_dir_sharded_and_dtype(tmp_path: Path, hf_model: LlamaForCausalLM, hf_state: dict) -> None:
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    _, state = load_hf_dir(tmp_path, dtype=torch.bfloat16)
    assert state.keys() == hf_state.keys()
    assert all(t.dtype == torch.bfloat16 for t in state.values())


def test_gguf_matches_hf(tmp_path: Path, hf_model: LlamaForCausalLM, hf_state: dict) -> None:
    config, state, vocab = load_gguf(write_gguf(tmp_path / "m.gguf", hf_model, hf_state))
    assert state.keys() == hf_state.keys()
    for name, tensor in hf_state.items():
        if tensor.ndim == 1:
            assert torch.equal(state[name], tensor), name
        else:
            atol = 2e-3 if name == "model.embed_tokens.weight" else 1e-4
            torch.testing.assert_close(state[name], tensor, atol=atol, rtol=0, msg=name)
    hf_cfg = hf_model.config
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rms_norm_eps",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "head_dim",
    ):
        assert config[key] == getattr(hf_cfg, key), key
    assert (vocab.bos_token_id, vocab.eos_token_id, vocab.chat_template) == (1, 2, TEMPLATE)
    assert vocab.merges == ["t 1", "t1 0"] and len(vocab.tokens) == VOCAB


def test_unpermute_inverts_llama_cpp_permute() -> None:
    weight = torch.randn(32, 8)
    permuted = torch.from_numpy(permute(weight.numpy(), KV_HEADS))
    assert not torch.equal(permuted, weight)
    assert torch.equal(unpermute(permuted, KV_HEADS), weight)


def test_gguf_without_output_is_tied(tmp_path: Path, hf_model: LlamaForCausalLM, hf_state: dict) -> None:
    config, state, _ = load_gguf(write_gguf(tmp_path / "m.gguf", hf_model, hf_state, tied=True))
    assert config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in state


def test_missing_dir_and_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found"):
        load_hf_dir(tmp_path / "absent")
    with pytest.raises(ValueError, match="config.json missing"):
        load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed JSON"):
        load_hf_dir(tmp_path)


def test_config_lacking_field(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 9}')
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_hf_dir(tmp_path)


def test_missing_safetensors(tmp_path: Path) -> None:
    fields = '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 9}'
    (tmp_path / "config.json").write_text(fields)
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_hf_dir(tmp_path)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="fake.gguf"):
        load_gguf(path)
    with pytest.raises(ValueError, match="not found"):
        load_gguf(tmp_path / "absent.gguf")


def test_gguf_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_token_list(["a", "b"])
    finish(writer)
    with pytest.raises(ValueError, match="unsupported architecture 'mamba'"):
        load_gguf(path)


def test_gguf_lacking_metadata(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "b"])
    writer.add_head_count(4)
    writer.add_embedding_length(64)
    finish(writer)
    with pytest.raises(ValueError, match="m.gguf lacks metadata field llama.feed_forward_length"):
        load_gguf(path)


def test_gguf_unsupported_quant_type(tmp_path: Path, hf_model: LlamaForCausalLM) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    write_metadata(writer, hf_model.config)
    q = gguf.GGMLQuantizationType.Q5_0
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(np.ones((4, 32), np.float32), q), raw_dtype=q)
    finish(writer)
    with pytest.raises(ValueError, match="m.gguf: tensor token_embd.weight has unsupported type Q5_0"):
        load_gguf(path)
