"""mechopd: the mechanistic study of on-policy distillation (OPD) of privileged context."""

__version__ = "0.1.0"
