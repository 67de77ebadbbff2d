"""Fine-tuning a pre-trained GPT on a small labelled task, against the same model from scratch.

Chapter 12's character GPT learned Shakespeare's spelling by predicting the next character.
:func:`spelling_task` turns lines of the corpus into a labelled task that needs exactly that
knowledge: is a line as written, or were the inner letters of its words shuffled?
:class:`SequenceClassifier` puts a linear head on a :class:`~coursepkg.DecoderOnlyLM`'s hidden
states (their mean over the line's real characters), and :func:`labels_curve` measures test
accuracy against the number of labelled examples, for the pre-trained body fine-tuned whole,
the pre-trained body frozen under a trained head, and the same architecture trained from scratch
with the same examples and the same number of steps.

Dimension legend: B batch, L length, D d_model, C classes.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.vocab import CharVocab
from ..decoder_only import DecoderOnlyLM
from ..masks import causal_mask
from .run_cache import cache_file, check_cache_mode, reuse_run, save_run
from .train import fit, seed_everything

__all__ = [
    "MODES",
    "LabelledLines",
    "SequenceClassifier",
    "finetune_accuracy",
    "labels_curve",
    "scramble_words",
    "spelling_task",
    "zero_label_accuracy",
]

#: How the classifier's body starts and what trains: the pre-trained weights, all trained
#: (``"fine-tuned"``); the pre-trained weights frozen, only the head trained (``"frozen"``);
#: fresh random weights, all trained (``"from scratch"``).
MODES = ("fine-tuned", "frozen", "from scratch")


def scramble_words(line: str, rng: random.Random) -> str:
    """Shuffle the inner letters of every word of four letters or more, keeping its first and
    last letter and everything that is not a letter in place.

    Args:
        line: the text.
        rng: the source of the shuffles.

    Returns:
        The line with each word's inner letters shuffled (a word may come out unchanged, when
        its shuffle puts every letter back or its inner letters are all the same).
    """
    out, word = [], []

    def flush() -> None:
        if len(word) >= 4:
            inner = word[1:-1]
            rng.shuffle(inner)
            word[1:-1] = inner
        out.extend(word)
        word.clear()

    for ch in line:
        if ch.isalpha():
            word.append(ch)
        else:
            flush()
            out.append(ch)
    flush()
    return "".join(out)


@dataclass
class LabelledLines:
    """Lines of text with a class each.

    Attributes:
        lines: the texts.
        labels: one class id per line (1 = as written, 0 = scrambled, for :func:`spelling_task`).
    """

    lines: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.lines)

    def encode(self, vocab: CharVocab) -> tuple[Tensor, Tensor, Tensor]:
        """The lines as padded ids, their real-character mask and their labels.

        Shape:
            returns tokens (B, L) long, real (B, L) bool (True = a character), labels (B,) long.
        """
        rows = [vocab.encode(line) for line in self.lines]
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), vocab.pad_id, dtype=torch.long)  # (B, L)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row)
        return tokens, tokens != vocab.pad_id, torch.tensor(self.labels)


def spelling_task(
    text: str, n: int, seed: int, min_chars: int = 20, max_chars: int = 40
) -> LabelledLines:
    """``n`` lines of ``text``, each kept as written (label 1) or with its words' inner letters
    shuffled (label 0), half and half.

    Speakers' names (lines ending with a colon) and short lines are skipped; a line is cut at
    ``max_chars`` characters (at a space). Which lines are drawn, which are scrambled and how
    is fixed by ``seed``; a scrambled line always differs from its original.

    Args:
        text: the corpus part to draw from (the training part for the labelled examples, the
            held-out part for the test).
        n: how many examples (even).
        seed: fixes the draw.
        min_chars: the shortest line kept.
        max_chars: the longest line kept (longer ones are cut).

    Returns:
        A :class:`LabelledLines` of ``n`` examples in random order.
    """
    if not isinstance(n, int) or n < 2 or n % 2:
        raise ValueError(f"n must be an even int >= 2, got {n!r}")
    rng = random.Random(seed)
    pool = []
    for raw in text.split("\n"):
        line = raw.strip()
        if len(line) > max_chars:
            line = line[:max_chars].rsplit(" ", 1)[0]
        if len(line) >= min_chars and not line.endswith(":"):
            pool.append(line)
    rng.shuffle(pool)
    lines, labels = [], []
    for line in pool:
        if len(lines) == n:
            break
        label = len(lines) % 2
        scrambled = scramble_words(line, rng)
        if scrambled == line:  # nothing to shuffle: the line would give its label away
            continue
        lines.append(line if label else scrambled)
        labels.append(label)
    if len(lines) < n:
        raise ValueError(f"text holds only {len(lines)} usable lines, n={n} asked")
    order = list(range(n))
    rng.shuffle(order)
    return LabelledLines([lines[i] for i in order], [labels[i] for i in order])


class SequenceClassifier(nn.Module):
    """A decoder-only body and a linear head on what its states say about the next character.

    A GPT's language-model head scores the final state :math:`h_t` of position t against the
    output embedding :math:`e_v` of every character v. The classifier reads the same products
    for the character that really comes next, feature by feature, :math:`h_t \\odot e_{x_{t+1}}`,
    averages them over the line's real positions, standardises each of the D means (batch
    normalisation) and maps them to class scores: D numbers
    per line about how well each position anticipated the text, where the language model keeps
    their sum. Right padding never reaches a real position under the causal mask, so a padded
    line's features are those of the line alone.

    Args:
        body: the :class:`~coursepkg.DecoderOnlyLM` whose final states and output embedding
            (``lm_head.weight``, tied to the input embedding in GPT) are read.
        n_classes: C.

    Submodules ``body`` and ``head`` (BatchNorm1d, then Linear D -> C).
    """

    def __init__(self, body: DecoderOnlyLM, n_classes: int) -> None:
        super().__init__()
        self.body = body
        d = body.config.d_model
        # the products are small and of unequal spreads: standardise each over the batch
        self.head = nn.Sequential(nn.BatchNorm1d(d), nn.Linear(d, n_classes))

    def features(self, tokens: Tensor, real: Tensor) -> Tensor:
        """The mean over a line of its final states times the next character's embedding.

        Shape:
            tokens (B, L), real (B, L) bool -> (B, D).
        """
        body = self.body
        x = body.positions(body.embed(tokens))  # (B, L, D)
        mask = causal_mask(tokens.size(1), device=tokens.device)  # (L, L)
        for layer in body.layers:
            x = layer(x, mask)  # (B, L, D)
        if body.norm is not None:
            x = body.norm(x)  # (B, L, D)
        agreement = x[:, :-1] * body.lm_head.weight[tokens[:, 1:]]  # (B, L - 1, D)
        weights = real[:, 1:].unsqueeze(-1).to(x.dtype)  # (B, L - 1, 1): a real next character
        return (agreement * weights).sum(1) / weights.sum(1).clamp(min=1)  # (B, D)

    def forward(self, tokens: Tensor, real: Tensor) -> Tensor:
        """Class scores. Shape: tokens (B, L), real (B, L) -> (B, C)."""
        return self.head(self.features(tokens, real))  # (B, C)


def _loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    *inputs, labels = batch  # (B, L) tokens and (B, L) mask, or (B, D) features; (B,)
    return nn.functional.cross_entropy(model(*inputs), labels)


def _sampler(n: int, batch_size: int, generator: torch.Generator):
    # Endless random batches of example indices (all examples when there are fewer).
    while True:
        yield torch.randperm(n, generator=generator)[:batch_size]  # (B,)


def finetune_accuracy(
    pretrained: DecoderOnlyLM,
    vocab: CharVocab,
    train: LabelledLines,
    test: LabelledLines,
    mode: str,
    seed: int = 0,
    steps: int = 80,
    batch_size: int = 16,
    lr: float = 1e-3,
) -> float:
    """Train a :class:`SequenceClassifier` on ``train`` and measure its accuracy on ``test``.

    The body is a copy of ``pretrained`` (``"fine-tuned"``, ``"frozen"``) or a fresh model of
    the same configuration (``"from scratch"``); ``pretrained`` itself is never changed. Adam at
    ``lr`` runs ``steps`` steps on batches of ``batch_size`` examples drawn at random from
    ``train`` (all of them when there are fewer), gradients clipped at norm 1; a fine-tuned
    body's pre-trained weights get a tenth of ``lr``, so that the new head's first random
    gradients do not wreck them. A frozen body's features are computed once, and only the head
    trains on them, with the same batches.

    Args:
        pretrained: the pre-trained language model.
        vocab: its vocabulary.
        train: the labelled examples.
        test: the examples measured.
        mode: one of :data:`MODES`.
        seed: fixes the head's (and a fresh body's) initialisation and the batches.
        steps: optimisation steps, the same for every mode.
        batch_size: examples per step.
        lr: Adam's learning rate.

    Returns:
        The fraction of ``test`` classified correctly.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    generator = seed_everything(seed)
    body = DecoderOnlyLM(pretrained.config) if mode == "from scratch" else copy.deepcopy(pretrained)
    n_classes = max(max(train.labels), max(test.labels)) + 1
    model = SequenceClassifier(body.train(), n_classes)
    tokens, real, labels = train.encode(vocab)  # (N, L), (N, L), (N,)
    test_tokens, test_real, test_labels = test.encode(vocab)  # (T, L'), (T, L'), (T,)
    if mode == "frozen":
        with torch.no_grad():
            features = model.features(tokens, real)  # (N, D)
            test_features = model.features(test_tokens, test_real)  # (T, D)
        trained = model.head
        batches = ((features[i], labels[i]) for i in _sampler(len(labels), batch_size, generator))
    else:
        trained = model
        batches = (  # each batch cut to its longest line
            (tokens[i, :width], real[i, :width], labels[i])
            for i in _sampler(len(labels), batch_size, generator)
            for width in [int(real[i].sum(1).max())]
        )
    groups = [{"params": model.head.parameters()}]
    if mode != "frozen":  # pre-trained weights move ten times slower than the new head
        groups.append({"params": body.parameters(), "lr": lr / 10 if mode == "fine-tuned" else lr})
    optimizer = torch.optim.Adam(groups, lr=lr, foreach=True)  # foreach: same numbers, fewer calls
    fit(trained, batches, _loss, steps=steps, optimizer=optimizer, progress=False)
    with torch.no_grad():
        if mode == "frozen":
            scores = model.head(test_features)  # (T, C)
        else:
            scores = model.eval()(test_tokens, test_real)  # (T, C)
    return (scores.argmax(-1) == test_labels).float().mean().item()


