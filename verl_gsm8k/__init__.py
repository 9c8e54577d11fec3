"""The project's Python code, one package per stage (``python -m verl_gsm8k.<stage>``); what each
package holds: the map in docs/architecture.md."""

# Packages bottom to top; a package imports only from lower layers (tests/test_layout.py).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("tools",),
    ("common", "svgplot"),
    ("guard", "wheelhouse"),
    ("trace", "merge", "reshard", "questions"),
    ("ppo_trainer", "sft_trainer"),
    ("verl_plugins", "evaluate"),
    ("preflight",),
    ("resume",),
    ("launch",),
    ("sbatch",),
    ("analysis",),
    ("replay",),
    ("runpage",),
    ("compare",),
    ("report",),
    ("bench",),
)
