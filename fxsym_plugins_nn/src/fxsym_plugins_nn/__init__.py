"""fxsym-plugins-nn: the torch.nn module families and the common tensor ops for fxsym."""

__version__ = "0.1.0"
