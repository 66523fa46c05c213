"""The web console in a real headless Chromium (Debian's chromium and chromium-driver, driven by PyPI's
selenium): what it shows, that it follows the daemon without a reload, and that nothing a resource holds
runs as script. Chromium missing fails these tests; they never skip."""

import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import MESHCA

CHROMIUM = os.environ.get("MESHCA_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MESHCA_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "target" / "console-screenshots"
REBOUND = "rebound.attacker.example"


@pytest.fixture
def browser():
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), (
        "Chromium is not installed (Debian: apt-get install chromium chromium-driver): the console tests "
        "fail rather than skip"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,900",
        # A name a DNS-rebinding page would use: its own, resolving to the admin listener's address.
        f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
    ]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_overview_lists_the_mesh_and_its_ca_and_goes_live(daemon, browser):
    browser.get(f"http://127.0.0.1:{daemon.admin_port}/")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "live").text.startswith("live"))
    section = browser.find_element(By.CSS_SELECTOR, "section.mesh[data-mesh='default']")
    assert "Mesh default" in section.text
    backends = section.find_element(By.CSS_SELECTOR, "table.backends").text
    assert "ca-1" in backends and "enabled" in backends and "CN=meshca default/ca-1" in backends
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / "overview.png"))
    # On a phone's width the pages fit: wide tables scroll inside themselves, the page does not.
    browser.set_window_size(390, 844)
    for path in ["/", "/proxies", "/rollouts"]:
        browser.get(f"http://127.0.0.1:{daemon.admin_port}{path}")
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{path} is {overflow}px wider than a phone's screen"
        browser.save_screenshot(str(SCREENSHOTS / f"phone{path.replace('/', '-')}.png"))


def test_a_page_on_a_rebound_name_reads_nothing(daemon, browser):
    """DNS rebinding: a page on the attacker's name, rebound to 127.0.0.1, fetches the admin API as a
    same-origin page. The browser sends the attacker's name as Host, and the listener answers 421."""
    browser.get(f"http://{REBOUND}:{daemon.admin_port}/")
    assert "421 Misdirected Request" in browser.page_source
    assert "Mesh default" not in browser.page_source
    fetched = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/api/status').then(r => r.text().then(t => done([r.status, t])), e => done([0, String(e)]));"
    )
    assert fetched[0] == 421, fetched
    assert "meshes" not in fetched[1] and "admin.allowedHosts" in fetched[1], fetched
    # The same browser on the listener's address reads the console.
    browser.get(f"http://127.0.0.1:{daemon.admin_port}/api/status")
    assert "meshes" in browser.page_source


def test_a_payload_in_a_resource_shows_as_text_and_runs_nothing(daemon, browser):
    browser.get(f"http://127.0.0.1:{daemon.admin_port}/")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "live").text.startswith("live"))
    payload = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>"
    # An invalid Dataplane whose name is the payload: the update is rejected, and its error (which names
    # the resource) appears on the page, live.
    daemon.write_resource(
        "evil.yaml",
        f"type: Dataplane\nmesh: default\nname: '{payload}'\nnetworking:\n  address: 10.0.0.9\n"
        "  inbound: [{port: 1, tags: {kuma.io/service: x}}]\n",
    )
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "section.rejected"))
    rejected = browser.find_element(By.CSS_SELECTOR, "section.rejected").text
    assert "evil.yaml" in rejected
    assert browser.execute_script("return window.pwned === undefined")
    assert not browser.find_elements(By.CSS_SELECTOR, "section.rejected img, section.rejected script")


def test_the_proxies_table_lists_a_proxy_and_filters(daemon, browser, tmp_path):
    token = tmp_path / "web-1.token"
    token.write_text(daemon.token("web-1", "default", "--tag", "kuma.io/service=web"))
    daemon.cli("sds", "fetch", "--config", str(daemon.config), "--token-file", str(token), "default")
    base = f"http://127.0.0.1:{daemon.admin_port}/proxies"
    browser.get(base + "?mesh=default")
    row = browser.find_element(By.CSS_SELECTOR, "tr[data-proxy='default/web-1']")
    assert "spiffe://default/web" in row.text and "backend ca-1" in row.text
    row.find_element(By.LINK_TEXT, "web-1").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "section.proxy"))
    page = browser.find_element(By.CSS_SELECTOR, "section.proxy").text
    assert "Proxy web-1 in mesh default" in page and "spiffe://default/web" in page, page
    assert browser.current_url.endswith("/proxies/default/web-1")
    browser.get(base + "?mesh=other")
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-proxy='default/web-1']")
    browser.get(base + "?service=web")
    assert browser.find_elements(By.CSS_SELECTOR, "tr[data-proxy='default/web-1']")
    browser.get(base + "?service=api")
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-proxy='default/web-1']")
    browser.get(base + "?expiring=60")
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-proxy='default/web-1']"), "valid 1 h"


