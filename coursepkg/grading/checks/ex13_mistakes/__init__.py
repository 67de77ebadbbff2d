"""The catalogue of ex13_training_pieces, one module per concept: the optimiser (AdamW and its
parameter groups), the warm-up + cosine schedule, clipping by global norm and the resumable
training state. :mod:`..ex13_training_pieces_mistakes` gathers their ``BUGS``."""
