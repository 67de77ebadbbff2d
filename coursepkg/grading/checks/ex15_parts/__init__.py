"""ex15's checks, one module per concept: the ranks a check launches (``ranks``) and what
each rank trains (``training``). :mod:`..ex15_data_parallel` holds the checks."""
