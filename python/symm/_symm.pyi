"""Type stubs of the extension module ``symm._symm`` (see the package for documentation)."""

from typing import Any, Optional

MAX_SIM_BYTES: int

def names() -> dict[str, list[str]]:
    """Every name the functions take."""

def dtype_size(name: str) -> int:
    """Element size in bytes of a dtype."""

def buffer_sizes(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = ...,
                 op: str = ..., channels: Optional[int] = ..., root: int = ..., src: int = ...,
                 dst: Optional[int] = ...) -> tuple[int, int, int]:
    """Buffer sizes per rank: (input, output, scratch)."""

def simulate(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = ...,
             op: str = ..., channels: Optional[int] = ..., seed: int = ..., root: int = ...,
             src: int = ..., dst: Optional[int] = ...) -> dict[str, Any]:
    """Simulated run and reference: inputs, outputs, reference, trace, time_us, ops, matches."""

def reference(collective: str, algorithm: str, world: int, nbytes: int, inputs: list[bytes],
              dtype: str = ..., op: str = ..., channels: Optional[int] = ..., root: int = ...,
              src: int = ..., dst: Optional[int] = ...) -> list[bytes]:
    """The outputs a request defines for its inputs."""

def predict(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = ...,
            op: str = ..., channels: Optional[int] = ..., topology: str = ..., root: int = ...,
            src: int = ..., dst: Optional[int] = ...) -> float:
    """Predicted time in microseconds."""

def select(collective: str, world: int, nbytes: int, dtype: str = ..., op: str = ...,
           channels: Optional[int] = ..., topology: str = ..., multicast: bool = ...,
           root: int = ..., src: int = ..., dst: Optional[int] = ...) -> str:
    """The algorithm with the lowest predicted time."""

def tune(collective: str, world: int, nbytes: int, dtype: str = ..., op: str = ...,
         topology: str = ..., root: int = ..., src: int = ...,
         dst: Optional[int] = ...) -> tuple[str, int, str]:
    """(algorithm, channels, "calibrated" or "model")."""

def decode_trace(data: bytes) -> dict[str, Any]:
    """A decoded trace: version, layout, header, count, packed event columns, warning."""
