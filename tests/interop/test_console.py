"""The web console in a real headless Chromium (Debian's chromium and chromium-driver, driven by PyPI's
selenium): what it shows, that it follows the daemon without a reload, and that nothing a resource holds
runs as script. Chromium missing fails these tests; they never skip."""

import os
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = os.environ.get("MESHCA_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MESHCA_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "target" / "console-screenshots"


@pytest.fixture
def browser():
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), (
        "Chromium is not installed (Debian: apt-get install chromium chromium-driver): the console tests "
        "fail rather than skip"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]:
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
    browser.get(base + "?expiring=60")
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-proxy='default/web-1']"), "valid 1 h"
