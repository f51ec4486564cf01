"""A synchronous client for a nibble server: weights go up as numpy arrays
in the canonical layout (or as a float matrix quantized here), matmuls come
back as numpy arrays, and every failed call raises NibbleError carrying the
call's gRPC status code and the server's message.

Example:
    with nibble.Client("localhost:50051") as client:
        client.quantize_and_upload("layer0", b, "u4b8", group=128)
        c = client.matmul("layer0", a)      # a float32 [M, K] -> [M, N]
"""

import dataclasses

import grpc
import numpy as np

from nibble import formats
from nibble import quantize as quantize_module
from nibble._health.v1 import health_pb2
from nibble._health.v1 import health_pb2_grpc
from nibble.v1 import nibble_pb2
from nibble.v1 import nibble_pb2_grpc

# Each tensor of an upload goes in slices of at most this many bytes, well
# below gRPC's default 4 MiB message limit (as the C++ client sends them).
UPLOAD_CHUNK_BYTES = 1 << 20

# Activation dtypes: numpy's, and uint16 for bfloat16 bits (numpy has no
# bfloat16). The output has the input's dtype.
_DTYPES = {
    np.dtype(np.float32): nibble_pb2.DTYPE_F32,
    np.dtype(np.float16): nibble_pb2.DTYPE_F16,
    np.dtype(np.uint16): nibble_pb2.DTYPE_BF16,
}

# What a matmul's kernel may make of A (MatmulRequest.activation_precision).
_ACTIVATION_PRECISIONS = {
    "exact": nibble_pb2.ACTIVATION_PRECISION_EXACT,
    "bf16": nibble_pb2.ACTIVATION_PRECISION_BF16,
    "int8": nibble_pb2.ACTIVATION_PRECISION_INT8,
}


