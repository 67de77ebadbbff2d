"""Language identification with py3langid, whose naive Bayes model over byte n-grams (Lui and
Baldwin, 2012, langid.py) ships inside its wheel: nothing is downloaded at run time.

``zxx`` is the model's label for text with no linguistic content (digits, symbols).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["identify_language"]


@lru_cache(maxsize=1)
def _identifier():
    """The model, loaded once (about 1.5 s) with probabilities normalised to sum to one."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify_language(text: str) -> tuple[str, float]:
    """The most likely language of ``text`` and the model's probability for it.

    Args:
        text: any text; whitespace-only text gives ``("zxx", 0.0)``.

    Returns:
        An ISO 639-1 code (``"en"``, ``"fr"``, ...) or ``"zxx"`` (no language), and its
        probability in [0, 1].
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        return "zxx", 0.0
    language, probability = _identifier().classify(text)
    return language, float(probability)
