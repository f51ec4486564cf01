"""What the hostile-client tests share: a nibbled of their own in a memory-
and pids-limited cgroup, a well-behaved bystander client timing its calls,
and raw HTTP/2 connections that send gRPC frames as an attacker would.

Example:
    server = Nibbled(bin_dir, scratch, ["--max_weight_bytes=64Mi"], limits)
    server.start()
    server.upload("bystander", k=512, n=512, seed=1)
    with RawGrpcConnection(server.target, initial_window=0) as attacker:
        attacker.start_call("/nibble.v1.NibbleService/Matmul", request)
    result = Bystander(server, "bystander", seed=1).run(seconds=3)
    server.stop()
"""

import dataclasses
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import h2.config
import hpack
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

MIB = 1 << 20
CGROUP_ROOT = "/sys/fs/cgroup"


class HostileFailure(AssertionError):
    """A property the server must keep under attack did not hold."""


def require(condition, message):
    if not condition:
        raise HostileFailure(message)


@dataclasses.dataclass
class ProcessLimits:
    """What the server's cgroup allows it: bytes of memory, processes and
    threads."""
    memory_bytes: int
    max_pids: int


class Cgroups:
    """A memory and a pids cgroup (v1 or v2) of their own, or none where
    this process may not make them (not root, no writable hierarchy): then
    `skipped` says why, and the tests run without those limits."""

    def __init__(self, name, limits):
        self.paths = []
        self.skipped = None
        try:
            self._make(name, limits)
        except OSError as error:
            self.close()
            self.skipped = f"cgroup limits not applied ({error})"

    def _make(self, name, limits):
        unified = os.path.join(CGROUP_ROOT, "cgroup.controllers")
        if os.path.exists(unified):
            path = os.path.join(self._own_cgroup("", CGROUP_ROOT), name)
            os.mkdir(path)
            self.paths.append(path)
            self._write(path, "memory.max", limits.memory_bytes)
            self._write(path, "memory.swap.max", 0)
            self._write(path, "pids.max", limits.max_pids)
            return
        for controller, file, value in (
            ("memory", "memory.limit_in_bytes", limits.memory_bytes),
            ("pids", "pids.max", limits.max_pids)):
            root = os.path.join(CGROUP_ROOT, controller)
            path = os.path.join(self._own_cgroup(controller, root), name)
            os.mkdir(path)
            self.paths.append(path)
            self._write(path, file, value)

    @staticmethod
    def _own_cgroup(controller, root):
        """This process's cgroup of `controller` ("" on v2) under `root`."""
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(",") or (
                        controller == "" and controllers == ""):
                    return os.path.join(root, path.lstrip("/"))
        raise OSError(f"no {controller or 'unified'} cgroup in /proc/self/cgroup")

    @staticmethod
    def _write(path, file, value):
        with open(os.path.join(path, file), "w") as out:
            out.write(str(value))

    def join(self):
        """Moves the calling process into the cgroups (a Popen preexec_fn)."""
        for path in self.paths:
            self._write(path, "cgroup.procs", os.getpid())

    def oom_kills(self):
        """How many processes the memory limit killed, where the cgroup says."""
        for path in self.paths:
            for file in ("memory.events", "memory.oom_control"):
                try:
                    with open(os.path.join(path, file)) as lines:
                        for line in lines:
                            key, _, count = line.partition(" ")
                            if key == "oom_kill":
                                return int(count)
                except OSError:
                    continue
        return 0

    def close(self):
        for path in reversed(self.paths):
            try:
                os.rmdir(path)
            except OSError:
                pass
        self.paths = []


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """What a test needs of a nibbled to reach it: its address (`target`),
    the `nibble` CLI and `nibble-load` in `bin_dir`, a scratch folder, and
    the token file of its --auth_token_file, if any."""

    def __init__(self, bin_dir, scratch, target=None, token_file=None):
        self.bin_dir = bin_dir
        self.scratch = scratch
        self.target = target
        self.token_file = token_file

    def cli(self, *args, timeout=60):
        """`nibble ARGS` against this server; (exit code, stdout + stderr)."""
        token = ([f"--auth_token_file={self.token_file}"]
                 if self.token_file else [])
        done = subprocess.run(
            [os.path.join(self.bin_dir, "nibble"), args[0],
             f"--target={self.target}", *token, *args[1:]],
            capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr

    def upload(self, name, k, n, seed):
        code, output = self.cli("upload", f"--name={name}", "--format=u4b8",
                                f"--k={k}", f"--n={n}", "--group=128",
                                f"--random={seed}")
        require(code == 0, f"upload of {name} failed: {output}")

    def holds(self, name):
        return self.cli("get", f"--name={name}")[0] == 0

    def alive(self):
        """Answering health checks with SERVING."""
        return self.cli("health", timeout=30)[0] == 0


class RunningServer(Server):
    """A nibbled started elsewhere, at `target`: the container image behind
    its front (make container-test). It is attacked and its bystander timed
    as a Nibbled's, but its memory is neither limited nor measured, and it
    is never restarted."""

    def require_running(self):
        require(self.alive(), f"nibbled at {self.target} does not answer "
                "health checks")


class Nibbled(Server):
    """A nibbled on loopback (port 0) in cgroups of its own, started and
    stopped by the test; its stderr goes to `<scratch>/nibbled.log`. With
    `front_config`, HAProxy runs in front of it with that configuration, in
    the same cgroups as in the container image, and `target` is the front's
    address (`direct_target` nibbled's, a Unix socket as in the image).
    `max_open_files` lowers nibbled's RLIMIT_NOFILE, soft and hard, as many
    hosts set it."""

    def __init__(self, bin_dir, scratch, flags, limits, token_file=None,
                 front_config=None, max_open_files=None):
        super().__init__(bin_dir, scratch, token_file=token_file)
        self.flags = flags
        self.limits = limits
        self.front_config = front_config
        self.max_open_files = max_open_files
        self.process = None
        self.front = None
        self.direct_target = None
        self.socket_dir = None
        self.metrics_address = None
        self.cgroups = None
        self.log_path = os.path.join(scratch, "nibbled.log")

    def _confine(self):
        """A Popen preexec_fn: into the cgroups, with the open-file limit."""
        self.cgroups.join()
        if self.max_open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE,
                               (self.max_open_files, self.max_open_files))

    def start(self, wait_until_serving=True):
        self.cgroups = Cgroups(
            f"nibble-hostile-{os.getpid()}-{time.monotonic_ns()}", self.limits)
        # Behind the front nibbled listens on a Unix socket, as in the image
        # (deploy/nibble-entrypoint.sh); /tmp keeps its path short.
        listen = "127.0.0.1:0"
        if self.front_config is not None:
            if self.socket_dir is None:
                self.socket_dir = tempfile.mkdtemp(prefix="nibble-front-")
            listen = f"unix:{self.socket_dir}/nibbled.sock"
        self.process = subprocess.Popen(
            [os.path.join(self.bin_dir, "nibbled"), f"--listen={listen}",
             "--threads=2", *self.flags],
            stdout=subprocess.PIPE, stderr=open(self.log_path, "ab"),
            preexec_fn=self._confine, text=True)
        if not wait_until_serving:
            return
        line = self.process.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if match is None:
            raise HostileFailure(f"nibbled did not start (exit "
                                 f"{self.process.wait()}); see {self.log_path}")
        self.target = self.direct_target = match.group(1)
        metrics = re.search(r"metrics at http://([^/]+)/metrics", line)
        self.metrics_address = metrics.group(1) if metrics else None
        if self.front_config is not None:
            self._start_front()

    def _start_front(self):
        address = f"127.0.0.1:{free_port()}"
        self.front = subprocess.Popen(
            ["haproxy", "-f", self.front_config],
            env={**os.environ, "NIBBLE_FRONT_LISTEN": address,
                 "NIBBLE_FRONT_BACKEND": self.direct_target.replace(
                     "unix:", "unix@", 1)},
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.scratch, "haproxy.log"), "ab"),
            preexec_fn=self.cgroups.join)
        self.target = address
        deadline = time.monotonic() + 30
        while self.cli("health", timeout=10)[0] != 0:
            require(self.front.poll() is None and time.monotonic() < deadline,
                    f"HAProxy did not serve on {address}; see "
                    f"{self.scratch}/haproxy.log")
            time.sleep(0.1)

    def require_running(self):
        """Fails, saying how nibbled or its front ended, unless both still
        run."""
        for name, process in (("nibbled", self.process),
                              ("HAProxy", self.front)):
            code = process.poll() if process is not None else None
            if code is not None:
                raise HostileFailure(
                    f"{name} ended (exit {code}, {self.cgroups.oom_kills()} "
                    f"killed by the memory limit); see {self.scratch}")

    def alive(self):
        """Running and answering health checks with SERVING."""
        return self.process.poll() is None and super().alive()

    def peak_rss_bytes(self, process=None):
        """The largest resident set nibbled (or `process`) has had (VmHWM)."""
        with open(f"/proc/{(process or self.process).pid}/status") as lines:
            for line in lines:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise HostileFailure("no VmHWM in /proc/PID/status")

    def stop(self, timeout=30):
        """SIGTERM; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
            raise HostileFailure(f"nibbled ignored SIGTERM for {timeout} s")
        finally:
            self.process.stdout.close()
            if self.front is not None:
                self.front.terminate()
                self.front.wait()
                self.front = None
            if self.socket_dir is not None:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                self.socket_dir = None
            self.cgroups.close()
        return code


@dataclasses.dataclass
class BystanderResult:
    requests: int
    errors: dict
    p99_ms: float
    verified: int


class Bystander:
    """A well-behaved client: nibble-load's open loop at a low rate, M = 1 on
    a random weight uploaded with `seed`, every 10th reply checked against
    the float64 reference. Latency counts from each call's scheduled send,
    so a stalled server shows in the p99 however briefly it stalls."""

    RATE = 50

    def __init__(self, server, weight, seed):
        self.server = server
        self.weight = weight
        self.seed = seed

    def start(self, seconds):
        """Starts a run of `seconds` in the background; .join() gives its
        BystanderResult."""
        json_path = os.path.join(self.server.scratch,
                                 f"bystander-{time.monotonic_ns()}.json")
        token = ([f"--auth_token_file={self.server.token_file}"]
                 if self.server.token_file else [])
        process = subprocess.Popen(
            [os.path.join(self.server.bin_dir, "nibble-load"),
             f"--target={self.server.target}", f"--name={self.weight}",
             "--m=1", "--dtype=f32", f"--rate={self.RATE}",
             f"--duration={seconds}", "--warmup=0", "--connections=1",
             "--timeout=10s", "--verify=10", f"--random={self.seed}",
             f"--json={json_path}", *token],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return _BystanderRun(process, json_path)

    def run(self, seconds):
        return self.start(seconds).join()


class _BystanderRun:

    def __init__(self, process, json_path):
        self.process = process
        self.json_path = json_path

    def join(self):
        output, _ = self.process.communicate(timeout=120)
        try:
            with open(self.json_path) as file:
                result = json.load(file)
        except (OSError, ValueError):
            raise HostileFailure(f"nibble-load wrote no result (exit "
                                 f"{self.process.returncode}): {output}")
        return BystanderResult(
            requests=result["requests_ok"] + result["errors"],
            errors=result["errors_by_code"],
            p99_ms=result["latency_us"]["p99"] / 1000.0,
            verified=result["verified"])


@dataclasses.dataclass
class Answer:
    """What came back on one stream: the gRPC status (None while open or
    after a reset), its message, the reply bytes and the reset code."""
    status: int = None
    message: str = ""
    data: bytes = b""
    reset: int = None

    @property
    def finished(self):
        return self.status is not None or self.reset is not None


def grpc_frame(message, compressed=False):
    """`message` with gRPC's 5-byte prefix: the compressed flag, the length."""
    return bytes([int(compressed)]) + len(message).to_bytes(4, "big") + message


