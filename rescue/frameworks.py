"""The Miles, slime and Megatron-LM commits, and the SGLang release, rescue is built and
tested against.

The adapters (``rescue.miles``, ``rescue.slime``) follow the data path and hooks of these
commits; the integration tests run against sources at these commits (CI unpacks their
archives, named ``<package>-<commit[:8]>.tar.gz``) and warn, naming both commits, when
they are given sources at another one. The SWE launchers warn, naming both, when the Miles
checkout or the installed SGLang differ (``swe_smith_tasks.run_record``). This is the one
place the versions are stated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PinnedFramework:
    """A framework rescue plugs into, at the commit it is tested against."""

    #: How the framework is named in messages ("Miles").
    name: str
    #: Its top-level Python package, also the stem of its source archive ("miles").
    package: str
    #: Its GitHub repository ("radixark/miles").
    repository: str
    #: The full 40-character commit.
    commit: str

    @property
    def short(self) -> str:
        """The commit's first 8 characters, as in the archive's name."""
        return self.commit[:8]

    @property
    def archive(self) -> str:
        """The file name of this commit's source archive (``git archive`` output)."""
        return f"{self.package}-{self.short}.tar.gz"


MILES = PinnedFramework(
    "Miles", "miles", "radixark/miles", "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
)
SLIME = PinnedFramework("slime", "slime", "THUDM/slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515")
#: The Megatron-LM tree Miles' Megatron backend imports (``megatron.core``,
#: ``megatron.training``): radixark's fork at the commit Miles' Dockerfile clones. The training
#: rehearsal runs it on a CPU; its archive is ``megatron-<commit[:8]>.tar.gz``.
MEGATRON = PinnedFramework(
    "Megatron-LM", "megatron", "radixark/Megatron-LM", "2e64d788b67fe8155774200c87606e1e449c494b"
)
#: The SGLang release the SWE arms' sampling, parsers and error messages are read from.
SGLANG_VERSION = "0.5.23"
