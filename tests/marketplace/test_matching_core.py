"""Who meets a job's requirements, and the reason each other worker does not (marketplace/core/matching.py)."""

from __future__ import annotations

from marketplace.core.matching import Needs, Offer, match, remedy, unmet


def offer(wid=1, *, memory=24.0, engines=("hf",), price=1.0, reliability=1.0):
    return Offer(wid, price, reliability, memory, engines)


def test_each_requirement_names_its_reason():
    needs = Needs(memory_gb=40, memory_given=True, engine="vllm", max_price_per_hour=2.0, min_reliability=0.9)
    assert unmet(offer(memory=80, engines=("hf", "vllm")), needs) is None
    assert unmet(offer(memory=24, engines=("hf", "vllm")), needs) == "memory"
    assert unmet(offer(memory=80, engines=("hf",)), needs) == "engine"
    assert unmet(offer(memory=80, engines=("hf", "vllm"), price=3.0), needs) == "price"
    assert unmet(offer(memory=80, engines=("hf", "vllm"), reliability=0.5), needs) == "reliability"
    assert unmet(Offer(1, 1.0, 1.0), needs) == "hardware unknown"


def test_a_worker_without_hardware_is_matched_on_an_estimate_but_not_on_an_explicit_need():
    unknown = Offer(1, 1.0, 1.0)
    assert unmet(unknown, Needs(memory_gb=300.0)) is None  # derived: older agents keep serving
    assert unmet(unknown, Needs(memory_gb=300.0, memory_given=True)) == "hardware unknown"
    assert unmet(unknown, Needs(engine="hf")) == "hardware unknown"
    assert unmet(offer(engines=()), Needs()) == "engine"  # it reported no engine at all


def test_match_counts_per_reason_and_says_it_in_one_line():
    offers = [offer(1, memory=8), offer(2, memory=16), offer(3, memory=80), offer(4, memory=80, price=9.0)]
    matched = match(offers, Needs(memory_gb=20, max_price_per_hour=5.0))
    assert matched.qualify == (3,) and matched.total == 4
    assert matched.excluded == {"memory": 2, "price": 1} and matched.reasons == {1: "memory", 2: "memory", 4: "price"}
    assert matched.line() == "1 of 4 match (memory 2, price 1)"
    assert match([offer(1)], Needs()).line() == "1 of 1 match"


def test_a_job_no_worker_meets_is_told_the_requirement_and_the_fix():
    big, small = Offer(1, 0.9, 0.95, 24.0, ("hf",)), Offer(2, 0.4, 0.5, 16.0, ("hf",))
    needs = Needs(memory_gb=80, memory_given=True)
    assert remedy([big, small], needs, match([big, small], needs)) == (
        "needs 80 GB of GPU memory; the largest worker has 24 GB: lower requirements.min_gpu_memory_gb or wait")
    needs = Needs(max_price_per_hour=0.3)
    assert remedy([big, small], needs, match([big, small], needs)) == (
        "pays at most 0.3 USD/h; the cheapest worker asks 0.4: raise requirements.max_price_per_hour or wait")
    needs = Needs(min_reliability=0.99)
    assert "the most reliable worker has 0.95: lower requirements.min_reliability" in remedy(
        [big, small], needs, match([big, small], needs))
    assert remedy([big], Needs(), match([big], Needs())) == ""  # it qualifies: nothing to fix
