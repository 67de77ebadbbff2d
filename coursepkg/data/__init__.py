"""Small data sets of the course, generated here or shipped with the package (nothing downloads).

* :mod:`~coursepkg.data.vocab`: :class:`CharVocab`, ids 0-3 = ``<pad> <bos> <eos> <unk>``.
* :mod:`~coursepkg.data.batching`: :class:`Seq2SeqBatch` ``(src, tgt_in, tgt_out, src_mask,
  tgt_mask)``, the padded teacher-forcing batch of every seq2seq task (masks True = real token).
* :mod:`~coursepkg.data.dates`: human dates -> ISO 8601 (:func:`make_date_pairs`,
  :func:`date_split`).
* :mod:`~coursepkg.data.toy`: copy and reverse batches (:func:`make_copy_batch`).
* :mod:`~coursepkg.data.text`: Tiny Shakespeare (:func:`load_tinyshakespeare`) and character-level
  language-model batches (:func:`char_lm_batches`).
"""

from coursepkg.data.batching import Seq2SeqBatch, make_seq2seq_batch, pad_sequences
from coursepkg.data.dates import (
    DATE_FORMATS,
    DateDataset,
    date_split,
    date_vocabs,
    encode_batch,
    format_date,
    make_date_pairs,
)
from coursepkg.data.text import char_lm_batches, load_tinyshakespeare, read_verified_text
from coursepkg.data.toy import make_copy_batch
from coursepkg.data.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, CharVocab

__all__ = [
    "BOS_ID",
    "DATE_FORMATS",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "CharVocab",
    "DateDataset",
    "Seq2SeqBatch",
    "char_lm_batches",
    "date_split",
    "date_vocabs",
    "encode_batch",
    "format_date",
    "load_tinyshakespeare",
    "make_copy_batch",
    "make_date_pairs",
    "make_seq2seq_batch",
    "pad_sequences",
    "read_verified_text",
]
