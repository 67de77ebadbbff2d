"""The exercise stubs: one module per assignment, holding exactly what the student implements.

Each stub has the contract's signature and a docstring (shapes, the mask convention True = may
attend, the submodule and parameter names the checks rely on) and raises ``NotImplementedError``.
The notebooks' answer cells are these modules' source; the checks in :mod:`coursepkg.grading`
turn an untouched stub into a one-line "not implemented yet".

No solution lives here (students can import the package): solutions are only in the
instructors' ``solutions/`` notebooks.
"""

# The assignments with a notebook in solutions/ and exercises/.
ASSIGNMENTS = (
    "ex01_attention",
    "ex02_multihead",
    "ex03_positions",
    "ex04_encoder",
    "ex05_decoder",
    "ex06_training",
    "ex07_parameters",
    "ex08_decoding",
    "ex09_training_run",
    "ex10_tokenizer",
    "ex11_modern_block",
    "ex12_tiled_attention",
    "ex13_training_pieces",
    "ex14_post_training",
    "ex15_data_parallel",
    "ex16_experts",
    "ex17_serving",
    "ex18_data",
    "ex19_capstone",
)