class NibbleError(Exception):
    """A call that failed: `code` is its grpc.StatusCode, `message` the
    server's (or gRPC's) explanation."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True)
class WeightInfo:
    """A resident weight, as the server describes it."""
    name: str
    # The format's name ("u4b8"), or "WEIGHT_FORMAT_<N>" for one this client
    # does not know.
    format: str
    k: int
    n: int
    group: int
    # Bytes of the canonical layout (qweight + scales + zeros).
    canonical_bytes: int
    # Bytes the server holds in host memory, and in GPU memory.
    resident_bytes: int
    gpu_bytes: int
    # The server's GPU holding it, where gpu_bytes > 0.
    gpu: int
    # nvfp4's global scale; 1 for the other formats.
    global_scale: float
    # Whether the server reorders A's columns before every matmul.
    activation_order: bool

    @classmethod
    def from_proto(cls, info):
        fmt = formats.format_of_wire_value(info.format)
        return cls(name=info.name,
                   format=fmt.name if fmt else f"WEIGHT_FORMAT_{info.format}",
                   k=info.k, n=info.n, group=info.group_size,
                   canonical_bytes=info.canonical_bytes,
                   resident_bytes=info.resident_bytes,
                   gpu_bytes=info.gpu_bytes, gpu=info.gpu,
                   global_scale=info.global_scale,
                   activation_order=info.activation_order)


class Client:
    """A connection to one nibble server. Thread-safe, as gRPC channels are.

    target: "HOST:PORT" or any gRPC target.
    tls: connect with TLS; root_certificates (PEM bytes; None for the
        system's roots), and for servers that require client certificates
        certificate_chain and private_key (PEM bytes).
    token: sent as "authorization: Bearer TOKEN" on every call.
    timeout: seconds each call may take; None for no limit.
    """

    def __init__(self, target, tls=False, token=None, *, timeout=None,
                 root_certificates=None, certificate_chain=None,
                 private_key=None):
        # Replies (C [M, N]) and uploads' messages may pass gRPC's default
        # 4 MiB limit.
        options = [("grpc.max_receive_message_length", -1),
                   ("grpc.max_send_message_length", -1)]
        if tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates, private_key, certificate_chain)
            self._channel = grpc.secure_channel(target, credentials, options)
        else:
            self._channel = grpc.insecure_channel(target, options)
        self._metadata = (("authorization", f"Bearer {token}"),) if token \
            else ()
        self._timeout = timeout
        self._nibble = nibble_pb2_grpc.NibbleServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout,
                          metadata=self._metadata)
        except grpc.RpcError as error:
            raise NibbleError(error.code(), error.details()) from None

    def upload(self, name, qweight, scales, zeros=None, format="u4b8",
               group=None, global_scale=None, activation_order=None,
               gpu=None):
        """Uploads B [K, N] from its canonical arrays (nibble.formats):
        qweight [K/8, N] uint32 (or int32, bit for bit), scales [K/group, N]
        uint16 slots (or float16 values for fp16 scales, uint8 codes for
        8-bit ones) and, for u4, zeros [K/group, N] 0..15. `group` defaults
        to the one the shapes imply; `global_scale` is nvfp4's;
        `activation_order`, K entries, a GPTQ act-order weight's; `gpu`, the
        server's GPU to keep it on (None lets the server place it). Returns
        its WeightInfo. ValueError before anything is sent when the arrays
        do not fit together; NibbleError when the server refuses the
        weight."""
        fmt = formats.format_named(format)
        qweight = _qweight_array(qweight)
        scales = _scales_array(scales, fmt)
        k = qweight.shape[0] * formats.CODES_PER_WORD
        n = qweight.shape[1]
        if scales.shape[1] != n or scales.shape[0] == 0 or \
                k % scales.shape[0]:
            raise ValueError(f"scales {scales.shape} do not fit qweight "
                             f"{qweight.shape}: they must be [K/group, N] "
                             f"with K = {k}, N = {n}")
        implied_group = k // scales.shape[0]
        if group is not None and group != implied_group:
            raise ValueError(f"group={group}, but scales {scales.shape} for "
                             f"K = {k} give {implied_group} rows a scale")
        tensors = [(nibble_pb2.WEIGHT_TENSOR_QWEIGHT, qweight),
                   (nibble_pb2.WEIGHT_TENSOR_SCALES, scales)]
        if fmt.has_zeros != (zeros is not None):
            raise ValueError(f"{fmt.name} " + (
                "needs zeros [K/group, N] uint8" if fmt.has_zeros else
                "has no zero points: leave zeros out"))
        if zeros is not None:
            zeros = _zeros_array(zeros)
            if zeros.shape != scales.shape:
                raise ValueError(f"zeros {zeros.shape} must have the shape of "
                                 f"scales {scales.shape}")
            tensors.append((nibble_pb2.WEIGHT_TENSOR_ZEROS, zeros))
        header = nibble_pb2.WeightHeader(
            name=name, format=fmt.wire_value, k=k, n=n,
            group_size=implied_group,
            global_scale=0 if global_scale is None else global_scale)
        if gpu is not None:
            header.gpu = gpu
        if activation_order is not None:
            header.activation_order.extend(
                int(i) for i in np.asarray(activation_order).ravel())
        return WeightInfo.from_proto(self._call(
            self._nibble.UploadWeight, _upload_requests(header, tensors)))

    def upload_quantized(self, name, weight):
        """Uploads a nibble.QuantizedWeight."""
        return self.upload(name, weight.qweight, weight.scales, weight.zeros,
                           weight.format, global_scale=weight.global_scale)

    def quantize_and_upload(self, name, w, format, group=None):
        """Quantizes the float matrix B = `w` [K, N] (nibble.quantize, the
        rules of `nibble import --quantize`) and uploads it; returns its
        WeightInfo. nibble.quantize(w, format, group).dequantize() is the B
        the server then multiplies by."""
        return self.upload_quantized(
            name, quantize_module.quantize(w, format, group))

    def matmul(self, name, a, activation_precision=None):
        """C = A · dequant(B) on the resident weight `name`. `a` is A [M, K]
        (or one row [K], which gives C [N]) as float32, float16, or uint16
        holding bfloat16 bits; C comes back in the same dtype.
        `activation_precision` is the lossiest treatment of A accepted:
        "exact", "bf16" or "int8" (docs/api.md); None for the server's."""
        a = np.asarray(a)
        dtype = _DTYPES.get(a.dtype)
        if dtype is None:
            raise TypeError(f"matmul takes A as float32, float16 or uint16 "
                            f"(bfloat16 bits), got {a.dtype}")
        precision = nibble_pb2.ACTIVATION_PRECISION_UNSPECIFIED
        if activation_precision is not None:
            precision = _ACTIVATION_PRECISIONS.get(activation_precision)
            if precision is None:
                raise ValueError(
                    f"activation_precision must be one of "
                    f"{', '.join(_ACTIVATION_PRECISIONS)} or None, got "
                    f"{activation_precision!r}")
        if a.ndim not in (1, 2):
            raise ValueError(f"A must be [M, K] or [K], got shape {a.shape}")
        rows = a.reshape(-1, a.shape[-1])
        reply = self._call(self._nibble.Matmul, nibble_pb2.MatmulRequest(
            weight_name=name, m=rows.shape[0], k=rows.shape[1], dtype=dtype,
            a=np.ascontiguousarray(rows, dtype=a.dtype.newbyteorder("<"))
            .tobytes(), activation_precision=precision))
        c = np.frombuffer(reply.c, dtype=a.dtype.newbyteorder("<"))
        c = c.astype(a.dtype).reshape(reply.m, reply.n)
        return c[0] if a.ndim == 1 else c

    def get(self, name):
        """The WeightInfo of `name`; NibbleError NOT_FOUND when there is
        none."""
        return WeightInfo.from_proto(self._call(
            self._nibble.GetWeight, nibble_pb2.GetWeightRequest(name=name)))

    def list(self):
        """Every resident weight's WeightInfo, sorted by name."""
        weights, token = [], ""
        while True:
            page = self._call(self._nibble.ListWeights,
                              nibble_pb2.ListWeightsRequest(page_token=token))
            weights.extend(WeightInfo.from_proto(w) for w in page.weights)
            token = page.next_page_token
            if not token:
                return weights

    def delete(self, name):
        self._call(self._nibble.DeleteWeight,
                   nibble_pb2.DeleteWeightRequest(name=name))

    def health(self, service=""):
        """The serving status of `service` (the server as a whole when
        empty): "SERVING", "NOT_SERVING", ..."""
        reply = self._call(self._health.Check,
                           health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def _two_d(values, what):
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{what} must be 2-D, got shape {array.shape}")
    return array


def _qweight_array(qweight):
    """qweight as little-endian uint32; int32 (as GPTQ checkpoints store it)
    is taken bit for bit."""
    array = _two_d(qweight, "qweight")
    if array.dtype.kind not in "iu" or array.dtype.itemsize != 4:
        raise ValueError(f"qweight must be uint32 (or int32), got "
                         f"{array.dtype}")
    little_endian = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=little_endian).view("<u4")


def _scales_array(scales, fmt):
    """Scale slots as little-endian uint16: from uint16 slots, from float16
    values (fp16 scales) or from uint8 codes (8-bit scales)."""
    array = _two_d(scales, "scales")
    if array.dtype == np.uint16:
        return np.ascontiguousarray(array, dtype="<u2")
    if array.dtype == np.float16 and not fmt.eight_bit_scales:
        return np.ascontiguousarray(array, dtype="<f2").view("<u2")
    if array.dtype == np.uint8 and fmt.eight_bit_scales:
        return array.astype("<u2")
    wanted = f"uint8 {fmt.scale_type} codes" if fmt.eight_bit_scales \
        else "float16"
    raise ValueError(f"scales must be uint16 slots or {wanted} for "
                     f"{fmt.name}, got {array.dtype}")


def _zeros_array(zeros):
    array = _two_d(zeros, "zeros")
    if array.dtype.kind not in "iu" or (array.size and (
            array.min() < 0 or array.max() > 255)):
        raise ValueError(f"zeros must be integers 0..15, got {array.dtype}")
    return array.astype(np.uint8)


def _upload_requests(header, tensors):
    """The header, then each tensor's bytes in order, in chunks whose offset
    counts the tensor's bytes already sent."""
    yield nibble_pb2.UploadWeightRequest(header=header)
    for tensor, array in tensors:
        data = memoryview(array).cast("B")
        for offset in range(0, len(data), UPLOAD_CHUNK_BYTES):
            yield nibble_pb2.UploadWeightRequest(chunk=nibble_pb2.WeightChunk(
                tensor=tensor, offset=offset,
                data=bytes(data[offset:offset + UPLOAD_CHUNK_BYTES])))
