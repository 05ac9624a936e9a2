import pytest

from tropical.core.specs import ReplicaSpec, hardware
from tropical.models import load_model_spec, shipped_models


def test_shipped_models_are_the_five_promised():
    assert shipped_models() == ["internlm-20b", "internlm2-20b", "llama-2-7b", "llama-3-8b",
                                "smollm2-135m"]


@pytest.mark.parametrize("name, billions", [("llama-2-7b", 6.74), ("llama-3-8b", 8.03),
                                            ("internlm2-20b", 19.86), ("smollm2-135m", 0.1348)])
def test_parameter_counts_match_published_sizes(name, billions):
    assert load_model_spec(name).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_kv_bytes_per_token_counts_gqa_heads():
    assert load_model_spec("llama-2-7b").kv_bytes_per_token == 2 * 32 * 4096 * 2
    assert load_model_spec("internlm2-20b").kv_bytes_per_token == 2 * 48 * 8 * 128 * 2


def test_internlm2_context_is_200k():
    assert load_model_spec("internlm2-20b").max_context == 200_000


def test_replica_kv_capacity_is_memory_minus_weights():
    replica = ReplicaSpec(load_model_spec("internlm2-20b"), hardware("a100"), tp=2)
    free = 2 * 80 * 2**30 * 0.9 - replica.model.weight_bytes
    assert replica.kv_capacity_tokens == int(free // replica.model.kv_bytes_per_token)


def test_model_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        ReplicaSpec(load_model_spec("internlm2-20b"), hardware("a100"), tp=1,
                    memory_utilization=0.3)


def test_config_missing_a_field_names_it(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    with pytest.raises(ValueError, match="num_attention_heads"):
        load_model_spec(str(tmp_path))


def test_unknown_model_and_gpu_list_choices():
    with pytest.raises(ValueError, match="llama-2-7b"):
        load_model_spec("gpt-9")
    with pytest.raises(ValueError, match="a100-80gb"):
        hardware("tpu")
