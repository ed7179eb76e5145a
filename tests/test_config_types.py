"""One typed path for config values: text from flags/YAML is parsed per field type, typed
values are checked, and configs built in Python get the same checks."""

from __future__ import annotations

import pytest

from llm_marl.learners.config import MAGRPOConfig
from llm_marl.learners.reinforce.config import MARLOOConfig
from llm_marl.learners.config_docs import field_docs, field_sections
from llm_marl.learners.config_types import ConfigTypeError, coerce_mapping, coerce_value, field_types

TYPES = field_types(MAGRPOConfig)


@pytest.mark.parametrize("name, text, expected", [
    ("agent_learning_rate", "1e-3", 0.001),
    ("agent_learning_rate", 2, 2.0),
    ("num_generations", "8", 8),
    ("advantage_normalization", "false", False),
    ("advantage_normalization", "True", True),
    ("advantage_normalization", False, False),
    ("top_k", "none", None),
    ("top_k", None, None),
    ("early_termination_threshold", "-0.5", -0.5),
    ("agent_devices", "cuda:0,cuda:1", ["cuda:0", "cuda:1"]),
    ("agent_devices", "cpu", "cpu"),
    ("agent_devices", ["cpu", "cpu"], ["cpu", "cpu"]),
    ("joint_mode", "cross", "cross"),
    ("output_dir", "null", None),
])
def test_text_and_values_become_the_field_type(name, text, expected):
    value = coerce_value(name, TYPES[name], text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("name, value, message", [
    ("agent_learning_rate", "fast", "agent_learning_rate: expected a float (e.g. 1e-3), got 'fast'"),
    ("num_generations", "8.5", "num_generations: expected an int, got '8.5'"),
    ("num_generations", True, "num_generations: expected an int, got True"),
    ("advantage_normalization", "yes", "advantage_normalization: expected true or false, got 'yes'"),
    ("advantage_normalization", 1, "advantage_normalization: expected true or false, got 1"),
    ("temperature", None, "temperature: expected a float (e.g. 1e-3), got None"),
    ("agent_devices", [0, 1], "agent_devices: expected a comma-separated list of strings or a string or none, got [0, 1]"),
    ("agent_devices", "cpu,,cpu", "agent_devices: expected a comma-separated list of strings or a string or none, got 'cpu,,cpu'"),
    ("agent_advantage_normalization", "yes,no", "agent_advantage_normalization: expected a comma-separated list of true/false values or none, got 'yes,no'"),
    ("agent_learning_rates", "fast,slow", "agent_learning_rates: expected a comma-separated list of floats or none, got 'fast,slow'"),
])
def test_wrong_values_name_field_and_value(name, value, message):
    with pytest.raises(ConfigTypeError) as error:
        coerce_value(name, TYPES[name], value)
    assert str(error.value) == message


def test_yaml_mapping_names_its_source_and_leaves_other_keys():
    assert coerce_mapping(MAGRPOConfig, {"weight_decay": "1e-2", "env": "X"}) == {"weight_decay": 0.01, "env": "X"}
    with pytest.raises(ConfigTypeError, match=r"^run.yaml: seed: expected an int, got 'abc'$"):
        coerce_mapping(MAGRPOConfig, {"seed": "abc"}, source="run.yaml")


def test_configs_built_in_python_get_the_same_type_checks():
    with pytest.raises(ValueError, match=r"agent_learning_rate: expected a float \(e.g. 1e-3\), got '1e-3'"):
        MAGRPOConfig(agent_learning_rate="1e-3")  # Python strings are not parsed: a str is a mistake here
    with pytest.raises(ValueError, match="advantage_normalization: expected true or false, got 'false'"):
        MAGRPOConfig(advantage_normalization="false")
    with pytest.raises(ValueError, match="num_generations: expected an int, got 4.0"):
        MAGRPOConfig(num_generations=4.0)
    config = MAGRPOConfig(agent_learning_rate=1, reference_devices=("cpu", "cpu"))
    assert type(config.agent_learning_rate) is float and config.reference_devices == ["cpu", "cpu"]


def test_field_docs_come_from_the_source():
    docs = field_docs(MARLOOConfig)
    assert docs["num_generations"] == "K: samples per observation per agent (>= 2)."
    assert docs["advantage_mode"].startswith('Baseline: "mean" (MAGRPO)')  # inherited: the subclass has no string
    assert all(docs.values()), [name for name, doc in docs.items() if not doc]
    sections = field_sections(MAGRPOConfig)
    assert sections["num_generations"] != sections["seed"] and sections["seed"] == "beyond the specification"
