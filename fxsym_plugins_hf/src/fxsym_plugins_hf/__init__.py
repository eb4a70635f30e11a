"""fxsym-plugins-hf: Hugging Face transformers 5.x models for fxsym."""

__version__ = "0.1.0"
