"""crown-cli: certified robustness lower bounds for MLP classifiers with CROWN."""

__version__ = "0.1.0"
