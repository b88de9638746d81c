"""The knowledge table: precedence of each figure, calibration, learning from errors, silent truncation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.estimate import MAX_CORRECTION, MIN_CORRECTION, EstimateCounter
from app.core.knowledge import (
    CALIBRATION_SAMPLES,
    DiscoveredFigures,
    Knowledge,
    UsageVerdict,
    is_truncated,
)
from app.core.overflow import ContextOverflow
from app.core.registry import ModelSpec
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter

M = "acme/model"


def spec(
    source: str = "builtin", *, window: int = 8192, max_output: int = 4096, guessed: bool = False
) -> ModelSpec:
    return ModelSpec(
        name=M,
        window_tokens=window,
        max_output_tokens=max_output,
        encoding="estimate",
        source=source,
        guessed=guessed,
    )


def default_spec() -> ModelSpec:
    return spec("default", guessed=True)


def sources(s: ModelSpec) -> dict[str, str]:
    return dict(s.sources)


def usage(
    k: Knowledge,
    prompt: int,
    *,
    fixed: int = 10,
    text: int = 1000,
    exact: bool = False,
    window: int | None = None,
) -> UsageVerdict:
    return k.observe_usage(
        M, prompt_tokens=prompt, fixed_tokens=fixed, text_tokens=text, exact=exact, window_tokens=window
    )


# -- precedence ------------------------------------------------------------------------------------


def test_nothing_known_keeps_the_table_and_says_so() -> None:
    k = Knowledge()
    s = k.effective(spec())
    assert (s.window_tokens, s.max_output_tokens, s.source, s.correction) == (8192, 4096, "builtin", 1.0)
    assert sources(s) == {
        "window": "builtin",
        "max_output": "builtin",
        "encoding": "builtin",
        "correction": "none",
    }
    assert s.source_of("window") == "builtin"


def test_discovered_beats_builtin_and_default_but_not_the_operator() -> None:
    k = Knowledge()
    k.set_discovered(M, DiscoveredFigures(window_tokens=32768, max_output_tokens=2048, effective=True))
    for table in (spec(), default_spec()):
        s = k.effective(table)
        assert (s.window_tokens, s.max_output_tokens) == (32768, 2048)
        assert sources(s)["window"] == "discovered" and sources(s)["max_output"] == "discovered"
        assert not s.guessed
    s = k.effective(spec("operator", window=16384, max_output=1024))
    assert (s.window_tokens, s.max_output_tokens, s.source) == (16384, 1024, "operator")


def test_the_header_beats_everything() -> None:
    k = Knowledge()
    k.set_discovered(M, DiscoveredFigures(window_tokens=32768))
    k.observe_overflow(
        M, ContextOverflow("vllm", limit_tokens=2048), fixed_tokens=0, text_tokens=0, exact=False
    )
    s = k.effective(spec("operator"), header_window_tokens=1000)
    assert (s.window_tokens, s.source) == (1000, "request")
    assert s.max_output_tokens == 1000  # never above the window


def test_a_learned_window_beats_discovery_and_caps_the_operator_only_downwards() -> None:
    k = Knowledge()
    k.set_discovered(M, DiscoveredFigures(window_tokens=32768))
    k.observe_overflow(
        M, ContextOverflow("vllm", limit_tokens=4096), fixed_tokens=0, text_tokens=0, exact=False
    )
    assert (k.effective(spec()).window_tokens, k.effective(spec()).source) == (4096, "learned:overflow")
    assert k.effective(spec("operator", window=16384)).window_tokens == 4096
    assert k.effective(spec("operator", window=2048, max_output=1024)).window_tokens == 2048


def test_discovered_max_output_is_capped_by_the_window() -> None:
    k = Knowledge()
    k.set_discovered(M, DiscoveredFigures(window_tokens=4096, max_output_tokens=65536))
    s = k.effective(spec())
    assert (s.window_tokens, s.max_output_tokens) == (4096, 4096)


def test_empty_discoveries_are_not_stored_and_the_table_is_bounded() -> None:
    k = Knowledge(max_models=3)
    k.set_discovered(M, DiscoveredFigures())
    assert k.discovered(M) is None and k.models() == ()
    for i in range(5):
        k.set_discovered(f"m{i}", DiscoveredFigures(window_tokens=1000 + i))
    assert k.models() == ("m2", "m3", "m4")


# -- calibration -----------------------------------------------------------------------------------


def test_a_usage_sample_becomes_the_correction_of_an_estimate_model() -> None:
    k = Knowledge()
    verdict = usage(k, 10 + 1300)
    assert verdict.sampled and not verdict.truncated
    s = k.effective(spec())
    assert s.correction == pytest.approx(1.3)
    assert sources(s)["correction"] == "calibrated:usage"


def test_the_correction_is_the_median_of_recent_samples_and_old_ones_fall_out() -> None:
    k = Knowledge()
    for prompt in (1210, 1210, 1810, 1210):  # 1.2, 1.2, 1.8 (an outlier), 1.2
        usage(k, prompt)
    assert k.correction(M) == pytest.approx(1.2)
    for _ in range(CALIBRATION_SAMPLES):
        usage(k, 1510)
    assert k.correction(M) == pytest.approx(1.5)


def test_the_correction_is_bounded_and_a_count_below_the_lowest_factor_is_a_cut() -> None:
    k = Knowledge()
    usage(k, 10 + 5000)
    assert k.correction(M) == MAX_CORRECTION
    k2 = Knowledge()
    assert usage(k2, 10 + 450).truncated  # no factor in bounds explains 0.45
    assert k2.correction(M) is None


def test_tiny_requests_are_no_samples() -> None:
    k = Knowledge()
    assert not usage(k, 30, text=20).sampled
    assert k.correction(M) is None


def test_exact_models_record_the_ratio_but_apply_no_correction() -> None:
    k = Knowledge()
    assert usage(k, 1515, fixed=10, text=1000, exact=True).sampled
    facts = k.facts(M)
    assert facts is not None and facts.factor == pytest.approx(1.5) and facts.samples == 1
    exact = replace(spec(), encoding="o200k_base")
    assert k.effective(exact).correction == 1.0 and sources(k.effective(exact))["correction"] == "none"


def test_an_overflow_teaches_the_window_and_the_ratio() -> None:
    k = Knowledge()
    overflow = ContextOverflow("llamacpp", limit_tokens=4096, prompt_tokens=10 + 1400)
    k.observe_overflow(M, overflow, fixed_tokens=10, text_tokens=1000, exact=False)
    s = k.effective(spec())
    assert s.window_tokens == 4096 and s.correction == pytest.approx(1.4)
    assert sources(s)["correction"] == "calibrated:overflow"


def test_a_lower_bound_prompt_count_is_no_sample() -> None:
    k = Knowledge()
    overflow = ContextOverflow("vllm", limit_tokens=4096, prompt_tokens=4097, prompt_at_least=True)
    k.observe_overflow(M, overflow, fixed_tokens=10, text_tokens=1000, exact=False)
    assert k.correction(M) is None and k.effective(spec()).window_tokens == 4096


# -- silent truncation -----------------------------------------------------------------------------


def test_is_truncated_needs_a_clear_gap() -> None:
    assert is_truncated(prompt_tokens=400, expected_tokens=1000, calibrated=False)
    assert not is_truncated(prompt_tokens=600, expected_tokens=1000, calibrated=False)
    assert is_truncated(prompt_tokens=700, expected_tokens=1000, calibrated=True)
    assert not is_truncated(prompt_tokens=850, expected_tokens=1000, calibrated=True)
    assert not is_truncated(prompt_tokens=10, expected_tokens=70, calibrated=True)  # too small to tell


def test_a_count_far_below_ours_is_a_cut_that_teaches_the_window_and_warns_once() -> None:
    k = Knowledge()
    usage(k, 1010)
    usage(k, 1010)  # calibrated at 1.0
    verdict = usage(k, 2048, text=4000)
    assert verdict.truncated and verdict.learned_window_tokens == 2048 and not verdict.sampled
    assert k.correction(M) == pytest.approx(1.0)  # the cut is no calibration sample
    assert k.effective(spec()).window_tokens == 2048
    assert k.effective(spec()).source == "learned:truncation"
    assert k.take_warning(M) and not k.take_warning(M)


def test_a_tiny_truncated_count_warns_but_teaches_no_window() -> None:
    k = Knowledge()
    verdict = usage(k, 10, text=1000, exact=True)
    assert verdict.truncated and verdict.learned_window_tokens is None
    assert k.effective(spec()).window_tokens == 8192


def test_a_count_at_the_window_is_a_cut_and_a_lower_bound_sample() -> None:
    k = Knowledge()
    verdict = usage(k, 4096, fixed=96, text=3000, window=4096)  # ours ~3096, theirs >= 4096
    assert verdict.truncated
    assert k.correction(M) == pytest.approx(4000 / 3000 * 1.1)
    assert k.take_warning(M)
    # Without a known window, the same numbers are an ordinary sample.
    k2 = Knowledge()
    assert usage(k2, 4096, fixed=96, text=3000).sampled


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 20_000), st.booleans()), max_size=30))
def test_the_factor_always_stays_in_bounds(observations: list[tuple[int, int, bool]]) -> None:
    k = Knowledge()
    for prompt, text, at_window in observations:
        usage(k, prompt, text=text, window=prompt if at_window else None)
        factor = k.correction(M)
        assert factor is None or MIN_CORRECTION <= factor <= MAX_CORRECTION
        s = k.effective(spec())
        assert s.window_tokens > 0 and 0 < s.max_output_tokens <= s.window_tokens


# -- MessageCounter.request_parts (the calibration's inputs) ---------------------------------------


def test_request_parts_split_fixed_overheads_from_uncorrected_text() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there world"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": "does f"}}],
    }
    plain = MessageCounter(EstimateCounter())
    fixed, text = plain.request_parts(body)
    assert fixed + text == plain.count_request(body)
    assert fixed >= 2 * 3 + REPLY_PRIMING_TOKENS and text > 0
    corrected = MessageCounter(EstimateCounter(correction=2.0))
    assert corrected.request_parts(body) == (fixed, text)  # uncorrected, whatever the correction
    assert corrected.count_request(body) >= fixed + 2 * text


def test_a_cache_delta_count_warns_but_does_not_shrink_the_window() -> None:
    # Some servers report only the prompt tokens their cache did not hold: far below ours, varying.
    k = Knowledge()
    usage(k, 1010)
    usage(k, 3010, text=3000)  # a whole prompt taken: 3010 tokens
    for prompt, text in ((700, 3500), (900, 4000), (450, 4400)):
        verdict = usage(k, prompt, text=text)
        assert verdict.truncated and verdict.learned_window_tokens is None
    assert k.effective(spec()).window_tokens == 8192


def test_a_repeated_cut_count_confirms_the_window_never_below_a_prompt_taken_whole() -> None:
    k = Knowledge()
    usage(k, 1010)
    usage(k, 3010, text=3000)
    first = usage(k, 3500, text=6000)  # not a round number: not confirmed yet
    assert first.truncated and first.learned_window_tokens is None
    second = usage(k, 3510, text=8000)  # the same count for a larger prompt of ours: pinned
    assert second.learned_window_tokens == 3510
    assert k.effective(spec()).window_tokens == 3510
    k2 = Knowledge()
    usage(k2, 1010)
    usage(k2, 3010, text=3000)
    usage(k2, 2048, text=9000)  # a round count (Ollama num_ctx) confirms at once, floored at 3010
    assert k2.effective(spec()).window_tokens == 3010


# -- the upstream's counting endpoint --------------------------------------------------------------


def test_an_upstream_count_is_a_calibration_sample_and_never_a_cut() -> None:
    k = Knowledge()
    assert k.observe_count(M, input_tokens=1510, fixed_tokens=10, text_tokens=1000, exact=False)
    s = k.effective(spec())
    assert abs(s.correction - 1.5) < 1e-9 and sources(s)["correction"] == "calibrated:count"
    # Far below ours: an over-estimate of ours (nothing was sent to the model), no warning, no window.
    assert k.observe_count(M, input_tokens=110, fixed_tokens=10, text_tokens=1000, exact=False)
    facts = k.facts(M)
    assert facts is not None and facts.truncations == 0 and facts.learned_window_tokens is None
    assert not k.take_warning(M)
    assert not k.observe_count(M, input_tokens=0, fixed_tokens=10, text_tokens=1000, exact=False)
    assert not k.observe_count(M, input_tokens=40, fixed_tokens=10, text_tokens=20, exact=False)  # too small


def test_a_shared_count_calibration_keeps_its_source() -> None:
    k = Knowledge()
    k.observe_count(M, input_tokens=1210, fixed_tokens=10, text_tokens=1000, exact=False)
    exported = k.export(M)
    assert exported is not None
    other = Knowledge()
    assert other.absorb(M, exported)
    assert sources(other.effective(spec()))["correction"] == "calibrated:count"


# -- errors without numbers, proven windows, precision -----------------------------------------------


NO_NUMBERS = ContextOverflow("openai", message="Your input exceeds the context window of this model.")


def test_an_error_without_numbers_teaches_half_of_what_was_refused_and_each_one_halves_again() -> None:
    k = Knowledge()
    k.observe_overflow(M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True, sent_tokens=33_000)
    s = k.effective(spec(window=131_072))
    assert s.window_tokens == 16_500 and sources(s)["window"] == "learned:bound"
    # Nothing sent, nothing learned; a larger refusal does not raise it; a smaller one halves it.
    k.observe_overflow(M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True)
    k.observe_overflow(M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True, sent_tokens=40_000)
    assert k.effective(spec(window=131_072)).window_tokens == 16_500
    k.observe_overflow(
        M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True, sent_tokens=6_000, output_tokens=2_000
    )
    assert k.effective(spec(window=131_072)).window_tokens == 4_000


def test_a_window_stated_by_numbers_is_not_raised_by_a_bound() -> None:
    k = Knowledge()
    k.observe_overflow(
        M, ContextOverflow("openai", limit_tokens=4096), fixed_tokens=10, text_tokens=1000, exact=True
    )
    k.observe_overflow(M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True, sent_tokens=20_000)
    s = k.effective(spec(window=131_072))
    assert s.window_tokens == 4096 and sources(s)["window"] == "learned:overflow"


def test_a_success_after_a_bound_proves_the_window_the_next_requests_fit_to() -> None:
    k = Knowledge()
    assert not k.observe_proven(M, 3_000)  # nothing learned from a bound yet
    k.observe_overflow(M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True, sent_tokens=10_000)
    assert k.observe_proven(M, 3_900)
    assert k.effective(spec(window=131_072)).window_tokens == 3_900
    assert not k.observe_proven(M, 4_500)  # a proven window never raises the learned one


def test_a_shared_bound_is_absorbed_like_any_learned_window() -> None:
    k = Knowledge()
    k.observe_overflow(M, NO_NUMBERS, fixed_tokens=10, text_tokens=1000, exact=True, sent_tokens=10_000)
    exported = k.export(M)
    assert exported is not None and exported["learned_from"] == "learned:bound"
    other = Knowledge()
    assert other.absorb(M, exported)
    assert sources(other.effective(spec(window=131_072)))["window"] == "learned:bound"
    assert not other.absorb(M, {**exported, "learned_from": "learned:guess"})


def test_precision_needs_samples_and_measures_how_far_the_upstream_strayed_from_ours() -> None:
    k = Knowledge()
    for prompt in (1010, 1030):
        usage(k, prompt, exact=True, fixed=1000, text=0)
    assert k.precision(M, exact=True) is None
    usage(k, 990, exact=True, fixed=1000, text=0)
    exact = k.precision(M, exact=True)
    assert exact is not None and exact.samples == 3
    assert exact.under == pytest.approx(0.03) and exact.over == pytest.approx(0.01)
    # An estimate's are measured against its calibrated correction (the median).
    e = Knowledge()
    for text in (1000, 1100, 1200):
        e.observe_usage(M, prompt_tokens=10 + text, fixed_tokens=10, text_tokens=1000, exact=False)
    measured = e.precision(M, exact=False)
    assert measured is not None
    assert measured.under == pytest.approx(1.2 / 1.1 - 1) and measured.over == pytest.approx(1 - 1.0 / 1.1)


def test_the_effective_spec_is_reused_until_what_it_reads_changes() -> None:
    k = Knowledge()
    first = k.effective(spec())
    assert k.effective(spec()) is first  # an equal table spec, nothing learned since
    k.set_discovered(M, DiscoveredFigures(window_tokens=32768))
    discovered = k.effective(spec())
    assert discovered.window_tokens == 32768 and k.effective(spec()) is discovered
    for _ in range(5):  # calibration samples move the estimate's correction
        k.observe_usage(M, prompt_tokens=1500, fixed_tokens=0, text_tokens=1000, exact=False)
    calibrated = k.effective(spec())
    assert calibrated.correction != discovered.correction and calibrated.source_of("correction").startswith(
        "calibrated"
    )
    assert k.effective(spec(), header_window_tokens=1000).window_tokens == 1000
