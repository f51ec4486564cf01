"""nibble's Python client: upload 4-bit weights as numpy arrays and compute
C = A · dequant(B) on a nibble server.

Example:
    import nibble
    with nibble.Client("localhost:50051") as client:
        client.quantize_and_upload("layer0", b, "u4b8", group=128)
        c = client.matmul("layer0", a)
"""

from nibble.client import Client, NibbleError, WeightInfo
from nibble.formats import (FORMATS, Format, dequantize, format_named,
                            pack_codes, unpack_codes)
from nibble.quantize import QuantizedWeight, quantize

__all__ = ["Client", "NibbleError", "WeightInfo", "FORMATS", "Format",
           "dequantize", "format_named", "pack_codes", "unpack_codes",
           "QuantizedWeight", "quantize"]
