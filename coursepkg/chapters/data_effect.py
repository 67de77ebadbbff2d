"""What curation buys: one small byte-level model trained on a raw crawl and on its curated text
under the same budget, scored on clean held-out text in bits per byte, over seeds.

The "crawl" is made here, reproducibly, from the first 90% of Tiny Shakespeare: each document is a
passage wrapped the way the web wraps text (HTML with a menu, a cookie banner and a footer with an
address), some passages are crawled again and again (exact copies, and copies with a changed
line), and spam, a foreign language, empty pages and binary files are mixed in. The raw corpus is
every document's text as extracted, nothing removed; the curated corpus is what
:func:`coursepkg.curation.curate` keeps. Both models see the same number of training bytes; the
score is the held-out last 10% of Tiny Shakespeare, which neither saw.

Dimension legend: B windows, L bytes per window, V = 256 byte values.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from coursepkg.chapters.run_cache import cache_file, check_cache_mode, reuse_run, save_run
from coursepkg.chapters.token_lm import bits_per_byte, fit_on_windows
from coursepkg.chapters.train import seed_everything
from coursepkg.config import TransformerConfig
from coursepkg.curation import ExtractionError, curate, to_text
from coursepkg.data.text import load_tinyshakespeare
from coursepkg.decoder_only import DecoderOnlyLM

__all__ = ["DataEffect", "compare_raw_and_curated", "web_corpus"]

_MENU = "Home | Plays | Sonnets | Shop | About us | Contact"
_BANNER = "We use cookies to improve your experience. Accept all | Manage settings"
_SPAM = [
    "best cheap tickets online",
    "free shipping today",
    "click here for the deal",
    "limited offer buy now",
    "top ten discount codes",
    "win a free phone",
]
_FOREIGN = [
    "Le village se trouve au bord de la rivière et les enfants vont à l'école à pied.",
    "Die Straße war lang, und am Abend kamen die Leute aus den Feldern zurück.",
    "El mercado abre cada sábado y la plaza se llena de flores y de fruta.",
    "Il pleuvait depuis trois jours quand le facteur est enfin arrivé au moulin.",
]


#: The share of Tiny Shakespeare the synthetic crawl is made from (the rest is the held-out play).
CRAWL_SHARE = 0.9
#: How many of the crawl's pages are crawled again, and how many times each (half of the copies
#: exact, half with one line changed).
MIRRORED, MIRROR_COPIES = 20, 6


def _passages(text: str, size: int) -> list[str]:
    """``text`` cut at blank lines into passages of about ``size`` characters."""
    passages, current = [], []
    for speech in text.split("\n\n"):
        current.append(speech)
        if sum(len(s) for s in current) >= size:
            passages.append("\n\n".join(current))
            current = []
    return passages


def _page(passage: str, rng: random.Random) -> bytes:
    """A passage as a crawled page: HTML (or text) with a menu, a banner and a footer."""
    address = f"editor{rng.randrange(100)}@example.org"
    footer = f"Write to {address} or call 555-{rng.randrange(200, 999)}-0199"
    if rng.random() < 0.5:
        body = "".join(f"<p>{s.replace(chr(10), '<br>')}</p>" for s in passage.split("\n\n"))
        html = f"<html><body><nav>{_MENU}</nav><div>{_BANNER}</div>{body}<footer>{footer}</footer>"
        return html.encode()
    return f"{_MENU}\n{_BANNER}\n{passage}\n{footer}\n".encode()


def web_corpus(n_pages: int = 160, seed: int = 0) -> list[tuple[str, bytes]]:
    """A small raw crawl built from the first 90% of Tiny Shakespeare.

    Args:
        n_pages: distinct passages (of about 1,500 characters) to crawl.
        seed: seeds every choice.

    Returns:
        (name, bytes) pairs: each passage as a page, :data:`MIRRORED` of them crawled
        :data:`MIRROR_COPIES` times more (half exact copies, half with one line changed),
        40 spam pages, 12 pages in other languages, 4 empty pages and 4 binary files, shuffled.
    """
    rng = random.Random(seed)
    text = load_tinyshakespeare()
    passages = _passages(text[: int(CRAWL_SHARE * len(text))], 1500)
    passages = rng.sample(passages, min(n_pages, len(passages)))
    pages = [(f"play/{i:04d}.html", _page(p, rng)) for i, p in enumerate(passages)]
    for i, p in enumerate(passages[:MIRRORED]):
        for copy in range(MIRROR_COPIES):
            edited = p if copy < MIRROR_COPIES // 2 else p.replace("\n", f"\n[{copy}] ", 1)
            pages.append((f"mirror{copy}/{i:04d}.html", _page(edited, rng)))
    for i in range(40):
        words = " ".join(
            rng.choice(_SPAM) + rng.choice([" #deal", " #sale #deal", " #win"]) for _ in range(40)
        )
        pages.append((f"spam/{i:04d}.html", f"<html><body><p>{words}</p></body></html>".encode()))
    for i in range(12):
        foreign = " ".join(rng.choice(_FOREIGN) for _ in range(12))
        pages.append((f"foreign/{i:04d}.txt", foreign.encode()))
    pages += [(f"empty/{i}.html", b"<html><body></body></html>") for i in range(4)]
    pages += [(f"binary/{i}.bin", bytes(rng.randrange(256) for _ in range(512))) for i in range(4)]
    rng.shuffle(pages)
    return pages


def _raw_text(pages: list[tuple[str, bytes]]) -> str:
    """Every page's text as extracted, nothing filtered (binary and empty pages hold none)."""
    texts = []
    for _, data in pages:
        try:
            texts.append(to_text(data)[0])
        except ExtractionError:
            continue
    return "\n\n".join(texts)


