from ._tiermem import (
    AddressError as AddressError,
    Allocation as Allocation,
    Client as Client,
    ConfigError as ConfigError,
    Error as Error,
    Gva as Gva,
    Mapping as Mapping,
    ProtocolError as ProtocolError,
    RequestError as RequestError,
    TransportError as TransportError,
    __version__ as __version__,
    connect as connect,
)