class RawGrpcConnection:
    """One HTTP/2 connection speaking gRPC by hand, to send what a gRPC
    library would not: windows of 0 that never open, calls that stop after
    their headers, compressed messages, headers without a token."""

    def __init__(self, target, initial_window=None, timeout=30,
                 source="127.0.0.1"):
        host, port = target.rsplit(":", 1)
        self.authority = target
        self.socket = socket.create_connection(
            (host, int(port)), timeout=timeout, source_address=(source, 0))
        self.connection = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True,
                                      header_encoding="utf-8"))
        self.connection.initiate_connection()
        self.reads_replies = initial_window != 0
        if initial_window is not None:
            self.connection.update_settings(
                {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window})
        self.answers = {}
        self._flush()

    def __enter__(self):
        return self

    def __exit__(self, *unused):
        self.close()

    def close(self):
        try:
            self.socket.close()
        except OSError:
            pass

    def start_call(self, path, message=None, extra_headers=(),
                   end_stream=True, compressed=False):
        """Opens a call to `path`, sends its headers and, when given, one
        message; the stream id."""
        stream = self.connection.get_next_available_stream_id()
        self.connection.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"), ("te", "trailers"),
            *extra_headers], end_stream=message is None and end_stream)
        self.answers[stream] = Answer()
        if message is not None:
            self.send(stream, grpc_frame(message, compressed), end_stream)
        self._flush()
        return stream

    def send(self, stream, data, end_stream=False):
        """Sends `data` on `stream`, waiting for the server's windows; stops
        early where the server ends the stream first, as it may to refuse."""
        try:
            self._send(stream, data, end_stream)
        except h2.exceptions.StreamClosedError:
            pass

    def _send(self, stream, data, end_stream):
        while data:
            if self.answers[stream].finished:
                return
            room = min(self.connection.local_flow_control_window(stream),
                       self.connection.max_outbound_frame_size)
            if room <= 0:
                self.read_events(timeout=1)
                continue
            self.connection.send_data(stream, data[:room])
            data = data[room:]
            self._flush()
        if end_stream:
            self.connection.end_stream(stream)
            self._flush()

    def read_events(self, timeout):
        """Reads what arrives within `timeout` seconds into `answers`;
        False once the server has closed the connection."""
        readable, _, _ = select.select([self.socket], [], [], timeout)
        if not readable:
            return True
        try:
            received = self.socket.recv(1 << 16)
        except (ConnectionResetError, socket.timeout):
            return False
        if not received:
            return False
        try:
            events = self.connection.receive_data(received)
        except h2.exceptions.ProtocolError:
            return False
        for event in events:
            self._record(event)
        self._flush()
        return True

    def wait_any_answer(self, streams, timeout):
        """Reads until one stream of `streams` has finished or `timeout`
        seconds passed; their answers."""
        deadline = time.monotonic() + timeout
        while (not any(self.answers[s].finished for s in streams)
               and time.monotonic() < deadline):
            if not self.read_events(min(1.0, deadline - time.monotonic())):
                break
        return [self.answers[s] for s in streams]

    def wait_answers(self, streams, timeout):
        """Reads until every stream of `streams` has finished or `timeout`
        seconds passed; their answers."""
        deadline = time.monotonic() + timeout
        while (not all(self.answers[s].finished for s in streams)
               and time.monotonic() < deadline):
            if not self.read_events(min(1.0, deadline - time.monotonic())):
                break
        return [self.answers[s] for s in streams]

    def _record(self, event):
        answer = self.answers.get(getattr(event, "stream_id", None))
        if isinstance(event, h2.events.DataReceived):
            if answer is not None:
                answer.data += event.data
            if self.reads_replies:
                self.connection.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id)
        elif isinstance(event, (h2.events.ResponseReceived,
                                h2.events.TrailersReceived)):
            headers = dict(event.headers)
            if answer is not None and "grpc-status" in headers:
                answer.status = int(headers["grpc-status"])
                answer.message = headers.get("grpc-message", "")
        elif isinstance(event, h2.events.StreamReset) and answer is not None:
            answer.reset = event.error_code

    def _flush(self):
        outgoing = self.connection.data_to_send()
        if outgoing:
            self.socket.sendall(outgoing)

    def go_raw(self):
        """Settles the connection (the server's SETTINGS acknowledged), then
        hands it over to send_raw: from here on what arrives is read and
        dropped on a thread of its own, and h2's state is no longer kept."""
        for _ in range(3):
            self.read_events(timeout=0.2)

        def drain():
            try:
                while self.socket.recv(1 << 16):
                    pass
            except OSError:
                pass

        threading.Thread(target=drain, daemon=True).start()

    def header_block(self, path, extra_headers=()):
        """The HPACK block of a gRPC call's request headers, self-contained
        (static table and literals only), so it can be sent again and
        again."""
        return hpack.Encoder().encode([
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", self.authority),
            ("content-type", "application/grpc"), ("te", "trailers"),
            *extra_headers])

    def send_raw(self, data):
        """Sends bytes as they are; False once the server has closed."""
        try:
            self.socket.sendall(data)
            return True
        except OSError:
            return False


# HTTP/2 frame types and flags (RFC 9113, section 6).
DATA, HEADERS, RST_STREAM, CONTINUATION = 0x0, 0x1, 0x3, 0x9
END_HEADERS = 0x4
CANCEL = 0x8


def frame(kind, flags, stream, payload=b""):
    """One HTTP/2 frame as it goes on the wire."""
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags]) +
            stream.to_bytes(4, "big") + payload)


def run_for(seconds, step):
    """Calls `step()` until `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        step()


def in_background(function, *args):
    """Runs `function(*args)` on a thread; .join() re-raises its failure."""
    outcome = {}

    def body():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:  # re-raised by join
            outcome["error"] = error

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    class Handle:

        @staticmethod
        def join():
            thread.join()
            if "error" in outcome:
                raise outcome["error"]
            return outcome.get("value")

    return Handle()
