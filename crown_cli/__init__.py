"""crown-cli: certified robustness of neural-network classifiers with CROWN.

The public, stable Python API (docs/api.md): :func:`load_model`, :func:`load_images`,
:func:`certify`, :func:`verify`, :class:`Certification` and :class:`InputError`. The rest of
the package may change between versions. Importing ``crown_cli`` is cheap: the engine (and
numba) load at the first call.
"""

__version__ = "0.1.0"

from crown_cli.runtime import shorten_thread_waits  # before numpy loads OpenBLAS

shorten_thread_waits()

from crown_cli.api import Certification, certify, load_images, load_model, verify  # noqa: E402
from crown_cli.errors import InputError  # noqa: E402

__all__ = ["Certification", "InputError", "__version__", "certify", "load_images",
           "load_model", "verify"]
