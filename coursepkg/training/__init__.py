"""``coursepkg train``: a decoder-only language model trained on a text file or folder, on one
process or under ``torchrun`` (DistributedDataParallel), with exact resume from checkpoints.

- :mod:`~coursepkg.training.settings`: what a run is (flags or a YAML/TOML file);
- :mod:`~coursepkg.training.data`: tokenising once into ``numpy.memmap`` arrays, ``get_batch``;
- :mod:`~coursepkg.training.checkpoint`: atomic, verified checkpoints;
- :mod:`~coursepkg.training.distributed`: the process group ``torchrun`` describes;
- :mod:`~coursepkg.training.schemes`: how the ranks share the work (``--parallel``: DDP,
  sharded optimizer state, FSDP; PyTorch's or the course's) and its gathered checkpoints;
- :mod:`~coursepkg.training.lifecycle`: one run's life, shared with ``coursepkg finetune``
  (checkpoints, exact resume, the step loop, SIGTERM, autocast);
- :mod:`~coursepkg.training.loop`: pretraining's step, evaluation and samples (:func:`train`).

The optimiser, schedule, clipping and loss are the course's own (:mod:`coursepkg.optim`,
:mod:`coursepkg.functional`).
"""

from coursepkg.training.checkpoint import CheckpointError
from coursepkg.training.loop import TrainResult, train
from coursepkg.training.settings import TrainSettings, load_settings

__all__ = ["CheckpointError", "TrainResult", "TrainSettings", "load_settings", "train"]
