"""A server under long texts: 16 concurrent /embed requests of 32 x 125 KB texts (about 4 MB each, every word
made unique by a number so no word cache helps), and during them one one-word /embed; the seconds of each.

    python bench/long_texts.py                          # this tree: the default model, float32, 127.0.0.1:18811
    PYTHONPATH=OLD_TREE python bench/long_texts.py      # another tree (a git worktree): the server inherits it

What it measures is how much of a request's time goes to the text the model never reads: the server cuts each
text at the model's input limit (256 tokens), after tokenizing it whole before `Tokenizer.head`.
"""

import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
import urllib.request

PORT = 18811
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(body: dict, timeout: float = 900) -> float:
    """The seconds one /embed takes to answer."""
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/embed", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as answer:
        answer.read()
    return time.perf_counter() - start


def long_text(rng: random.Random, words: list, chars: int = 125_000) -> str:
    out, n = [], 0
    while n < chars:
        out.append(rng.choice(words) + str(rng.randint(0, 99999)))
        n += len(out[-1]) + 1
    return " ".join(out)


def main():
    print(platform.processor() or platform.machine(), os.cpu_count(), "cores, load", os.getloadavg(),
          "; the server: the default model in float32", flush=True)
    server = subprocess.Popen([sys.executable, "-m", "bertkit.cli", "serve", "--port", str(PORT), "--dtype", "float32"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):  # until it answers
            try:
                post({"inputs": "hello"}, timeout=5)
                break
            except OSError:
                time.sleep(1)
        rng = random.Random(0)
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            words = [w for w in f.read().split() if w.isalpha()][:2000]
        bodies = [{"inputs": [long_text(rng, words) for _ in range(32)], "truncate": True} for _ in range(16)]
        print(f"one word alone: {post({'inputs': 'hello'}):.3f} s; a body: {len(json.dumps(bodies[0])) / 1e6:.1f} MB",
              flush=True)
        times = []
        threads = [threading.Thread(target=lambda b=b: times.append(post(b))) for b in bodies]
        for t in threads:
            t.start()
        time.sleep(0.3)
        small = post({"inputs": "hello"})
        for t in threads:
            t.join()
        print(f"one word during 16 x 4 MB: {small:.3f} s; the 16: {min(times):.1f}-{max(times):.1f} s", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
