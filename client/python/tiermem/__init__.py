"""tiermem for Python: one memory view over VRAM, DRAM and PMEM of a cluster.

    import numpy, tiermem
    with tiermem.connect() as client:                  # $TIERMEM_SOCKET or /run/tiermem/tiermemd.sock
        a = client.alloc(1 << 20, tier="dram", name="weights")
        client.write(a.gva, numpy.arange(1024, dtype=numpy.float32))
        print(numpy.frombuffer(client.read(a.gva, 4096), numpy.float32)[:4])
        with client.map(a.gva) as m:                   # zero-copy: the tier's memory itself
            view = numpy.asarray(m).view(numpy.float32)
            view[0] = 42.0                             # seen by every other mapping at once
            del view                                   # a mapping with live views refuses to close
        a.free()

Every call raises a subclass of tiermem.Error on failure, by area:
RequestError, AddressError, TransportError, ProtocolError, ConfigError; each
has .code ('not_allocated'), .number and .message. Wrong Python types raise
TypeError. tiermem.torch keeps a model's and an optimizer's state in tiermem
and commits steps atomically.
"""

from ._tiermem import (  # noqa: F401
    AddressError,
    Allocation,
    Batch,
    Client,
    ConfigError,
    Error,
    Gva,
    Mapping,
    ProtocolError,
    RequestError,
    TransportError,
    __version__,
    connect,
)

__all__ = [
    "AddressError",
    "Allocation",
    "Batch",
    "Client",
    "ConfigError",
    "Error",
    "Gva",
    "Mapping",
    "ProtocolError",
    "RequestError",
    "TransportError",
    "connect",
]
