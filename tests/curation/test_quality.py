"""The quality classifier: trained on half the shipped examples, right on the other half."""

import pytest

from coursepkg.curation.quality import (
    QualityClassifier,
    default_quality_classifier,
    load_quality_examples,
)


def test_the_shipped_examples_are_balanced_and_labelled():
    texts, labels = load_quality_examples()
    assert len(texts) == len(labels) >= 40
    assert sorted(set(labels)) == [0, 1] and sum(labels) == len(labels) // 2


@pytest.mark.parametrize("half", [0, 1])
def test_held_out_examples_are_classified(half):
    texts, labels = load_quality_examples()
    model = QualityClassifier.train(texts[half::2], labels[half::2])
    held_texts, held_labels = texts[1 - half :: 2], labels[1 - half :: 2]
    right = sum(
        (model.probability(t) > 0.5) == y for t, y in zip(held_texts, held_labels, strict=True)
    )
    assert right >= 0.8 * len(held_texts)


def test_new_text_is_scored_as_a_reader_would():
    model = default_quality_classifier()
    prose = (
        "The harbour was quiet in the early morning, and the boats rocked gently at their "
        "moorings while the gulls waited on the wall for the first of the fishermen."
    )
    junk = "Sale | New In | Login | Basket (0) | Free delivery >>> Shop now >>> 70% off"
    assert model.probability(prose) > 0.5 > model.probability(junk)
    assert 0.0 <= model.probability("") <= 1.0


def test_bad_training_input_is_refused_by_name():
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        QualityClassifier.train(["a", "b"], [0, 2])
    with pytest.raises(ValueError, match="as many labels as texts"):
        QualityClassifier.train(["a"], [])
