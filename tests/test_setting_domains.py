"""Every numeric setting is checked against the domain the method defines for it, and the refusal names it.

Each config class declares one :class:`~simcse_weince.validation.Domain` per numeric field (``FIELD_DOMAINS``,
``WEINCE_DOMAINS``); the invariant, over every field of every class: a value outside its domain is refused with
``<field> must be <domain>``, and a value inside it is accepted (the other fields at their defaults, and a field
that another one bounds given room). A numeric field without a declared domain fails the first test.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcse_weince.settings import apply_overrides
from simcse_weince.text.config import FIELD_DOMAINS as TEXT_DOMAINS
from simcse_weince.text.config import SpeedConfig, TrainConfig
from simcse_weince.validation import Domain
from simcse_weince.vision.config import FIELD_DOMAINS as VISION_DOMAINS
from simcse_weince.vision.config import VisionTrainConfig
from simcse_weince.weince.config import WEINCE_DOMAINS, WeinceConfig

SPEED_DOMAINS = {"length_chunks": Domain(1, why="or auto")}
#: (class, domains, settings that give a field room: field -> other settings the value needs)
CLASSES = {
    "TrainConfig": (TrainConfig, TEXT_DOMAINS),
    "VisionTrainConfig": (VisionTrainConfig, VISION_DOMAINS),
    "WeinceConfig": (WeinceConfig, WEINCE_DOMAINS),
    "SpeedConfig": (SpeedConfig, SPEED_DOMAINS),
}
CASES = [(name, field) for name, (_, domains) in CLASSES.items() for field in domains]


def _numeric_fields(cls) -> set[str]:
    hints = typing.get_type_hints(cls)
    numeric = set()
    for field in dataclasses.fields(cls):
        options = typing.get_args(hints[field.name]) or (hints[field.name],)
        if any(option in (int, float) for option in options):
            numeric.add(field.name)
    return numeric


@pytest.mark.parametrize("name", CLASSES)
def test_every_numeric_setting_has_a_domain(name):
    cls, domains = CLASSES[name]
    assert _numeric_fields(cls) == set(domains)


def _is_int(cls, field) -> bool:
    options = typing.get_args(typing.get_type_hints(cls)[field]) or (typing.get_type_hints(cls)[field],)
    return float not in options


def _build(cls, field, value):
    """The config with ``field = value``, other settings at defaults, except where a rule between fields needs
    room: the clamp of beta holds its ends in order, ViT depth needs a ViT."""
    extra = {}
    if cls is WeinceConfig and field == "beta_min":
        extra["beta_max"] = max(16.0, value)
    if cls is WeinceConfig and field == "beta_max" and value > 0:
        extra["beta_min"] = min(0.5, value)
    if cls is VisionTrainConfig and field == "vit_layers":
        extra["backbone"] = "vit_small"
    return cls(**{field: value, **extra})


def _inside(domain: Domain, integer: bool):
    low = domain.low if domain.low != -math.inf else -1e6
    high = domain.high if domain.high != math.inf else 1e6
    if integer:
        low = math.ceil(low) if domain.low_closed else math.floor(low) + 1
        high = math.floor(high) if domain.high_closed else math.ceil(high) - 1
        return st.integers(int(low), int(high))
    return st.floats(low, high, exclude_min=not domain.low_closed, exclude_max=not domain.high_closed)


def _outside(domain: Domain, integer: bool):
    options = []
    if domain.low != -math.inf:
        below = domain.low if not domain.low_closed else (domain.low - 1 if integer else math.nextafter(domain.low, -1))
        options.append(st.integers(int(below) - 1000, int(below)) if integer else
                       st.floats(domain.low - 1000, below))  # fmt: skip
    if domain.high != math.inf:
        above = domain.high if not domain.high_closed else (domain.high + 1 if integer else
                                                            math.nextafter(domain.high, 2))  # fmt: skip
        options.append(st.integers(int(above), int(above) + 1000) if integer else st.floats(above, domain.high + 1000))
    return st.one_of(options) if options else st.nothing()


@pytest.mark.parametrize("name, field", CASES, ids=[f"{name}.{field}" for name, field in CASES])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_value_inside_its_domain_is_accepted_and_one_outside_is_refused_naming_it(name, field, data):
    cls, domains = CLASSES[name]
    domain, integer = domains[field], _is_int(cls, field)
    value = data.draw(_inside(domain, integer), label="inside")
    assert getattr(_build(cls, field, value), field) == value
    if domain.low == -math.inf and domain.high == math.inf:
        return  # any finite number (NaN and infinities are refused by the type check)
    value = data.draw(_outside(domain, integer), label="outside")
    with pytest.raises(ValueError) as refused:
        _build(cls, field, value)
    message = str(refused.value)
    assert message.startswith(f"{field} must be {domain}") and message.endswith(f"got {value}"), message


@pytest.mark.parametrize(
    "setting, text",
    [
        ("temperature", "temperature must be > 0, got 0.0"),
        ("dropout", "dropout must be in [0, 1) (a probability of dropping a unit; None keeps the model's), got 1.0"),
        ("batch_size", "batch_size must be >= 2 (each sentence needs at least one in-batch negative), got 1"),
        ("weince.kappa_rho", "kappa_rho must be > 0 (the slope of the hardness sigmoid; 0 would fix lambda_rho at"),
        ("weince.tail_fraction", "tail_fraction must be in (0, 1] (a share of each anchor's negatives), got 0.0"),
    ],
)
def test_the_refusal_of_a_flag_names_the_field_and_its_domain(setting, text):
    """As a flag or a config file gives it (a string): the same check, the same words."""
    value = {"temperature": "0", "dropout": "1", "batch_size": "1"}.get(setting, "0")
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        apply_overrides(TrainConfig(), {setting: value})
