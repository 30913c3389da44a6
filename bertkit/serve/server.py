"""Start-up and shutdown of `bertkit serve`: load, bind, serve with uvicorn, drain.

Order matters for the user: the model is loaded (and run once) before the port
is opened, so a missing or corrupt model directory fails with one line and
status 2 rather than after clients were told to connect. The socket is bound
here, not by uvicorn, so `--port 0` can print the port it got.

Shutdown on SIGTERM or Ctrl+C is uvicorn's graceful one: stop accepting
connections, let every request already received get its answer, then run the
app's lifespan exit, which lets the batcher answer anything still queued.
uvicorn then re-raises the signal it caught so that the default action (death
by signal) happens; a drained server has done its job, so we absorb that
re-raise and exit 0. The socket listens before the start line is printed, and
a signal that arrives before uvicorn has installed its handler is uvicorn's
shutdown all the same (it starts, answers what it accepted, stops).
"""

from __future__ import annotations

import dataclasses
import signal
import socket
import sys

from bertkit.errors import BertkitError, MissingPackage
from bertkit.serve.connections import capacity, descriptors_in_use, guarded
from bertkit.serve.metrics import Metrics


BACKLOG = 2048  # connections the kernel holds until they are accepted (uvicorn's default, handed to it too)


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)  # now, before the start line tells clients to connect: they wait in the backlog
    except OSError as err:
        raise BertkitError(f"cannot listen on {host}:{port}: {err.strerror or err}; pick another --port or --host") from None
    sock.set_inheritable(True)
    return sock


def speed(onednn: bool | None = None):
    """The fast-path settings a server runs on (`bertkit.runtime.fast.SpeedSettings`): this CPU's,
    at the torch threads set now, with rule 7 (row buckets) on; `onednn` forces the matmul kernel
    either way (the command line's BERTKIT_ONEDNN)."""
    from bertkit.runtime.fast import decide

    return decide(onednn=onednn, row_buckets=True)


def batch_limits(runner, settings) -> str:
    """What cuts a forward pass, as the start line says it: tokens and rows for an encoder, inputs for a
    fine-tuned model (`bertkit.predict` batches those by count: `--max-batch-tokens` does not apply)."""
    if runner.budget_in_tokens:
        return f"max {settings.max_batch_tokens} tokens / {settings.max_batch_size} rows per batch"
    return f"max {settings.max_batch_size} inputs per batch"


def serve(settings, log=None, onednn: bool | None = None) -> None:
    """Load the model in `settings.model`, serve it until SIGTERM/SIGINT, answer what was accepted, return.
    onednn: None, the kernels this CPU's rules pick; True/False, oneDNN / MKL for every matmul."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    settings.validate().model_path()  # a wrong directory is said at once, before torch loads
    try:
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from bertkit.serve.app import create_app
    except ImportError as err:
        raise MissingPackage(f"bertkit serve needs the serve extra ({err.name} is missing): "
                           "pip install 'bertkit[serve]'") from None
    import torch

    from bertkit.runtime.devices import cores, resolve_device
    from bertkit.serve.runner import load_runner

    gpu = resolve_device(None).type == "cuda"
    workers, threads = settings.parallelism(cores(), gpu)
    settings = dataclasses.replace(settings, workers=workers, threads=threads)
    torch.set_num_threads(threads)  # process-wide: each worker's passes use this many threads
    runner = load_runner(settings, speed(onednn))  # after the threads are set: rule 1 reads them
    app = create_app(runner, settings, Metrics({"model": runner.name, "task": runner.task,
                                                "precision": runner.precision}))
    sock = bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    what = f"a {runner.task} model" if runner.dim is None else f"{runner.dim}-dimensional embeddings"
    what += f", /search over {settings.index}" if settings.index else ""
    held = descriptors_in_use()  # the model's, the index's, the socket's: connections get what is left
    http = guarded(AutoHTTPProtocol, settings.header_timeout_s, settings.max_connections, held, log,
                   send_timeout_s=settings.send_timeout_s)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_keep_alive=settings.keep_alive_s, http=http, backlog=BACKLOG)
    server = uvicorn.Server(config)
    # the server's own handler before the start line: a signal before uvicorn installs it (the port already
    # takes connections) is a shutdown, not lost; and it absorbs uvicorn's re-raise of the signal it caught
    absorbed = {s: signal.signal(s, server.handle_exit) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        log(f"bertkit serve: {runner.name} ({what}) on http://{shown}:{port} "
            f"({batch_limits(runner, settings)}, "
            f"queue {settings.max_queue}, {capacity(settings.max_connections, held)} connections, "
            f"{workers} worker(s) x {threads} thread(s)"
            f", {runner.precision}{' matmuls on ' + runner.speed.matmul_kernel if runner.precision == 'float32' and not gpu else ''}"
            f"{', API key required' if settings.api_key else ''})")
        server.run(sockets=[sock])
    finally:
        for s, handler in absorbed.items():
            signal.signal(s, handler)
        sock.close()
    log("bertkit serve: stopped after answering every accepted request")
