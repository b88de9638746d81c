"""app.tokenizer: offline vocabularies, tiktoken parity, exact counting and token-boundary cuts."""

from __future__ import annotations

import gzip
import shutil
import threading
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tiktoken_ext.openai_public as openai_public
from hypothesis import given, settings
from hypothesis import strategies as st

import app.tokenizer as tokenizer
from app.core.estimate import EstimateCounter
from app.core.tokens import BatchCounter, TokenCounter
from app.tokenizer import TiktokenCounter, VocabularyError, counter_for, load_encoding, load_ranks

VOCAB = Path(tokenizer.__file__).parent / "vocab"


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """tiktoken's own download/cache path must never be used."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))

    def refuse(path: str) -> bytes:
        raise AssertionError(f"tiktoken tried to read {path}")

    monkeypatch.setattr(tiktoken.load, "read_file", refuse)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", lambda *a, **k: refuse(str(a)))


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_encoding_definition_equals_tiktoken(
    name: str, monkeypatch: pytest.MonkeyPatch, no_download: None
) -> None:
    ranks = load_encoding(name)._mergeable_ranks
    calls: list[str | None] = []

    def fake_load(path: str, expected_hash: str | None = None) -> dict[bytes, int]:
        calls.append(expected_hash)
        return ranks

    monkeypatch.setattr(tiktoken.load, "load_tiktoken_bpe", fake_load)
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
    theirs = openai_public.ENCODING_CONSTRUCTORS[name]()
    assert theirs["pat_str"] == tokenizer.PAT_STRS[name]
    assert theirs["special_tokens"] == tokenizer.SPECIAL_TOKENS[name]
    sums = dict(reversed(line.split()) for line in (VOCAB / "SHA256SUMS").read_text().splitlines())
    assert calls == [sums[f"{name}.tiktoken"]]  # our SHA256SUMS carry tiktoken's expected_hash
    ours = load_encoding(name)
    assert ours.n_vocab == tiktoken.Encoding(name, **{k: v for k, v in theirs.items() if k != "name"}).n_vocab


def test_loads_offline_without_tiktoken_download(monkeypatch: pytest.MonkeyPatch, no_download: None) -> None:
    monkeypatch.setattr(tokenizer, "_encodings", {})
    monkeypatch.setattr(tokenizer, "_counters", {})
    assert tokenizer.loaded_encodings() == ()
    assert counter_for("o200k_base").count_text("Hello world") == 2
    assert tokenizer.loaded_encodings() == ("o200k_base",)
    tokenizer.preload()
    assert tokenizer.loaded_encodings() == ("o200k_base", "cl100k_base")


def test_concurrent_first_loads_build_once(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = load_encoding("cl100k_base")._mergeable_ranks
    monkeypatch.setattr(tokenizer, "_encodings", {})
    built: list[str] = []

    def counting(name: str, **kwargs: object) -> dict[bytes, int]:
        built.append(name)
        return ranks

    monkeypatch.setattr(tokenizer, "load_ranks", counting)
    results: list[tiktoken.Encoding] = []
    threads = [
        threading.Thread(target=lambda: results.append(load_encoding("cl100k_base"))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert built == ["cl100k_base"]
    assert len({id(r) for r in results}) == 1


def test_hash_mismatch_raises(tmp_path: Path) -> None:
    shutil.copy(VOCAB / "SHA256SUMS", tmp_path / "SHA256SUMS")
    (tmp_path / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(b"IQ== 0\nIg== 1\n"))
    with pytest.raises(VocabularyError, match="does not match"):
        load_ranks("cl100k_base", vocab_dir=tmp_path)


def test_missing_checksum_entry_and_unreadable_file_raise(tmp_path: Path) -> None:
    (tmp_path / "SHA256SUMS").write_text("00  other.tiktoken\n")
    with pytest.raises(VocabularyError, match="no entry"):
        load_ranks("cl100k_base", vocab_dir=tmp_path)
    shutil.copy(VOCAB / "SHA256SUMS", tmp_path / "SHA256SUMS")
    with pytest.raises(VocabularyError, match="cannot read"):
        load_ranks("cl100k_base", vocab_dir=tmp_path)
    (tmp_path / "cl100k_base.tiktoken.gz").write_bytes(b"not gzip")
    with pytest.raises(VocabularyError, match="cannot read"):
        load_ranks("cl100k_base", vocab_dir=tmp_path)


def test_unknown_encoding_raises() -> None:
    with pytest.raises(VocabularyError, match="unknown encoding"):
        load_encoding("p50k_base")
    with pytest.raises(VocabularyError):
        counter_for("gpt2")


def test_counter_for() -> None:
    exact = counter_for("o200k_base")
    assert isinstance(exact, TiktokenCounter) and isinstance(exact, TokenCounter)
    assert exact.name == "o200k_base" and exact.exact is True
    assert counter_for("o200k_base") is exact
    estimate = counter_for("estimate", correction=1.5)
    assert isinstance(estimate, EstimateCounter) and isinstance(estimate, TokenCounter)
    assert estimate.name == "estimate" and estimate.exact is False and estimate.correction == 1.5


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_special_token_text_counts_as_plain_text(name: str) -> None:
    counter = counter_for(name)
    text = "stop here <|endoftext|> and <|endofprompt|>"
    assert counter.count_text(text) == len(load_encoding(name).encode_ordinary(text))
    assert counter.count_text(text) > counter.count_text("stop here  and ") + 2
    assert counter.count_text("") == 0


def test_head_tail_takes_whole_tokens() -> None:
    counter = counter_for("o200k_base")
    text = "Hello world, how are you today?"
    head, tail = counter.head_tail(text, head_tokens=2, tail_tokens=2)
    assert head == "Hello world"
    assert tail == " today?"
    assert counter.head_tail(text, head_tokens=0, tail_tokens=0) == ("", "")
    assert counter.head_tail(text, head_tokens=100, tail_tokens=100) == (text, text)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_head_tail_drops_a_split_multibyte_character(name: str) -> None:
    counter = counter_for(name)
    encoding = load_encoding(name)
    text = "a🧑‍🚀b"  # the emoji takes several tokens, none of them a whole character
    first = encoding.encode_ordinary(text)
    assert len(first) > 3
    for k in range(len(first) + 1):
        head, tail = counter.head_tail(text, head_tokens=k, tail_tokens=k)
        assert text.startswith(head) and text.endswith(tail)
        assert "\ufffd" not in head + tail


TEXT = st.lists(
    st.sampled_from(
        [*"ab cd,.\n", "中", "文", "語", "한", "é", "😀", "🧑\u200d🚀", "\u0301", "<|endoftext|>"]
    ),
    max_size=60,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    text=TEXT,
    head=st.integers(0, 30),
    tail=st.integers(0, 30),
    name=st.sampled_from(["o200k_base", "cl100k_base"]),
)
def test_head_tail_property(text: str, head: int, tail: int, name: str) -> None:
    counter = counter_for(name)
    h, t = counter.head_tail(text, head_tokens=head, tail_tokens=tail)
    assert text.startswith(h) and text.endswith(t)
    assert counter.count_text(h) <= head and counter.count_text(t) <= tail
    if counter.count_text(text) <= head:
        assert h == text
    if counter.count_text(text) <= tail:
        assert t == text


def _full_head_tail(counter: TiktokenCounter, text: str, head: int, tail: int) -> tuple[str, str]:
    """The reference: both ends cut from the whole text's tokens (what head_tail did before windows)."""
    tokens = counter.encoding.encode_ordinary(text)
    return counter._fit(tokens, head, from_start=True), counter._fit(tokens, tail, from_start=False)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_head_tail_of_a_long_text_encodes_only_its_ends_and_cuts_the_same(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from bench.scenarios import mixed

    text = mixed(random.Random(7), 200_000)  # prose, code, JSON and CJK
    counter = TiktokenCounter(load_encoding(name))
    expected = {n: _full_head_tail(counter, text, n, n) for n in (1, 300, 5_000, 40_000)}
    encoded: list[int] = []
    real = counter._encode
    monkeypatch.setattr(counter, "_encode", lambda t: encoded.append(len(t)) or real(t))
    for n, ends in expected.items():
        encoded.clear()
        assert counter.head_tail(text, head_tokens=n, tail_tokens=n) == ends
        assert max(encoded) < len(text) // 2  # never the whole text


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize(
    "text",
    [
        "x" * 300_000,  # one pre-tokenizer piece: every window edge falls inside it
        " " * 100_000 + "end",
        "a b\n" * 60_000,
        "🧑\u200d🚀" * 40_000,
        "1234567890" * 30_000,
    ],
    ids=["one-piece", "spaces", "short-lines", "emoji", "digits"],
)
def test_windowed_head_tail_keeps_its_contract_on_adversarial_texts(name: str, text: str) -> None:
    counter = TiktokenCounter(load_encoding(name))
    for n in (1, 100, 3_000):
        head, tail = counter.head_tail(text, head_tokens=n, tail_tokens=n)
        assert text.startswith(head) and text.endswith(tail)
        assert counter.count_text(head) <= n and counter.count_text(tail) <= n
        full_head, full_tail = _full_head_tail(counter, text, n, n)
        # as long as the whole text's cut, or within a few tokens of it (a window edge inside
        # one long piece may merge that piece differently: the re-count keeps the limit)
        assert counter.count_text(head) >= counter.count_text(full_head) - 8
        assert counter.count_text(tail) >= counter.count_text(full_tail) - 8


# -- every core: the counting pool -------------------------------------------------------------


def test_a_large_batch_is_counted_on_the_pool_with_the_same_counts() -> None:
    counter = counter_for("o200k_base")
    assert isinstance(counter, BatchCounter)
    texts = [f"{i} " + "the quick brown fox jumps over the lazy dog; " * (40 + i % 50) for i in range(300)]
    assert sum(map(len, texts)) >= tokenizer.PARALLEL_MIN_CHARS
    threads: set[str] = set()

    def count(text: str) -> int:
        threads.add(threading.current_thread().name)
        return counter.count_text(text)

    pool = tokenizer.CountingPool(2)
    try:
        assert pool.counts(count, texts) == [counter.count_text(t) for t in texts]
        assert threads and all(name.startswith("ctxproxy-count") for name in threads)
        threads.clear()
        assert pool.counts(count, texts[:3]) == [counter.count_text(t) for t in texts[:3]]
        assert threads == {threading.current_thread().name}  # a small batch: no thread hop
    finally:
        pool.shutdown()


def test_one_batch_counts_on_at_most_threads_threads_at_a_time() -> None:
    texts = ["x" * tokenizer.CHUNK_MIN_CHARS] * 40
    assert tokenizer._chunks(texts, 3 * tokenizer.CHUNK_MIN_CHARS)[:2] == [(0, 3), (3, 6)]
    lock = threading.Lock()
    active = peak = calls = 0

    def count(text: str) -> int:
        nonlocal active, peak, calls
        with lock:
            active += 1
            calls += 1
            peak = max(peak, active)
        try:
            return len(text)
        finally:
            with lock:
                active -= 1

    pool = tokenizer.CountingPool(2)
    try:
        assert pool.counts(count, texts) == [len(t) for t in texts]
    finally:
        pool.shutdown()
    assert calls == len(texts) and 1 <= peak <= 2


def test_a_chunk_that_fails_raises_in_the_caller_and_the_pool_serves_on() -> None:
    texts = ["z" * tokenizer.CHUNK_MIN_CHARS] * 24

    def count(text: str) -> int:
        if text is texts[13]:
            raise ValueError("boom")
        return len(text)

    texts[13] = "w" * tokenizer.CHUNK_MIN_CHARS
    pool = tokenizer.CountingPool(2)
    try:
        with pytest.raises(ValueError, match="boom"):
            pool.counts(count, texts)
        assert pool.counts(len, texts) == [len(t) for t in texts]
    finally:
        pool.shutdown()


def test_a_pool_shut_down_during_a_batch_finishes_it() -> None:
    texts = [f"{i} " + "y" * tokenizer.CHUNK_MIN_CHARS for i in range(24)]
    pool = tokenizer.CountingPool(2)

    def count(text: str) -> int:
        pool.shutdown()  # as configure_counting does to the pool it replaces
        return len(text)

    assert pool.counts(count, texts) == [len(t) for t in texts]
    assert pool.counts(len, texts) == [len(t) for t in texts]  # after: counted in the caller


def test_a_pool_of_one_thread_counts_in_the_caller() -> None:
    pool = tokenizer.CountingPool(1)
    texts = ["y" * tokenizer.PARALLEL_MIN_CHARS] * 3
    seen: set[str] = set()
    assert (
        pool.counts(lambda t: seen.add(threading.current_thread().name) or len(t), texts)
        == [len(texts[0])] * 3
    )
    assert seen == {threading.current_thread().name}


def test_configure_counting_sizes_the_process_pool() -> None:
    before = tokenizer.counting_pool().threads
    try:
        assert tokenizer.configure_counting(threads=3).threads == 3
        assert tokenizer.counting_pool().threads == 3
        same = tokenizer.counting_pool()
        assert tokenizer.configure_counting(threads=3) is same  # unchanged: kept
        assert tokenizer.configure_counting(threads=0).threads == tokenizer.usable_cpus()
    finally:
        tokenizer.configure_counting(threads=before)


@pytest.mark.parametrize(
    ("files", "affinity", "expected"),
    [
        ({}, 8, 8),  # no cgroup limit: the affinity mask
        ({"cpu.max": "max 100000\n"}, 8, 8),
        ({"cpu.max": "200000 100000\n"}, 8, 2),
        ({"cpu.max": "150000 100000\n"}, 8, 1),  # 1.5 CPUs: one counting thread, never more
        ({"cpu.max": "50000 100000\n"}, 8, 1),
        ({"cpu.max": "400000 100000\n"}, 2, 2),  # the affinity mask is the smaller
        ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8, 3),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8, 8),
        ({"cpu.max": "garbage\n"}, 4, 4),
    ],
)
def test_usable_cpus_is_the_affinity_capped_by_the_cgroup_quota(
    tmp_path: Path, files: dict[str, str], affinity: int, expected: int
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert tokenizer.usable_cpus(cgroup_root=tmp_path, affinity=affinity) == expected


def test_the_quota_of_the_process_own_cgroup_comes_first(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "system.slice" / "ctxproxy.service").mkdir(parents=True)
    (tmp_path / "system.slice" / "ctxproxy.service" / "cpu.max").write_text("300000 100000\n")
    assert tokenizer.cgroup_cpu_quota(tmp_path, own="/system.slice/ctxproxy.service") == 3.0
    assert tokenizer.cgroup_cpu_quota(tmp_path, own="/elsewhere") is None
    assert tokenizer.usable_cpus() >= 1  # this machine's own answer
