"""A small benchmark harness: ours against a peer, in one process run.

Timing noise on this machine is +-15-20% between processes, so every benchmark
times all contenders in the same process, interleaved round-robin (ours, peer,
ours, peer, ...), repeated, and reports the median. Results are ratios
ours/peer in *throughput* terms (higher is better for us) together with the
machine and library versions, and can be written into one section of
docs/benchmarks.md, delimited by `<!-- bench:NAME -->` markers, so each
benchmark owns its own table.
"""

import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SHARED_DATA = Path(os.environ.get("BERTKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))


def versions(*packages) -> dict:
    out = {"python": platform.python_version()}
    for name in ("bertkit", "torch", "numpy", *packages):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine_line(*packages) -> str:
    v = versions(*packages)
    libs = ", ".join(f"{k} {val}" for k, val in v.items())
    from bertkit.runtime.devices import cpu_features  # the model, cores and instruction set the kernels were chosen by

    return f"{cpu_features().describe()}; {platform.system()} {platform.machine()}; {libs}"


def load_line() -> str:
    """The load average now, printed beside every timing: other jobs on the shared
    cores slow every contender, so a number is read together with it."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min)"


def interleaved(contenders: dict, rounds: int = 5, warmup: int = 1, settle: float = 0.0) -> dict:
    """Time each zero-argument callable `rounds` times, round-robin.

    Returns name -> list of seconds. The first `warmup` rounds are discarded
    (caches, lazy initialisation, allocator warm-up). `settle`: seconds to sleep
    before each timing, so that thread pools the previous contender left spinning
    (ONNX Runtime's do, after each run) have gone idle and take no CPU from this one.
    """
    times = {name: [] for name in contenders}
    for r in range(warmup + rounds):
        for name, fn in contenders.items():
            time.sleep(settle)
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[name].append(dt)
    return times


def table(title: str, work: float, unit: str, times: dict, ours: str, note: str = "") -> str:
    """A markdown table: median time, throughput (work/time) and ratio to ours.

    `work` is the amount done per call (bytes, sequences, tokens...), `unit` its
    name; the ratio column is ours/peer throughput: above 1.0 we are faster.
    """
    med = {name: statistics.median(ts) for name, ts in times.items()}
    rate = {name: work / t for name, t in med.items()}
    lines = [f"### {title}", ""]
    if note:
        lines += [note, ""]
    lines += [
        f"| contender | median s/call | {unit}/s | ours/this |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name in times:
        ratio = rate[ours] / rate[name]
        lines.append(f"| {name} | {med[name]:.4f} | {rate[name]:,.1f} | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) the `<!-- bench:NAME -->` section of docs/benchmarks.md."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text)


def report(name: str, markdown: str, write: bool) -> None:
    print(markdown)
    if write:
        write_section(name, markdown)
        print(f"wrote section {name!r} of {DOCS.relative_to(ROOT)}", file=sys.stderr)
