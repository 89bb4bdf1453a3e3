"""The injection vocabulary every backend applies (cluster.injection): a
bad injection is refused naming what is wrong, and the M a rank publishes
and consumes, which the emulated host half, the emulated rank and the GPU
rank all take from :func:`rank_tokens`."""

import pytest

from cluster.injection import INJECTIONS, rank_tokens, validate_injection


@pytest.mark.parametrize("injection, tokens", [
    (None, 8), ({"kind": "skip_publish"}, 8), ({"kind": "tokens_delta", "delta": -1}, 7),
    ({"kind": "tokens_delta", "delta": 2}, 10), ({"kind": "delay_publish", "delay_ns": 5}, 8)])
def test_a_rank_s_tokens_move_by_a_tokens_delta_only(injection, tokens):
    assert rank_tokens(8, injection) == tokens


@pytest.mark.parametrize("injection, said", [
    ({"kind": None}, "unknown fault injection None"),
    ({"kind": "tokens_delta"}, "takes parameters ['delta'], got []"),
    ({"kind": "skip_publish", "delta": 1}, "takes parameters [], got ['delta']"),
])
def test_a_bad_injection_is_refused_naming_it(injection, said):
    with pytest.raises(ValueError) as refused:
        validate_injection(injection)
    assert said in str(refused.value)
    with pytest.raises(ValueError):
        rank_tokens(8, injection)


def test_every_kind_validates_with_its_parameters():
    for kind, params in INJECTIONS.items():
        assert validate_injection({"kind": kind, **{p: 1 for p in params}})["kind"] == kind
