"""The attention page in a real browser: Debian's headless Chromium, driven over
the DevTools protocol through a pipe (--remote-debugging-pipe: NUL-separated
JSON on file descriptors 3 and 4), so the test needs no package beyond the
standard library and the `chromium` apt package.

The page is built from synthetic row-stochastic weights (odd shapes: 3 layers,
5 heads, 9 tokens, one of them a pair), so what it shows can be checked number
by number against what went in. The model-backed page is checked in
test_attention.py.
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest

from bertkit.explain.attention_view import AttentionMap, save_html
from conftest import need

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, exe: str):
        self.profile = tempfile.mkdtemp(prefix="bertkit-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # our commands -> Chromium's fd 3
        self._out_r, out_w = os.pipe()  # Chromium's fd 4 -> us

        def wire_fds():  # runs in the child before exec
            a, b = os.dup(cmd_r), os.dup(out_w)
            os.dup2(a, 3)  # dup2 makes 3 and 4 inheritable; everything else closes on exec
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"],
            close_fds=False, preexec_fn=wire_fds,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._next, self._buffer, self.events = 0, b"", []

    def call(self, method: str, params=None, session=None, timeout: float = 20.0):
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._out_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the debugging pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Chromium):
        self.browser = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method, params=None):
        return self.browser.call(method, params, self.session)

    def open(self, url: str):
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + 20
        while self.eval("document.readyState") != "complete":
            assert time.monotonic() < deadline, "page did not finish loading"
            time.sleep(0.05)

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def select(self, element_id: str, value: str):
        """Choose an option the way a user does: set the value, fire 'change'."""
        self.eval(
            f"(function(){{var s=document.getElementById({element_id!r}); s.value={value!r};"
            "s.dispatchEvent(new Event('change'));})()"
        )


def synthetic_map(seed=0, L=3, N=5, pair=True) -> AttentionMap:
    rng = np.random.default_rng(seed)
    tokens = ["[CLS]", "bert", "sees", "the", "hat", "[SEP]", "he", "##s", "[SEP]"] if pair else \
        ["[CLS]", "bert", "sees", "the", "hat", "and", "he", "##s", "[SEP]"]
    T = len(tokens)
    logits = rng.normal(scale=2.0, size=(L, N, T, T))
    weights = np.exp(logits)
    weights /= weights.sum(-1, keepdims=True)
    types = [0] * 6 + [1] * 3 if pair else [0] * T
    return AttentionMap(tokens, weights.astype(np.float32), types, "bert sees the hat", "he s" if pair else None)


@pytest.fixture(scope="module")
def browser():
    need(CHROMIUM is not None, "Debian's chromium is not installed (apt-get install chromium)")
    b = Chromium(CHROMIUM)
    yield b
    b.close()


def test_page_switches_layer_and_head_and_shows_the_weights(browser, tmp_path):
    amap = synthetic_map()
    page_file = save_html(amap, tmp_path / "page.html", token=4, layer=0, head=0)
    page = Page(browser)
    page.open(page_file.as_uri())

    errors = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    assert not errors, errors
    assert page.eval("bertkitAttention.tokens") == amap.tokens
    assert page.eval("document.querySelectorAll('#overview canvas').length") == 3 * 5

    def shown():
        return np.array(page.eval("bertkitAttention.shown()"))

    # the starting view: token 4 ("hat"), layer 0, head 0
    np.testing.assert_allclose(shown(), amap.weights[0, 0, 4], rtol=0, atol=1e-7)
    assert abs(shown().sum() - 1) < 1e-5

    page.select("layer", "2")
    page.select("head", "3")
    assert page.eval("bertkitAttention.state()") == {"layer": 2, "head": 3, "token": 4}
    np.testing.assert_allclose(shown(), amap.weights[2, 3, 4], rtol=0, atol=1e-7)

    # the mean over heads, and another source token picked by clicking it
    page.select("head", "mean")
    page.eval("document.querySelectorAll('#text .tok')[6].click()")
    np.testing.assert_allclose(shown(), amap.weights[2, :, 6].mean(0), rtol=0, atol=1e-6)

    # clicking a heatmap of the overview selects its layer and head
    page.eval("document.querySelectorAll('#overview canvas')[1 * 5 + 2].click()")
    assert page.eval("bertkitAttention.state()") == {"layer": 1, "head": 2, "token": 6}
    np.testing.assert_allclose(shown(), amap.weights[1, 2, 6], rtol=0, atol=1e-7)
    assert page.eval("document.querySelector('#overview canvas.current').title") == "layer 1, head 2"

    # the strongest-attended token gets the strongest colour
    alphas = page.eval(
        "Array.from(document.querySelectorAll('#text .tok')).map(s => getComputedStyle(s).backgroundColor)"
    )
    strongest = int(np.argmax(amap.weights[1, 2, 6]))
    assert alphas[strongest] in ("rgb(220, 60, 40)", "rgba(220, 60, 40, 1)")

    shot = page.call("Page.captureScreenshot", {"format": "png"})["data"]
    png = base64.b64decode(shot)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    (tmp_path / "page.png").write_bytes(png)

    # nothing but the file itself was requested: no CDN, no network
    urls = [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
    assert urls and all(u.startswith(("file:", "data:")) for u in urls), urls


def test_page_survives_markup_in_tokens(browser, tmp_path):
    amap = synthetic_map(seed=1, pair=False)
    amap.tokens[2] = "</script><b>x"
    amap.text = "<i>title</i>"
    page = Page(browser)
    page.open(save_html(amap, tmp_path / "odd.html").as_uri())
    assert page.eval("bertkitAttention.tokens")[2] == "</script><b>x"
    assert page.eval("document.querySelectorAll('#text .tok')[2].textContent") == "</script><b>x"
    assert page.eval("document.title") == "Attention: <i>title</i>"


def test_model_page_from_the_cli(browser, tmp_path):
    """The issue's example end to end: `bertkit attention ... --token he`, opened and switched."""
    from bertkit.explain.attention_view import attention_map
    from bertkit.cli import main

    text = "Bert notices the hat, but chooses not to engage Ernie since he knows it'll lead to some ridiculous stuff."
    page_file = tmp_path / "he.html"
    # float32 both ways: the page must show the very weights (1e-7), and --dtype auto is bfloat16 on some CPUs
    assert main(["attention", text, "--token", "he", "-o", str(page_file), "--dtype", "float32"]) == 0
    amap = attention_map(text, dtype="float32")
    page = Page(browser)
    page.open(page_file.as_uri())
    assert page.eval("bertkitAttention.state()") == {"layer": 0, "head": 0, "token": 13}
    page.select("layer", "4")
    page.select("head", "7")
    shown = np.array(page.eval("bertkitAttention.shown()"))
    np.testing.assert_allclose(shown, amap.weights[4, 7, 13], rtol=0, atol=1e-7)
    assert abs(shown.sum() - 1) < 1e-5
    png = base64.b64decode(page.call("Page.captureScreenshot", {"format": "png"})["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "he.png").write_bytes(png)
