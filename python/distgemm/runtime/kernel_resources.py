"""The per-communicator state of a kernel that exchanges through a control region of its own (the
fused GEMM + all-reduce, our all-reduce): its attachment, its control region and its launcher.

A subclass names its attachment (``ATTACHMENT``), its control region's size (``CONTROL_BYTES``,
a ``_core`` attribute) and its launcher class (``LAUNCHER``, a ``_core`` class taking the CUDA
device, the communicator's LaunchOrder and its wait timeout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _core
from .workspace import Workspace

if TYPE_CHECKING:
    from .communicator import Communicator


class KernelResources:
    """A communicator attachment's shared part: made at the first use (``of``), the control
    region allocated zeroed and exchanged at the first call (collective: every rank makes it at
    the same call), the launcher made once."""

    ATTACHMENT = ""
    CONTROL_BYTES = ""
    LAUNCHER = ""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self._control: Workspace | None = None
        self._launcher: Any = None

    @classmethod
    def of(cls, comm: Communicator):
        """The communicator's resources of this kind, made at the first use."""
        res = comm.attachment(cls.ATTACHMENT)
        if res is None:
            res = comm.attach(cls.ATTACHMENT, cls(comm))
        return res

    def control_bases(self) -> list[int]:
        """Every rank's control region as seen from this device (allocated zeroed and exchanged
        at the first call: collective)."""
        if self._control is None:
            nbytes = int(getattr(_core, self.CONTROL_BYTES))
            core, bases = self.comm.allocate_symmetric(nbytes)
            self._control = Workspace(core, 0, nbytes, list(bases))
        return list(self._control.bases)

    @property
    def launcher(self) -> Any:
        """This rank's launcher (ordered by the communicator's LaunchOrder)."""
        if self._launcher is None:
            c = self.comm
            self._launcher = getattr(_core, self.LAUNCHER)(
                c.device.index, c.order, c.wait_timeout_s
            )
        return self._launcher

    def launch_error(self) -> str:
        return self._launcher.error() if self._launcher is not None else ""