class Drill:
    """`meshca drill ca-rotation` in a child process, paused at its steady state until `go()`; its stderr
    lines are read on a thread so that the pipe never fills."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(
            [MESHCA, "drill", "ca-rotation", "--pause", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, pattern, timeout=180):
        """The first stderr line from now on that matches `pattern`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0 and self.proc.poll() is None, f"no line matching {pattern!r}: {self.seen[-30:]}"
            try:
                line = self.lines.get(timeout=min(left, 1))
            except queue.Empty:
                continue
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def go(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def text_of(browser, css):
    """The text of the first element matching `css` now, or None (read in the page at once: the console
    replaces its elements on every update, so a held element goes stale)."""
    return browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null", css
    )


def state_of(browser, step):
    return browser.execute_script(
        "const e = document.querySelector(`li.step[data-step='${arguments[0]}']`);"
        "return e ? e.dataset.state : null",
        step,
    )


def count_on(browser, issuer):
    """The count on `issuer`'s bar of mesh `default`, or None while it has no bar."""
    text = text_of(browser, f"section.mesh[data-mesh='default'] .bar[data-issuer='{issuer}'] .count")
    return None if text is None else int(text)


def test_a_rotation_moves_the_bar_from_0_to_all_live_and_names_the_proxy_it_waits_for(browser):
    """The drill's 12 simulated proxies rotate from ca-1 to ca-2 while the page stays open: one of them
    withholds its ACKs, so the trust step waits for it (named, with its countdown) until rollout.ackTimeout;
    then every proxy moves to ca-2. The page is never reloaded."""
    proxies = 12
    drill = Drill("--proxies", str(proxies), "--handshakes", "300", "--stuck", "1")
    try:
        url = drill.wait_for(r"watch it in the console at (http://\S+/)").group(1)
        drill.wait_for(r"steady state reached; press Enter")
        browser.get(url)
        WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "live").text.startswith("live"))
        browser.execute_script("window.notReloaded = true")
        WebDriverWait(browser, 30).until(lambda d: count_on(d, "backend ca-1") == proxies)
        assert count_on(browser, "backend ca-2") is None, "ca-2 is not configured yet"

        drill.go()
        stuck = drill.wait_for(r"\d+ proxies \(([^)]+)\) now withhold their ACKs").group(1)
        # The trust step waits for the stuck proxy: named, counted down, and nobody is on ca-2 yet.
        wait_css = "section.mesh[data-mesh='default'] .wait[data-step='trust-before-identity']"
        # The others ACK the new trust one by one; the page follows (no snapshot changes meanwhile).
        WebDriverWait(browser, 25, poll_frequency=0.1).until(
            lambda d: text_of(d, wait_css + " .waiting-for") == f"default.{stuck}"
        )
        assert text_of(browser, wait_css + " .waiting-count") == "1"
        assert state_of(browser, "trust-before-identity") == "waiting"
        assert count_on(browser, "backend ca-2") == 0
        first = int(text_of(browser, wait_css + " .countdown"))
        WebDriverWait(browser, 10).until(lambda d: int(text_of(d, wait_css + " .countdown")) < first)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOTS / "rotation.png"))

        # After rollout.ackTimeout (30 s) the rollout goes ahead without it: the bar fills to all.
        seen = set()

        def all_on_ca2(d):
            count = count_on(d, "backend ca-2")
            seen.add(count)
            return count == proxies

        WebDriverWait(browser, 120, poll_frequency=0.1).until(all_on_ca2)
        assert 0 in seen and proxies in seen, seen
        assert state_of(browser, "trust-before-identity") == "done"
        assert browser.execute_script("return window.notReloaded === true"), "the page was reloaded"
        browser.get(url + "rollouts")
        timeline = browser.find_element(By.CSS_SELECTOR, "section.timeline[data-mesh='default']").text
        assert "trust-before-identity began" in timeline and "went ahead after rollout.ackTimeout" in timeline
    finally:
        drill.stop()