@dataclass
class DataEffect:
    """The comparison's results.

    Attributes:
        bpb: held-out bits per byte of each seed's model, by corpus (``raw``, ``curated``).
        corpus_bytes: each corpus's size in bytes.
        removed: what curation removed, by stage.
        details: curation's further counts (lines removed, masked spans, ...).
        settings: the budget and the model, shared by both corpora.
    """

    bpb: dict[str, list[float]]
    corpus_bytes: dict[str, int]
    removed: dict[str, int]
    details: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)

    def mean(self, corpus: str) -> float:
        """The mean over seeds of ``corpus``'s held-out bits per byte."""
        return statistics.fmean(self.bpb[corpus])

    def spread(self, corpus: str) -> float:
        """The standard deviation over seeds (0 for one seed)."""
        values = self.bpb[corpus]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def verdict(self) -> str:
        """``"better"``, ``"worse"`` or ``"no clear difference"`` for the curated corpus: better
        or worse when the means differ by more than twice the larger spread and every curated
        seed is on the same side of every raw seed."""
        gap = self.mean("raw") - self.mean("curated")
        margin = 2 * max(self.spread("raw"), self.spread("curated"))
        if gap > margin and max(self.bpb["curated"]) < min(self.bpb["raw"]):
            return "better"
        if -gap > margin and min(self.bpb["curated"]) > max(self.bpb["raw"]):
            return "worse"
        return "no clear difference"


def _bytes(text: str) -> Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)  # (N,)


def _train_and_score(train: Tensor, heldout: Tensor, settings: dict[str, Any], seed: int) -> float:
    """Train one byte model on ``train`` with ``settings`` and return its held-out bits per byte."""
    generator = seed_everything(seed)
    config = TransformerConfig(vocab_size=256, **settings["model"])
    model = DecoderOnlyLM(config)
    block, batch = settings["block_size"], settings["batch_size"]
    fit_on_windows(
        model,
        train,
        block=block,
        batch=batch,
        steps=settings["steps"],
        lr=settings["lr"],
        generator=generator,
    )
    model.eval()
    return bits_per_byte(model, heldout, torch.ones(256, dtype=torch.long), block)[0]


def compare_raw_and_curated(
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    steps: int = 400,
    block_size: int = 64,
    batch_size: int = 16,
    lr: float = 3e-3,
    n_pages: int = 160,
    heldout_bytes: int = 16_384,
    cache: str | None = None,
) -> DataEffect:
    """Train the same small byte-level GPT on the raw crawl and on its curated text, alike.

    Both runs of a seed start from the same weights, draw windows from the same generator state
    and take ``steps`` AdamW steps of ``batch_size`` windows of ``block_size`` bytes: the same
    training bytes, the same compute. Curation runs with the quality classifier off (its shipped
    examples are modern prose, and it scores much of the verse below one half) and repeated lines of
    fewer than 30 characters spared (a play repeats its speakers' names on lines of their own).

    Args:
        seeds: one run per seed and corpus.
        steps: optimisation steps of each run.
        block_size: bytes per window (L).
        batch_size: windows per step (B).
        lr: AdamW's learning rate (constant).
        n_pages: the crawl's distinct passages (:func:`web_corpus`).
        heldout_bytes: how much of the held-out 10% of Tiny Shakespeare is scored.
        cache: None, ``"save"`` or ``"reuse"`` (:mod:`coursepkg.chapters.run_cache`).

    Returns:
        A :class:`DataEffect`.
    """
    check_cache_mode(cache)
    model = dict(d_model=48, n_heads=4, d_ff=192, n_layers=2, dropout=0.0, max_len=block_size)
    model.update(norm_first=True, positional="learned", activation="gelu")
    settings = dict(
        model=model,
        steps=steps,
        block_size=block_size,
        batch_size=batch_size,
        lr=lr,
        seeds=list(seeds),
        heldout_bytes=heldout_bytes,
        n_pages=n_pages,
    )
    path = cache_file(settings, "data-effect") if cache is not None else None
    saved: dict[str, Any] = {}
    if cache == "reuse" and reuse_run(path, saved.update):
        return DataEffect(**saved)
    pages = web_corpus(n_pages)
    result = curate(pages, min_quality=None, line_min_chars=30)
    corpora = {"raw": _raw_text(pages), "curated": "\n\n".join(t for _, t in result.kept)}
    text = load_tinyshakespeare()
    heldout = _bytes(text[int(CRAWL_SHARE * len(text)) :][:heldout_bytes])
    bpb = {
        name: [_train_and_score(_bytes(corpus), heldout, settings, seed) for seed in seeds]
        for name, corpus in corpora.items()
    }
    effect = DataEffect(
        bpb=bpb,
        corpus_bytes={name: len(c.encode()) for name, c in corpora.items()},
        removed=dict(result.removed),
        details=dict(result.details),
        settings=settings,
    )
    if path is not None:
        save_run(path, asdict(effect), "the data-effect runs")
    return effect
