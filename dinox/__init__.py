"""dinox: measure real training steps over a grid of configurations and decide what fits the budget."""

__version__ = "0.1.0"