@torch.no_grad()
def zero_label_accuracy(model: DecoderOnlyLM, vocab: CharVocab, test: LabelledLines) -> float:
    """Accuracy on :func:`spelling_task` without a single label: call a line scrambled when the
    language model's mean next-character loss on it is above the median of the test lines.

    The rule uses no label, only the knowledge that half of the lines are scrambled (the
    median). It measures how much of the task the pre-trained model already knows.

    Args:
        model: the language model.
        vocab: its vocabulary.
        test: the examples (label 1 = as written, 0 = scrambled).

    Returns:
        The fraction of ``test`` classified correctly.
    """
    tokens, real, labels = test.encode(vocab)  # (T, L), (T, L), (T,)
    logits = model.eval()(tokens[:, :-1])  # (T, L - 1, V): right padding reaches no real one
    losses = nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    scored = real[:, 1:].float()  # (T, L - 1): the predictions of a real character
    per_line = (losses * scored).sum(1) / scored.sum(1)  # (T,)
    as_written = per_line <= per_line.median()  # (T,)
    return (as_written.long() == labels).float().mean().item()


def labels_curve(
    pretrained: DecoderOnlyLM,
    vocab: CharVocab,
    train_text: str,
    test_text: str,
    sizes: Sequence[int] = (16, 64, 256, 1024),
    seeds: Sequence[int] = (0, 1),
    n_test: int = 400,
    cache: str | None = None,
    **train_settings: float,
) -> dict[str, dict[int, list[float]]]:
    """Test accuracy on :func:`spelling_task` against the number of labelled examples, in each
    of the :data:`MODES`.

    For every size and seed, the labelled examples are drawn from ``train_text`` (they change
    with the seed) and every mode trains on the same ones; the test set, ``n_test`` lines of
    ``test_text``, is the same for all.

    Args:
        pretrained: the pre-trained language model.
        vocab: its vocabulary.
        train_text: where the labelled examples come from.
        test_text: where the test examples come from.
        sizes: numbers of labelled examples (each even).
        seeds: one run per seed and mode.
        n_test: test examples.
        cache: as :func:`~coursepkg.chapters.char_gpt.train_char_gpt`'s: ``"reuse"`` loads the
            accuracies measured with the same arguments and pre-trained weights, or measures
            and saves them.
        **train_settings: passed to :func:`finetune_accuracy` (``steps``, ``batch_size``,
            ``lr``).

    Returns:
        mode -> size -> one test accuracy per seed.
    """
    check_cache_mode(cache)
    settings = dict(sizes=list(sizes), seeds=list(seeds), n_test=n_test, **train_settings)
    path = None
    if cache is not None:
        digest = hashlib.sha256(f"{train_text}\0{test_text}".encode())
        for tensor in pretrained.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        path = cache_file({**settings, "inputs": digest.hexdigest()}, "labels_curve")
    curve: dict[str, dict[int, list[float]]] = {}

    def restore(saved: dict) -> None:
        curve.update({m: {int(n): accs for n, accs in by.items()} for m, by in saved.items()})

    if cache == "reuse" and reuse_run(path, restore):
        return curve
    test = spelling_task(test_text, n_test, seed=-1)
    curve.update({mode: {n: [] for n in sizes} for mode in MODES})
    for n in sizes:
        for seed in seeds:
            train = spelling_task(train_text, n, seed=seed)
            for mode in MODES:
                curve[mode][n].append(
                    finetune_accuracy(pretrained, vocab, train, test, mode, seed, **train_settings)
                )
    if path is not None:  # string keys: torch.load(weights_only=True) reads them back
        saved = {m: {str(n): accs for n, accs in by.items()} for m, by in curve.items()}
        save_run(path, saved, "the fine-tuning curve")
    return curve
