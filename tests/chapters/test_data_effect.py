"""The data chapter's comparison: the crawl it builds, its verdict's rule, one tiny run of each."""

import pytest

from coursepkg.chapters.data_effect import DataEffect, compare_raw_and_curated, web_corpus
from coursepkg.curation import curate


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_the_crawl_is_reproducible_and_holds_each_kind_of_page():
    pages = web_corpus(n_pages=30, seed=1)
    assert pages == web_corpus(n_pages=30, seed=1)
    kinds = {name.split("/")[0] for name, _ in pages}
    assert kinds == {"play", "spam", "foreign", "empty", "binary"} | {
        f"mirror{i}" for i in range(6)
    }
    result = curate(pages, min_quality=None, line_min_chars=30)
    assert result.removed["binary"] == 4 and result.removed["empty"] == 4
    assert result.removed["language"] == 12 and result.removed["gopher"] == 40
    assert result.removed["near_duplicate"] >= 6 * 20  # every mirror of the 20 re-crawled pages
    assert len(result.kept) == 30  # one copy of each passage, whichever was crawled first


@pytest.mark.parametrize(
    ("raw", "curated", "word"),
    [
        ([2.0, 2.1, 2.05], [1.8, 1.85, 1.82], "better"),
        ([1.8, 1.85, 1.82], [2.0, 2.1, 2.05], "worse"),
        ([2.0, 1.7, 2.3], [1.9, 2.2, 1.8], "no clear difference"),
        ([2.0, 2.0, 2.0], [1.99, 2.0, 2.0], "no clear difference"),  # overlapping seeds
    ],
)
def test_the_verdict_needs_a_gap_beyond_the_spread(raw, curated, word):
    effect = DataEffect(
        bpb={"raw": raw, "curated": curated}, corpus_bytes={}, removed={}, details={}
    )
    assert effect.verdict() == word


@pytest.mark.slow  # make test; left out of make test-fast (issue 70)
def test_a_tiny_run_scores_both_corpora_on_the_same_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSEPKG_CACHE_DIR", str(tmp_path))
    effect = compare_raw_and_curated(
        seeds=(0,), steps=2, n_pages=20, heldout_bytes=1024, cache="reuse"
    )
    assert set(effect.bpb) == {"raw", "curated"}
    assert all(0 < bpb[0] < 9 for bpb in effect.bpb.values())  # near log2(256) = 8 after 2 steps
    assert effect.corpus_bytes["curated"] < effect.corpus_bytes["raw"]
    again = compare_raw_and_curated(
        seeds=(0,), steps=2, n_pages=20, heldout_bytes=1024, cache="reuse"
    )
    assert again.bpb == effect.bpb and len(list(tmp_path.iterdir())) == 1  # read from the cache
