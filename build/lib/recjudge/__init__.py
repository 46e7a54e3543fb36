"""recjudge: LLM reward models and judges for recommender systems."""

__version__ = "0.1.0"
__all__ = ["__version__"]
